"""Delivery semantics on real JetStream + Postgres: dedup, redelivery, retries, concurrency."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import nats.errors
import pytest

from events.catalog import MessagesDeleted
from events.omitted import OMITTED
from events.publisher import Publisher
from projections import queries
from projections.history import HistoryProjection
from projections.runner import apply_batch, prepare
from services.bootstrap import Container
from services.errors import ParentCycle
from services.writes.commands import Commands
from tests.conftest import operator_nats
from tests.integration.helpers import appended, other_process, text_message


async def test_same_event_applied_twice_has_one_effect(stack: Container, new_id: Callable[[str], str]) -> None:
    sid = new_id("dup")
    event = appended("tenant-a", sid, "m1", None)
    items = [(10_000_000, event)]
    projections = [HistoryProjection()]
    async with stack.pool.connection() as conn:
        async with conn.transaction():
            first = await apply_batch(conn, "dup-test-" + sid, projections, items, notify=False)
        async with conn.transaction():
            second = await apply_batch(conn, "dup-test-" + sid, projections, items, notify=False)
        # even with the checkpoint bypassed (another checkpoint name), the row is not doubled
        async with conn.transaction():
            await apply_batch(conn, "dup-test-other-" + sid, projections, items, notify=False)
        cur = await conn.execute("SELECT count(*) FROM messages WHERE tenant = 'tenant-a' AND session_id = %s", (sid,))
        row = await cur.fetchone()
    assert (first, second) == (1, 0)
    assert row is not None
    assert row[0] == 1


async def test_publishing_one_event_twice_stores_it_once(stack: Container, new_id: Callable[[str], str]) -> None:
    sid = new_id("dedup")
    event = appended("tenant-a", sid, "m1", None)
    a = await stack.publisher.publish(event)
    b = await stack.publisher.publish(event)
    assert (b.seq, b.duplicate) == (a.seq, True)
    assert await stack.publisher.last_subject_seq("tenant-a", sid) == a.seq


class _AckLostOnce:
    """A JetStream context whose first publish reaches the server but whose ack is lost."""

    def __init__(self, js: Any) -> None:
        self._js = js
        self.calls = 0

    async def publish(self, *args: Any, **kwargs: Any) -> Any:
        self.calls += 1
        ack = await self._js.publish(*args, **kwargs)
        if self.calls == 1:
            raise nats.errors.TimeoutError
        return ack

    def __getattr__(self, name: str) -> Any:
        return getattr(self._js, name)


async def test_publish_retried_after_timeout_does_not_append_twice(
    stack: Container, new_id: Callable[[str], str]
) -> None:
    sid = new_id("retry")
    flaky = _AckLostOnce(stack.js)
    publisher = Publisher(flaky, stack.layout, backoff_s=0.001)  # type: ignore[arg-type]
    result = await publisher.publish(appended("tenant-a", sid, "m1", None))
    assert flaky.calls == 2
    assert result.duplicate
    n = 0
    from events import log as eventlog

    async for _ in eventlog.read(stack.js, stack.layout, stack.layout.session_subject("tenant-a", sid)):
        n += 1
    assert n == 1


async def test_concurrent_writers_never_lose_a_message(stack: Container, new_id: Callable[[str], str]) -> None:
    """10 writers, each with its own NATS connection, append 100 messages each without a parent."""
    sid = new_id("race")
    writers, per_writer = 10, 100
    conns = [await operator_nats(stack.settings.nats_url) for _ in range(writers)]
    try:
        commands = [other_process(stack, nc, attempts=1000) for nc in conns]

        async def writer(w: int, cmd: Commands) -> None:
            for i in range(per_writer):
                await cmd.append("tenant-a", sid, text_message(f"w{w}-{i}", f"writer {w} says {i}"), OMITTED)

        await asyncio.gather(*(writer(w, cmd) for w, cmd in enumerate(commands)))
    finally:
        for nc in conns:
            await nc.close()
    last = await stack.publisher.last_subject_seq("tenant-a", sid)
    await stack.waiter.wait_session("tenant-a", sid, last)
    async with stack.pool.connection() as conn:
        leaf = await queries.latest_leaf(conn, "tenant-a", sid)
        assert leaf is not None
        path = await queries.history(conn, "tenant-a", sid, leaf.id)
        cur = await conn.execute(
            "SELECT count(*), count(*) FILTER (WHERE parent_id IS NULL), count(DISTINCT parent_id) "
            "FROM messages WHERE tenant = 'tenant-a' AND session_id = %s",
            (sid,),
        )
        total, roots, distinct_parents = await cur.fetchone()  # type: ignore[misc]
    assert total == writers * per_writer
    assert roots == 1
    assert distinct_parents == total - 1  # every message but the leaf has exactly one child
    assert len(path) == total
    # each writer's own messages appear in the order it wrote them
    for w in range(writers):
        mine = [int(r.id.split("-")[1]) for r in path if r.id.startswith(f"w{w}-")]
        assert mine == list(range(per_writer))


@pytest.mark.parametrize("parent", [None, "m1"])
async def test_conditional_publish_rejects_stale_expectation(
    stack: Container, new_id: Callable[[str], str], parent: str | None
) -> None:
    from events.publisher import ConcurrencyConflict

    sid = new_id("occ")
    first = await stack.publisher.publish(appended("tenant-a", sid, "m1", None), expected_last_subject_seq=0)
    with pytest.raises(ConcurrencyConflict):
        await stack.publisher.publish(appended("tenant-a", sid, "m2", parent), expected_last_subject_seq=0)
    ok = await stack.publisher.publish(appended("tenant-a", sid, "m2", parent), expected_last_subject_seq=first.seq)
    assert ok.seq > first.seq


async def test_history_survives_a_parent_cycle(stack: Container, new_id: Callable[[str], str]) -> None:
    """Deleting a message and re-appending its id under a former descendant makes a cycle: the
    append command refuses it, but the log may hold one (published straight to the stream, or
    before the refusal existed), and the projection applies it and its reads end."""
    sid = new_id("cycle")
    await stack.commands.append("tenant-a", sid, text_message("a", "root"), None)
    await stack.commands.append("tenant-a", sid, text_message("b", "child"), "a")
    deleted = await stack.commands.delete_messages("tenant-a", sid, ["a"])
    with pytest.raises(ParentCycle):
        await stack.commands.append("tenant-a", sid, text_message("a", "root again"), "b")
    r = await stack.publisher.publish(
        appended("tenant-a", sid, "a", "b", "root again"), expected_last_subject_seq=deleted.seq
    )
    await stack.waiter.wait_session("tenant-a", sid, r.seq)
    async with stack.pool.connection() as conn:
        path = await queries.history(conn, "tenant-a", sid, "a")
        length = await queries.path_length(conn, "tenant-a", sid, "a")
    assert [m.id for m in path] == ["b", "a"]
    assert length == 2


async def test_one_batch_with_two_runs_of_inserts_does_not_resurrect_a_deleted_message(
    stack: Container, new_id: Callable[[str], str]
) -> None:
    """Inserts are staged in a temporary table: a second run in the same transaction starts empty."""
    sid = new_id("runs")
    items = [
        (20_000_001, appended("tenant-a", sid, "m1", None)),
        (20_000_002, MessagesDeleted(tenant="tenant-a", session=sid, message_ids=["m1"])),
        (20_000_003, appended("tenant-a", sid, "m2", None)),
    ]
    async with stack.pool.connection() as conn:
        async with conn.transaction():
            await apply_batch(conn, "runs-test-" + sid, [HistoryProjection()], items, notify=False)
        cur = await conn.execute(
            "SELECT id FROM messages WHERE tenant = 'tenant-a' AND session_id = %s ORDER BY id", (sid,)
        )
        ids = [r[0] for r in await cur.fetchall()]
    assert ids == ["m2"]


async def test_a_batch_with_redelivered_older_events_applies_each_new_one_with_its_own_plan(
    stack: Container, new_id: Callable[[str], str]
) -> None:
    """A fetch may mix redelivered events (at or below the checkpoint) in after new ones: the
    prepared plans must still be the fresh events' own, in stream order."""
    sid = new_id("mixed")
    name = "mixed-test-" + sid
    projections = [HistoryProjection()]
    old = [
        (30_000_001, appended("tenant-a", sid, "m1", None, "one")),
        (30_000_002, appended("tenant-a", sid, "m2", "m1")),
    ]
    new = [
        (30_000_004, appended("tenant-a", sid, "m4", "m3", "four")),
        (30_000_003, appended("tenant-a", sid, "m3", "m2", "three")),
    ]
    async with stack.pool.connection() as conn:
        async with conn.transaction():
            await apply_batch(conn, name, projections, old, notify=False, prepared=await prepare(projections, old))
        mixed = [new[0], *old, new[1], new[0]]  # out of order, with repeats
        async with conn.transaction():
            applied = await apply_batch(
                conn, name, projections, mixed, notify=False, prepared=await prepare(projections, mixed)
            )
        rows = await queries.history(conn, "tenant-a", sid, "m4")
        cur = await conn.execute("SELECT seq FROM checkpoints WHERE name = %s", (name,))
        checkpoint = await cur.fetchone()
    assert applied == 2
    assert [(r.id, r.parent_id, r.seq) for r in rows] == [
        ("m1", None, 30_000_001),
        ("m2", "m1", 30_000_002),
        ("m3", "m2", 30_000_003),
        ("m4", "m3", 30_000_004),
    ]
    assert "four" in rows[-1].content
    assert checkpoint == (30_000_004,)
