"""A delivery that never reaches the projector (lost in a disconnect: nats-server cuts a slow
consumer and drops what it had in flight) is applied all the same: the runner sees the skipped
consumer sequence, applies and acknowledges nothing past it, and re-positions at its checkpoint.
Before, the next batch's acknowledgement (the consumer acknowledges all up to a sequence)
acknowledged the lost event unapplied and the checkpoint moved past it: gone from the read models
for good, with readiness saying all was well (the adversarial trial's 1 MB flood)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import psycopg
from nats.aio.msg import Msg
from nats.js.client import JetStreamContext

from events.catalog import SessionRenamed
from events.envelope import Event
from projections.runner import FETCH_CHUNK, ProjectorRunner, read_checkpoint
from tests.conftest import make_settings, running_stack


class Recording:
    """A projection that records the sequences it applied (committed with the checkpoint)."""

    name = "recording"

    def __init__(self) -> None:
        self.applied: list[int] = []

    async def apply(self, conn: psycopg.AsyncConnection[Any], items: Sequence[tuple[int, Event]]) -> None:
        self.applied.extend(seq for seq, _ in items)


class Losing:
    """Wraps a pull subscription's ``fetch``: records how many messages each pull request asked
    for, and (``lose``) the first fetch of more than one message loses its second message, as a
    cut connection loses what was in flight."""

    def __init__(self, *, lose: bool = True) -> None:
        self.lose = lose
        self.lost: list[int] = []
        self.asked: list[int] = []

    def wrap(self, sub: JetStreamContext.PullSubscription) -> JetStreamContext.PullSubscription:
        fetch = sub.fetch

        async def losing(batch: int = 1, timeout: float | None = 5, heartbeat: float | None = None) -> list[Msg]:
            self.asked.append(batch)
            msgs = await fetch(batch, timeout, heartbeat)
            if self.lose and not self.lost and len(msgs) > 1:
                self.lost.append(msgs[1].metadata.sequence.stream)
                return [msgs[0], *msgs[2:]]
            return msgs

        sub.fetch = losing  # type: ignore[method-assign]
        return sub


async def _run_over_backlog(
    nats_url: str, fresh_db: str, events: int, losing: Losing
) -> tuple[ProjectorRunner, Recording, list[int]]:
    """A runner with a :class:`Recording` projection over a backlog of ``events`` events, its
    subscriptions wrapped by ``losing``, run until its checkpoint is past the last."""
    settings = make_settings(nats_url, fresh_db)
    async with running_stack(settings, projector=False) as c:
        seqs = []
        for i in range(events):  # published before the runner starts: one backlog, fetched in batches
            done = await c.publisher.publish(SessionRenamed(tenant="tenant-a", session="gap", name=f"name {i}"))
            seqs.append(done.seq)
        recording = Recording()
        runner = ProjectorRunner(
            js=c.js, pool=c.pool, conninfo=settings.database_url, layout=c.layout, projections=[recording], name="gaps"
        )
        position = runner._position

        async def positioned() -> JetStreamContext.PullSubscription:
            return losing.wrap(await position())

        runner._position = positioned  # type: ignore[method-assign]
        stop = asyncio.Event()
        task = asyncio.create_task(runner.run(stop))
        try:
            async with asyncio.timeout(30):
                while runner.stats.last_seq < seqs[-1] or await _checkpoint(c.pool, "gaps") < seqs[-1]:
                    await asyncio.sleep(0.05)
        finally:
            stop.set()
            await asyncio.wait_for(task, 15)
    return runner, recording, seqs


async def test_a_lost_delivery_is_applied_after_re_positioning(nats_url: str, fresh_db: str) -> None:
    losing = Losing()
    runner, recording, seqs = await _run_over_backlog(nats_url, fresh_db, 20, losing)
    assert len(losing.lost) == 1
    assert runner.stats.gaps == 1
    assert sorted(set(recording.applied)) == seqs  # the lost one too
    assert losing.lost[0] in recording.applied


async def _checkpoint(pool: Any, name: str) -> int:
    async with pool.connection() as conn:
        return await read_checkpoint(conn, name)


async def test_a_backlog_is_pulled_a_chunk_at_a_time_into_larger_batches(nats_url: str, fresh_db: str) -> None:
    """Each pull request asks for at most ``FETCH_CHUNK`` messages (what fits under nats-server's
    default 64 MiB per connection with 1 MiB events); a batch still gathers more than one chunk."""
    counting = Losing(lose=False)
    runner, recording, seqs = await _run_over_backlog(nats_url, fresh_db, 3 * FETCH_CHUNK, counting)
    assert max(counting.asked) == FETCH_CHUNK
    assert runner.stats.batches < len(seqs) / FETCH_CHUNK  # batches of more than one request
    assert sorted(set(recording.applied)) == seqs
    assert runner.stats.gaps == 0
