"""A session's compaction is exclusive across compactor processes (its lease, a Postgres advisory
lock): two work-queue subscribers, each on its own NATS connection and its own lease connections,
on one real nats-server and Postgres. The work queue hands them the same session at once; one
summarises, the other waits and then finds nothing left to do; when the holder's connection ends
the other takes over; a manual compaction while one runs is refused without a summary."""

from __future__ import annotations

import asyncio
import contextlib

import pytest
from nats.js.errors import NotFoundError

from events.catalog import CompactionRequested
from services.bootstrap import Container
from services.compaction import queue
from services.compaction.lease import Leases, LeasesExhausted, SessionBusy
from services.compaction.queue import KIND, WorkStats
from services.compaction.ranges import Plan
from services.compaction.service import Series
from services.compaction.state import series, still_due
from services.compaction.summarizers import Summarizer, SummarizerError
from services.errors import CompactionInProgress, RateLimited
from services.requests import writes
from tests.conftest import make_settings, running_stack
from tests.integration.test_compaction_queue import (
    POLICY,
    T,
    _failures,
    _overlays,
    _request,
    _session,
    _settled,
    _subscriber,
    _until,
)

DUE = POLICY.model_copy(update={"compact_after": 300})
# the lease of (tenant, session) in pg_locks: the two-key advisory form, keys as unsigned 32-bit
_HOLDERS = (
    "SELECT pid, granted FROM pg_locks WHERE locktype = 'advisory' AND objsubid = 2 "
    "AND database = (SELECT oid FROM pg_database WHERE datname = current_database()) "
    "AND classid = (hashtext('chronicle-compaction')::bigint & 4294967295)::oid "
    "AND objid = (hashtext(%s || '/' || %s)::bigint & 4294967295)::oid"
)


class _Gated:
    """A summarizer that, once entered, waits until the test opens its gate."""

    def __init__(self, name: str, *, gated: bool = True, fails: bool = False, empty: bool = False) -> None:
        self.name = name
        self.fails = fails
        self.empty = empty
        self.model: str | None = None
        self.calls = 0
        self.entered = asyncio.Event()
        self.gate = asyncio.Event()
        if not gated:
            self.gate.set()

    async def summarize(self, plan: Plan) -> str:
        self.calls += 1
        self.entered.set()
        await self.gate.wait()
        if self.fails:
            raise SummarizerError(f"{self.name}: the model is down")
        return "" if self.empty else f"## Topic\nsummary by {self.name}"


def _compactor(
    c: Container, summarizer: Summarizer, *, attempts: int = 3, compact_timeout_s: float = 600
) -> contextlib.AbstractAsyncContextManager[WorkStats]:
    """What ``chronicle compactor`` runs: a subscriber of the shared durable on a NATS connection of
    its own, with leases of its own, weighing requests against the committed state (and going on
    with the session's series of attempts there)."""

    async def due(req: CompactionRequested) -> bool:
        async with c.pool.connection() as conn:
            return await still_due(conn, c.settings.projector_name, req.tenant, req.session, req.seq)

    async def series_of(req: CompactionRequested) -> Series:
        async with c.pool.connection() as conn:
            return await series(conn, c.settings.projector_name, req.tenant, req.session)

    return _subscriber(
        c, summarizer, attempts=attempts, still_due=due, series_of=series_of, compact_timeout_s=compact_timeout_s
    )


async def _lease(c: Container, sid: str) -> list[tuple[int, bool]]:
    """(backend pid, granted) of every holder of and waiter for the session's lease."""
    async with c.pool.connection() as conn:
        cur = await conn.execute(_HOLDERS, (T, sid))
        return [(int(pid), bool(granted)) for pid, granted in await cur.fetchall()]


async def _waiting(c: Container, sid: str) -> bool:
    held = await _lease(c, sid)
    return sum(g for _, g in held) == 1 and sum(not g for _, g in held) == 1


async def _requested(c: Container, sid: str) -> int:
    """A new session ``sid`` over its threshold, and the projector's request of it as it stands
    now waiting in the work queue (no compactor runs yet: one request, of the final state); the
    sequence of its last append."""
    seq = await _session(c, sid, DUE)

    async def request_of_the_last_append() -> bool:
        with contextlib.suppress(NotFoundError):
            stored = await c.js.get_last_msg(c.layout.work_stream, c.layout.work_subject(KIND, T, sid))
            return CompactionRequested.model_validate_json(stored.data or b"").seq >= seq
        return False

    await _until(request_of_the_last_append, "the projector to request the session")
    return seq


async def _holding(c: Container, sid: str, holder: _Gated) -> int:
    """Once ``holder``'s compactor summarises ``sid`` (holding its lease): its lease's backend pid."""
    await asyncio.wait_for(holder.entered.wait(), 30)
    ((pid, granted),) = await _lease(c, sid)
    assert granted
    return pid


async def test_two_compactors_given_one_session_summarise_it_once(
    nats_url: str, fresh_db: str, s3_endpoint: str
) -> None:
    settings = make_settings(nats_url, fresh_db, s3_endpoint=s3_endpoint)
    async with running_stack(settings) as c:
        first, second = _Gated("first"), _Gated("second", gated=False)
        seq = await _requested(c, "both")
        async with _compactor(c, first) as first_stats:
            await _holding(c, "both", first)
            async with _compactor(c, second) as second_stats:
                # a newer request of the session (a newer decision) while the first is summarising:
                # the stream hands it to the free compactor, which waits for the lease
                await _request(c, "both", seq, estimate=999)
                await _until(lambda: _waiting(c, "both"), "the second compactor to wait for the lease")
                first.gate.set()
                await _until(lambda: _settled(c), "both requests to be settled")
        assert (first.calls, second.calls) == (1, 0)  # one summary: billed once
        (overlay,) = await _overlays(c, "both")
        assert overlay.summarizer == "first"
        assert (first_stats.compactions, second_stats.compactions, second_stats.nothing) == (1, 0, 1)
        assert await _lease(c, "both") == []


async def test_a_newer_request_in_another_compactor_continues_the_failing_series(
    nats_url: str, fresh_db: str, s3_endpoint: str
) -> None:
    """The summarizer down, 2 attempts: a newer request of the session replaces the one the first
    compactor is trying and goes to the second, which waits for the lease; it then continues the
    series the first began (attempt 2, after the backoff), not a series of its own: two
    summaries in all, two failures recorded, the second the last."""
    settings = make_settings(nats_url, fresh_db, s3_endpoint=s3_endpoint)
    async with running_stack(settings) as c:
        first, second = _Gated("first", fails=True), _Gated("second", gated=False, fails=True)
        seq = await _requested(c, "series")
        async with _compactor(c, first, attempts=2) as first_stats:
            await _holding(c, "series", first)
            async with _compactor(c, second, attempts=2) as second_stats:
                await _request(c, "series", seq, estimate=999)  # replaces the first compactor's request
                await _until(lambda: _waiting(c, "series"), "the second compactor to wait for the lease")
                first.gate.set()
                await _until(lambda: _settled(c), "the series to be settled")
        assert first.calls + second.calls == 2, (first.calls, second.calls)
        assert first_stats.gave_up + second_stats.gave_up == 1
        async with c.pool.connection() as conn:
            cur = await conn.execute(
                "SELECT attempt FROM compaction_failures WHERE tenant = %s AND session_id = %s ORDER BY seq",
                (T, "series"),
            )
            assert [a for (a,) in await cur.fetchall()] == [1, 2]
            assert (await series(conn, settings.projector_name, T, "series")).failed == 2
        assert await _overlays(c, "series") == []


async def test_when_the_holders_connection_ends_the_waiting_compactor_takes_over(
    nats_url: str, fresh_db: str, s3_endpoint: str
) -> None:
    """The holder's lease connection ends (its process died, or the database cut it): the lease is
    released by Postgres, and the compactor waiting for it summarises. A holder that was in fact
    still summarising records nothing after it: its overlay's publish finds the other's."""
    settings = make_settings(nats_url, fresh_db, s3_endpoint=s3_endpoint)
    async with running_stack(settings) as c:
        dying, other = _Gated("dying"), _Gated("other", gated=False)
        seq = await _requested(c, "orphan")
        async with _compactor(c, dying):
            holder = await _holding(c, "orphan", dying)
            async with _compactor(c, other) as other_stats:
                await _request(c, "orphan", seq, estimate=999)
                await _until(lambda: _waiting(c, "orphan"), "the second compactor to wait for the lease")
                async with c.pool.connection() as conn:
                    await conn.execute("SELECT pg_terminate_backend(%s)", (holder,))

                async def compacted() -> bool:  # its stats, not the overlay: that is visible before it returns
                    return other_stats.compactions == 1

                await _until(compacted, "the waiting compactor to take over and compact")
                assert other.calls == 1
                assert len(await _overlays(c, "orphan")) == 1
                dying.gate.set()  # the old holder finishes its summary late
                await _until(lambda: _settled(c), "both requests to be settled")
        (overlay,) = await _overlays(c, "orphan")
        assert overlay.summarizer == "other"
        assert await _lease(c, "orphan") == []


async def test_a_manual_compaction_while_the_compactor_runs_is_refused_without_a_summary(
    nats_url: str, fresh_db: str, s3_endpoint: str
) -> None:
    settings = make_settings(nats_url, fresh_db, s3_endpoint=s3_endpoint)
    async with running_stack(settings) as c:
        running = _Gated("running")
        manual = _Gated("manual", gated=False)
        c.compaction.summarizer = manual
        await _requested(c, "manual")
        async with _compactor(c, running):
            await _holding(c, "manual", running)
            with pytest.raises(CompactionInProgress) as refused:
                await writes.compact(c, T, "manual", None)
            assert (refused.value.status, refused.value.code) == (409, "compaction_in_progress")
            assert manual.calls == 0
            running.gate.set()
            await _until(lambda: _settled(c), "the compactor's request to be settled")
        (overlay,) = await _overlays(c, "manual")
        assert overlay.summarizer == "running"
        # once it is done, a manual compaction takes the lease and tries, as always (here the
        # compactor left nothing new to summarise)
        out = await writes.compact(c, T, "manual", None)
        assert out["reason"] == "nothing new to summarise", out
        assert await _lease(c, "manual") == []


async def test_a_wait_for_the_lease_that_times_out_leaves_no_waiter(
    nats_url: str, fresh_db: str, s3_endpoint: str
) -> None:
    leases, other = Leases(fresh_db), Leases(fresh_db)
    settings = make_settings(nats_url, fresh_db, s3_endpoint=s3_endpoint)
    async with running_stack(settings, projector=False) as c:
        async with leases.hold(T, "timeout"):
            with pytest.raises(SessionBusy):
                async with other.hold(T, "timeout"):
                    pytest.fail("the lease is held")
            with pytest.raises(TimeoutError):
                async with other.hold(T, "timeout", wait_s=0.3):
                    pytest.fail("the lease is held")
            ((_, granted),) = await _lease(c, "timeout")  # the holder alone: the waiter was cancelled
            assert granted
            async with other.hold(T, "another session"):  # another session's lease is free
                pass
        async with other.hold(T, "timeout"):  # released at the end of the body
            pass
        assert await _lease(c, "timeout") == []


async def test_a_process_holds_no_more_leases_than_its_limit(nats_url: str, fresh_db: str, s3_endpoint: str) -> None:
    """Each lease is a Postgres connection held through a summary: a burst of manual compactions
    is refused beyond the limit (429) rather than using up the server's connections."""
    leases = Leases(fresh_db, limit=1)
    async with leases.hold(T, "first"):
        with pytest.raises(LeasesExhausted):
            async with leases.hold(T, "second"):
                pytest.fail("over the limit")
        with pytest.raises(TimeoutError):  # a request that may wait waits for a slot, bounded
            async with leases.hold(T, "second", wait_s=0.2):
                pytest.fail("over the limit")
    async with leases.hold(T, "second"):  # the slot is free again after the body
        pass
    settings = make_settings(nats_url, fresh_db, s3_endpoint=s3_endpoint, compactor_concurrency=1)
    async with running_stack(settings) as c:
        c.compaction.summarizer = _Gated("manual", gated=False)
        await _session(c, "other", DUE)
        async with c.compaction.leases.hold(T, "busy"):
            with pytest.raises(RateLimited) as refused:
                await writes.compact(c, T, "other", None)
        assert (refused.value.status, refused.value.code, refused.value.retry_after_s) == (429, "rate_limited", 1.0)


async def test_a_wait_for_the_lease_that_runs_out_records_nothing_and_the_request_decides_later(
    nats_url: str, fresh_db: str, s3_endpoint: str
) -> None:
    """Another compaction of the session holds its lease longer than ``compact_timeout_s``, three
    times over, with one attempt allowed: each wait that runs out puts the request off, records
    no ``compaction.failed``, calls no summarizer and leaves the series alone; once the lease is
    free the request decides (here: still due, so it summarises)."""
    settings = make_settings(nats_url, fresh_db, s3_endpoint=s3_endpoint)
    async with running_stack(settings) as c:
        later = _Gated("later", gated=False)
        # compact_timeout_s bounds the wait for the lease and the summary (enough for this one)
        async with _compactor(c, later, attempts=1, compact_timeout_s=1.5) as stats:
            async with Leases(fresh_db).hold(T, "held"):  # the other compaction
                await _requested(c, "held")

                async def put_off_thrice() -> bool:
                    return stats.busy >= 3

                await _until(put_off_thrice, "the request to find the lease held three times")
                assert later.calls == 0
                assert (stats.failures, stats.gave_up, stats.compactions, stats.nothing) == (0, 0, 0, 0)
                await c.commands.optimistic.catch_up(T, "held")
                assert await _failures(c, "held") == []
                async with c.pool.connection() as conn:
                    assert (await series(conn, settings.projector_name, T, "held")).failed == 0
            await _until(lambda: _settled(c), "the request to be decided once the lease is free")
        assert later.calls == 1
        (overlay,) = await _overlays(c, "held")
        assert overlay.summarizer == "later"
        assert await _failures(c, "held") == []
        assert (stats.failures, stats.gave_up, stats.compactions) == (0, 0, 1)


async def _redelivered_after_a_kill(c: Container, sid: str) -> tuple[_Gated, WorkStats]:
    """A compactor takes the projector's request of a new session ``sid`` (one attempt allowed)
    and stops mid-summary without settling it (as a killed process does); another compactor then
    takes the request, redelivered after the ack wait, until it is settled: that one's
    summarizer and stats."""
    dying, other = _Gated("dying"), _Gated("other", gated=False)
    await _requested(c, sid)
    async with _compactor(c, dying, attempts=1):
        await _holding(c, sid, dying)
    async with _compactor(c, other, attempts=1) as stats:
        await _until(lambda: _settled(c), "the redelivered request to be settled")
    return other, stats


async def test_an_attempt_that_died_unsettled_is_tried_again_not_counted(
    nats_url: str, fresh_db: str, s3_endpoint: str
) -> None:
    """One attempt allowed; the compactor trying it is killed: it recorded nothing, so the
    redelivered request (its second delivery) is still that attempt, and summarises."""
    settings = make_settings(nats_url, fresh_db, s3_endpoint=s3_endpoint)
    async with running_stack(settings) as c:
        other, stats = await _redelivered_after_a_kill(c, "died")
        assert other.calls == 1
        (overlay,) = await _overlays(c, "died")
        assert overlay.summarizer == "other"
        assert (stats.compactions, stats.gave_up) == (1, 0)
        assert await _failures(c, "died") == []


async def test_the_last_delivery_records_the_failure_without_a_summary(
    nats_url: str, fresh_db: str, s3_endpoint: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The consumer's ``max_deliver`` (here 2) bounds the deliveries of a request that never
    settles: the last one records ``compaction.failed`` (the series' attempt, 1) and summarises
    no more."""
    monkeypatch.setattr(queue, "max_deliveries", lambda attempts: 2)
    settings = make_settings(nats_url, fresh_db, s3_endpoint=s3_endpoint)
    async with running_stack(settings) as c:
        other, stats = await _redelivered_after_a_kill(c, "bound")
        assert other.calls == 0
        assert stats.gave_up == 1
        await c.commands.optimistic.catch_up(T, "bound")
        ((attempt, error),) = await _failures(c, "bound")
        assert attempt == 1
        assert "delivered 2 times without an answer" in error
        assert await _overlays(c, "bound") == []


@pytest.mark.parametrize("outcome", ["skipped", "failed"])
async def test_a_session_erased_mid_summary_records_nothing_after_its_erasure(
    nats_url: str, fresh_db: str, s3_endpoint: str, outcome: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another process erases the session while a compactor process summarises it; the summary
    then ends in what would record ``compaction.skipped`` (an empty summary) or
    ``compaction.failed`` (the summarizer fails, the last attempt): nothing is published after
    ``session.erased``, and the request is settled."""
    settings = make_settings(nats_url, fresh_db, s3_endpoint=s3_endpoint)
    async with running_stack(settings) as c, running_stack(settings, projector=False) as worker:
        # the compactor process's writer learns of erasures elsewhere by polling (every 2 s): here it
        # wrote to the session just before the erasure and has not polled since, as any writer in
        # that window
        keys = worker.publisher.keys
        assert keys is not None
        monkeypatch.setattr(keys, "_ttl", 3600.0)
        summarizer = _Gated("erased", fails=outcome == "failed", empty=outcome == "skipped")
        await _requested(c, "erased")
        async with _compactor(worker, summarizer, attempts=1) as stats:
            await _holding(c, "erased", summarizer)
            await keys.for_writing(T, "erased")  # polled now, not again
            async with running_stack(settings, projector=False) as other:
                gone = await other.eraser.erase_session(T, "erased")
            summarizer.gate.set()
            await _until(lambda: _settled(c), "the request to be settled")
        assert summarizer.calls == 1
        assert await c.publisher.last_subject_seq(T, "erased") == gone.seq
        assert (stats.nothing, stats.compactions, stats.gave_up) == (1, 0, 0)
