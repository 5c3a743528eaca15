"""Compaction on the real stack: overlays on read, manual and automatic compaction, failures."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncIterator, Awaitable, Callable

import httpx
import pytest

from events.catalog import CompactionRecorded
from events.context import CompactionConfig, SessionConfig
from events.omitted import OMITTED, ParentId
from projections.overlays import Overlay, overlays
from services.api.app import build_app
from services.bootstrap import Container
from services.compaction import service as service_module
from services.compaction import summarizers as summarizers_module
from services.compaction.ranges import Plan
from services.compaction.service import Outcome, compacted_view
from services.compaction.summarizers import SummarizerError
from services.context.rules import object_key
from services.errors import ProjectionTimeout, SummarizerFailed
from services.requests import writes
from services.writes.optimistic import OptimisticWriter
from tests.conftest import make_settings, running_stack
from tests.e2e.context_support import new_bucket
from tests.integration.helpers import fault_after_overlay, tenant_client, text_message

T = "tenant-a"


async def _append_chain(c: Container, sid: str, ids: list[str], parent: ParentId = OMITTED) -> int:
    seq = 0
    for i, mid in enumerate(ids):
        r = await c.commands.append(
            T, sid, text_message(mid, f"message {mid} " + "lorem ipsum " * 20), parent if i == 0 else OMITTED
        )
        seq = r.seq
    return seq


async def _overlay(c: Container, sid: str, first: str, last: str, text: str) -> int:
    ev = CompactionRecorded(
        tenant=T,
        session=sid,
        overlay_id=f"{first}-{last}-{text}",
        from_message_id=first,
        to_message_id=last,
        leaf_id=last,
        tokens_before=0,
        tokens_after=0,
        summarizer="test",
        model=None,
        summary=text,
    )
    return (await c.publisher.publish(ev)).seq


async def _view_ids(c: Container, sid: str, leaf: str | None = None) -> list[str]:
    await c.commands.optimistic.catch_up(T, sid)
    async with c.pool.connection() as conn:
        _, _, view = await compacted_view(conn, T, sid, leaf)
    return [v.message_id if isinstance(v, Overlay) else v.id for v in view]


async def test_overlays_apply_per_branch_and_supersede(stack: Container, new_id: Callable[[str], str]) -> None:
    sid = new_id("ov")
    await _append_chain(stack, sid, [f"m{i}" for i in range(6)])
    await _overlay(stack, sid, "m1", "m3", "S1")
    assert await _view_ids(stack, sid) == ["m0", "compaction_m1-m3-S1", "m4", "m5"]
    await _append_chain(stack, sid, [f"m{i}" for i in range(6, 15)])
    await _overlay(stack, sid, "m1", "m12", "S2")
    assert await _view_ids(stack, sid) == ["m0", "compaction_m1-m12-S2", "m13", "m14"]
    async with stack.pool.connection() as conn:
        assert len(await overlays(conn, T, sid)) == 2
    # sibling isolation
    sid2 = new_id("sib")
    await _append_chain(stack, sid2, ["m0"])
    await _append_chain(stack, sid2, ["a1", "a2", "a3", "a4"], "m0")
    await _append_chain(stack, sid2, ["b1", "b2", "b3"], "m0")
    await _overlay(stack, sid2, "m0", "a2", "A1")
    await _overlay(stack, sid2, "m0", "a3", "A2")
    await _overlay(stack, sid2, "m0", "b2", "B1")
    assert await _view_ids(stack, sid2, "a4") == ["compaction_m0-a3-A2", "a4"]
    assert await _view_ids(stack, sid2, "b3") == ["compaction_m0-b2-B1", "b3"]


async def test_manual_compaction_is_iterative_and_branch_local(stack: Container, new_id: Callable[[str], str]) -> None:
    sid = new_id("cmp")
    config = SessionConfig(compaction=CompactionConfig(protect_head=1, tail_token_budget=10, min_tail_messages=2))
    await stack.context.configure(T, sid, config)
    await _append_chain(stack, sid, [f"m{i}" for i in range(10)])
    first = await stack.compaction.compact(T, sid)
    assert first.overlay is not None
    assert (first.overlay.from_message_id, first.overlay.to_message_id) == ("m1", "m7")
    assert "## Topic" in first.overlay.summary
    assert await _view_ids(stack, sid) == ["m0", first.overlay.message_id, "m8", "m9"]
    await _append_chain(stack, sid, ["m10", "m11", "m12"])
    second = await stack.compaction.compact(T, sid)
    assert second.overlay is not None
    assert (second.overlay.from_message_id, second.overlay.to_message_id) == ("m1", "m10")
    assert await _view_ids(stack, sid) == ["m0", second.overlay.message_id, "m11", "m12"]
    assert second.overlay.tokens_after < second.overlay.tokens_before
    # a repeated compaction of the same state records nothing new
    again = await stack.compaction.compact(T, sid)
    assert again.overlay is None
    # compacted=false still has every original
    raw = await stack.commands.optimistic.catch_up(T, sid)
    assert raw > 0
    async with stack.pool.connection() as conn:
        _, rows, _ = await compacted_view(conn, T, sid, None, compacted=False)
    assert [r.id for r in rows] == [f"m{i}" for i in range(13)]
    short = new_id("short")
    await _append_chain(stack, short, ["x0", "x1"])
    outcome = await stack.compaction.compact(T, short)
    assert (outcome.overlay, outcome.reason) == (None, "too few messages")


async def test_a_manual_compaction_parses_counts_and_summarises_off_the_event_loop(
    stack: Container, new_id: Callable[[str], str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """(All of it ran on the event loop: in the API, 4 compactions of 5,000-message sessions held
    every tenant's requests 0.6-1.2 s, an outside trial found.) The branch's messages are parsed,
    their tokens counted and the offline summary written in worker threads, each message counted
    once; the loop only awaits them."""
    sid = new_id("loop")
    config = SessionConfig(compaction=CompactionConfig(protect_head=1, tail_token_budget=10, min_tail_messages=2))
    await stack.context.configure(T, sid, config)
    await _append_chain(stack, sid, [f"m{i}" for i in range(30)])
    await stack.commands.optimistic.catch_up(T, sid)
    ran: dict[str, set[int]] = {"parse": set(), "count": set(), "summary": set()}
    counted: list[str] = []

    def spying(kind: str, real: Callable[..., object]) -> Callable[..., object]:
        def spy(*args: object) -> object:
            ran[kind].add(threading.get_ident())
            return real(*args)

        return spy

    real_tokens = stack.compaction.tokens
    monkeypatch.setattr(service_module, "as_message", spying("parse", service_module.as_message))
    monkeypatch.setattr(summarizers_module, "_clip", spying("summary", summarizers_module._clip))

    def tokens(msg: dict[str, object]) -> int:
        ran["count"].add(threading.get_ident())
        counted.append(str(msg.get("id")))
        return real_tokens(msg)

    monkeypatch.setattr(stack.compaction, "tokens", tokens)
    outcome = await stack.compaction.compact(T, sid)
    assert outcome.overlay is not None
    loop_thread = threading.get_ident()
    assert all(ran.values()), ran  # each kind of work was done
    assert loop_thread not in set().union(*ran.values()), ran
    assert sorted(counted) == sorted({*counted}), counted  # no message counted twice


class _Recording:
    """A summarizer that keeps every plan it is given."""

    name = "recording"
    model: str | None = None

    def __init__(self) -> None:
        self.plans: list[Plan] = []

    async def summarize(self, plan: Plan) -> str:
        self.plans.append(plan)
        return "## Topic\nmerged"


async def test_compacting_over_two_overlays_gives_the_summarizer_both(
    stack: Container, new_id: Callable[[str], str]
) -> None:
    sid = new_id("two")
    await stack.context.configure(
        T, sid, SessionConfig(compaction=CompactionConfig(protect_head=1, tail_token_budget=10, min_tail_messages=2))
    )
    await _append_chain(stack, sid, [f"m{i}" for i in range(17)])
    await _overlay(stack, sid, "m1", "m4", "S1")
    await _overlay(stack, sid, "m5", "m12", "S2")
    assert await _view_ids(stack, sid) == ["m0", "compaction_m1-m4-S1", "compaction_m5-m12-S2", *_ids(13, 17)]
    recording = _Recording()
    original, stack.compaction.summarizer = stack.compaction.summarizer, recording
    try:
        outcome = await stack.compaction.compact(T, sid)
    finally:
        stack.compaction.summarizer = original
    assert outcome.overlay is not None, outcome.reason
    (plan,) = recording.plans
    assert plan.previous_summary == "S1\n\nS2"  # both hidden summaries, in path order
    assert [m["id"] for m in plan.middle] == ["m13", "m14"]
    assert (outcome.overlay.from_message_id, outcome.overlay.to_message_id) == ("m1", "m14")
    assert await _view_ids(stack, sid) == ["m0", outcome.overlay.message_id, "m15", "m16"]


def _ids(start: int, stop: int) -> list[str]:
    return [f"m{i}" for i in range(start, stop)]


class _Flaky:
    name = "flaky"
    model: str | None = "m"

    def __init__(self) -> None:
        self.calls = 0

    async def summarize(self, plan: Plan) -> str:
        self.calls += 1
        if self.calls == 1:
            raise SummarizerError("boom")
        return "## Topic\nrecovered"


@pytest.mark.timing  # "nothing more happened" is checked after a fixed wait (no signal marks it)
async def test_auto_compaction_with_failure_and_retry(nats_url: str, fresh_db: str, s3_endpoint: str) -> None:
    settings = make_settings(nats_url, fresh_db, s3_endpoint=s3_endpoint)
    async with running_stack(settings) as c:
        flaky = _Flaky()
        c.compaction.summarizer = flaky
        compactor = c.compactor()
        stop = asyncio.Event()
        task = asyncio.create_task(compactor.run(stop))
        try:
            sid = "auto"
            cfg = CompactionConfig(compact_after=400, protect_head=1, tail_token_budget=50, min_tail_messages=2)
            await c.context.configure(T, sid, SessionConfig(compaction=cfg))
            seq = await _append_chain(c, sid, ["m0", "m1"])
            # below the threshold: nothing happens
            await asyncio.sleep(0.5)
            assert flaky.calls == 0
            await _append_chain(c, sid, [f"m{i}" for i in range(2, 12)])
            for _ in range(100):
                async with c.pool.connection() as conn:
                    found = await overlays(conn, T, sid)
                if found:
                    break
                await asyncio.sleep(0.1)
            assert found, "auto-compaction did not record an overlay"
            assert flaky.calls >= 2
            async with c.pool.connection() as conn:
                # each failed attempt is recorded (the session's series of attempts goes on from it);
                # the redelivery that got through records the overlay
                cur = await conn.execute("SELECT attempt FROM compaction_failures WHERE session_id = 'auto'")
                assert await cur.fetchall() == [(1,)]
            assert found[0].seq > seq  # recorded after the appends that stayed below the threshold
        finally:
            stop.set()
            await asyncio.wait_for(task, 15)


@pytest.mark.timing  # "nothing more happened" is checked after a fixed wait (no signal marks it)
async def test_two_compactors_record_each_overlay_once(nats_url: str, fresh_db: str, s3_endpoint: str) -> None:
    settings = make_settings(nats_url, fresh_db, s3_endpoint=s3_endpoint)
    async with running_stack(settings) as c:
        cfg = CompactionConfig(compact_after=300, protect_head=1, tail_token_budget=50, min_tail_messages=2)
        await c.context.configure(T, "twice", SessionConfig(compaction=cfg))
        await _append_chain(c, "twice", [f"m{i}" for i in range(12)])
        stop = asyncio.Event()
        workers = []
        for name in ("compactor-a", "compactor-b"):
            c.settings = c.settings.model_copy(update={"compactor_name": name})
            workers.append(asyncio.create_task(c.compactor().run(stop)))
        try:
            for _ in range(100):
                async with c.pool.connection() as conn:
                    found = await overlays(conn, T, "twice")
                if found:
                    break
                await asyncio.sleep(0.1)
            await asyncio.sleep(1.5)
            async with c.pool.connection() as conn:
                found = await overlays(conn, T, "twice")
            assert len(found) == 1, [(o.from_message_id, o.to_message_id) for o in found]
        finally:
            stop.set()
            for w in workers:
                await asyncio.wait_for(w, 15)


async def test_fork_copies_the_branch_and_its_overlay(stack: Container, new_id: Callable[[str], str]) -> None:
    from services.writes.commands import fork

    sid = new_id("src")
    await _append_chain(stack, sid, [f"m{i}" for i in range(6)])
    await _overlay(stack, sid, "m1", "m3", "S1")
    await _append_chain(stack, sid, ["b5"], "m4")
    forked = await fork(stack.commands, stack.eraser, T, sid, "m5", None, "copy")
    assert forked.messages == 6
    assert await _view_ids(stack, forked.id) == ["m0", await _fork_overlay_id(stack, forked.id), "m4", "m5"]
    assert await _view_ids(stack, sid, "m5") == ["m0", "compaction_m1-m3-S1", "m4", "m5"]


async def _fork_overlay_id(c: Container, sid: str) -> str:
    async with c.pool.connection() as conn:
        (only,) = await overlays(conn, T, sid)
    return only.message_id


class _Blocking:
    """A summarizer that blocks until released, to kill the compactor mid-compaction."""

    name = "offline"
    model: str | None = None

    def __init__(self) -> None:
        self.entered = asyncio.Event()
        self.release = asyncio.Event()

    async def summarize(self, plan: Plan) -> str:
        self.entered.set()
        await self.release.wait()
        return "## Topic\nsummary"


@pytest.mark.timing  # "nothing more happened" is checked after a fixed wait (no signal marks it)
async def test_compactor_killed_mid_compaction_records_once_after_restart(
    nats_url: str, fresh_db: str, s3_endpoint: str
) -> None:
    settings = make_settings(nats_url, fresh_db, s3_endpoint=s3_endpoint)
    async with running_stack(settings) as c:
        cfg = CompactionConfig(compact_after=300, protect_head=1, tail_token_budget=50, min_tail_messages=2)
        await c.context.configure(T, "killed", SessionConfig(compaction=cfg))
        await _append_chain(c, "killed", [f"m{i}" for i in range(12)])
        blocking = _Blocking()
        c.compaction.summarizer = blocking
        stop = asyncio.Event()
        task = asyncio.create_task(c.compactor().run(stop))
        await asyncio.wait_for(blocking.entered.wait(), 20)
        task.cancel()  # the process dies while the summarizer runs
        with contextlib.suppress(asyncio.CancelledError):
            await task
        async with c.pool.connection() as conn:
            assert await overlays(conn, T, "killed") == []
        blocking.release.set()
        stop = asyncio.Event()
        task = asyncio.create_task(c.compactor().run(stop))
        try:
            for _ in range(100):
                async with c.pool.connection() as conn:
                    found = await overlays(conn, T, "killed")
                if found:
                    break
                await asyncio.sleep(0.1)
            await asyncio.sleep(1.0)
            async with c.pool.connection() as conn:
                assert len(await overlays(conn, T, "killed")) == 1
        finally:
            stop.set()
            await asyncio.wait_for(task, 15)


async def _compact_around(stack: Container, sid: str, during: Callable[[], Awaitable[object]]) -> Outcome:
    """Compact ``sid`` with a summarizer held open while ``during`` runs, then release it."""
    cfg = CompactionConfig(protect_head=1, tail_token_budget=50, min_tail_messages=2)
    await stack.context.configure(T, sid, SessionConfig(compaction=cfg))
    await _append_chain(stack, sid, [f"m{i}" for i in range(10)])
    blocking = _Blocking()
    original = stack.compaction.summarizer
    stack.compaction.summarizer = blocking
    try:
        task = asyncio.create_task(stack.compaction.compact(T, sid))
        await asyncio.wait_for(blocking.entered.wait(), 10)
        await during()
        blocking.release.set()
        return await asyncio.wait_for(task, 20)
    finally:
        stack.compaction.summarizer = original


async def test_a_clear_during_the_summary_records_nothing(stack: Container, new_id: Callable[[str], str]) -> None:
    sid = new_id("race")

    async def append_then_clear() -> None:
        await _append_chain(stack, sid, ["late"])  # harmless: an append after the decision
        await stack.commands.clear(T, sid)  # not harmless: the covered messages are gone

    outcome = await _compact_around(stack, sid, append_then_clear)
    assert outcome.overlay is None
    assert outcome.reason == "the session changed while summarising; nothing recorded"
    async with stack.pool.connection() as conn:
        assert await overlays(conn, T, sid) == []


async def test_appends_during_the_summary_do_not_stop_it(stack: Container, new_id: Callable[[str], str]) -> None:
    sid = new_id("busy")
    outcome = await _compact_around(stack, sid, lambda: _append_chain(stack, sid, ["late1", "late2"]))
    assert outcome.overlay is not None
    assert await _view_ids(stack, sid) == ["m0", outcome.overlay.message_id, "m8", "m9", "late1", "late2"]


class _Slow:
    """A summarizer that takes a while and records how many summaries run at once, per session too."""

    name = "slow"
    model: str | None = "m"

    def __init__(self) -> None:
        self.in_flight: set[str] = set()
        self.peak = 0
        self.overlapping_same_session = False

    async def summarize(self, plan: Plan) -> str:
        session = str(plan.middle[0]["id"]).split("-m")[0] if plan.middle else ""  # ids are "<session>-m<i>"
        if session in self.in_flight:
            self.overlapping_same_session = True
        self.in_flight.add(session)
        self.peak = max(self.peak, len(self.in_flight))
        try:
            await asyncio.sleep(0.3)
            return "## Topic\nslow"
        finally:
            self.in_flight.discard(session)


async def test_the_compactor_summarises_several_sessions_at_once(
    nats_url: str, fresh_db: str, s3_endpoint: str
) -> None:
    settings = make_settings(nats_url, fresh_db, s3_endpoint=s3_endpoint, compactor_concurrency=3)
    async with running_stack(settings) as c:
        slow = _Slow()
        c.compaction.summarizer = slow
        stop = asyncio.Event()
        task = asyncio.create_task(c.compactor().run(stop))
        try:
            cfg = CompactionConfig(compact_after=400, protect_head=1, tail_token_budget=50, min_tail_messages=2)
            sessions = [f"busy-{i}" for i in range(6)]
            for sid in sessions:
                await c.context.configure(T, sid, SessionConfig(compaction=cfg))
            for sid in sessions:
                await _append_chain(c, sid, [f"{sid}-m{i}" for i in range(12)])
            for _ in range(150):
                async with c.pool.connection() as conn:
                    done = [sid for sid in sessions if await overlays(conn, T, sid)]
                if len(done) == len(sessions):
                    break
                await asyncio.sleep(0.1)
            assert sorted(done) == sessions
            assert 2 <= slow.peak <= 3  # several at once, never more than the setting
            assert not slow.overlapping_same_session
        finally:
            stop.set()
            await asyncio.wait_for(task, 15)


async def test_partition_workers_keep_and_request_their_own_sessions(
    nats_url: str, fresh_db: str, s3_endpoint: str
) -> None:
    """Each partition worker keeps the compaction state of its partitions' sessions in its own
    transactions and requests their compaction; one compactor (no consumer of the log) takes both."""
    from events.subjects import partition_of
    from services.compaction.state import CompactorState
    from tests.integration.test_quarantine import projectors

    settings = make_settings(nats_url, fresh_db, s3_endpoint=s3_endpoint, partitions=2)
    sids: dict[int, str] = {}
    i = 0
    while len(sids) < 2:
        sids.setdefault(partition_of(T, f"part-{i}", 2), f"part-{i}")
        i += 1
    async with running_stack(settings, projector=False) as c, projectors(c, settings, [[0], [1]]) as runners:
        stop = asyncio.Event()
        task = asyncio.create_task(c.compactor().run(stop))
        try:
            cfg = CompactionConfig(compact_after=300, protect_head=1, tail_token_budget=50, min_tail_messages=2)
            for sid in sids.values():
                await c.context.configure(T, sid, SessionConfig(compaction=cfg))
                await _append_chain(c, sid, [f"m{k}" for k in range(12)])
            for _ in range(200):
                async with c.pool.connection() as conn:
                    found = {p: await overlays(conn, T, sid) for p, sid in sids.items()}
                if all(found.values()):
                    break
                await asyncio.sleep(0.1)
            assert all(found.values()), "a partition's session was not compacted"
            for part, runner in enumerate(runners):
                (state,) = [p for p in runner.projections if isinstance(p, CompactorState)]
                assert (T, sids[part]) in state.tracked
                assert all(partition_of(t, s, 2) == part for t, s in state.candidates)
            async with c.pool.connection() as conn:
                cur = await conn.execute(
                    "SELECT session_id FROM compactor_sessions WHERE worker = %s ORDER BY session_id",
                    (settings.projector_name,),
                )
                assert [r[0] for r in await cur.fetchall()] == sorted(sids.values())
        finally:
            stop.set()
            await asyncio.wait_for(task, 15)


class _LongError:
    """A summarizer whose failure carries an upstream LLM's long error body."""

    name = "long-error"
    model: str | None = None

    async def summarize(self, plan: Plan) -> str:
        raise SummarizerError("HTTP 500: " + "upstream says " * 500)


async def test_a_manual_compaction_whose_summarizer_fails_is_summarizer_failed_with_a_capped_detail(
    nats_url: str, fresh_db: str, s3_endpoint: str
) -> None:
    """``POST …/compact`` with the summarizer failing: 502 ``summarizer_failed`` (the SDK's
    ``SummarizerFailed``) whose detail is cut at 200 characters, and the failure recorded."""
    settings = make_settings(nats_url, fresh_db, s3_endpoint=s3_endpoint)
    async with running_stack(settings) as c:
        c.compaction.summarizer = _LongError()
        cfg = CompactionConfig(protect_head=1, tail_token_budget=50, min_tail_messages=2)
        await c.context.configure(T, "manual-fail", SessionConfig(compaction=cfg))
        await _append_chain(c, "manual-fail", [f"m{i}" for i in range(12)])
        with pytest.raises(SummarizerFailed) as failed:
            await writes.compact(c, T, "manual-fail", None)
        assert (failed.value.status, failed.value.code) == (502, "summarizer_failed")
        assert failed.value.detail.startswith("HTTP 500: upstream says")
        assert len(failed.value.detail) == 200
        await c.commands.optimistic.catch_up(T, "manual-fail")
        async with c.pool.connection() as conn:
            cur = await conn.execute("SELECT error FROM compaction_failures WHERE session_id = 'manual-fail'")
            ((error,),) = await cur.fetchall()
        assert "upstream says" in error


@pytest.fixture
async def http(stack: Container) -> AsyncIterator[httpx.AsyncClient]:
    async with tenant_client(build_app(stack.settings, stack), T) as client:
        yield client


CMP = {"protect_head": 1, "tail_token_budget": 50, "min_tail_messages": 2}


async def test_a_manual_compaction_recorded_but_not_yet_applied_answers_so(
    stack: Container, http: httpx.AsyncClient, new_id: Callable[[str], str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The overlay is in the log, then the wait for the projector to apply it times out (the
    projector behind, under load): ``200 {compacted: false, reason: "recorded; not yet visible",
    seq}`` with the overlay's sequence, which a ``min_seq`` read of ``…/compactions`` waits for.
    No failure is recorded, and a client has no error to retry (another summary)."""
    published = fault_after_overlay(
        monkeypatch, OptimisticWriter, "catch_up", ProjectionTimeout("the read model did not catch up in time")
    )
    sid = new_id("late")
    assert (await http.put(f"/v1/sessions/{sid}/config", json={"compaction": CMP})).status_code == 200
    await _append_chain(stack, sid, [f"m{i}" for i in range(12)])
    r = await http.post(f"/v1/sessions/{sid}/compact", json={})
    assert r.status_code == 200, r.text
    assert r.json() == {"compacted": False, "reason": "recorded; not yet visible", "seq": published[0]}
    r = await http.get(f"/v1/sessions/{sid}/compactions", params={"min_seq": published[0]})
    assert [o["seq"] for o in r.json()["compactions"]] == published
    r = await http.get(f"/v1/sessions/{sid}/compaction-failures", params={"min_seq": published[0]})
    assert r.json() == {"failures": [], "next_cursor": None}


async def test_a_compaction_whose_prompt_cannot_be_rendered_again_stands(
    stack: Container, http: httpx.AsyncClient, new_id: Callable[[str], str]
) -> None:
    """A read-only block's object is no longer UTF-8 text when the overlay is recorded: the
    re-render after it is refused (``source_not_text``), the compaction stands and is answered,
    and the prompt in force stays (as after a clear)."""
    sid = new_id("not-text")
    bucket = new_bucket(stack.settings)  # a document put makes no bucket
    storage = stack.context._storage()
    await storage.put(bucket, object_key(T, "soul.md"), "You are kind.", None)
    block = {"label": "soul", "kind": "readonly", "source": {"bucket": bucket, "key": "soul.md"}}
    r = await http.put(f"/v1/sessions/{sid}/config", json={"blocks": [block], "compaction": CMP})
    assert r.status_code == 200, r.text
    await _append_chain(stack, sid, [f"m{i}" for i in range(12)])
    frozen = (await http.get(f"/v1/sessions/{sid}/system-prompt")).json()
    await storage.put_bytes(bucket, object_key(T, "soul.md"), b"\xff\xfe policy \xc3\x28")
    r = await http.post(f"/v1/sessions/{sid}/compact", json={})
    assert r.status_code == 200, r.text
    assert r.json()["compacted"] is True, r.json()
    assert r.json()["overlay"]["seq"] == r.json()["seq"]
    assert (await http.get(f"/v1/sessions/{sid}/system-prompt")).json() == frozen
    r = await http.get(f"/v1/sessions/{sid}/compaction-failures")
    assert r.json() == {"failures": [], "next_cursor": None}


@contextlib.asynccontextmanager
async def _turn_held(c: Container, sid: str, timeout_s: float = 0.2) -> AsyncIterator[None]:
    """Another write of this process (a slow one, in a task of its own) holds the session's turn
    for the block, and a write waiting for it gives up after ``timeout_s``."""
    turns = c.commands.optimistic.turns
    taken, done = asyncio.Event(), asyncio.Event()

    async def hold() -> None:
        held = await turns.take((T, sid))
        taken.set()
        try:
            await done.wait()
        finally:
            turns.give_back((T, sid), held)

    before, turns.timeout_s = turns.timeout_s, timeout_s
    task = asyncio.create_task(hold())
    try:
        await taken.wait()
        yield
    finally:
        done.set()
        await task
        turns.timeout_s = before


async def test_a_manual_compaction_does_not_wait_for_the_turn_of_the_sessions_writes(
    stack: Container, http: httpx.AsyncClient, new_id: Callable[[str], str]
) -> None:
    """A write of the API process holds the session's turn past the turns' timeout (a slow one,
    appends queued behind it): the overlay's publish takes no turn (its own loop expects the
    session's last sequence), so the summary is recorded and answered, not ``503 contention``
    after a summary (which a client retries: another summary)."""
    sid = new_id("turn")
    assert (await http.put(f"/v1/sessions/{sid}/config", json={"compaction": CMP})).status_code == 200
    await _append_chain(stack, sid, [f"m{i}" for i in range(12)])
    async with _turn_held(stack, sid):
        r = await http.post(f"/v1/sessions/{sid}/compact", json={})
    assert r.status_code == 200, r.text
    assert r.json()["compacted"] is True, r.json()


class _Says:
    """A summarizer that answers ``text``, whatever it is asked."""

    name = "says"
    model: str | None = None

    def __init__(self, text: str) -> None:
        self.text = text

    async def summarize(self, plan: Plan) -> str:
        return self.text


@pytest.mark.parametrize(("summary", "recorded"), [("\ufeff \u3000\n", False), ("\x1c", True)])
async def test_a_summary_is_blank_as_javascripts_trim_says(
    stack: Container, new_id: Callable[[str], str], monkeypatch: pytest.MonkeyPatch, summary: str, recorded: bool
) -> None:
    """The reference records nothing for a summary that ``summary.trim()`` leaves empty (§4.3): a
    byte-order mark is blank there (Python's ``strip()`` kept it, and the mark was recorded as the
    summary), U+001C is not (``strip()`` removed it, and nothing was recorded)."""
    sid = new_id("blank")
    monkeypatch.setattr(stack.compaction, "summarizer", _Says(summary))
    await stack.context.configure(T, sid, SessionConfig(compaction=CompactionConfig(**CMP)))
    await _append_chain(stack, sid, [f"m{i}" for i in range(12)])
    outcome = await stack.compaction.compact(T, sid)
    assert (outcome.overlay is not None) is recorded
    if not recorded:
        assert outcome.reason == "the summarizer returned an empty summary"
