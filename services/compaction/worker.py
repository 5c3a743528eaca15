"""Compaction: the service behind ``POST …/compact`` and the ``chronicle compactor`` worker.

The worker runs its own durable consumer (checkpoint ``compactor``) feeding
:class:`~services.compaction.state.CompactorState`; after each batch, sessions whose estimate
passed ``compact_after`` are compacted one at a time. An overlay's event id is derived from
(tenant, session, first id, last id), so two compactors, or a retry after a crash, record it once.
A failing summarizer records ``compaction.failed`` and is retried with backoff; appends never wait
for any of this. While its consumer is more than a batch behind the log (after a restart under
load), the worker only catches up: sessions are compacted again once the state is current.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg_pool import AsyncConnectionPool

from events import log as eventlog
from events.admission import Refused, admit, scrub
from events.catalog import (
    CompactionFailed,
    CompactionRecorded,
    MessagesCleared,
    MessagesDeleted,
    MessageUpdated,
    SessionDeleted,
)
from events.context import CompactionConfig
from events.ids import derived_id
from events.publisher import ConcurrencyConflict, Published, Publisher
from projections import context_queries, queries
from projections.overlays import Overlay, apply_overlays, overlays
from projections.runner import ProjectorRunner
from services.compaction.ranges import Message, Plan, Skip, message_tokens, plan_compaction
from services.compaction.summarizers import Summarizer
from services.context.service import ContextService
from services.tokens import TokenCounter
from services.writes.optimistic import OptimisticWriter

Conn = psycopg.AsyncConnection[Any]
log = logging.getLogger("chronicle.compactor")


@dataclass(frozen=True, slots=True)
class Outcome:
    overlay: Overlay | None
    reason: str | None
    seq: int


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
    ) -> None:
        self._pool = pool
        self._pub = publisher
        self._cond = optimistic
        self._context = context
        self._counter = counter
        self.summarizer = summarizer
        self._attempts: dict[tuple[str, str], int] = {}

    def tokens(self, msg: Message) -> int:
        return message_tokens(msg, self._counter.count)

    async def compact(self, tenant: str, session: str, leaf_id: str | None = None) -> Outcome:
        """Compact the branch ending at ``leaf_id`` (default: the latest leaf) now.

        Raises :class:`~services.compaction.summarizers.SummarizerError` after recording
        ``compaction.failed`` when the summarizer fails.
        """
        last = await self._cond.catch_up(tenant, session)
        async with self._pool.connection() as conn:
            cfg = (await self._context.config(conn, tenant, session)).compaction or CompactionConfig()
            leaf, _, view = await compacted_view(conn, tenant, session, leaf_id)
            prompt = await context_queries.latest_prompt(conn, tenant, session)
        if leaf is None or not view:
            return Outcome(None, "no messages", last)
        messages = [as_message(v) for v in view]
        plan = plan_compaction(
            messages,
            self.tokens,
            protect_head=cfg.protect_head,
            tail_token_budget=cfg.tail_token_budget,
            min_tail_messages=cfg.min_tail_messages,
        )
        if isinstance(plan, Skip):
            return Outcome(None, plan.reason, last)
        summary = await self._summarize(tenant, session, leaf, plan)
        if not summary.strip():
            return Outcome(None, "the summarizer returned an empty summary", last)
        existing = next((v for v in view if isinstance(v, Overlay)), None)
        first = existing.from_message_id if existing else str(plan.middle[0]["id"])
        last_id = str(plan.middle[-1]["id"])
        prompt_tokens = prompt.tokens if prompt else 0
        before = sum(self.tokens(m) for m in messages) + prompt_tokens
        covered = _covered(messages, first, last_id, existing)
        summary_msg: Message = {"id": "", "role": "assistant", "parts": [{"type": "text", "text": summary}]}
        after = before - sum(self.tokens(m) for m in covered) + self.tokens(summary_msg)
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
        covered_ids = {str(m.get("id")) for m in covered}
        published = await self._publish_unless_changed(event, last, covered_ids)
        if published is None:
            return Outcome(None, "the session changed while summarising; nothing recorded", last)
        self._attempts.pop((tenant, session), None)
        if not published.duplicate and await self._context.has_prompt(tenant, session):
            await self._context.refresh_prompt(tenant, session, "compaction")
        await self._cond.catch_up(tenant, session)
        async with self._pool.connection() as conn:
            recorded = next((o for o in await overlays(conn, tenant, session) if o.overlay_id == overlay_id), None)
        return Outcome(recorded, None if recorded else "recorded; not yet visible", published.seq)

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
                return await self._pub.publish(event, expected_last_subject_seq=expected)
            except ConcurrencyConflict:
                pass
            async for stored in eventlog.read(self._pub.js, self._pub.layout, subject, expected + 1):
                expected = stored.seq
                try:
                    newer = admit(stored.data, stored.subject, self._pub.layout)
                except Refused:
                    continue  # quarantined: no projection applies it, so it changes nothing here
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

    async def _summarize(self, tenant: str, session: str, leaf: str, plan: Plan) -> str:
        try:
            return await self.summarizer.summarize(plan)
        except Exception as exc:
            attempt = self._attempts.get((tenant, session), 0) + 1
            self._attempts[(tenant, session)] = attempt
            await self._pub.publish(
                CompactionFailed(
                    tenant=tenant,
                    session=session,
                    leaf_id=leaf,
                    summarizer=self.summarizer.name,
                    error=scrub(f"{type(exc).__name__}: {exc}"[:2000]),
                    attempt=attempt,
                )
            )
            raise


def _covered(messages: list[Message], first: str, last: str, existing: Overlay | None) -> list[Message]:
    """The view's messages the new overlay replaces (the old overlay message included)."""
    ids = [str(m.get("id")) for m in messages]
    start_id = existing.message_id if existing else first
    start = ids.index(start_id) if start_id in ids else 0
    end = ids.index(last) if last in ids else len(ids) - 1
    return messages[start : end + 1]


class Compactor:
    """The worker: state projection + a queue of sessions to compact, with retry backoff."""

    def __init__(
        self,
        runner: ProjectorRunner,
        state: Any,
        service: CompactionService,
        *,
        max_backoff_s: float = 300,
        concurrency: int = 4,
        compact_timeout_s: float = 600,
    ) -> None:
        self._compact_timeout_s = compact_timeout_s
        self._runner = runner
        self._state = state
        self._service = service
        self._concurrency = max(1, concurrency)
        self._queue: asyncio.Queue[tuple[str, str]] = asyncio.Queue()
        self._queued: set[tuple[str, str]] = set()
        self._active: set[tuple[str, str]] = set()  # sessions being compacted (never twice at once)
        self._tried_at: dict[tuple[str, str], int] = {}
        self._retry_at: dict[tuple[str, str], float] = {}
        self._failures: dict[tuple[str, str], int] = {}
        self._max_backoff = max_backoff_s
        # set while the state is caught up with the log: compacting from a state far behind would
        # only be redone, and it takes the CPU the consumer needs to catch up under load
        self._caught_up = asyncio.Event()
        runner.on_batch = self._after_batch
        self.compactions = 0
        self.failures = 0

    def _after_batch(self, applied: int, last_seq: int) -> None:
        if self._runner.stats.pending > self._runner.batch_size:
            self._caught_up.clear()
            return  # candidates are looked at again once the state has caught up
        self._caught_up.set()
        now = time.monotonic()
        for key, cand in list(self._state.candidates.items()):
            if self._tried_at.get(key) == cand.estimate or self._retry_at.get(key, 0) > now:
                continue
            self._enqueue(key)

    def _enqueue(self, key: tuple[str, str]) -> None:
        if key not in self._queued and key not in self._active:
            self._queued.add(key)
            self._queue.put_nowait(key)

    async def run(self, stop: asyncio.Event) -> None:
        async with self._runner.pool.connection() as conn:
            await self._state.load(conn)
        self._after_batch(0, 0)
        # summaries wait on an LLM: several sessions are compacted at once (each one by one worker)
        workers = [asyncio.create_task(self._work(stop)) for _ in range(self._concurrency)]
        retries = asyncio.create_task(self._retry_loop(stop))
        try:
            await self._runner.run(stop)
        finally:
            for task in (*workers, retries):
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task

    async def _retry_loop(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            await asyncio.sleep(0.5)
            now = time.monotonic()
            for key, when in list(self._retry_at.items()):
                if when <= now and key in self._state.candidates:
                    del self._retry_at[key]
                    self._enqueue(key)

    async def _work(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            await self._caught_up.wait()
            key = await self._queue.get()
            self._queued.discard(key)
            cand = self._state.candidates.get(key)
            if cand is None:
                continue
            self._active.add(key)
            try:
                async with asyncio.timeout(self._compact_timeout_s):  # a dead connection never holds a worker
                    outcome = await self._service.compact(*key)
                self._tried_at[key] = cand.estimate
                self._failures.pop(key, None)
                if outcome.overlay is not None:
                    self.compactions += 1
                    log.info("compacted %s/%s: %s", key[0], key[1], outcome.overlay.overlay_id)
                else:
                    log.info("nothing to compact in %s/%s: %s", key[0], key[1], outcome.reason)
            except Exception:
                n = self._failures.get(key, 0) + 1
                self._failures[key] = n
                self.failures += 1
                delay = min(self._max_backoff, 0.5 * 2**n)
                self._retry_at[key] = time.monotonic() + delay
                log.warning("compaction of %s/%s failed (attempt %d); retrying in %.1fs", *key, n, delay, exc_info=True)
            finally:
                self._active.discard(key)
                # what arrived for the session meanwhile was not enqueued while it was active
                now = self._state.candidates.get(key)
                if now is not None and self._tried_at.get(key) != now.estimate and key not in self._retry_at:
                    self._enqueue(key)
