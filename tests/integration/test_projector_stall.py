"""A projector whose consuming stops making progress (an await that never returns, even one that
ignores its cancellation) re-positions at its checkpoint by itself after ``stall_s`` and applies
what waits. An outside trial saw a projector, stopped for 80 s under load after a NATS restart and
killed Postgres connections, never pull again: silent, every reader waiting, until restarted by hand."""

from __future__ import annotations

import asyncio
from typing import Any

from nats.aio.msg import Msg
from nats.js.client import JetStreamContext

from events.catalog import SessionRenamed
from projections import runner as runner_module
from projections.runner import ProjectorRunner
from services.bootstrap import Container
from tests.conftest import make_settings, running_stack
from tests.integration.test_delivery_gap import Recording, _checkpoint


class Hanging:
    """The first subscription's first fetch never returns; with ``deaf``, it ignores its
    cancellation too (until :meth:`release`)."""

    def __init__(self, *, deaf: bool) -> None:
        self.deaf = deaf
        self.hung = 0
        self.released = asyncio.Event()

    def release(self) -> None:
        self.released.set()

    def wrap(self, sub: JetStreamContext.PullSubscription) -> JetStreamContext.PullSubscription:
        if self.hung:
            return sub
        fetch = sub.fetch

        async def hanging(batch: int = 1, timeout: float | None = 5, heartbeat: float | None = None) -> list[Msg]:
            if self.hung:
                return await fetch(batch, timeout, heartbeat)
            self.hung += 1
            while not self.released.is_set():
                try:
                    await self.released.wait()
                except asyncio.CancelledError:
                    if not self.deaf:
                        raise
            return []

        sub.fetch = hanging  # type: ignore[method-assign]
        return sub


def runner_of(c: Container, projection: Any, name: str) -> ProjectorRunner:
    """A runner of ``projection`` alone whose watchdog fires after 1 s without progress."""
    return ProjectorRunner(
        js=c.js,
        pool=c.pool,
        conninfo=c.settings.database_url,
        layout=c.layout,
        projections=[projection],
        name=name,
        stall_s=1.0,
        lock_check_s=0.2,
    )


async def published(c: Container, session: str, n: int) -> list[int]:
    return [
        (await c.publisher.publish(SessionRenamed(tenant="tenant-a", session=session, name=f"n{i}"))).seq
        for i in range(n)
    ]


async def run_until(c: Container, runner: ProjectorRunner, last: int) -> None:
    """Run ``runner`` until its checkpoint reaches ``last``, then stop it."""
    stop = asyncio.Event()
    task = asyncio.create_task(runner.run(stop))
    try:
        async with asyncio.timeout(60):
            while await _checkpoint(c.pool, runner.name) < last:
                await asyncio.sleep(0.05)
    finally:
        stop.set()
        await asyncio.wait_for(task, 15)


async def run_until_applied(
    nats_url: str, fresh_db: str, hanging: Hanging
) -> tuple[ProjectorRunner, Recording, list[int]]:
    async with running_stack(make_settings(nats_url, fresh_db), projector=False) as c:
        seqs = await published(c, "stall", 5)
        recording = Recording()
        runner = runner_of(c, recording, "stalls")
        position = runner._position

        async def positioned() -> JetStreamContext.PullSubscription:
            return hanging.wrap(await position())

        runner._position = positioned  # type: ignore[method-assign]
        try:
            await run_until(c, runner, seqs[-1])
        finally:
            hanging.release()
    return runner, recording, seqs


async def test_a_fetch_that_never_returns_is_abandoned_and_the_runner_re_positions(
    nats_url: str, fresh_db: str
) -> None:
    hanging = Hanging(deaf=False)
    runner, recording, seqs = await run_until_applied(nats_url, fresh_db, hanging)
    assert hanging.hung == 1
    assert runner.stats.stalls == 1
    assert sorted(set(recording.applied)) == seqs


async def test_a_stalled_await_that_ignores_its_cancellation_is_left_behind(
    nats_url: str, fresh_db: str, monkeypatch: Any
) -> None:
    """The stalled round's task does not end when cancelled: the runner waits for it only
    ``CANCEL_GRACE_S``, then re-positions and applies the events all the same."""
    monkeypatch.setattr(runner_module, "CANCEL_GRACE_S", 0.5)
    hanging = Hanging(deaf=True)
    runner, recording, seqs = await run_until_applied(nats_url, fresh_db, hanging)
    assert runner.stats.stalls == 1
    assert sorted(set(recording.applied)) == seqs


class SlowPlanning:
    """A planning projection that takes ``per_item_s`` to plan each event (bodies fetched one by
    one from a slow object store)."""

    name = "slow-planning"

    def __init__(self, per_item_s: float) -> None:
        self.per_item_s = per_item_s
        self.applied: list[int] = []

    async def prepare(self, items: Any, batch: Any = None) -> list[Any]:
        for _ in items:
            await asyncio.sleep(self.per_item_s)
        return [seq for seq, _ in items]

    async def apply_prepared(self, conn: Any, plans: Any) -> None:
        self.applied.extend(plans)

    async def apply(self, conn: Any, items: Any) -> None:
        self.applied.extend(seq for seq, _ in items)


async def test_work_that_is_slow_not_stuck_finishes_the_stall_limit_doubling_after_each_stall(
    nats_url: str, fresh_db: str
) -> None:
    """Planning one batch takes 3 s, over a 1 s ``stall_s``: the watchdog abandons it, then waits
    twice as long, and again, until the batch commits (a stall limit that stayed put re-positioned
    the same batch forever: the review's probe applied nothing in 15 s, 7 stalls)."""
    async with running_stack(make_settings(nats_url, fresh_db), projector=False) as c:
        seqs = await published(c, "slow", 30)
        slow = SlowPlanning(0.1)
        runner = runner_of(c, slow, "slow")
        await run_until(c, runner, seqs[-1])
        assert sorted(set(slow.applied)) == seqs
        assert 1 <= runner.stats.stalls <= 3
