"""Partitioned projectors: one worker per partition; idle partitions still let readers through."""

from __future__ import annotations

import asyncio

import pytest

from events.omitted import OMITTED
from events.subjects import partition_of
from projections import queries
from projections.runner import ProjectorRunner
from services.audit import readers as audit
from services.bootstrap import Container
from services.settings import Settings
from tests.conftest import make_settings, running_stack
from tests.integration.helpers import appended, text_message


def projector_of(c: Container, settings: Settings, parts: list[int] | None) -> ProjectorRunner:
    """The projector a process configured with ``projector_partitions=parts`` would run."""
    c.settings = settings.model_copy(update={"projector_partitions": parts})
    try:
        return c.projector()
    finally:
        c.settings = settings


async def test_partitioned_projectors_serve_reads_with_min_seq(nats_url: str, fresh_db: str, s3_endpoint: str) -> None:
    settings = make_settings(nats_url, fresh_db, s3_endpoint=s3_endpoint, partitions=4)
    async with running_stack(settings, projector=False) as c:
        stop = asyncio.Event()
        workers = []
        for p in range(4):
            workers.append(asyncio.create_task(projector_of(c, settings, [p]).run(stop)))
        try:
            last = 0
            for i in range(3):  # a few sessions: some partitions stay idle
                r = await c.commands.append(
                    "tenant-a", f"part-{i}", text_message("m0", f"partition probe {i}"), OMITTED
                )
                last = max(last, r.seq)
            await c.waiter.wait_all(last, timeout_s=10)  # every partition's checkpoint reaches it
            async with c.pool.connection() as conn:
                cur = await conn.execute(
                    "SELECT count(*) FROM checkpoints WHERE name LIKE %s", (f"{settings.projector_name}.p%",)
                )
                assert await cur.fetchone() == (4,)
                cur = await conn.execute("SELECT count(*) FROM messages WHERE session_id LIKE 'part-%%'")
                assert await cur.fetchone() == (3,)
        finally:
            stop.set()
            for w in workers:
                await asyncio.wait_for(w, 15)


async def test_verify_with_partitioned_projectors_compares_each_partition_at_its_checkpoint(
    nats_url: str, fresh_db: str, s3_endpoint: str
) -> None:
    """One partition's projector stopped and behind: verify still passes (each partition is
    rebuilt to its own checkpoint), and a tampered row still fails it."""
    settings = make_settings(nats_url, fresh_db, s3_endpoint=s3_endpoint, partitions=2)
    async with running_stack(settings, projector=False) as c:
        stops = [asyncio.Event(), asyncio.Event()]
        workers = []
        for p in range(2):
            workers.append(asyncio.create_task(projector_of(c, settings, [p]).run(stops[p])))
        sessions = {partition_of("tenant-a", f"v-{i}", 2): f"v-{i}" for i in range(20)}
        assert set(sessions) == {0, 1}
        try:
            for sid in sessions.values():
                r = await c.commands.append("tenant-a", sid, text_message("m0", "before"), None)
                await c.waiter.wait_session("tenant-a", sid, r.seq, timeout_s=10)
            stops[1].set()
            await asyncio.wait_for(workers[1], 15)
            await c.publisher.publish(appended("tenant-a", sessions[1], "m1", "m0"))  # partition 1: not applied
            r0 = await c.commands.append("tenant-a", sessions[0], text_message("m1", "after"), "m0")
            await c.waiter.wait_session("tenant-a", sessions[0], r0.seq, timeout_s=10)

            report = await audit.verify(c)
            assert report.ok, report.differences
            async with c.pool.connection() as conn:
                await conn.execute(
                    "UPDATE messages SET content = '{}' WHERE tenant = 'tenant-a' AND session_id = %s AND id = 'm0'",
                    (sessions[0],),
                )
            report = await audit.verify(c)
            assert not report.ok
            assert "messages" in report.differences
        finally:
            for stop in stops:
                stop.set()
            for w in workers:
                await asyncio.wait_for(w, 15)


async def test_workers_of_several_partitions_and_switching_layouts(
    nats_url: str, fresh_db: str, s3_endpoint: str
) -> None:
    """Two workers of two partitions each serve tenant-wide reads; switching between one projector
    and partitioned workers starts from the other layout's checkpoint (nothing re-applied)."""
    settings = make_settings(nats_url, fresh_db, s3_endpoint=s3_endpoint, partitions=4)
    async with running_stack(settings, projector=False) as c:

        async def run(shares: list[list[int] | None], sessions: range) -> tuple[list[int], int]:
            stop = asyncio.Event()
            runners = [projector_of(c, settings, parts) for parts in shares]
            tasks = [asyncio.create_task(r.run(stop)) for r in runners]
            try:
                last = 0
                for i in sessions:
                    r = await c.commands.append("tenant-a", f"w-{i}", text_message("m0", f"switch {i}"), None)
                    last = max(last, r.seq)
                await c.waiter.wait_all(last, timeout_s=10)
            finally:
                stop.set()
                for t in tasks:
                    await asyncio.wait_for(t, 15)
            return [r.stats.applied for r in runners], last

        async def names() -> dict[str, int]:
            async with c.pool.connection() as conn:
                return {
                    k: v for k, v in (await queries.checkpoints(conn)).items() if k.startswith(settings.projector_name)
                }

        applied, first = await run([None], range(0, 6))
        assert applied == [6]
        applied, last = await run([[0, 2], [1, 3]], range(6, 12))
        assert sum(applied) == 6  # started from the single projector's checkpoint
        assert {n for n in await names() if ".p" in n} == {f"{settings.projector_name}.p{p:03d}" for p in range(4)}
        assert all(seq >= last for n, seq in (await names()).items() if ".p" in n)
        applied, _ = await run([None], range(12, 15))
        assert applied == [3]  # back to one projector: from the partitions' lowest checkpoint
        assert set(await names()) == {settings.projector_name}  # the partitions' rows are gone
        async with c.pool.connection() as conn:
            cur = await conn.execute("SELECT count(*) FROM messages WHERE session_id LIKE 'w-%%'")
            assert await cur.fetchone() == (15,)
        assert first < last
        assert (await audit.verify(c)).ok


@pytest.mark.timing  # "nothing more happened" is checked after a fixed wait (no signal marks it)
async def test_a_projector_of_every_partition_and_partition_workers_never_run_together(
    nats_url: str, fresh_db: str, s3_endpoint: str
) -> None:
    settings = make_settings(nats_url, fresh_db, s3_endpoint=s3_endpoint, partitions=2)
    async with running_stack(settings, projector=False) as c:
        single_stop, worker_stop = asyncio.Event(), asyncio.Event()
        single = projector_of(c, settings, None)
        worker = projector_of(c, settings, [0, 1])
        tasks = [asyncio.create_task(single.run(single_stop))]
        try:
            r = await c.commands.append("tenant-a", "lock-0", text_message("m0", "first"), None)
            await c.waiter.wait_session("tenant-a", "lock-0", r.seq, timeout_s=10)
            tasks.append(asyncio.create_task(worker.run(worker_stop)))
            r = await c.commands.append("tenant-a", "lock-1", text_message("m0", "second"), None)
            await c.waiter.wait_session("tenant-a", "lock-1", r.seq, timeout_s=10)
            await asyncio.sleep(1.5)
            assert (single.stats.applied, worker.stats.applied) == (2, 0)  # the worker waits for the locks
            single_stop.set()
            await asyncio.wait_for(tasks[0], 15)
            r = await c.commands.append("tenant-a", "lock-2", text_message("m0", "third"), None)
            await c.waiter.wait_session("tenant-a", "lock-2", r.seq, timeout_s=15)
            # the runner counts a batch after its commit, which the read-model wait may see first
            for _ in range(100):
                if worker.stats.applied:
                    break
                await asyncio.sleep(0.05)
            assert worker.stats.applied == 1  # took over from the single projector's checkpoint
        finally:
            single_stop.set()
            worker_stop.set()
            for t in tasks:
                await asyncio.wait_for(t, 15)
