"""Summary overlays: the projection of compaction events, and their read-time application.

History reads apply, per requested branch, the overlays whose first and last messages are both
on that branch's path (sibling branches never see each other's overlays); where several start at
the same message, the widest wins, ties to the newest (:func:`in_force`). The originals
are never touched; ``compacted=false`` reads return the raw path.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import astuple, dataclass
from datetime import datetime
from typing import Any, Protocol, TypeVar

from psycopg import AsyncConnection
from psycopg.rows import class_row
from psycopg.types.json import Jsonb

from events.catalog import (
    COMPACTION_PREFIX,
    CompactionFailed,
    CompactionRecorded,
    CompactionSkipped,
    MessagesCleared,
    SessionDeleted,
    SessionErased,
)
from events.envelope import Event
from projections import pages
from projections.overlay_rule import in_force

Statement = tuple[str, tuple[Any, ...]]


@dataclass(frozen=True, slots=True)
class Overlay:
    overlay_id: str
    from_message_id: str
    to_message_id: str
    leaf_id: str
    summary: str
    tokens_before: int
    tokens_after: int
    summarizer: str
    model: str | None
    created_at: datetime
    seq: int

    @property
    def message_id(self) -> str:
        return COMPACTION_PREFIX + self.overlay_id

    def as_message(self) -> dict[str, Any]:
        return {
            "id": self.message_id,
            "role": "assistant",
            "parts": [{"type": "text", "text": self.summary}],
            "createdAt": self.created_at.isoformat().replace("+00:00", "Z"),
        }


def overlay_of(event: CompactionRecorded, seq: int) -> Overlay:
    """The overlay a ``compaction.recorded`` event at ``seq`` records."""
    return Overlay(
        event.overlay_id,
        event.from_message_id,
        event.to_message_id,
        event.leaf_id,
        event.summary,
        event.tokens_before,
        event.tokens_after,
        event.summarizer,
        event.model,
        event.occurred_at,
        seq,
    )


def plan(event: Event, seq: int) -> list[Statement]:
    t, s = event.tenant, event.session
    match event:
        case CompactionRecorded():
            o = overlay_of(event, seq)
            return [
                (
                    "INSERT INTO overlays (tenant, session_id, overlay_id, from_message_id, to_message_id, leaf_id, "
                    "summary, tokens_before, tokens_after, summarizer, model, created_at, seq) "
                    "VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s) ON CONFLICT DO NOTHING",
                    (t, s, *astuple(o)),
                )
            ]
        case CompactionFailed():
            return [
                (
                    "INSERT INTO compaction_failures (tenant, session_id, seq, leaf_id, summarizer, error, attempt, "
                    "created_at) VALUES (%s, %s, %s, %s, %s, %s, %s, %s) ON CONFLICT DO NOTHING",
                    (
                        t,
                        s,
                        seq,
                        event.leaf_id,
                        event.summarizer,
                        event.error,
                        event.attempt,
                        event.occurred_at,
                    ),
                )
            ]
        case CompactionSkipped():
            return [
                (
                    "INSERT INTO compaction_skips (tenant, session_id, seq, leaf_id, estimate, reason, config, "
                    "created_at) VALUES (%s, %s, %s, %s, %s, %s, %s, %s) ON CONFLICT DO NOTHING",
                    (
                        t,
                        s,
                        seq,
                        event.leaf_id,
                        event.estimate,
                        event.reason,
                        Jsonb(event.config.model_dump(mode="json")),
                        event.occurred_at,
                    ),
                )
            ]
        case MessagesCleared() | SessionDeleted():
            return [("DELETE FROM overlays WHERE tenant = %s AND session_id = %s", (t, s))]
        case SessionErased():
            return [
                ("DELETE FROM overlays WHERE tenant = %s AND session_id = %s", (t, s)),
                ("DELETE FROM compaction_failures WHERE tenant = %s AND session_id = %s", (t, s)),
                ("DELETE FROM compaction_skips WHERE tenant = %s AND session_id = %s", (t, s)),
            ]
        case _:
            return []


class OverlayProjection:
    name = "overlays"

    async def apply(self, conn: AsyncConnection[Any], items: Sequence[tuple[int, Event]]) -> None:
        async with conn.cursor() as cur:
            for seq, event in items:
                for sql, params in plan(event, seq):
                    await cur.execute(sql, params)


async def overlays(conn: AsyncConnection[Any], tenant: str, session: str) -> list[Overlay]:
    """Every overlay of the session, oldest first (stream order breaks every tie)."""
    async with conn.cursor(row_factory=class_row(Overlay)) as cur:
        await cur.execute(
            "SELECT overlay_id, from_message_id, to_message_id, leaf_id, summary, tokens_before, tokens_after, "
            "summarizer, model, created_at, seq FROM overlays WHERE tenant = %s AND session_id = %s ORDER BY seq",
            (tenant, session),
        )
        return await cur.fetchall()


async def overlay_page(
    conn: AsyncConnection[Any], tenant: str, session: str, after: int, limit: int
) -> tuple[list[Overlay], bool]:
    """A page of the session's overlays, superseded ones included, oldest first: those after
    sequence ``after``, at most ``limit`` and ending early at :data:`~projections.pages.PAGE_BYTES`
    of summaries; and whether more follow."""
    cur = await conn.execute(
        pages.page_sql(
            "overlay_id, from_message_id, to_message_id, leaf_id, tokens_before, tokens_after, summarizer, model, "
            "created_at, seq",
            "summary",
            "overlays",
            "seq",
        ),
        pages.page_params(tenant, session, after, limit),
    )
    rows, more = pages.cut(await cur.fetchall(), limit)
    return [
        Overlay(o, f, to, leaf, text, tb, ta, by, model, at, q)
        for o, f, to, leaf, tb, ta, by, model, at, q, text in rows
    ], more


@dataclass(frozen=True, slots=True)
class Span:
    """An overlay without its summary: what :func:`in_force` needs to pick the ones a path shows."""

    overlay_id: str
    from_message_id: str
    to_message_id: str


async def send_spans(conn: AsyncConnection[Any], tenant: str, session: str) -> Callable[[], Awaitable[list[Span]]]:
    """The spans of every overlay of the session, oldest first (stream order breaks every tie),
    sent now and answered when the returned function is awaited (in pipeline mode the query
    travels with the statements that follow it). No summary is read: a reader loads those of the
    overlays in force on its path only (:func:`summaries`)."""
    cur = conn.cursor(row_factory=class_row(Span))
    await cur.execute(
        "SELECT overlay_id, from_message_id, to_message_id FROM overlays WHERE tenant = %s AND session_id = %s "
        "ORDER BY seq",
        (tenant, session),
    )

    async def answer() -> list[Span]:
        async with cur:
            return await cur.fetchall()

    return answer


async def summaries(conn: AsyncConnection[Any], tenant: str, session: str, ids: Sequence[str]) -> dict[str, Overlay]:
    """The session's overlays named by ``ids`` (its summaries included), by id; read in the
    transaction that read their spans, so none is missing."""
    if not ids:
        return {}
    async with conn.cursor(row_factory=class_row(Overlay)) as cur:
        await cur.execute(
            "SELECT overlay_id, from_message_id, to_message_id, leaf_id, summary, tokens_before, tokens_after, "
            "summarizer, model, created_at, seq FROM overlays WHERE tenant = %s AND session_id = %s "
            "AND overlay_id = ANY(%s)",
            (tenant, session, list(ids)),
        )
        return {o.overlay_id: o for o in await cur.fetchall()}


async def overlay_at(
    conn: AsyncConnection[Any], tenant: str, session: str, overlay_id: str
) -> tuple[Overlay, str | None] | None:
    """The session's overlay ``overlay_id`` (superseded ones included) and the parent of its first
    message (None for a root, or a first message deleted since): where history shows it. None when
    the session has no such overlay."""
    async with conn.cursor() as cur:
        await cur.execute(
            "SELECT o.overlay_id, o.from_message_id, o.to_message_id, o.leaf_id, o.summary, o.tokens_before, "
            "o.tokens_after, o.summarizer, o.model, o.created_at, o.seq, m.parent_id FROM overlays o "
            "LEFT JOIN messages m ON m.tenant = o.tenant AND m.session_id = o.session_id AND m.id = o.from_message_id "
            "WHERE o.tenant = %s AND o.session_id = %s AND o.overlay_id = %s",
            (tenant, session, overlay_id),
        )
        row = await cur.fetchone()
    return None if row is None else (Overlay(*row[:11]), row[11])


@dataclass(frozen=True, slots=True)
class CompactionFailure:
    seq: int
    leaf_id: str
    summarizer: str
    error: str
    attempt: int
    created_at: datetime


async def failures(
    conn: AsyncConnection[Any], tenant: str, session: str, after: int, limit: int
) -> tuple[list[CompactionFailure], bool]:
    """A page of the session's recorded summarizer failures, oldest first: those after sequence
    ``after``, at most ``limit`` and ending early at :data:`~projections.pages.PAGE_BYTES` of
    errors; and whether more follow."""
    cur = await conn.execute(
        pages.page_sql("seq, leaf_id, summarizer, attempt, created_at", "error", "compaction_failures", "seq"),
        pages.page_params(tenant, session, after, limit),
    )
    rows, more = pages.cut(await cur.fetchall(), limit)
    return [CompactionFailure(q, leaf, by, error, n, at) for q, leaf, by, n, at, error in rows], more


class Spanned(Protocol):
    """An overlay, or its :class:`Span`: where it starts and ends."""

    @property
    def from_message_id(self) -> str: ...
    @property
    def to_message_id(self) -> str: ...


Sp = TypeVar("Sp", bound=Spanned)


def apply_overlays(path_ids: Sequence[str], all_overlays: Sequence[Sp]) -> list[str | Sp]:
    """The compacted view of a path: message ids, with covered ranges replaced by the overlay in
    force there (:func:`in_force`; ``all_overlays`` oldest first, whole or their spans)."""
    return in_force(path_ids, all_overlays, lambda o: (o.from_message_id, o.to_message_id))


def overlay_json(overlay: Overlay) -> str:
    return json.dumps(overlay.as_message(), ensure_ascii=False, separators=(",", ":"))
