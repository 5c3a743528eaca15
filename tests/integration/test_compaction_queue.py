"""The compaction work queue on a real nats-server (never FastStream's TestNatsBroker, which
ignores acks, dedup and redelivery): one request per decision, explicit acks, redelivery with
backoff, ``compaction.failed`` once per failed attempt, one durable shared by subscribers in
several processes, and a killed subscriber's request taken by another."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
from nats.js.api import DiscardPolicy, StreamInfo
from nats.js.errors import NotFoundError

from bench.support import settings_env
from events import log as eventlog
from events.admission import admit
from events.catalog import CompactionRecorded, CompactionRequested, CompactionSkipped
from events.context import CompactionConfig, SessionConfig
from events.publisher import Publisher
from projections.overlays import Overlay, overlays
from services.bootstrap import Container, work_broker
from services.compaction import queue, state
from services.compaction.lease import Leases
from services.compaction.queue import (
    KIND,
    PendingOf,
    Requests,
    SeriesOf,
    StillDue,
    WorkStats,
    consumer_config,
    request,
    subscribe,
)
from services.compaction.ranges import Plan
from services.compaction.service import CompactionService, Series
from services.compaction.summarizers import Summarizer, SummarizerError
from services.compaction.worker import ensure_consumer
from services.errors import ProjectionTimeout
from services.ops.localstack import free_port
from services.settings import Settings
from services.writes.optimistic import OptimisticWriter
from tests.conftest import make_settings, running_stack
from tests.e2e.stub_llm import StubLLM
from tests.integration.helpers import fault_after_overlay, text_message

T = "tenant-a"
POLICY = CompactionConfig(protect_head=1, tail_token_budget=50, min_tail_messages=2)


async def _session(c: Container, sid: str, policy: CompactionConfig = POLICY) -> int:
    """A session with enough history to compact; the sequence of its last append."""
    await c.context.configure(T, sid, SessionConfig(compaction=policy))
    seq = 0
    for i in range(12):
        seq = (await c.commands.append(T, sid, text_message(f"m{i}", f"{sid} turn {i} " + "lorem ipsum " * 20))).seq
    return seq


async def _until(check: Callable[[], Awaitable[bool]], what: str, seconds: float = 30) -> None:
    deadline = time.monotonic() + seconds
    while not await check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.05)


async def _overlays(c: Container, sid: str) -> list[Overlay]:
    async with c.pool.connection() as conn:
        return await overlays(conn, T, sid)


async def _failures(c: Container, sid: str) -> list[tuple[int, str]]:
    async with c.pool.connection() as conn:
        cur = await conn.execute(
            "SELECT attempt, error FROM compaction_failures WHERE tenant = %s AND session_id = %s", (T, sid)
        )
        return [(int(a), str(e)) for a, e in await cur.fetchall()]


async def _work_stream(c: Container) -> StreamInfo:
    return await c.js.stream_info(c.layout.work_stream)


async def _settled(c: Container) -> bool:
    """Nothing left to deliver or to acknowledge: no delivery can happen any more."""
    info = await c.js.consumer_info(c.layout.work_stream, c.settings.compaction_queue)
    return info.num_pending == 0 and info.num_ack_pending == 0 and (await _work_stream(c)).state.messages == 0


@contextlib.asynccontextmanager
async def _subscriber(
    c: Container,
    summarizer: Summarizer,
    *,
    attempts: int = 3,
    still_due: StillDue | None = None,
    series_of: SeriesOf | None = None,
    pending_of: PendingOf | None = None,
    compact_timeout_s: float = 600,
) -> AsyncIterator[WorkStats]:
    """A work-queue subscriber on a NATS connection of its own, on the shared durable, with
    leases of its own (each on a connection of its own)."""
    s = c.settings
    service = CompactionService(
        c.pool, c.publisher, c.commands.optimistic, c.context, c.context.counter, summarizer, Leases(s.database_url)
    )
    broker = work_broker(s)
    stats = subscribe(
        broker,
        c.layout,
        service,
        durable=s.compaction_queue,
        concurrency=1,
        attempts=attempts,
        backoff_s=s.compaction_backoff_s,
        still_due=still_due,
        series_of=series_of,
        pending_of=pending_of,
        compact_timeout_s=compact_timeout_s,
    )
    await ensure_consumer(
        c.js, c.layout, consumer_config(c.layout, s.compaction_queue, attempts, s.compaction_backoff_s)
    )
    await broker.start()
    try:
        yield stats
    finally:
        await broker.stop()


async def _request(c: Container, sid: str, seq: int, leaf: str = "m11", estimate: int = 1000) -> None:
    assert await Requests(c.js, c.layout).publish([request(T, sid, leaf, estimate, seq)]) == 1


class _Failing:
    name = "failing"
    model: str | None = None

    def __init__(self) -> None:
        self.at: list[float] = []

    async def summarize(self, plan: Plan) -> str:
        self.at.append(time.monotonic())
        raise SummarizerError("the model is down")


class _Counting:
    def __init__(self, name: str, delay_s: float = 0.0) -> None:
        self.name = name
        self.model: str | None = None
        self.delay_s = delay_s
        self.sessions: list[str] = []
        self.entered = asyncio.Event()

    async def summarize(self, plan: Plan) -> str:
        self.entered.set()
        self.sessions.append(str(plan.middle[0]["parts"][0]["text"]).split(" turn ")[0])  # "<sid> turn <i> …"
        await asyncio.sleep(self.delay_s)
        return f"## Topic\nsummary by {self.name}"


async def test_a_decision_taken_twice_is_one_request_and_a_newer_one_replaces_it(
    nats_url: str, fresh_db: str, s3_endpoint: str
) -> None:
    settings = make_settings(nats_url, fresh_db, s3_endpoint=s3_endpoint)
    async with running_stack(settings, projector=False) as c:
        first = request(T, "s1", "m5", 700, 10)
        # two compactors (two Requests) decide the same: the stream stores it once
        assert await Requests(c.js, c.layout).publish([first]) == 1
        assert await Requests(c.js, c.layout).publish([first]) == 1
        info = await _work_stream(c)
        assert (info.state.messages, info.state.last_seq) == (1, 1)
        # the same Requests does not publish a decision again
        requests = Requests(c.js, c.layout)
        assert await requests.publish([first]) == 1
        assert await requests.publish([first]) == 0
        # a newer decision for the session replaces the one no compactor has taken yet
        newer = request(T, "s1", "m7", 900, 12)
        assert await requests.publish([newer]) == 1
        info = await _work_stream(c)
        assert info.state.messages == 1
        stored = await c.js.get_last_msg(c.layout.work_stream, c.layout.work_subject(KIND, T, "s1"))
        assert json.loads(stored.data or b"{}")["id"] == newer.id
        # another session's request waits beside it
        assert await requests.publish([newer, request(T, "s2", "m1", 800, 13)]) == 1
        assert (await _work_stream(c)).state.messages == 2


async def test_requests_the_work_queue_refuses_fail_within_a_bound(
    nats_url: str, fresh_db: str, s3_endpoint: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A full work queue answers each publish with an error, whose pipelined future nats-py never
    settles: the requests waited forever (no compaction requested again). They fail within the
    bound, and the requester tries again."""
    settings = make_settings(nats_url, fresh_db, s3_endpoint=s3_endpoint)
    async with running_stack(settings, projector=False) as c:
        config = (await _work_stream(c)).config
        config.max_bytes, config.discard = 1, DiscardPolicy.NEW  # full: every publish is refused
        await c.js.update_stream(config)
        monkeypatch.setattr(queue, "REQUESTS_ACK_TIMEOUT_S", 0.5)
        requests = Requests(c.js, c.layout)
        task = asyncio.create_task(requests.publish([request(T, "s1", "m5", 700, 10)]))
        await asyncio.wait({task}, timeout=20)  # the publish's own bound, not this one, ends it
        assert task.done(), "the publish still waits for the refused request's ack"
        assert isinstance(task.exception(), TimeoutError)
        assert requests.unsent([request(T, "s1", "m5", 700, 10)])  # not counted as sent: tried again
        assert (await _work_stream(c)).state.messages == 0


async def test_the_shared_consumer_follows_the_settings(nats_url: str, fresh_db: str, s3_endpoint: str) -> None:
    """Attempts and backoff are on the durable consumer itself, and a new release's values reach it."""
    settings = make_settings(nats_url, fresh_db, s3_endpoint=s3_endpoint)
    async with running_stack(settings, projector=False) as c:
        name = settings.compaction_queue
        await ensure_consumer(c.js, c.layout, consumer_config(c.layout, name, 4, (0.5, 1.0)))
        info = await c.js.consumer_info(c.layout.work_stream, name)
        assert (info.config.max_deliver, info.config.backoff, info.config.ack_wait) == (17, [0.5, 1.0], 0.5)
        await ensure_consumer(c.js, c.layout, consumer_config(c.layout, name, 2, (2.0, 3.0, 4.0)))
        info = await c.js.consumer_info(c.layout.work_stream, name)
        assert (info.config.max_deliver, info.config.backoff) == (9, [2.0, 3.0, 4.0])


async def test_a_compactor_stopped_while_its_work_queue_cannot_connect_stops(
    nats_url: str, fresh_db: str, s3_endpoint: str
) -> None:
    """A stop (SIGTERM) while the compactor starts and its work queue's nats-server is gone (killed
    as it started): the start ends and the compactor stops. It waited to connect for good, the
    stop unheeded (``chronicle compactor`` was killed after 20 s)."""
    settings = make_settings(nats_url, fresh_db, s3_endpoint=s3_endpoint)
    async with running_stack(settings, projector=False) as c:
        compactor = c.compactor()
        gone = settings.model_copy(update={"nats_url": f"nats://127.0.0.1:{free_port()}"})  # nothing listens
        compactor.broker = work_broker(gone)
        stop = asyncio.Event()
        running = asyncio.create_task(compactor.run(stop))
        await asyncio.sleep(0.5)  # connecting, again and again
        assert not running.done()
        stop.set()
        async with asyncio.timeout(5):
            await running


async def test_a_failing_summarizer_is_redelivered_with_backoff_each_attempt_recorded_once(
    nats_url: str, fresh_db: str, s3_endpoint: str
) -> None:
    settings = make_settings(nats_url, fresh_db, s3_endpoint=s3_endpoint, compaction_backoff_s=(0.6, 1.2))
    async with running_stack(settings) as c:
        failing, stats = await _failed_request(c, "failing", attempts=3)
        assert len(failing.at) == 3, failing.at
        gaps = [b - a for a, b in zip(failing.at, failing.at[1:], strict=False)]
        assert gaps[0] >= 0.55, gaps  # nak delays: the backoff of each attempt
        assert gaps[1] >= 1.15, gaps
        await c.commands.optimistic.catch_up(T, "failing")
        failures = await _failures(c, "failing")
        assert sorted(a for a, _ in failures) == [1, 2, 3], failures  # each attempt, once
        assert all("the model is down" in e for _, e in failures)
        assert (stats.failures, stats.gave_up, stats.compactions) == (3, 1, 0)
        assert await _overlays(c, "failing") == []


async def test_a_failure_not_recorded_in_the_lock_is_recorded_after_it_once(
    nats_url: str, fresh_db: str, s3_endpoint: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The last attempt's ``compaction.failed`` is recorded inside the session's lock; when that
    fails (the publish, say), it is recorded once after the lock, with the summarizer's error,
    and the request acked."""
    record = CompactionService.record_failure
    tries: list[str] = []

    async def flaky(self: CompactionService, *args: Any, **kwargs: Any) -> Any:
        tries.append(str(args[3]))
        if len(tries) == 1:
            raise RuntimeError("the publish failed")
        return await record(self, *args, **kwargs)

    monkeypatch.setattr(CompactionService, "record_failure", flaky)
    settings = make_settings(nats_url, fresh_db, s3_endpoint=s3_endpoint)
    async with running_stack(settings) as c:
        failing, stats = await _failed_request(c, "flaky", attempts=1)
        assert tries == ["the model is down", "the model is down"]
        assert (len(failing.at), stats.gave_up) == (1, 1)
        await c.commands.optimistic.catch_up(T, "flaky")
        failures = await _failures(c, "flaky")
        assert [a for a, _ in failures] == [1]
        assert "the model is down" in failures[0][1]


async def _failed_request(c: Container, sid: str, *, attempts: int) -> tuple[_Failing, WorkStats]:
    """One request of a new session ``sid`` through a subscriber whose summarizer always fails,
    until it is settled; the summarizer and the subscriber's stats."""
    seq = await _session(c, sid)
    failing = _Failing()
    async with _subscriber(c, failing, attempts=attempts) as stats:
        await _request(c, sid, seq)
        await _until(lambda: _settled_after(c, failing), "the request to be settled")
    return failing, stats


async def _settled_after(c: Container, failing: _Failing) -> bool:
    return bool(failing.at) and await _settled(c)


async def _types(c: Container, sid: str) -> list[str]:
    """The types of the session's events in the log, in order."""
    subject = c.layout.session_subject(T, sid)
    return [json.loads(e.data)["type"] async for e in eventlog.read(c.js, c.layout, subject)]


@pytest.mark.parametrize(
    ("error", "delay_s"),
    [(ProjectionTimeout("the read model did not catch up in time"), 0.0), (None, 3.5)],
    ids=["projector_behind", "past_the_timeout"],
)
async def test_a_fault_after_the_overlay_is_recorded_is_no_failed_attempt(
    nats_url: str,
    fresh_db: str,
    s3_endpoint: str,
    monkeypatch: pytest.MonkeyPatch,
    error: Exception | None,
    delay_s: float,
) -> None:
    """The overlay is in the log; then the wait for the projector to apply it times out (the
    projector behind, under load), or outlasts ``compact_timeout_s``. The compaction stands: no
    ``compaction.failed`` after the overlay (which ends a failure series), the request acked, and
    the session not summarised again."""
    published = fault_after_overlay(monkeypatch, OptimisticWriter, "catch_up", error, delay_s)
    settings = make_settings(nats_url, fresh_db, s3_endpoint=s3_endpoint)
    async with running_stack(settings) as c:
        seq = await _session(c, "after")
        counting = _Counting("after")
        async with _subscriber(c, counting, compact_timeout_s=3.0) as stats:
            await _request(c, "after", seq)
            await _until(lambda: _settled_after_summary(c, counting), "the request to be settled")
        assert counting.sessions == ["after"]  # summarised once
        assert len(published) == 1
        await c.commands.optimistic.catch_up(T, "after")
        types = await _types(c, "after")
        assert types.count("compaction.recorded") == 1, types
        assert "compaction.failed" not in types, types
        assert await _failures(c, "after") == []
        assert [o.seq for o in await _overlays(c, "after")] == published
        assert (stats.compactions, stats.failures, stats.nothing) == (1, 0, 0)


async def _settled_after_summary(c: Container, summarizer: _Counting) -> bool:
    return bool(summarizer.sessions) and await _settled(c)


async def test_a_malformed_request_is_dropped_not_redelivered(nats_url: str, fresh_db: str, s3_endpoint: str) -> None:
    settings = make_settings(nats_url, fresh_db, s3_endpoint=s3_endpoint)
    async with running_stack(settings, projector=False) as c:
        counting = _Counting("any")
        async with _subscriber(c, counting) as stats:
            await c.js.publish(c.layout.work_subject(KIND, T, "bad"), b'{"not": "a request"}')
            await _until(lambda: _settled(c), "the malformed request to be dropped")
        assert counting.sessions == []
        assert (stats.compactions, stats.failures, stats.nothing) == (0, 0, 0)


def _compactor(settings: Settings, name: str, llm: StubLLM, model: str) -> subprocess.Popen[bytes]:
    env = settings_env(settings)
    env.update(
        CHRONICLE_COMPACTOR_NAME=name,
        CHRONICLE_COMPACTOR_CONCURRENCY="1",
        CHRONICLE_SUMMARIZER="openai",
        CHRONICLE_SUMMARIZER_BASE_URL=llm.base_url,
        CHRONICLE_SUMMARIZER_MODEL=model,
        CHRONICLE_SUMMARIZER_ATTEMPTS="1",
    )
    return subprocess.Popen([sys.executable, "-m", "services.ops.cli", "compactor"], env=env, stderr=subprocess.DEVNULL)


def _stop(*procs: subprocess.Popen[bytes]) -> None:
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    for p in procs:
        p.wait(timeout=20)


def _asked_about(llm: StubLLM, sid: str) -> int:
    return sum(1 for body in llm.requests if f"{sid} turn" in json.dumps(body))


async def test_two_compactor_processes_share_the_work_without_duplicates(
    nats_url: str, fresh_db: str, s3_endpoint: str
) -> None:
    settings = make_settings(nats_url, fresh_db, s3_endpoint=s3_endpoint)
    sessions = [f"share-{i}" for i in range(6)]
    async with running_stack(settings) as c:
        for sid in sessions:
            await _session(c, sid, POLICY.model_copy(update={"compact_after": 300}))
        script = [StubLLM.slow("## Topic\nshared", 1.0) for _ in sessions]
        with StubLLM(script, fallback="## Topic\nshared") as llm:
            procs = [_compactor(settings, "cmp-a", llm, "stub-a"), _compactor(settings, "cmp-b", llm, "stub-b")]
            try:

                async def all_compacted() -> bool:
                    return all([await _overlays(c, sid) for sid in sessions])

                await _until(all_compacted, "every session to be compacted", 60)
                await _until(lambda: _settled(c), "the work queue to be empty")
            finally:
                _stop(*procs)
            found = {sid: await _overlays(c, sid) for sid in sessions}
            assert all(len(found[sid]) == 1 for sid in sessions), found
            assert {sid: _asked_about(llm, sid) for sid in sessions} == dict.fromkeys(sessions, 1)
            assert {o.model for sid in sessions for o in found[sid]} == {"stub-a", "stub-b"}


async def test_a_killed_compactors_request_is_redelivered_to_the_other(
    nats_url: str, fresh_db: str, s3_endpoint: str
) -> None:
    settings = make_settings(nats_url, fresh_db, s3_endpoint=s3_endpoint)
    async with running_stack(settings) as c:
        await _session(c, "victim", POLICY.model_copy(update={"compact_after": 300}))
        with StubLLM([StubLLM.slow("## Topic\nnever", 60.0)], fallback="## Topic\nunused") as llm:
            killed = _compactor(settings, "cmp-killed", llm, "stub-killed")
            try:
                await _until(lambda: _asked(llm), "the first compactor to ask its summarizer")
            finally:
                killed.send_signal(signal.SIGKILL)
                killed.wait()
            assert await _overlays(c, "victim") == []
            other = _Counting("the-other")
            async with _subscriber(c, other) as stats:
                await _until(lambda: _settled(c), "the request to be redelivered and settled")
            assert other.sessions == ["victim"]
            assert stats.compactions == 1
            (overlay,) = await _overlays(c, "victim")
            assert overlay.summarizer == "the-other"


async def _asked(llm: StubLLM) -> bool:
    return bool(llm.requests)


class _Committed:
    """What ``chronicle compactor`` weighs a delivery against (services/bootstrap.py): the committed
    compaction state; the sessions whose pending request was asked for, in order."""

    def __init__(self, c: Container, *, fails: int = 0, attempts: int = 3) -> None:
        self._c = c
        self._fails = fails  # reads of the pending request that fail first (the database gone)
        self._attempts = attempts
        self.asked: list[tuple[str, str]] = []

    async def still_due(self, req: CompactionRequested) -> bool:
        async with self._c.pool.connection() as conn:
            return await state.still_due(conn, self._c.settings.projector_name, req.tenant, req.session, req.seq)

    async def series_of(self, req: CompactionRequested) -> Series:
        async with self._c.pool.connection() as conn:
            return await state.series(conn, self._c.settings.projector_name, req.tenant, req.session)

    async def pending_of(self, tenant: str, session: str) -> CompactionRequested | None:
        self.asked.append((tenant, session))
        if len(self.asked) <= self._fails:
            raise ConnectionError("the database is gone")
        async with self._c.pool.connection() as conn:
            found = await state.pending(conn, self._c.settings.projector_name, tenant, session, attempts=self._attempts)
        return None if found is None else request(tenant, session, found.leaf, found.estimate, found.seq)

    def subscriber(self, summarizer: Summarizer) -> contextlib.AbstractAsyncContextManager[WorkStats]:
        return _subscriber(
            self._c,
            summarizer,
            attempts=self._attempts,
            still_due=self.still_due,
            series_of=self.series_of,
            pending_of=self.pending_of,
        )


def _ack(c: Container, seq: int) -> bytes:
    """A JetStream publish ack of the log, as JetStream sends it to a publish's reply subject."""
    return json.dumps({"stream": c.layout.stream, "seq": seq}).encode()


async def _pending(c: Container, sid: str) -> bytes | None:
    """The message waiting on the session's work subject (None: none)."""
    try:
        stored = await c.js.get_last_msg(c.layout.work_stream, c.layout.work_subject(KIND, T, sid))
    except NotFoundError:
        return None
    return stored.data


async def _replace_request(c: Container, sid: str, data: bytes) -> None:
    """Once the projector has requested the session's compaction at its last event (a request
    for an earlier one is replaced by the next), replace the request by ``data``."""
    last = await c.publisher.last_subject_seq(T, sid)

    async def requested() -> bool:
        pending = await _pending(c, sid)
        return pending is not None and json.loads(pending).get("seq") == last

    await _until(requested, "the projector to request the session's compaction")
    await c.js.publish(c.layout.work_subject(KIND, T, sid), data)
    assert await _pending(c, sid) == data  # the request is gone: replaced


async def _recorded(c: Container, sid: str) -> list[CompactionRecorded]:
    """The ``compaction.recorded`` events in the session's log."""
    found = []
    async for stored in eventlog.read(c.js, c.layout, c.layout.session_subject(T, sid)):
        event = admit(stored.data, stored.subject, c.layout, c.keys)
        if isinstance(event, CompactionRecorded):
            found.append(event)
    return found


async def test_a_reflected_ack_replacing_a_pending_request_still_gets_its_session_compacted(
    nats_url: str, fresh_db: str, s3_endpoint: str
) -> None:
    """The work stream keeps one message per session subject: anything published there replaces
    the session's pending request (a publish ack that a tenant had JetStream send there, as the
    server, does: tests/integration/test_foreign_duplicates.py), and the projector does not ask
    again for a decision it published. Not being a request, it makes the compactor read the
    session's request back from the committed state, and work on it."""
    settings = make_settings(nats_url, fresh_db, s3_endpoint=s3_endpoint)
    async with running_stack(settings) as c:
        seq = await _session(c, "replaced", POLICY.model_copy(update={"compact_after": 300}))
        await _replace_request(c, "replaced", _ack(c, seq))
        assert (await _work_stream(c)).state.messages == 1
        committed = _Committed(c)
        counting = _Counting("reread")
        async with committed.subscriber(counting) as stats:
            await _until(lambda: _settled_with(c, stats), "the session to be compacted")
        assert committed.asked == [(T, "replaced")]  # one read of the state
        assert (stats.malformed, stats.dropped, stats.compactions, stats.failures) == (1, 0, 1, 0)
        assert counting.sessions == ["replaced"]
        (recorded,) = await _recorded(c, "replaced")
        assert recorded.summarizer == "reread"
        (overlay,) = await _overlays(c, "replaced")
        assert overlay.overlay_id == recorded.overlay_id


async def _settled_with(c: Container, stats: WorkStats) -> bool:
    return stats.compactions + stats.nothing + stats.dropped > 0 and await _settled(c)


async def test_garbage_on_a_session_not_due_costs_one_state_read_and_is_acked(
    nats_url: str, fresh_db: str, s3_endpoint: str
) -> None:
    """A session under its threshold, and one nobody configured for compaction: one read each,
    nothing summarised, nothing recorded, nothing left in the queue."""
    settings = make_settings(nats_url, fresh_db, s3_endpoint=s3_endpoint)
    async with running_stack(settings) as c:
        seq = await _session(c, "under")  # no compact_after: not tracked, never due
        await c.context.configure(
            T, "calm", SessionConfig(compaction=POLICY.model_copy(update={"compact_after": 10**6}))
        )
        await c.commands.optimistic.catch_up(T, "calm")
        committed = _Committed(c)
        counting = _Counting("unused")
        async with committed.subscriber(counting) as stats:
            for sid in ("under", "calm"):
                await c.js.publish(c.layout.work_subject(KIND, T, sid), _ack(c, seq))
            await _until(lambda: _nothing_after(c, stats, 2), "both to be looked at")
        assert sorted(committed.asked) == [(T, "calm"), (T, "under")]
        assert (stats.malformed, stats.dropped, stats.nothing, stats.compactions) == (2, 0, 2, 0)
        assert counting.sessions == []
        assert await _recorded(c, "under") == []
        assert await _recorded(c, "calm") == []


async def _nothing_after(c: Container, stats: WorkStats, n: int) -> bool:
    return stats.nothing == n and await _settled(c)


async def test_a_request_of_another_session_weighs_its_subjects_session(
    nats_url: str, fresh_db: str, s3_endpoint: str
) -> None:
    """The subject names the session: a request stored under another session's subject (only the
    operator publishes requests; this one is made up) is no request of that session, and the
    session it names in its body is not compacted through it."""
    settings = make_settings(nats_url, fresh_db, s3_endpoint=s3_endpoint)
    async with running_stack(settings, projector=False) as c:
        committed = _Committed(c)
        counting = _Counting("unused")
        async with committed.subscriber(counting) as stats:
            foreign = request(T, "named", "m11", 1000, 1)
            await c.js.publish(c.layout.work_subject(KIND, T, "subject"), foreign.to_json())
            await _until(lambda: _nothing_after(c, stats, 1), "the request to be looked at")
        assert committed.asked == [(T, "subject")]
        assert (stats.malformed, stats.compactions) == (1, 0)
        assert counting.sessions == []


async def test_garbage_whose_state_cannot_be_read_is_looked_at_again(
    nats_url: str, fresh_db: str, s3_endpoint: str
) -> None:
    """Reading the state fails (the database gone): the message is put off, not dropped, and the
    session is compacted once the state answers."""
    settings = make_settings(nats_url, fresh_db, s3_endpoint=s3_endpoint, compaction_backoff_s=(0.3, 0.6))
    async with running_stack(settings) as c:
        seq = await _session(c, "later", POLICY.model_copy(update={"compact_after": 300}))
        await _replace_request(c, "later", _ack(c, seq))
        committed = _Committed(c, fails=1)
        async with committed.subscriber(_Counting("later")) as stats:
            await _until(lambda: _settled_with(c, stats), "the session to be compacted")
        assert committed.asked == [(T, "later"), (T, "later")]
        assert (stats.malformed, stats.compactions) == (2, 1)  # each delivery is looked at
        assert len(await _recorded(c, "later")) == 1


async def test_garbage_on_a_subject_that_names_no_session_is_dropped_without_asking(
    nats_url: str, fresh_db: str, s3_endpoint: str, caplog: pytest.LogCaptureFixture
) -> None:
    settings = make_settings(nats_url, fresh_db, s3_endpoint=s3_endpoint)
    async with running_stack(settings, projector=False) as c:
        prefix = f"{c.layout.work_prefix}.{KIND}"
        subjects = [
            f"{prefix}.{T}",  # no session
            f"{prefix}.{T}.s.extra",
            f"{prefix}.{T}.=",  # the tenant scope
            f"{prefix}.~@@.s",  # no token of an id
            f"{prefix}.~YSBi.s",  # "a b": no tenant id
        ]
        committed = _Committed(c)
        counting = _Counting("unused")
        with caplog.at_level(logging.ERROR, logger="chronicle.compactor"):
            async with committed.subscriber(counting) as stats:
                for subject in subjects:
                    await c.js.publish(subject, _ack(c, 7))
                await _until(lambda: _dropped_after(c, stats, len(subjects)), "the garbage to be dropped")
        assert committed.asked == []
        assert (stats.malformed, stats.nothing, stats.compactions, stats.failures) == (len(subjects), 0, 0, 0)
        assert counting.sessions == []
        logged = [r.getMessage() for r in caplog.records if "names no session" in r.getMessage()]
        assert sorted(s for s in subjects if any(f" on {s}:" in m for m in logged)) == sorted(subjects)


async def _dropped_after(c: Container, stats: WorkStats, n: int) -> bool:
    return stats.dropped == n and await _settled(c)


class _FailsOnce:
    """Fails its first summary, then summarises."""

    name = "fails-once"
    model: str | None = None

    def __init__(self) -> None:
        self.calls = 0

    async def summarize(self, plan: Plan) -> str:
        self.calls += 1
        if self.calls == 1:
            raise SummarizerError("the model is down, once")
        return "## Topic\nsummary"


async def test_garbage_during_a_failure_series_continues_the_series(
    nats_url: str, fresh_db: str, s3_endpoint: str
) -> None:
    """The first attempt fails (``compaction.failed`` holds the session from being due) and the
    request is naked for its backoff; meanwhile garbage replaces it on the session's work subject.
    Read back from the state, the series' request is still pending: the garbage waits out the
    backoff and runs the second attempt (it was acked as "nothing due", and the series was dead
    until the session grew)."""
    settings = make_settings(nats_url, fresh_db, s3_endpoint=s3_endpoint, compaction_backoff_s=(4.0, 4.0))
    async with running_stack(settings) as c:
        seq = await _session(c, "series", POLICY.model_copy(update={"compact_after": 300}))
        committed = _Committed(c)
        summarizer = _FailsOnce()
        async with committed.subscriber(summarizer) as stats:

            async def failed_once() -> bool:
                return len(await _failures(c, "series")) == 1

            await _until(failed_once, "the first attempt to fail")
            assert await _pending(c, "series") is not None  # the request, naked for its backoff
            await c.js.publish(c.layout.work_subject(KIND, T, "series"), _ack(c, seq))
            assert await _pending(c, "series") == _ack(c, seq)  # it replaced the request

            async def compacted() -> bool:
                return stats.compactions == 1 and await _settled(c)

            await _until(compacted, "the series' second attempt", 20)
        assert summarizer.calls == 2
        assert [a for a, _ in await _failures(c, "series")] == [1]
        assert len(await _overlays(c, "series")) == 1
        assert (stats.malformed, stats.dropped, stats.failures, stats.gave_up) == (
            len(committed.asked),
            0,
            1,
            0,
        )
        assert committed.asked[0] == (T, "series")


class _Empty(_Counting):
    """Summarises to nothing: the attempt records ``compaction.skipped``."""

    async def summarize(self, plan: Plan) -> str:
        await super().summarize(plan)
        return ""


@pytest.mark.parametrize(
    ("late", "summarizer"),
    [(CompactionRecorded, _Counting), (CompactionSkipped, _Empty)],
    ids=["overlay", "skip"],
)
async def test_an_ack_arriving_after_the_compact_timeout_is_no_failed_attempt(
    nats_url: str,
    fresh_db: str,
    s3_endpoint: str,
    monkeypatch: pytest.MonkeyPatch,
    late: type[CompactionRecorded | CompactionSkipped],
    summarizer: type[_Counting],
) -> None:
    """The server stores the overlay (or the skip), and its ack arrives after ``compact_timeout_s``
    (a slow server): the timeout bounds the summary, not the publishes, so what was stored stands,
    with no ``compaction.failed`` after it (which had the session summarised again)."""
    real = Publisher.publish
    stored: list[int] = []

    async def late_ack(self: Publisher, event: Any, *args: Any, **kwargs: Any) -> Any:
        out = await real(self, event, *args, **kwargs)
        if isinstance(event, late):
            stored.append(out.seq)
            await asyncio.sleep(2.5)  # stored; the ack comes past the compact timeout (and twice it)
        return out

    monkeypatch.setattr(Publisher, "publish", late_ack)
    settings = make_settings(nats_url, fresh_db, s3_endpoint=s3_endpoint, compaction_backoff_s=(0.5, 0.5))
    async with running_stack(settings) as c:
        seq = await _session(c, "late")
        counting = summarizer("late")
        async with _subscriber(c, counting, attempts=2, compact_timeout_s=1.0) as stats:
            await _request(c, "late", seq)
            await _until(lambda: _settled_after_summary(c, counting), "the request to be settled")
        assert counting.sessions == ["late"]  # summarised once
        assert len(stored) == 1
        await c.commands.optimistic.catch_up(T, "late")
        types = await _types(c, "late")
        assert types.count(late.model_fields["type"].default) == 1, types
        assert "compaction.failed" not in types, types
        assert await _failures(c, "late") == []
        recorded = late is CompactionRecorded
        assert (stats.compactions, stats.nothing, stats.failures) == (int(recorded), int(not recorded), 0)


async def test_the_read_model_behind_before_the_summary_puts_the_request_off(
    nats_url: str, fresh_db: str, s3_endpoint: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The attempt's first wait for the read model times out, before anything is summarised (the
    projector behind; as after a compaction recorded but not yet visible, whose lease the next
    request of the session then takes while the state still finds the session due). Nothing was
    tried: the request is put off for the first backoff delay, as a lease held elsewhere is (busy),
    with no ``compaction.failed`` (which began a series: another summary) and no attempt counted."""
    settings = make_settings(nats_url, fresh_db, s3_endpoint=s3_endpoint, compaction_backoff_s=(0.5, 1.0))
    async with running_stack(settings) as c:
        seq = await _session(c, "behind")
        catch_up = OptimisticWriter.catch_up
        behind: list[str] = []

        async def once_behind(self: OptimisticWriter, tenant: str, session: str) -> int:
            if not behind:
                behind.append(session)
                raise ProjectionTimeout("the read model has not applied the session yet")
            return await catch_up(self, tenant, session)

        monkeypatch.setattr(OptimisticWriter, "catch_up", once_behind)
        counting = _Counting("behind")
        async with _subscriber(c, counting, attempts=1) as stats:
            await _request(c, "behind", seq)

            async def settled() -> bool:
                return bool(behind) and await _settled(c)

            await _until(settled, "the request to be settled")
        assert behind == ["behind"]
        assert counting.sessions == ["behind"]
        await c.commands.optimistic.catch_up(T, "behind")
        assert await _failures(c, "behind") == []
        assert len(await _overlays(c, "behind")) == 1
        assert (stats.busy, stats.failures, stats.gave_up, stats.compactions) == (1, 0, 0, 1)


async def test_a_compaction_does_not_wait_for_the_turn_of_the_sessions_writes(
    nats_url: str, fresh_db: str, s3_endpoint: str
) -> None:
    """A write of this process holds the session's turn past the turns' timeout (a slow one, with
    appends queued behind it): the compaction's publishes take no turn (their own loop expects the
    session's last sequence), so the overlay is recorded rather than a ``contention`` failure
    recorded after the summary, and another summary."""
    settings = make_settings(nats_url, fresh_db, s3_endpoint=s3_endpoint)
    async with running_stack(settings) as c:
        seq = await _session(c, "turn")
        turns = c.commands.optimistic.turns
        turns.timeout_s = 0.2
        held = await turns.take((T, "turn"))
        try:
            counting = _Counting("turn")
            async with _subscriber(c, counting, attempts=1) as stats:
                await _request(c, "turn", seq)
                await _until(lambda: _settled_after_summary(c, counting), "the request to be settled")
        finally:
            turns.give_back((T, "turn"), held)
        assert counting.sessions == ["turn"]
        await c.commands.optimistic.catch_up(T, "turn")
        assert await _failures(c, "turn") == []
        assert len(await _overlays(c, "turn")) == 1
        assert (stats.compactions, stats.failures) == (1, 0)
