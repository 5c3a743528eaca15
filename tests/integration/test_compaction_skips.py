"""A compaction the work queue asked for that records nothing (here: the offline summary of short
messages would not shrink the context) records ``compaction.skipped``, and the session is not
asked again on every append while it stays over ``compact_after``: one summary for many appends,
also across a restart of the projector and the compactor, and a new attempt once the session has
grown past the skipped estimate by a tenth of ``compact_after``. Real NATS, Postgres, projector
(its requester) and compactor (its work-queue subscriber)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest

from events.catalog import CompactionFailed, CompactionSkipped
from events.context import CompactionConfig, SessionConfig
from events.publisher import Published
from projections.overlays import Overlay, overlays
from services.bootstrap import Container, open_container
from services.compaction.estimate import skip_margin
from services.compaction.ranges import Plan, message_tokens
from services.compaction.requester import Requester
from services.compaction.service import CompactionService, Series
from services.compaction.state import series
from services.compaction.summarizers import OfflineSummarizer, OpenAISummarizer, SummarizerError
from services.errors import ProjectionTimeout
from services.settings import Settings
from services.writes.optimistic import OptimisticWriter
from tests.conftest import make_settings
from tests.e2e.stub_llm import StubLLM
from tests.integration.helpers import assert_rebuild_equals_live, text_message

T = "tenant-a"
# a wide tail: what is left between head and tail stays a few short messages, whose offline
# summary is longer than they are
POLICY = CompactionConfig(compact_after=300, protect_head=1, tail_token_budget=260, min_tail_messages=2)


class _Recording:
    """The offline summarizer, counting its calls (each would be a billed LLM call)."""

    name = "offline"
    model: str | None = None

    def __init__(self) -> None:
        self.calls = 0
        self._inner = OfflineSummarizer()

    async def summarize(self, plan: Plan) -> str:
        self.calls += 1
        return await self._inner.summarize(plan)


async def _until(check: Callable[[], Awaitable[bool]], what: str, seconds: float = 30) -> None:
    deadline = time.monotonic() + seconds
    while not await check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.05)


@contextlib.asynccontextmanager
async def _workers(c: Container, sid: str) -> AsyncIterator[Callable[[int], Awaitable[None]]]:
    """A projector (with its requester) and a compactor; yields ``settle(seq)``: every event up to
    ``seq`` applied, every request it made due published, and the work queue drained."""
    stop = asyncio.Event()
    runner = c.projector()
    requester = next(getattr(side, "__self__", None) for side in runner.sidecars)
    assert isinstance(requester, Requester)
    compactor = c.compactor()
    tasks = [asyncio.create_task(runner.run(stop)), asyncio.create_task(compactor.run(stop))]

    async def settle(seq: int) -> None:
        await _until(lambda: c.waiter.session_applied(T, sid, seq), f"sequence {seq} applied")

        async def quiet() -> bool:
            return requester.settled() and await compactor.idle()

        await _until(quiet, "the requests published and the work queue drained")

    try:
        yield settle
    finally:
        stop.set()
        await asyncio.wait_for(asyncio.gather(*tasks), timeout=20)


class _Appender:
    """Short messages (``ok <n>``: their offline summary is longer than they are), one at a time."""

    def __init__(self, c: Container, sid: str) -> None:
        self.c, self.sid, self.n = c, sid, 0

    async def __call__(self) -> tuple[int, int]:
        """Append one; (its seq, its tokens)."""
        body: dict[str, Any] = text_message(f"m{self.n}", f"ok {self.n}", "user" if self.n % 2 == 0 else "assistant")
        self.n += 1
        seq = (await self.c.commands.append(T, self.sid, body)).seq
        return seq, message_tokens(body, self.c.context.counter.count)

    async def just_over(self, threshold: int) -> int:
        """Append until the session is just over ``threshold`` (one request); the last seq."""
        total, seq = 0, 0
        while total <= threshold:
            seq, tokens = await self()
            total += tokens
        return seq


class _Down:
    """A summarizer that always fails (the LLM down or refusing), counting its calls."""

    name = "down"
    model: str | None = None

    def __init__(self) -> None:
        self.calls = 0

    async def summarize(self, plan: Plan) -> str:
        self.calls += 1
        raise SummarizerError("HTTP 503: upstream unavailable")


async def _requests_stored(c: Container) -> int:
    """How many ``compaction.requested`` the work stream ever stored (acked ones included)."""
    return int((await c.js.stream_info(c.layout.work_stream)).state.last_seq)


async def _skips(c: Container, sid: str) -> list[tuple[int, str]]:
    async with c.pool.connection() as conn:
        cur = await conn.execute(
            "SELECT estimate, reason FROM compaction_skips WHERE tenant = %s AND session_id = %s ORDER BY seq",
            (T, sid),
        )
        return [(int(e), str(r)) for e, r in await cur.fetchall()]


async def _failures(c: Container, sid: str) -> int:
    async with c.pool.connection() as conn:
        cur = await conn.execute(
            "SELECT count(*) FROM compaction_failures WHERE tenant = %s AND session_id = %s", (T, sid)
        )
        row = await cur.fetchone()
    assert row is not None
    return int(row[0])


async def _held_at(c: Container, sid: str) -> int | None:
    """The estimate a skip or a failure holds the session at (None: nothing holds it)."""
    async with c.pool.connection() as conn:
        cur = await conn.execute(
            "SELECT skipped_estimate FROM compactor_sessions WHERE worker = %s AND tenant = %s AND session_id = %s",
            (c.settings.projector_name, T, sid),
        )
        row = await cur.fetchone()
    assert row is not None
    return None if row[0] is None else int(row[0])


async def _estimate(c: Container, sid: str) -> int:
    async with c.pool.connection() as conn:
        cur = await conn.execute(
            "SELECT estimate + prompt_tokens FROM compactor_sessions WHERE worker = %s AND tenant = %s "
            "AND session_id = %s",
            (c.settings.projector_name, T, sid),
        )
        row = await cur.fetchone()
    assert row is not None
    return int(row[0])


@contextlib.asynccontextmanager
async def _stack(settings: Settings, sid: str) -> AsyncIterator[tuple[Container, _Recording, _Appender]]:
    """A container whose compactions count their summaries, and ``sid`` configured with POLICY."""
    async with open_container(settings) as c:
        recording = _Recording()
        c.compaction.summarizer = recording
        await c.context.configure(T, sid, SessionConfig(compaction=POLICY))
        yield c, recording, _Appender(c, sid)


async def test_a_skipped_compaction_is_tried_again_only_after_enough_growth(
    nats_url: str, fresh_db: str, s3_endpoint: str
) -> None:
    settings = make_settings(nats_url, fresh_db, s3_endpoint=s3_endpoint)
    sid = "skip-grow"
    assert POLICY.compact_after is not None
    margin = skip_margin(POLICY.compact_after)
    async with _stack(settings, sid) as (c, recording, append):
        async with _workers(c, sid) as settle:
            await settle(await append.just_over(POLICY.compact_after))
            ((skipped, reason),) = await _skips(c, sid)
            assert reason.startswith("the summary would not shrink the context"), reason
            assert recording.calls == 1
            requested = await _requests_stored(c)
            # appends over the threshold, within the margin: no request, no summary; room is left
            # for one more after the restart below
            appended = 0
            while True:
                seq, tokens = await append()
                await settle(seq)
                appended += 1
                assert await _estimate(c, sid) > POLICY.compact_after
                if await _estimate(c, sid) + 2 * (tokens + 1) > skipped + margin:
                    break
            assert appended >= 2, "the margin should hold several short messages"
            assert (recording.calls, await _requests_stored(c)) == (1, requested)

        async with _workers(c, sid) as settle:  # a restart of both: the skip still holds (it is in the state)
            seq, _ = await append()
            await settle(seq)
            assert await _estimate(c, sid) <= skipped + margin
            assert (recording.calls, await _requests_stored(c), len(await _skips(c, sid))) == (1, requested, 1)
            # grown past the skipped estimate by the margin: a new attempt, exactly one
            while await _estimate(c, sid) <= skipped + margin:
                seq, _ = await append()
                await settle(seq)
            assert recording.calls == 2
            assert await _requests_stored(c) == requested + 1
        await assert_rebuild_equals_live(c, fresh_db, settings.projector_name)


async def test_new_compaction_settings_make_a_skipped_session_due_again(
    nats_url: str, fresh_db: str, s3_endpoint: str
) -> None:
    """The skip holds under the settings it was tried with (configuring them again changes
    nothing); other settings are worth a try, on the next append (a request of the same leaf and
    estimate is the decision already taken)."""
    settings = make_settings(nats_url, fresh_db, s3_endpoint=s3_endpoint)
    sid = "skip-config"
    assert POLICY.compact_after is not None
    async with _stack(settings, sid) as (c, recording, append), _workers(c, sid) as settle:
        await settle(await append.just_over(POLICY.compact_after))
        assert (recording.calls, len(await _skips(c, sid))) == (1, 1)
        await c.context.configure(T, sid, SessionConfig(compaction=POLICY))
        seq, _ = await append()
        await settle(seq)
        assert recording.calls == 1  # the same settings again: the skip holds
        wider = POLICY.model_copy(update={"tail_token_budget": 250})
        await c.context.configure(T, sid, SessionConfig(compaction=wider))
        seq, _ = await append()
        await settle(seq)
        assert (recording.calls, len(await _skips(c, sid))) == (2, 2)


async def test_a_failed_compaction_is_tried_again_only_after_enough_growth(
    nats_url: str, fresh_db: str, s3_endpoint: str
) -> None:
    """A summarizer that always fails: the request's attempts are used up and ``compaction.failed``
    recorded once; the appends after it, over the threshold and within the margin, request
    nothing and call no summarizer; grown past the failed estimate by the margin, one more
    request (and its attempts)."""
    settings = make_settings(nats_url, fresh_db, s3_endpoint=s3_endpoint)
    sid = "fail-grow"
    attempts = settings.compaction_attempts
    assert POLICY.compact_after is not None
    margin = skip_margin(POLICY.compact_after)
    async with _stack(settings, sid) as (c, _, append):
        down = _Down()
        c.compaction.summarizer = down
        async with _workers(c, sid) as settle:
            await settle(await append.just_over(POLICY.compact_after))
            assert (down.calls, await _failures(c, sid)) == (attempts, attempts)  # each attempt recorded
            held = await _held_at(c, sid)
            assert held is not None
            assert held > POLICY.compact_after
            requested = await _requests_stored(c)
            appended = 0
            while True:
                seq, _ = await append()
                await settle(seq)
                if await _estimate(c, sid) > held + margin:
                    break
                appended += 1
                now = (down.calls, await _requests_stored(c), await _failures(c, sid))
                assert now == (attempts, requested, attempts)
            assert appended >= 2, "the margin should hold several short messages"
            assert (down.calls, await _requests_stored(c), await _failures(c, sid)) == (
                2 * attempts,
                requested + 1,
                2 * attempts,
            )
        await assert_rebuild_equals_live(c, fresh_db, settings.projector_name)


class _Outage:
    """The OpenAI-compatible summarizer (its own 3 attempts) against an LLM that answers every
    call with HTTP 500 and a long error body; its first call waits for :attr:`release`, so that
    appends arrive while the first attempt of a request is still running."""

    name = "openai-compatible"
    model: str | None = None

    def __init__(self, llm: StubLLM) -> None:
        self.inner = OpenAISummarizer(base_url=llm.base_url, model="stub", attempts=3, backoff_s=0.01)
        self.entered = asyncio.Event()
        self.release = asyncio.Event()

    async def summarize(self, plan: Plan) -> str:
        self.entered.set()
        await self.release.wait()
        return await self.inner.summarize(plan)


class _Back:
    """The summarizer working again: a summary much shorter than what it replaces."""

    name = "back"
    model: str | None = None

    def __init__(self) -> None:
        self.calls = 0

    async def summarize(self, plan: Plan) -> str:
        self.calls += 1
        return "## Topic\nok"


async def test_an_outage_costs_one_series_of_attempts_however_many_appends_and_requests(
    nats_url: str, fresh_db: str, s3_endpoint: str
) -> None:
    """The summarizer down (HTTP 500), ``compaction_attempts`` 2, ``compact_after`` 300: ten
    appends while the first attempt runs (each a newer request replacing the one being worked on)
    and more while the series waits for its next attempt (past the margin: a newer request
    again) cost one request's attempts, 2 x 3 HTTP calls, and two recorded failures. When the
    summarizer works again and the session grows past the margin, it is compacted."""
    settings = make_settings(
        nats_url, fresh_db, s3_endpoint=s3_endpoint, compaction_attempts=2, compaction_backoff_s=(2.0, 2.0)
    )
    sid = "outage"
    attempts = settings.compaction_attempts
    assert POLICY.compact_after is not None
    margin = skip_margin(POLICY.compact_after)
    calls_per_attempt = 3
    with StubLLM([StubLLM.fail(500) for _ in range(100)]) as llm:
        async with _stack(settings, sid) as (c, _, append):
            down = _Outage(llm)
            c.compaction.summarizer = down
            async with _workers(c, sid) as settle:
                first = await append.just_over(POLICY.compact_after)
                await asyncio.wait_for(down.entered.wait(), 30)  # attempt 1 of the first request runs
                before = await _requests_stored(c)
                for _ in range(10):
                    seq, _ = await append()
                await _until(lambda: c.waiter.session_applied(T, sid, seq), "the burst applied")
                assert first < seq
                down.release.set()
                await _until(lambda: _failure_count(c, sid, 1), "attempt 1 recorded")
                held = await _held_at(c, sid)
                assert held is not None
                grown = await _estimate(c, sid)
                while await _estimate(c, sid) <= max(held, grown) + margin:  # while the series waits: a new request
                    seq, _ = await append()
                    await c.waiter.session_applied(T, sid, seq)
                await settle(seq)
                assert await _requests_stored(c) > before + 1, "newer requests should have replaced the first"
                assert len(llm.requests) == attempts * calls_per_attempt
                async with c.pool.connection() as conn:  # the series is over: its last attempt failed
                    assert (await series(conn, settings.projector_name, T, sid)).failed == attempts
                assert await _failures(c, sid) == attempts
                assert "scripted failure" in (await _failure_errors(c, sid))[0]

                c.compaction.summarizer = back = _Back()
                held = await _held_at(c, sid)
                assert held is not None
                while not await _overlays(c, sid):  # compacted once grown past the failed estimate by the margin
                    assert await _estimate(c, sid) <= held + margin
                    seq, _ = await append()
                    await settle(seq)
                assert back.calls == 1
                async with c.pool.connection() as conn:  # the overlay ended the series of attempts
                    assert await series(conn, settings.projector_name, T, sid) == Series()
            await assert_rebuild_equals_live(c, fresh_db, settings.projector_name)


async def _failure_count(c: Container, sid: str, n: int) -> bool:
    return await _failures(c, sid) >= n


async def _failure_errors(c: Container, sid: str) -> list[str]:
    async with c.pool.connection() as conn:
        cur = await conn.execute(
            "SELECT error FROM compaction_failures WHERE tenant = %s AND session_id = %s ORDER BY seq", (T, sid)
        )
        return [str(e) for (e,) in await cur.fetchall()]


async def _overlays(c: Container, sid: str) -> list[Overlay]:
    async with c.pool.connection() as conn:
        return await overlays(conn, T, sid)


async def test_a_projector_behind_after_a_recorded_skip_is_no_failed_attempt(
    nats_url: str, fresh_db: str, s3_endpoint: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """(The wait for the projector after ``compaction.skipped`` was recorded timed out, and the
    queue recorded ``compaction.failed`` after the skip and asked for another summary.)"""
    publish, catch_up = CompactionService._publish_unless_erased, OptimisticWriter.catch_up
    skipped: list[int] = []
    faulted: list[int] = []

    async def recording(self: CompactionService, event: CompactionSkipped | CompactionFailed) -> Published | None:
        done = await publish(self, event)
        if done is not None and isinstance(event, CompactionSkipped):
            skipped.append(done.seq)
        return done

    async def behind(self: OptimisticWriter, *args: Any, **kwargs: Any) -> Any:
        if len(faulted) < len(skipped):  # the first wait after the skip's publish
            faulted.append(skipped[-1])
            raise ProjectionTimeout("the read model did not catch up in time")
        return await catch_up(self, *args, **kwargs)

    monkeypatch.setattr(CompactionService, "_publish_unless_erased", recording)
    monkeypatch.setattr(OptimisticWriter, "catch_up", behind)
    settings = make_settings(nats_url, fresh_db, s3_endpoint=s3_endpoint)
    sid = "skip-behind"
    assert POLICY.compact_after is not None
    async with _stack(settings, sid) as (c, summaries, append), _workers(c, sid) as settle:
        await settle(await append.just_over(POLICY.compact_after))
        assert len(skipped) == 1
        assert faulted == skipped
        await settle(skipped[0])  # the skip applied: the wait for it was the one that failed

        async def one_skip() -> bool:
            return len(await _skips(c, sid)) == 1

        await _until(one_skip, "the skip applied")
        assert await _failures(c, sid) == 0
        assert summaries.calls == 1
