"""The compactor's incremental estimate: exact, threshold strictly greater, prompt counted."""

from __future__ import annotations

from collections.abc import Callable

from events.catalog import (
    CompactionFailed,
    CompactionRecorded,
    CompactionSkipped,
    MessageAppended,
    MessagesDeleted,
    MessageUpdated,
    PromptRendered,
    SessionConfigured,
)
from events.context import CompactionConfig, SessionConfig
from events.envelope import Event
from events.messages import body_hash
from projections.runner import apply_batch
from services.bootstrap import Container
from services.compaction.ranges import message_tokens
from services.compaction.state import CompactorState

T = "tenant-a"


def _msg(sid: str, mid: str, parent: str | None, text: str) -> MessageAppended:
    body = {"id": mid, "role": "user", "parts": [{"type": "text", "text": text}]}
    return MessageAppended(
        tenant=T, session=sid, message_id=mid, parent_id=parent, role="user", body_sha256=body_hash(body), message=body
    )


class _Feeder:
    """Applies events to ``state`` in one transaction per call, at sequences from ``seq`` up."""

    def __init__(self, stack: Container, state: CompactorState, seq: int) -> None:
        self.stack, self.state, self.seq = stack, state, seq

    async def __call__(self, *evs: Event) -> None:
        items: list[tuple[int, Event]] = []
        for ev in evs:
            self.seq += 1
            items.append((self.seq, ev))
        async with self.stack.pool.connection() as conn, conn.transaction():
            await apply_batch(conn, self.state.worker, [self.state], items, notify=False)


async def test_estimate_threshold_and_prompt(stack: Container, new_id: Callable[[str], str]) -> None:
    sid = new_id("est")
    count = stack.context.counter.count
    state = CompactorState(new_id("w"), count, None, adopt=False)
    events = [_msg(sid, f"m{i}", f"m{i - 1}" if i else None, f"hello number {i} " * 5) for i in range(5)]
    total = sum(message_tokens(e.message or {}, count) for e in events)
    feed = _Feeder(stack, state, 10_000_000)

    at = SessionConfig(compaction=CompactionConfig(compact_after=total))
    await feed(SessionConfigured(tenant=T, session=sid, config=at), *events)
    assert (T, sid) not in state.candidates  # equal to the threshold: not over it
    await feed(PromptRendered(tenant=T, session=sid, text="x", tokens=1, version_no=1, reason="freeze"))
    assert state.candidates[(T, sid)].estimate == total + 1  # the frozen prompt counts
    # a branch from m2 re-sums the stored counts for the new path
    await feed(_msg(sid, "b3", "m2", "short"))
    expected = sum(message_tokens(e.message or {}, count) for e in events[:3]) + message_tokens(
        {"parts": [{"type": "text", "text": "short"}]}, count
    )
    assert state.candidates.get((T, sid)) is None or state.candidates[(T, sid)].estimate == expected + 1
    async with stack.pool.connection() as conn:
        cur = await conn.execute(
            "SELECT estimate, leaf_id FROM compactor_sessions WHERE worker = %s AND session_id = %s",
            (state.worker, sid),
        )
        assert await cur.fetchone() == (expected, "b3")
    # an overlay on the branch replaces the covered messages by the summary
    await feed(
        CompactionRecorded(
            tenant=T,
            session=sid,
            overlay_id="o1",
            from_message_id="m0",
            to_message_id="m2",
            leaf_id="b3",
            tokens_before=0,
            tokens_after=0,
            summarizer="t",
            model=None,
            summary="sum",
        )
    )
    async with stack.pool.connection() as conn:
        cur = await conn.execute(
            "SELECT estimate FROM compactor_sessions WHERE worker = %s AND session_id = %s", (state.worker, sid)
        )
        row = await cur.fetchone()
    assert row is not None
    assert row[0] == 4 + count("sum") + message_tokens({"parts": [{"type": "text", "text": "short"}]}, count)


async def test_any_event_that_puts_the_branch_over_makes_it_due_not_only_an_append(
    stack: Container, new_id: Callable[[str], str]
) -> None:
    """The reference checks ``compactAfter`` only when a new message is appended (§4.1); here an
    update that grows a message, or a config that lowers ``compact_after``, makes the session due
    at once (README, "Where we differ"), as a frozen prompt does (above)."""
    count = stack.context.counter.count
    state = CompactorState(new_id("w"), count, None, adopt=False)
    feed = _Feeder(stack, state, 20_000_000)
    grown, lowered = new_id("grown"), new_id("lowered")
    texts = [f"hello number {i} " * 5 for i in range(3)]
    total = sum(message_tokens({"parts": [{"type": "text", "text": t}]}, count) for t in texts)
    for sid in (grown, lowered):
        events = [_msg(sid, f"m{i}", f"m{i - 1}" if i else None, t) for i, t in enumerate(texts)]
        await feed(SessionConfigured(tenant=T, session=sid, config=at_most(total)), *events)
        assert (T, sid) not in state.candidates  # equal to the threshold: not over it

    longer = {"id": "m1", "role": "user", "parts": [{"type": "text", "text": "a much longer text " * 20}]}
    update = MessageUpdated(
        tenant=T, session=grown, message_id="m1", role="user", body_sha256=body_hash(longer), message=longer
    )
    await feed(update)
    assert state.candidates[(T, grown)].estimate > total

    await feed(SessionConfigured(tenant=T, session=lowered, config=at_most(total - 1)))
    assert state.candidates[(T, lowered)].estimate == total


def at_most(tokens: int) -> SessionConfig:
    return SessionConfig(compaction=CompactionConfig(compact_after=tokens))


async def _compactor_rows(stack: Container, worker: str, sid: str) -> int:
    async with stack.pool.connection() as conn:
        cur = await conn.execute(
            "SELECT (SELECT count(*) FROM compactor_messages WHERE worker = %(w)s AND session_id = %(s)s)"
            " + (SELECT count(*) FROM compactor_sessions WHERE worker = %(w)s AND session_id = %(s)s)",
            {"w": worker, "s": sid},
        )
        row = await cur.fetchone()
    assert row is not None
    return int(row[0])


async def test_session_without_compaction_stores_nothing(stack: Container, new_id: Callable[[str], str]) -> None:
    sid = new_id("plain")
    tokenised: list[str] = []

    def count(text: str) -> int:
        tokenised.append(text)
        return len(text)

    state = CompactorState(new_id("w"), count, None, adopt=False)
    items = [(20_000_000 + i, _msg(sid, f"m{i}", f"m{i - 1}" if i else None, f"text {i}")) for i in range(5)]
    async with stack.pool.connection() as conn, conn.transaction():
        await apply_batch(conn, state.worker, [state], items, notify=False)
    assert tokenised == []
    assert await _compactor_rows(stack, state.worker, sid) == 0
    assert (T, sid) not in state.tracked


async def test_switching_compaction_on_backfills_from_the_read_model(
    stack: Container, new_id: Callable[[str], str]
) -> None:
    """Messages appended before compaction was configured count as if tracked from the start."""
    sid = new_id("late")
    await stack.commands.create_session(T, sid, "", None, {})
    texts = [f"hello number {i} " * 5 for i in range(4)]
    seq = 0
    for i, text in enumerate(texts):
        body = {"id": f"m{i}", "role": "user", "parts": [{"type": "text", "text": text}]}
        seq = (await stack.commands.append(T, sid, body)).seq
    await stack.waiter.wait_session(T, sid, seq)
    count = stack.context.counter.count
    state = CompactorState(new_id("w"), count, None, adopt=False)
    total = sum(message_tokens({"parts": [{"type": "text", "text": t}]}, count) for t in texts)
    configured = SessionConfigured(
        tenant=T, session=sid, config=SessionConfig(compaction=CompactionConfig(compact_after=total - 1))
    )
    config_seq = await stack.publisher.publish(configured)
    async with stack.pool.connection() as conn, conn.transaction():
        await apply_batch(conn, state.worker, [state], [(config_seq.seq, configured)], notify=False)
    assert (T, sid) in state.tracked
    assert state.candidates[(T, sid)].estimate == total
    async with stack.pool.connection() as conn:
        cur = await conn.execute(
            "SELECT leaf_id, estimate FROM compactor_sessions WHERE worker = %s AND session_id = %s",
            (state.worker, sid),
        )
        assert await cur.fetchone() == ("m3", total)
    # the appends the backfill already counted, delivered afterwards, count once
    late = _msg(sid, "m3", "m2", texts[3])
    async with stack.pool.connection() as conn, conn.transaction():
        await apply_batch(conn, state.worker, [state], [(config_seq.seq + 1, late)], notify=False)
    assert state.candidates[(T, sid)].estimate == total
    # switching it off drops the state
    off = SessionConfigured(tenant=T, session=sid, config=SessionConfig())
    async with stack.pool.connection() as conn, conn.transaction():
        await apply_batch(conn, state.worker, [state], [(config_seq.seq + 2, off)], notify=False)
    assert (T, sid) not in state.tracked
    assert (T, sid) not in state.candidates
    assert await _compactor_rows(stack, state.worker, sid) == 0


async def test_undecoded_events_are_wanted_from_a_configuration_until_tracked_is_read_again(
    stack: Container, new_id: Callable[[str], str]
) -> None:
    sid = new_id("raw")
    state = CompactorState(new_id("w"), stack.context.counter.count, None, adopt=False)
    async with stack.pool.connection() as conn:
        await state.load(conn)
    plain = _msg(sid, "m0", None, "hello").model_dump_json().encode()
    assert not state.wants_stored(T, sid, plain)
    configured = SessionConfigured(tenant=T, session=sid, config=SessionConfig())
    before = state.generation
    assert state.wants_stored(T, sid, configured.model_dump_json().encode())
    assert state.generation != before  # a batch prepared earlier is prepared again
    assert state.wants_stored(T, sid, plain)  # the configuration may track this session
    async with stack.pool.connection() as conn:
        await state.load(conn)
    assert not state.wants_stored(T, sid, plain)


async def test_switched_on_mid_batch_the_backfill_reads_the_batchs_own_rows(
    stack: Container, new_id: Callable[[str], str]
) -> None:
    """In the projector's transaction, after the read models: a configuration between a
    session's appends backfills from the rows this batch wrote (nothing to wait for), and the
    appends after it count once."""
    sid = new_id("same")
    count = stack.context.counter.count
    state = CompactorState(new_id("w"), count, None, adopt=False)
    configured, msgs, total = _chain_over_threshold(sid, 4, count)
    base = 30_000_000
    items = [(base + 1, msgs[0]), (base + 2, msgs[1]), (base + 3, configured), (base + 4, msgs[2]), (base + 5, msgs[3])]
    async with stack.pool.connection() as conn, conn.transaction():
        await apply_batch(conn, new_id("cp"), [*stack.projections(), state], items, notify=False)
    assert state.candidates[(T, sid)].estimate == total
    async with stack.pool.connection() as conn:
        cur = await conn.execute(
            "SELECT leaf_id, estimate, seq FROM compactor_sessions WHERE worker = %s AND session_id = %s",
            (state.worker, sid),
        )
        assert await cur.fetchone() == ("m3", total, base + 5)


async def test_still_due_is_read_from_the_committed_state(stack: Container, new_id: Callable[[str], str]) -> None:
    """A redelivered request stands while the committed state finds the session over its
    threshold; compacted (estimate below it) or switched off, it does not."""
    from services.compaction.state import still_due

    sid = new_id("due")
    count = stack.context.counter.count
    state = CompactorState(new_id("w"), count, None, adopt=False)
    text = "hello there " * 10
    tokens = message_tokens({"parts": [{"type": "text", "text": text}]}, count)
    on = SessionConfigured(
        tenant=T, session=sid, config=SessionConfig(compaction=CompactionConfig(compact_after=tokens))
    )
    items = [(40_000_001, on), (40_000_002, _msg(sid, "m0", None, text)), (40_000_003, _msg(sid, "m1", "m0", text))]
    async with stack.pool.connection() as conn, conn.transaction():
        await apply_batch(conn, state.worker, [state], items, notify=False)
    async with stack.pool.connection() as conn:
        assert await still_due(conn, state.worker, T, sid, 40_000_003)
        assert not await still_due(conn, state.worker, T, new_id("never"), 1)  # untracked: nothing due
    overlay = CompactionRecorded(
        tenant=T,
        session=sid,
        overlay_id="o1",
        from_message_id="m0",
        to_message_id="m1",
        leaf_id="m1",
        tokens_before=2 * tokens,
        tokens_after=1,
        summarizer="x",
        model=None,
        summary="s",
    )
    async with stack.pool.connection() as conn, conn.transaction():
        await apply_batch(conn, state.worker, [state], [(40_000_004, overlay)], notify=False)
    async with stack.pool.connection() as conn:
        assert not await still_due(conn, state.worker, T, sid, 40_000_003)  # compacted meanwhile
    off = SessionConfigured(tenant=T, session=sid, config=SessionConfig())
    async with stack.pool.connection() as conn, conn.transaction():
        await apply_batch(conn, state.worker, [state], [(40_000_005, off)], notify=False)
    async with stack.pool.connection() as conn:
        assert not await still_due(conn, state.worker, T, sid, 40_000_003)


async def test_configured_sessions_it_does_not_track_are_adopted_at_the_first_batch(
    stack: Container, new_id: Callable[[str], str]
) -> None:
    """A state started after a session's configuration (an upgrade from the compactor's own
    consumer of the log) backfills it from the read models at its first batch."""
    sid = new_id("adopt")
    count = stack.context.counter.count
    configured, msgs, total = _chain_over_threshold(sid, 3, count)
    base = 50_000_000
    items = [(base + 1, configured), *((base + 2 + i, m) for i, m in enumerate(msgs))]
    async with stack.pool.connection() as conn, conn.transaction():
        await apply_batch(conn, new_id("cp"), stack.projections(), items, notify=False)  # read models only
    mine = {(T, sid)}
    state = CompactorState(new_id("w"), count, None, lambda t, s: (t, s) in mine)
    unrelated = _msg(new_id("other"), "x0", None, "not tracked")
    async with stack.pool.connection() as conn, conn.transaction():
        await apply_batch(conn, new_id("cp"), [state], [(base + 10, unrelated)], notify=False)
    assert state.tracked >= mine
    assert state.candidates[(T, sid)].estimate == total
    assert state.candidates.keys() == mine  # only the sessions it owns


def _chain_over_threshold(
    sid: str, n: int, count: Callable[[str], int]
) -> tuple[SessionConfigured, list[MessageAppended], int]:
    """``n`` chained messages and a configuration whose ``compact_after`` they pass; their tokens."""
    texts = [f"hello number {i} " * 5 for i in range(n)]
    total = sum(message_tokens({"parts": [{"type": "text", "text": t}]}, count) for t in texts)
    configured = SessionConfigured(
        tenant=T, session=sid, config=SessionConfig(compaction=CompactionConfig(compact_after=total - 1))
    )
    return configured, [_msg(sid, f"m{i}", f"m{i - 1}" if i else None, t) for i, t in enumerate(texts)], total


class _Held:
    """A session of ``state`` (synthetic events, no adoption) whose messages are ``text``
    (``tokens`` each) under ``policy`` (``compact_after`` ten messages: a margin of one);
    :meth:`due_now` checks the committed state against the candidates."""

    text = "hello there " * 10

    def __init__(self, stack: Container, new_id: Callable[[str], str], name: str, seq: int) -> None:
        count = stack.context.counter.count
        self.stack, self.sid = stack, new_id(name)
        self.state = CompactorState(new_id("w"), count, None, adopt=False)
        self.tokens = message_tokens({"parts": [{"type": "text", "text": self.text}]}, count)
        self.policy = CompactionConfig(compact_after=10 * self.tokens)
        self.feed = _Feeder(stack, self.state, seq)

    async def due_now(self) -> bool:
        from services.compaction.state import still_due

        async with self.stack.pool.connection() as conn:
            committed = await still_due(conn, self.state.worker, T, self.sid, self.feed.seq)
        assert committed == ((T, self.sid) in self.state.candidates)
        return committed


async def test_a_skip_holds_under_its_settings_until_growth_an_overlay_or_a_fall_under(
    stack: Container, new_id: Callable[[str], str]
) -> None:
    """``compaction.skipped`` keeps an over-threshold session from being due (and a request of
    it from standing) until its estimate passes the skipped one by a tenth of ``compact_after``;
    applied twice, it is the same; under other settings than the session's, it is void; an
    overlay, or the estimate falling under the threshold, ends it."""
    from services.compaction.estimate import skip_margin

    held = _Held(stack, new_id, "skip", 50_000_000)
    sid, text, tokens, policy, feed, due_now = held.sid, held.text, held.tokens, held.policy, held.feed, held.due_now
    assert skip_margin(10 * tokens) == tokens
    n = 0

    leaf: str | None = None

    def grow(k: int) -> list[Event]:
        nonlocal n, leaf
        out: list[Event] = []
        for _ in range(k):
            out.append(_msg(sid, f"m{n}", leaf, text))
            leaf, n = f"m{n}", n + 1
        return out

    def skipped(estimate: int, cfg: CompactionConfig = policy) -> CompactionSkipped:
        return CompactionSkipped(tenant=T, session=sid, leaf_id=f"m{n - 1}", estimate=estimate, reason="r", config=cfg)

    await feed(SessionConfigured(tenant=T, session=sid, config=SessionConfig(compaction=policy)), *grow(11))
    assert await due_now()
    await feed(skipped(11 * tokens, policy.model_copy(update={"protect_head": 0})))
    assert await due_now()  # tried under other settings: void
    await feed(skipped(11 * tokens))
    await feed(skipped(11 * tokens))  # the same skip again: the same state
    assert not await due_now()
    await feed(*grow(1))  # 12 messages: within the margin of one
    assert not await due_now()
    await feed(*grow(1))  # 13: past it
    assert await due_now()
    await feed(skipped(13 * tokens))
    assert not await due_now()
    overlay = CompactionRecorded(
        tenant=T,
        session=sid,
        overlay_id="o1",
        from_message_id="m0",
        to_message_id="m0",
        leaf_id=f"m{n - 1}",
        tokens_before=0,
        tokens_after=0,
        summarizer="t",
        model=None,
        summary=text,
    )
    await feed(overlay)  # the view changed (and, the summary as long as the message, still over)
    assert await due_now()
    await feed(skipped(13 * tokens))
    assert not await due_now()
    await feed(MessagesDeleted(tenant=T, session=sid, message_ids=[f"m{n - 1}", f"m{n - 2}", f"m{n - 3}"]))
    leaf = f"m{n - 4}"
    assert not await due_now()  # under the threshold: the skip ends
    await feed(*grow(3))  # over it again, within the old skip's margin: a new attempt is fair
    assert await due_now()


async def test_a_failure_of_a_request_holds_like_a_skip_and_a_manual_one_holds_nothing(
    stack: Container, new_id: Callable[[str], str]
) -> None:
    """``compaction.failed`` with the request's estimate and settings keeps the session from being
    due until it grows past that estimate by the margin (under other settings it is void); one
    without them (a manual compaction's, or one stored before they were named) changes nothing."""
    held = _Held(stack, new_id, "fail", 60_000_000)
    sid, text, tokens, policy, feed, due_now = held.sid, held.text, held.tokens, held.policy, held.feed, held.due_now
    msgs = [_msg(sid, f"m{i}", f"m{i - 1}" if i else None, text) for i in range(13)]

    def failed(estimate: int | None, cfg: CompactionConfig | None = policy) -> CompactionFailed:
        return CompactionFailed(
            tenant=T, session=sid, leaf_id="m10", summarizer="s", error="e", attempt=4, estimate=estimate, config=cfg
        )

    await feed(SessionConfigured(tenant=T, session=sid, config=SessionConfig(compaction=policy)), *msgs[:11])
    assert await due_now()
    await feed(failed(None, None))  # a manual failure
    assert await due_now()
    await feed(failed(11 * tokens, policy.model_copy(update={"protect_head": 0})))
    assert await due_now()  # failed under other settings: void
    await feed(failed(11 * tokens))
    assert not await due_now()
    await feed(msgs[11])  # within the margin of one
    assert not await due_now()
    await feed(msgs[12])  # past it
    assert await due_now()


async def test_the_pending_request_read_back_is_the_one_the_projector_published(
    stack: Container, new_id: Callable[[str], str]
) -> None:
    """What the work queue reads back for a session whose request was replaced by garbage: the
    candidate the projector published (the same leaf and estimate, so the same request id), and
    nothing once a skip holds the session, or for a session not tracked."""
    from services.compaction.queue import request
    from services.compaction.state import pending

    sid = new_id("pending")
    count = stack.context.counter.count
    state = CompactorState(new_id("w"), count, None, adopt=False)
    configured, msgs, _ = _chain_over_threshold(sid, 4, count)
    feed = _Feeder(stack, state, 60_000_000)
    await feed(
        configured, *msgs, PromptRendered(tenant=T, session=sid, text="x", tokens=3, version_no=1, reason="freeze")
    )
    published = state.candidates[(T, sid)]
    async with stack.pool.connection() as conn:
        found = await pending(conn, state.worker, T, sid, attempts=3)
        assert found == published
        assert await pending(conn, state.worker, T, new_id("never"), attempts=3) is None
    assert found is not None
    as_requested = request(T, sid, published.leaf, published.estimate, published.seq)
    assert request(T, sid, found.leaf, found.estimate, found.seq).id == as_requested.id
    cfg = configured.config.compaction
    assert cfg is not None
    await feed(
        CompactionSkipped(tenant=T, session=sid, leaf_id=found.leaf, estimate=found.estimate, reason="r", config=cfg)
    )
    async with stack.pool.connection() as conn:
        assert await pending(conn, state.worker, T, sid, attempts=3) is None


async def test_a_failure_series_with_attempts_left_is_pending(stack: Container, new_id: Callable[[str], str]) -> None:
    """A failed attempt holds the session from being due (no new request), yet its series goes on:
    what the work queue reads back for garbage that replaced the series' request is that request
    (the queue then waits out the failure's backoff before the next attempt), while attempts are
    left; after the last, nothing."""
    from services.compaction.state import pending

    sid = new_id("series")
    count = stack.context.counter.count
    state = CompactorState(new_id("w"), count, None, adopt=False)
    configured, msgs, _ = _chain_over_threshold(sid, 4, count)
    feed = _Feeder(stack, state, 60_000_000)
    await feed(configured, *msgs)
    published = state.candidates[(T, sid)]
    cfg = configured.config.compaction
    assert cfg is not None

    def failed(attempt: int) -> CompactionFailed:
        return CompactionFailed(
            tenant=T,
            session=sid,
            leaf_id=published.leaf or "",
            summarizer="s",
            error="e",
            attempt=attempt,
            estimate=published.estimate,
            config=cfg,
        )

    for attempt in (1, 2):
        await feed(failed(attempt))
        assert (T, sid) not in state.candidates  # held: no new request
        async with stack.pool.connection() as conn:
            found = await pending(conn, state.worker, T, sid, attempts=3)
        assert found is not None, f"the series after attempt {attempt} of 3 is pending"
        assert (found.leaf, found.estimate) == (published.leaf, published.estimate)  # the same request id
    await feed(failed(3))
    async with stack.pool.connection() as conn:
        assert await pending(conn, state.worker, T, sid, attempts=3) is None  # the series is over
