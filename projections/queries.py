"""Read queries over the history read models. Plain SQL; bodies come back as stored JSON text."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypeVar

from psycopg import AsyncConnection
from psycopg.rows import class_row

Conn = AsyncConnection[Any]
T = TypeVar("T")

SEARCH_CANDIDATES = 1000


@dataclass(frozen=True, slots=True)
class SessionRow:
    tenant: str
    id: str
    name: str
    parent_session_id: str | None
    metadata: dict[str, Any]
    created_at: datetime
    updated_at: datetime
    deleted_at: datetime | None
    created_seq: int
    last_seq: int


@dataclass(frozen=True, slots=True)
class MessageRow:
    id: str
    parent_id: str | None
    role: str
    content: str
    body_sha256: str
    created_at: datetime
    seq: int
    original_ref: dict[str, Any] | None = None


@dataclass(frozen=True, slots=True)
class SearchHit:
    session_id: str
    id: str
    role: str
    content: str
    snippet: str
    rank: float
    created_at: datetime


_SESSION_COLS = (
    "tenant, id, name, parent_session_id, metadata, created_at, updated_at, deleted_at, created_seq, last_seq"
)
_MESSAGE_COLS = "id, parent_id, role, content, body_sha256, created_at, seq, original_ref"


async def get_session(conn: Conn, tenant: str, session: str) -> SessionRow | None:
    async with conn.cursor(row_factory=class_row(SessionRow)) as cur:
        await cur.execute(f"SELECT {_SESSION_COLS} FROM sessions WHERE tenant = %s AND id = %s", (tenant, session))
        return await cur.fetchone()


async def list_sessions(conn: Conn, tenant: str, limit: int, before_seq: int | None) -> list[SessionRow]:
    """Live sessions, newest first; ``before_seq`` is the cursor (a ``created_seq``)."""
    async with conn.cursor(row_factory=class_row(SessionRow)) as cur:
        await cur.execute(
            f"SELECT {_SESSION_COLS} FROM sessions WHERE tenant = %s AND deleted_at IS NULL AND id <> '' "
            "AND (%s::bigint IS NULL OR created_seq < %s) ORDER BY created_seq DESC LIMIT %s",
            (tenant, before_seq, before_seq, limit),
        )
        return await cur.fetchall()


async def get_message(conn: Conn, tenant: str, session: str, message_id: str) -> MessageRow | None:
    async with conn.cursor(row_factory=class_row(MessageRow)) as cur:
        await cur.execute(
            f"SELECT {_MESSAGE_COLS} FROM messages WHERE tenant = %s AND session_id = %s AND id = %s",
            (tenant, session, message_id),
        )
        return await cur.fetchone()


async def latest_leaf(conn: Conn, tenant: str, session: str) -> MessageRow | None:
    """The most recently appended message without children (ties impossible: seq is total)."""
    async with conn.cursor(row_factory=class_row(MessageRow)) as cur:
        await cur.execute(
            f"SELECT {_MESSAGE_COLS} FROM messages m WHERE m.tenant = %s AND m.session_id = %s "
            "AND NOT EXISTS (SELECT 1 FROM messages c WHERE c.tenant = m.tenant "
            "AND c.session_id = m.session_id AND c.parent_id = m.id) ORDER BY m.seq DESC LIMIT 1",
            (tenant, session),
        )
        return await cur.fetchone()


@dataclass(frozen=True, slots=True)
class AppendState:
    session_deleted: bool
    existing_parent_id: str | None
    existing_seq: int | None
    existing_sha256: str | None
    latest_leaf: str | None
    parent_exists: bool


async def append_state(
    conn: Conn, tenant: str, session: str, message_id: str, parent_id: str | None, want_leaf: bool
) -> AppendState:
    """Everything an append decides on, in one round trip."""
    cur = await conn.execute(
        """
        SELECT
          coalesce((SELECT deleted_at IS NOT NULL FROM sessions WHERE tenant = %(t)s AND id = %(s)s), false),
          e.parent_id, e.seq, e.body_sha256,
          CASE WHEN %(leaf)s THEN (
            SELECT m.id FROM messages m WHERE m.tenant = %(t)s AND m.session_id = %(s)s
              AND NOT EXISTS (SELECT 1 FROM messages c WHERE c.tenant = m.tenant
                              AND c.session_id = m.session_id AND c.parent_id = m.id)
            ORDER BY m.seq DESC LIMIT 1) END,
          %(p)s::text IS NOT NULL AND EXISTS (
            SELECT 1 FROM messages WHERE tenant = %(t)s AND session_id = %(s)s AND id = %(p)s)
        FROM (SELECT 1) one
        LEFT JOIN messages e ON e.tenant = %(t)s AND e.session_id = %(s)s AND e.id = %(m)s
        """,
        {"t": tenant, "s": session, "m": message_id, "p": parent_id, "leaf": want_leaf},
    )
    row = await cur.fetchone()
    assert row is not None
    return AppendState(bool(row[0]), row[1], row[2], row[3], row[4], bool(row[5]))


async def children(conn: Conn, tenant: str, session: str, message_id: str) -> list[MessageRow]:
    async with conn.cursor(row_factory=class_row(MessageRow)) as cur:
        await cur.execute(
            f"SELECT {_MESSAGE_COLS} FROM messages WHERE tenant = %s AND session_id = %s AND parent_id = %s "
            "ORDER BY seq",
            (tenant, session, message_id),
        )
        return await cur.fetchall()


_PATH = """
WITH RECURSIVE bound AS (
    SELECT count(*) AS n FROM messages WHERE tenant = %(t)s AND session_id = %(s)s
), path AS (
    SELECT {cols}, 0 AS depth FROM messages WHERE tenant = %(t)s AND session_id = %(s)s AND id = %(leaf)s
  UNION ALL
    SELECT {mcols}, p.depth + 1
    FROM path p JOIN messages m ON m.tenant = %(t)s AND m.session_id = %(s)s AND m.id = p.parent_id
    WHERE p.depth < (SELECT n FROM bound)
)
"""


def _acyclic(rows: list[T], key: Callable[[T], str]) -> list[T]:
    """Leaf-first rows cut at the first repeated id (a cycle is possible only after a message was
    deleted and its id re-appended under one of its former descendants)."""
    seen: set[str] = set()
    out: list[T] = []
    for row in rows:
        if key(row) in seen:
            break
        seen.add(key(row))
        out.append(row)
    return out


async def history(conn: Conn, tenant: str, session: str, leaf_id: str) -> list[MessageRow]:
    """Root-to-``leaf_id`` path, root first; an unknown leaf gives ``[]``.

    A deleted ancestor ends the path there (children keep their parent id, as the reference).
    The walk carries the row's columns, so each step is one index lookup.
    """
    sql = _PATH.format(cols=_MESSAGE_COLS, mcols=", ".join("m." + c for c in _MESSAGE_COLS.split(", ")))
    async with conn.cursor(row_factory=class_row(MessageRow)) as cur:
        await cur.execute(
            sql + f"SELECT {_MESSAGE_COLS} FROM path ORDER BY depth",
            {"t": tenant, "s": session, "leaf": leaf_id},
        )
        rows = await cur.fetchall()
    return list(reversed(_acyclic(rows, lambda r: r.id)))


async def path_length(conn: Conn, tenant: str, session: str, leaf_id: str) -> int:
    """Rows on the path (no overlays applied); walks ids only, never the bodies."""
    cur = await conn.execute(
        _PATH.format(cols="id, parent_id", mcols="m.id, m.parent_id") + "SELECT id FROM path ORDER BY depth",
        {"t": tenant, "s": session, "leaf": leaf_id},
    )
    return len(_acyclic(list(await cur.fetchall()), lambda r: str(r[0])))


async def search(conn: Conn, tenant: str, session: str | None, query: str, limit: int) -> list[SearchHit]:
    """All words must match (stemmed, English); ranked; snippet per hit.

    Ranking is bounded: at most ``SEARCH_CANDIDATES`` newest matches are ranked, so a very common
    word costs the same as a rare one.
    """
    async with conn.cursor(row_factory=class_row(SearchHit)) as cur:
        await cur.execute(
            """
            WITH q AS (SELECT plainto_tsquery('english', %(q)s) AS q),
            cand AS (
                SELECT m.session_id, m.id, m.role, m.text_content, m.content_tsv, m.created_at, m.seq
                FROM messages m
                WHERE m.tenant = %(t)s AND (%(s)s::text IS NULL OR m.session_id = %(s)s)
                  AND numnode(plainto_tsquery('english', %(q)s)) > 0
                  AND m.content_tsv @@ plainto_tsquery('english', %(q)s)
                ORDER BY m.seq DESC
                LIMIT %(cand)s
            ),
            ranked AS (
                SELECT cand.*, ts_rank(cand.content_tsv, q.q) AS rank FROM cand, q
                ORDER BY rank DESC, cand.seq DESC LIMIT %(limit)s
            )
            SELECT r.session_id, r.id, r.role, r.text_content AS content,
                   ts_headline('english', r.text_content, q.q,
                               'MaxWords=24, MinWords=8, MaxFragments=2, StartSel=**, StopSel=**') AS snippet,
                   r.rank::float8 AS rank, r.created_at
            FROM ranked r, q ORDER BY r.rank DESC, r.seq DESC
            """,
            {"q": query, "t": tenant, "s": session, "cand": SEARCH_CANDIDATES, "limit": limit},
        )
        return await cur.fetchall()


async def checkpoints(conn: Conn) -> dict[str, int]:
    cur = await conn.execute("SELECT name, seq FROM checkpoints")
    return {str(name): int(seq) for name, seq in await cur.fetchall()}
