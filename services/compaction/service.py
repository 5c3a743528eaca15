"""Compaction of one session now: the one code path behind ``POST …/compact`` and every request
the compaction work queue (:mod:`services.compaction.queue`) delivers.

One compaction of a session runs at a time across every process: callers hold the session's lease
(:mod:`services.compaction.lease`) around :meth:`CompactionService.compact`. An overlay's event id
is derived from (tenant, session, first id, last id), so a redelivery after a crash, or a holder
that lost its lease mid-summary, records it once; it is published only if nothing that
invalidates it reached the session while the summary was written. Appends never wait for any of
this.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg
from psycopg_pool import AsyncConnectionPool

from events import log as eventlog
from events.admission import MAX_WRITTEN_BYTES, Refused, admit, scrub
from events.catalog import (
    CompactionFailed,
    CompactionRecorded,
    CompactionSkipped,
    MessagesCleared,
    MessagesDeleted,
    MessageUpdated,
    SessionDeleted,
)
from events.context import CompactionConfig
from events.envelope import new_event_id
from events.ids import derived_id
from events.publisher import ConcurrencyConflict, Published, Publisher
from events.sealing import KeyDestroyed, kid_in
from projections import context_queries, queries
from projections.overlays import Overlay, apply_overlays, overlays
from services.compaction.lease import Leases
from services.compaction.ranges import Message, Plan, Skip, message_tokens, plan_compaction
from services.compaction.summarizers import Summarizer, SummarizerError
from services.context.entry_keys import js_trim
from services.context.service import ContextService
from services.errors import ProjectionTimeout
from services.tokens import TokenCounter
from services.writes.optimistic import OptimisticWriter

Conn = psycopg.AsyncConnection[Any]
log = logging.getLogger("chronicle.compactor")


@dataclass(frozen=True, slots=True)
class Attempt:
    """Which attempt (``number`` in the session's attempt series) of which work-queue request a
    compaction is: its failure is then recorded by the queue, once per attempt (not by
    :meth:`CompactionService.compact`)."""

    request_id: str
    number: int
    estimate: int = 0  # the request's (the compaction state's estimate, prompt included)


def failure_id(attempt: Attempt | None) -> str:
    """A work-queue attempt's failure: derived from the request's id and the attempt's number (a
    redelivered attempt records it once); a manual one's: new."""
    return derived_id("compaction-failed", attempt.request_id, attempt.number) if attempt else new_event_id()


@dataclass(frozen=True, slots=True)
class Series:
    """The session's attempt series in the work queue, from the committed state: ``failed`` is
    the number of the latest failed attempt since the series began (0: no failure holds the
    session; a skip, an overlay, a clear, other settings or a fall under ``compact_after`` end a
    series), recorded at ``at``."""

    failed: int = 0
    at: datetime | None = None


NOT_YET_VISIBLE = "recorded; not yet visible"
"""The reason of an overlay recorded at ``seq`` that the read model had not applied when asked."""


@dataclass(frozen=True, slots=True)
class Outcome:
    overlay: Overlay | None
    reason: str | None
    seq: int

    @property
    def recorded(self) -> bool:
        """An overlay is recorded (``overlay`` None when it was not yet visible)."""
        return self.overlay is not None or self.reason == NOT_YET_VISIBLE


class ReadModelBehind(Exception):
    """A work-queue attempt found the read model behind the session's log as it began (its first
    wait timed out, the projector behind): nothing was summarised and nothing recorded; the queue
    puts the request off, as it does for a session whose lease another compaction holds."""


@dataclass(frozen=True, slots=True)
class _Nothing:
    """Nothing to record, for ``reason``, decided at ``last`` (on ``leaf``, under ``cfg``)."""

    leaf: str | None
    cfg: CompactionConfig
    reason: str
    last: int


@dataclass(frozen=True, slots=True)
class _Summary:
    """The overlay to record, decided at ``last``; ``covered``: the ids of the messages it replaces."""

    event: CompactionRecorded
    last: int
    covered: set[str]


async def compacted_view(
    conn: Conn, tenant: str, session: str, leaf_id: str | None, *, compacted: bool = True
) -> tuple[str | None, list[queries.MessageRow], list[queries.MessageRow | Overlay]]:
    """(leaf, raw path rows, view) — the view has overlays applied unless ``compacted`` is false."""
    if leaf_id is None:
        leaf = await queries.latest_leaf(conn, tenant, session)
        leaf_id = leaf.id if leaf else None
    rows = await queries.history(conn, tenant, session, leaf_id) if leaf_id else []
    if not compacted or not rows:
        return leaf_id, rows, list(rows)
    by_id = {r.id: r for r in rows}
    found = await overlays(conn, tenant, session)
    view: list[queries.MessageRow | Overlay] = [
        by_id[x] if isinstance(x, str) else x for x in apply_overlays(list(by_id), found)
    ]
    return leaf_id, rows, view


class _Counted:
    """A message's tokens, counted once per compaction (planning and measuring ask for the same
    messages again): by the message object, which the compaction keeps alive throughout."""

    def __init__(self, tokens: Callable[[Message], int]) -> None:
        self._tokens = tokens
        self._known: dict[int, int] = {}

    def __call__(self, msg: Message) -> int:
        key = id(msg)
        if key not in self._known:
            self._known[key] = self._tokens(msg)
        return self._known[key]

    def total(self, messages: Sequence[Message]) -> int:
        return sum(self(m) for m in messages)


def _planned(
    view: list[queries.MessageRow | Overlay], cfg: CompactionConfig, tokens: Callable[[Message], int]
) -> tuple[list[Message], Plan | Skip]:
    """The view as messages and the range to compact in it (CPU only: run in a worker thread)."""
    messages = [as_message(v) for v in view]
    plan = plan_compaction(
        messages,
        tokens,
        overlays={i for i, v in enumerate(view) if isinstance(v, Overlay)},
        protect_head=cfg.protect_head,
        tail_token_budget=cfg.tail_token_budget,
        min_tail_messages=cfg.min_tail_messages,
    )
    return messages, plan


def as_message(item: queries.MessageRow | Overlay) -> Message:
    if isinstance(item, Overlay):
        return item.as_message()
    body: Message = json.loads(item.content)
    return body


class CompactionService:
    def __init__(
        self,
        pool: AsyncConnectionPool[Conn],
        publisher: Publisher,
        optimistic: OptimisticWriter,
        context: ContextService,
        counter: TokenCounter,
        summarizer: Summarizer,
        leases: Leases,
    ) -> None:
        """``leases``: the sessions' compaction leases, which callers of :meth:`compact` hold."""
        self._pool = pool
        self.leases = leases
        self._pub = publisher
        self._cond = optimistic
        self._context = context
        self._counter = counter
        self.summarizer = summarizer

    def tokens(self, msg: Message) -> int:
        return message_tokens(msg, self._counter.count)

    async def compact(
        self,
        tenant: str,
        session: str,
        leaf_id: str | None = None,
        *,
        attempt: Attempt | None = None,
        timeout_s: float | None = None,
    ) -> Outcome:
        """Compact the branch ending at ``leaf_id`` (default: the latest leaf) now.

        The caller holds the session's lease (:attr:`leases`): the work queue waits for it, a
        manual compaction takes it or answers that another compaction runs.

        Raises :class:`~services.compaction.summarizers.SummarizerError` when the summarizer
        fails, after recording ``compaction.failed`` unless this is a work-queue ``attempt`` (the
        queue records the failure of each attempt). A summary too large to store (its overlay
        event, sealed when the session seals, over what an event may be) is such a failure: the
        summarizer's answer is unusable, as an answer that is not a completion is.

        A work-queue ``attempt`` that records nothing (nothing to compact, an empty summary, or a
        summary that would not shrink the context) records ``compaction.skipped`` and waits until
        the projector has applied it: the compaction state then asks for the session again only
        after enough growth (:func:`~services.compaction.estimate.is_due`). A manual compaction
        records no skip, and always tries.

        ``timeout_s`` bounds the catch-up, the planning and the summary (:class:`TimeoutError`),
        never a publish: stopped after the server stored an overlay or a skip but before its ack,
        it would have the queue record ``compaction.failed`` after it, and summarise again. The
        publishes and what follows them are bounded by the publisher's retries and the read
        wait's timeout. Once the overlay is recorded, nothing raises: the prompt's re-render and
        the wait for the projector are best effort (:meth:`_after_recorded`), for a failure
        recorded after an overlay, or an error answered for it, would have the session
        summarised again.

        For a work-queue ``attempt``, a read model that has not applied the session's events
        when the compaction begins (its first wait times out) is :class:`ReadModelBehind`:
        nothing was tried.
        """
        async with asyncio.timeout(timeout_s):
            decided = await self._decide(tenant, session, leaf_id, attempt)
        if isinstance(decided, _Nothing):
            return await self._skipped(tenant, session, decided, attempt)
        published = await self._publish_unless_changed(decided.event, decided.last, decided.covered)
        if published is None:
            return Outcome(None, "the session changed while summarising; nothing recorded", decided.last)
        return await self._after_recorded(tenant, session, decided.event.overlay_id, published)

    async def _decide(
        self, tenant: str, session: str, leaf_id: str | None, attempt: Attempt | None
    ) -> _Nothing | _Summary:
        """:meth:`compact` up to the publish (it publishes nothing but a manual compaction's
        failure): the overlay to record, or why there is none."""
        try:
            last = await self._cond.catch_up(tenant, session)
        except ProjectionTimeout as exc:
            if attempt is None:
                raise
            raise ReadModelBehind(f"{tenant}/{session}: {exc}") from exc
        async with self._pool.connection() as conn:
            cfg = (await self._context.config(conn, tenant, session)).compaction or CompactionConfig()
            leaf, _, view = await compacted_view(conn, tenant, session, leaf_id)
            prompt = await context_queries.latest_prompt(conn, tenant, session)
        if leaf is None or not view:
            return _Nothing(leaf, cfg, "no messages", last)
        # Parsing the branch and counting its tokens costs in proportion to the branch (a
        # 5,000-message one ~0.5 s): in a worker thread, so the process's event loop, which every
        # tenant's requests share (a manual compaction runs in the API), goes on meanwhile;
        # tiktoken counts without the GIL. Each message is counted once (``counted``).
        counted = _Counted(self.tokens)
        messages, plan = await asyncio.to_thread(_planned, view, cfg, counted)
        if isinstance(plan, Skip):
            return _Nothing(leaf, cfg, plan.reason, last)
        summary = await self._summarize(tenant, session, leaf, plan, attempt)
        if not js_trim(summary):  # the reference's ``!summary.trim()``: U+FEFF blank, U+001C not
            return _Nothing(leaf, cfg, "the summarizer returned an empty summary", last)
        # The new overlay replaces exactly view[start:end]: from its first message (an overlay
        # there: from that overlay's first) to its last (an overlay there: to that one's last).
        head, tail = view[plan.start], view[plan.end - 1]
        first = head.from_message_id if isinstance(head, Overlay) else head.id
        last_id = tail.to_message_id if isinstance(tail, Overlay) else tail.id
        prompt_tokens = prompt.tokens if prompt else 0
        covered = messages[plan.start : plan.end]
        summary_msg: Message = {"id": "", "role": "assistant", "parts": [{"type": "text", "text": summary}]}
        branch, summarised, summary_tokens = await asyncio.to_thread(
            lambda: (counted.total(messages), counted.total(covered), self.tokens(summary_msg))
        )
        before = branch + prompt_tokens
        after = before - summarised + summary_tokens
        overlay_id = derived_id("overlay", tenant, session, first, last_id)
        event = CompactionRecorded(
            id=overlay_id,
            tenant=tenant,
            session=session,
            overlay_id=overlay_id,
            from_message_id=first,
            to_message_id=last_id,
            leaf_id=leaf,
            tokens_before=before,
            tokens_after=after,
            summarizer=self.summarizer.name,
            model=self.summarizer.model,
            summary=scrub(summary),
        )
        size = await self._pub.stored_size(event)
        if size > MAX_WRITTEN_BYTES:
            too_large = SummarizerError(f"the summary is too large to store: {size} bytes, at most {MAX_WRITTEN_BYTES}")
            if attempt is None:
                await self.record_failure(tenant, session, leaf, too_large)
            raise too_large
        if after >= before:  # recording it would grow the context
            reason = f"the summary would not shrink the context ({before} tokens before, {after} after)"
            return _Nothing(leaf, cfg, reason, last)
        return _Summary(event, last, {str(m.get("id")) for m in covered})

    async def _after_recorded(self, tenant: str, session: str, overlay_id: str, published: Published) -> Outcome:
        """What follows a recorded overlay, best effort (the compaction stands whatever fails): the
        frozen prompt re-rendered (failing, the prompt in force stays until a refresh works, as
        after a clear), then the overlay as the read model has it, or :data:`NOT_YET_VISIBLE`
        when it is not applied in time (the projector behind) or cannot be read."""
        try:
            if not published.duplicate and await self._context.has_prompt(tenant, session):
                await self._context.refresh_prompt(tenant, session, "compaction")
        except Exception as exc:  # a source missing or not text, a prompt unstorable, storage or NATS away
            log.warning("after compacting %s/%s the prompt was not re-rendered: %s", tenant, session, exc)
        try:
            await self._cond.catch_up(tenant, session)
            async with self._pool.connection() as conn:
                found = await overlays(conn, tenant, session)
        except Exception as exc:  # the projector behind (ProjectionTimeout), the database away
            log.warning("compacted %s/%s at seq %d, not yet visible: %s", tenant, session, published.seq, exc)
            return Outcome(None, NOT_YET_VISIBLE, published.seq)
        recorded = next((o for o in found if o.overlay_id == overlay_id), None)
        return Outcome(recorded, None if recorded else NOT_YET_VISIBLE, published.seq)

    async def _skipped(self, tenant: str, session: str, nothing: _Nothing, attempt: Attempt | None) -> Outcome:
        """Nothing recorded, for its reason; a work-queue ``attempt`` records ``compaction.skipped``
        (id derived from the request's: a redelivery records it once) and waits until it is
        applied, so the next request of the session is weighed against it."""
        leaf, cfg, reason, last = nothing.leaf, nothing.cfg, nothing.reason, nothing.last
        if attempt is None:
            return Outcome(None, reason, last)
        skipped = CompactionSkipped(
            id=derived_id("compaction-skipped", attempt.request_id),
            tenant=tenant,
            session=session,
            leaf_id=leaf,
            estimate=attempt.estimate,
            reason=reason,
            config=cfg,
        )
        published = await self._publish_unless_erased(skipped)
        if published is None:
            return Outcome(None, "the session is erased; nothing recorded", last)
        try:
            await self._cond.catch_up(tenant, session)
        except ProjectionTimeout as exc:  # recorded: never a failed attempt after it (the next request is
            log.warning("skipped compacting %s/%s at seq %d, not yet applied: %s", tenant, session, published.seq, exc)
        return Outcome(None, reason, published.seq)  # weighed again if it comes before the skip is applied)

    async def _publish_unless_erased(self, event: CompactionSkipped | CompactionFailed) -> Published | None:
        """Publish a skip or a failure unless the session is erased (``None``): at the session's
        last sequence, after reading ``erasures`` (recorded before ``session.erased`` is
        published), so an erasure published meanwhile makes it conflict and be weighed again
        (nothing is published after a session's ``session.erased``). Other events arriving
        meanwhile (appends) only move the expectation on.

        It takes no turn among this process's writes to the session (:mod:`services.writes.turns`),
        nor does the overlay's publish: their loops expect the session's last sequence and move
        past what came meanwhile, so appends cost them a retry, not a failure. Waiting behind a
        slow write instead, they ran out of the turn's time (``contention``) after a summary: a
        manual compaction answered 503 for it, the queue recorded a failure and summarised again."""
        for _ in range(20):
            last = await self._pub.last_subject_seq(event.tenant, event.session)
            async with self._pool.connection() as conn:
                if await queries.is_erased(conn, event.tenant, event.session):
                    log.info("%s/%s is erased: its %s is not recorded", event.tenant, event.session, event.type)
                    return None
            try:
                # its id derives from the request's (public): taken on another subject, a fresh
                # one (as an overlay's)
                return await self._pub.publish(event, expected_last_subject_seq=last, fresh_id_on_foreign=True)
            except ConcurrencyConflict:
                continue
        raise ConcurrencyConflict(f"{event.tenant}/{event.session} kept changing: {event.type} not recorded")

    async def _publish_unless_changed(
        self, event: CompactionRecorded, expected: int, covered: set[str]
    ) -> Published | None:
        """Publish the overlay only if nothing that invalidates it reached the session meanwhile.

        The decision was made at ``expected``; appends (and other events that leave the covered
        range alone) that arrived during the summary are fine, and the expectation moves past
        them. A clear, a deletion, an update in the range or another overlay aborts (``None``);
        the same overlay recorded by another compactor counts as done.
        """
        subject = self._pub.layout.session_subject(event.tenant, event.session)
        for _ in range(20):
            try:
                # The overlay's event id derives from public inputs (tenant, session, message ids):
                # a tenant publishing straight to the stream can take it first, on its own subjects.
                # Then the overlay is published under a fresh random id (its ``overlay_id`` stays):
                # failing instead would let that tenant stop another's compactions for as long as it
                # keeps publishing the ids; the fresh id only loses the duplicate window's guard for
                # this one publish, and a second copy of an overlay (a redelivered request) records
                # the same range with the same summary, where the newest overlay is the one in force.
                return await self._pub.publish(event, expected_last_subject_seq=expected, fresh_id_on_foreign=True)
            except ConcurrencyConflict:
                pass
            keys = self._pub.keys
            if keys is not None:
                await keys.load([(event.tenant, event.session, None)])
            async for stored in eventlog.read(self._pub.js, self._pub.layout, subject, expected + 1):
                expected = stored.seq
                if keys is not None and (kid := kid_in(stored.data)) is not None:  # evicted or made since
                    await keys.load([(event.tenant, event.session, kid)])
                try:
                    newer = admit(stored.data, stored.subject, self._pub.layout, keys)
                except Refused:
                    continue  # quarantined: no projection applies it, so it changes nothing here
                except KeyDestroyed:
                    return None  # the session is erased: nothing to record
                match newer:
                    case CompactionRecorded() if newer.overlay_id == event.overlay_id:
                        return Published(seq=stored.seq, duplicate=True)
                    case MessagesCleared() | SessionDeleted() | CompactionRecorded():
                        return None
                    case MessageUpdated() if newer.message_id in covered:
                        return None
                    case MessagesDeleted() if covered & set(newer.message_ids):
                        return None
                    case _:
                        continue
        return None

    async def _summarize(self, tenant: str, session: str, leaf: str, plan: Plan, attempt: Attempt | None) -> str:
        try:
            return await self.summarizer.summarize(plan)
        except Exception as exc:
            if attempt is None:
                await self.record_failure(tenant, session, leaf, exc)
            raise

    async def record_failure(
        self,
        tenant: str,
        session: str,
        leaf: str | None,
        exc: BaseException,
        attempt: Attempt | None = None,
        *,
        event_id: str | None = None,
    ) -> Published | None:
        """Record ``compaction.failed`` (``None``: the session is erased, nothing recorded): for a
        work-queue request, with an id derived from the request's and the attempt's number (a
        redelivered attempt records it once), that number, its estimate and the session's
        compaction settings now (those it was tried under, unless they changed during the
        attempt), and wait until the projector has applied it, as a skip: the compaction state
        asks for the session again only after enough growth. ``event_id``: the event's id in place
        of the one derived from the attempt (a request JetStream gave up: its stream sequence's)."""
        config = None
        if attempt is not None:
            async with self._pool.connection() as conn:
                config = (await self._context.config(conn, tenant, session)).compaction
        failed = CompactionFailed(
            id=event_id
            or (derived_id("compaction-failed", attempt.request_id, attempt.number) if attempt else new_event_id()),
            tenant=tenant,
            session=session,
            leaf_id=leaf or "",
            summarizer=self.summarizer.name,
            error=scrub(f"{type(exc).__name__}: {exc}"[:2000]),
            attempt=attempt.number if attempt else 1,
            estimate=attempt.estimate if attempt else None,
            config=config,
        )
        published = await self._publish_unless_erased(failed)
        if published is not None and attempt is not None:
            await self._cond.catch_up(tenant, session)
        return published
