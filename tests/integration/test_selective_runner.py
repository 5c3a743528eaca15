"""A runner whose projections want none of a batch acknowledges it without a transaction, and
moves its checkpoint at most every ``checkpoint_interval_s``; a wanted event is applied as usual."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Sequence
from typing import Any

import psycopg

from events.envelope import Event
from projections.runner import ProjectorRunner, read_checkpoint
from services.bootstrap import Container
from tests.integration.helpers import appended

T = "tenant-a"


class OneSession:
    """Wants the events of one session only; records what it is given."""

    def __init__(self, session: str) -> None:
        self.name = "selective"
        self.session = session
        self.applied: list[int] = []
        self.got = asyncio.Event()
        self.generation = 0

    def wants(self, event: Event) -> bool:
        return event.session == self.session

    def wants_stored(self, tenant: str, session: str, data: bytes) -> bool:
        return session == self.session

    async def apply(self, conn: psycopg.AsyncConnection[Any], items: Sequence[tuple[int, Event]]) -> None:
        self.applied.extend(seq for seq, _ in items)
        self.got.set()


async def test_unwanted_batches_are_skipped_and_checkpointed_lazily(
    stack: Container, new_id: Callable[[str], str]
) -> None:
    other, mine = new_id("other"), new_id("mine")
    last = 0
    for i in range(20):
        last = (await stack.publisher.publish(appended(T, other, f"m{i}", None))).seq
    projection = OneSession(mine)
    runner = ProjectorRunner(
        js=stack.js,
        pool=stack.pool,
        conninfo=stack.settings.database_url,
        layout=stack.layout,
        projections=[projection],
        name=new_id("selective"),
        batch_size=5,
        idle_timeout_s=30,  # no idle checkpoint advance while the test looks
        checkpoint_interval_s=3600,
        keys=stack.keys,
    )
    stop = asyncio.Event()
    task = asyncio.create_task(runner.run(stop))
    try:
        async with asyncio.timeout(30):
            while runner.stats.last_seq < last:
                await asyncio.sleep(0.02)
        async with stack.pool.connection() as conn:
            lazily = await read_checkpoint(conn, runner.name)
        assert runner.stats.batches > 1
        assert runner.stats.applied == 0
        assert 0 < lazily < last  # written by the first skipped batch only
        wanted = (await stack.publisher.publish(appended(T, mine, "x", None))).seq
        async with asyncio.timeout(30):
            await projection.got.wait()
        assert projection.applied == [wanted]
        async with asyncio.timeout(10):
            while True:  # the checkpoint is committed just after apply returns
                async with stack.pool.connection() as conn:
                    if await read_checkpoint(conn, runner.name) >= wanted:
                        break
                await asyncio.sleep(0.02)
    finally:
        stop.set()
        with contextlib.suppress(Exception):
            await task
