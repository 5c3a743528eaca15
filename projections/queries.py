"""Read queries over the history read models. Plain SQL; bodies come back as stored JSON text."""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, NamedTuple, TypeVar

import psycopg
from psycopg import AsyncConnection
from psycopg.rows import class_row

from events.messages import body_hash
from projections import pages, search_languages
from projections import search_query as sq
from projections.search_bound import SEARCH_TIMEOUT_S, bounded

Conn = AsyncConnection[Any]
T = TypeVar("T")

SEARCH_CANDIDATES = 1000  # newest matches ranked
SEARCH_SAMPLE = 1000  # newest messages of the scope that give BM25 its document frequencies
MAX_BIGINT = 2**63 - 1


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
    input_tokens: int
    output_tokens: int
    estimated_cost: float
    end_reason: str | None


class MessageRow(NamedTuple):
    """A stored message (a tuple: a 1,000-message path builds in microseconds, not milliseconds)."""

    id: str
    parent_id: str | None
    role: str
    content: str
    body_sha256: str | None  # None: the stored body's own (migration 019)
    created_at: datetime
    seq: int
    original_ref: dict[str, Any] | None = None


class PathRow(NamedTuple):
    """What a history read serves per message: its id and stored JSON."""

    id: str
    content: str
    seq: int = 0  # its append's sequence (where a read walked the session's rows: :func:`path_from`)


class RowStat(NamedTuple):
    """A path row's size, read without its body: ``bytes`` is the stored JSON's UTF-8 length."""

    id: str
    role: str
    bytes: int


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
    "tenant, id, name, parent_session_id, metadata, created_at, updated_at, deleted_at, created_seq, last_seq, "
    "input_tokens, output_tokens, estimated_cost, end_reason"
)
_MESSAGE_COLS = "id, parent_id, role, content, body_sha256, created_at, seq, original_ref"


def by_ids_sql(cols: str, also: str = "") -> str:
    """``SELECT cols`` of a session's messages named by an id array (parameters: the ids, the
    tenant, the session), each found through the primary key whatever the planner knows
    (``chronicle_messages_by_ids``, migration 037): asked ``id = x``, a planner without statistics
    took ``messages_by_seq`` for the key and filtered the whole session for each id (1 s for 40 ids
    of a 20,000-message session). ``also``: a further condition on the row."""
    return f"SELECT {cols} FROM chronicle_messages_by_ids(%s, %s, %s) m WHERE true {also}"


@contextlib.asynccontextmanager
async def snapshot(conn: Conn) -> AsyncIterator[None]:
    """A read-only REPEATABLE READ transaction on an autocommit connection: several reads that
    see one state (a read in pieces never mixes a tree from before a clear with rows after it)."""
    await conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
    try:
        yield
    except BaseException:
        await conn.execute("ROLLBACK")
        raise
    await conn.execute("COMMIT")


async def get_session(conn: Conn, tenant: str, session: str) -> SessionRow | None:
    async with conn.cursor(row_factory=class_row(SessionRow)) as cur:
        await cur.execute(f"SELECT {_SESSION_COLS} FROM sessions WHERE tenant = %s AND id = %s", (tenant, session))
        return await cur.fetchone()


@dataclass(frozen=True, slots=True)
class AppliedUsage:
    """A ``session.usage_added`` event the history projection applied (``usage_applied``)."""

    seq: int
    input_tokens: int
    output_tokens: int
    cost: float


async def applied_usage(conn: Conn, tenant: str, session: str, event_id: str) -> AppliedUsage | None:
    """The usage event ``event_id`` of the session, when it was applied (a deleted or erased
    session has none)."""
    async with conn.cursor(row_factory=class_row(AppliedUsage)) as cur:
        await cur.execute(
            "SELECT seq, input_tokens, output_tokens, cost FROM usage_applied "
            "WHERE tenant = %s AND session_id = %s AND event_id = %s",
            (tenant, session, event_id),
        )
        return await cur.fetchone()


async def is_erased(conn: Conn, tenant: str, session: str) -> bool:
    """Whether the session's erasure is recorded (``erasures``: before its ``session.erased`` event
    is published, so before the projections drop its rows)."""
    cur = await conn.execute("SELECT 1 FROM erasures WHERE tenant = %s AND session_id = %s", (tenant, session))
    return await cur.fetchone() is not None


async def erased_at(conn: Conn, tenant: str, session: str) -> datetime | None:
    """When the session's erasure was recorded (None: it was not)."""
    cur = await conn.execute("SELECT erased_at FROM erasures WHERE tenant = %s AND session_id = %s", (tenant, session))
    row = await cur.fetchone()
    return None if row is None else row[0]


async def list_sessions(
    conn: Conn, tenant: str, limit: int, before_seq: int | None, *, deleted: bool = False
) -> list[SessionRow]:
    """Live sessions (``deleted``: deleted ones instead), newest created first; ``before_seq`` is
    the cursor (a ``created_seq``). Each walks its own partial index (migrations 001 and 035)."""
    which = "deleted_at IS NOT NULL" if deleted else "deleted_at IS NULL"
    async with conn.cursor(row_factory=class_row(SessionRow)) as cur:
        await cur.execute(
            f"SELECT {_SESSION_COLS} FROM sessions WHERE tenant = %s AND {which} AND id <> '' "
            "AND (%s::bigint IS NULL OR created_seq < %s) ORDER BY created_seq DESC LIMIT %s",
            (tenant, before_seq, before_seq, limit),
        )
        return await cur.fetchall()


@dataclass(frozen=True, slots=True)
class ErasureRow:
    session_id: str
    erased_at: datetime
    requested_by: str | None
    reason: str | None
    seq: int | None


async def list_erasures(conn: Conn, tenant: str, limit: int, before: tuple[datetime, str] | None) -> list[ErasureRow]:
    """The tenant's recorded erasures, newest first (``erased_at``, then session id, descending);
    ``before`` is the cursor: the last row's ``(erased_at, session_id)``."""
    async with conn.cursor(row_factory=class_row(ErasureRow)) as cur:
        await cur.execute(
            "SELECT session_id, erased_at, requested_by, reason, seq FROM erasures WHERE tenant = %(t)s "
            "AND (%(at)s::timestamptz IS NULL OR (erased_at, session_id) < (%(at)s, %(s)s)) "
            "ORDER BY erased_at DESC, session_id DESC LIMIT %(n)s",
            {"t": tenant, "at": before[0] if before else None, "s": before[1] if before else "", "n": limit},
        )
        return await cur.fetchall()


ACTIVITY_SHIFT = 16
"""``sessions.activity`` is ``last_seq >> ACTIVITY_SHIFT`` (migration 022's generated column)."""
# Every touch of a session changes its ``last_seq``, so it is not indexed (the touches stay HOT):
# the index holds its coarse ``activity``, and the exact order within a bucket comes from an
# incremental sort of the index walk. With explicit sorts off (for this statement only), no plan
# but that walk is left, whatever the planner knows of the table (it may never have been
# analysed): every other plan sorts all the tenant's sessions. The walk reads the page and the
# rest of the last bucket it reaches: at most 2**16 stream sequences, so at most that many
# sessions, in practice the tenant's sessions active in that stretch of the log; each bucket is
# sorted in memory, top-N bounded by the page.
RECENT_PLAN = "SET LOCAL enable_sort = off"
RECENT = (
    f"SELECT {_SESSION_COLS} FROM sessions WHERE tenant = %(t)s AND deleted_at IS NULL AND id <> '' "
    "AND activity <= %(a)s AND (last_seq, id) < (%(s)s, %(i)s) "
    "ORDER BY activity DESC, last_seq DESC, id DESC LIMIT %(n)s"
)


def recent_params(tenant: str, limit: int, after: tuple[int, str] | None) -> dict[str, Any]:
    """:data:`RECENT`'s parameters; ``after`` is the cursor ``(last_seq, id)``."""
    seq, sid = after if after is not None else (MAX_BIGINT, "")
    return {"t": tenant, "a": seq >> ACTIVITY_SHIFT, "s": seq, "i": sid, "n": limit}


async def list_sessions_recent(conn: Conn, tenant: str, limit: int, after: tuple[int, str] | None) -> list[SessionRow]:
    """Live sessions, most recently active first (the highest ``last_seq``: the session's last
    event of any kind), ties impossible (a sequence is one event's) but broken by id.

    ``after`` is the cursor, the last row of the previous page as ``(last_seq, id)``: the page
    holds the sessions ordered after it. A session is on at most one page of a walk (its
    ``last_seq`` only grows, so once passed it stays before the cursor); one active again while
    the pages are walked moves before the cursor, so a walk misses it unless it was already
    seen: a fresh first page shows it."""
    async with conn.transaction(), conn.cursor(row_factory=class_row(SessionRow)) as cur:
        await cur.execute(RECENT_PLAN)
        await cur.execute(RECENT, recent_params(tenant, limit, after))
        return await cur.fetchall()


async def get_message(conn: Conn, tenant: str, session: str, message_id: str) -> MessageRow | None:
    async with conn.cursor(row_factory=class_row(MessageRow)) as cur:
        await cur.execute(
            f"SELECT {_MESSAGE_COLS} FROM chronicle_messages_by_ids(ARRAY[%s], %s, %s)",  # through the key (037)
            (message_id, tenant, session),
        )
        return await cur.fetchone()


async def existing_ids(conn: Conn, tenant: str, session: str, message_ids: list[str]) -> set[str]:
    """Which of ``message_ids`` are messages of the session (one set-based query)."""
    cur = await conn.execute(by_ids_sql("id"), (message_ids, tenant, session))
    return {row[0] for row in await cur.fetchall()}


async def latest_leaf(conn: Conn, tenant: str, session: str) -> MessageRow | None:
    """The most recently appended message without children (ties impossible: seq is total), as
    the projector keeps it in ``sessions.leaf_id``: one index lookup, whatever the session's size."""
    async with conn.cursor(row_factory=class_row(MessageRow)) as cur:
        await cur.execute(  # the leaf's id first (a scalar), then its row through the key whatever the plan
            f"SELECT {_MESSAGE_COLS} FROM chronicle_messages_by_ids("
            "ARRAY[(SELECT leaf_id FROM sessions WHERE tenant = %s AND id = %s)], %s, %s)",
            (tenant, session, tenant, session),
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
    applied_seq: int = 0  # the session's last sequence the read model has applied
    ids: list[str] | None = None  # every message id of the session, when asked for and at most the cap
    # no row and its erasure recorded (by any process: ``erasures`` is written before the
    # ``session.erased`` event is published, and the projections drop the row when they apply it)
    session_erased: bool = False
    # the parents asked about (:func:`append_state`) that stored messages put under the new id (a
    # deleted message's id, re-used): at most those asked, never the id's subtree; None when the
    # subtree was not walked (an id no message names as its parent, or no parent to ask about)
    under: list[str] | None = None
    # with ``ids``: the ids that stored messages name as their parent but the session does not
    # hold (deleted messages'; none in a single-branch session)
    dangling: list[str] | None = None


_UNDER = """
  WITH RECURSIVE d(id) AS (
    SELECT id FROM messages WHERE tenant = %(t)s AND session_id = %(s)s AND parent_id = %(m)s
    UNION
    SELECT c.id FROM d CROSS JOIN LATERAL (
      SELECT id FROM messages WHERE tenant = %(t)s AND session_id = %(s)s AND parent_id = d.id OFFSET 0) c)
  SELECT ARRAY(SELECT id FROM d WHERE id = ANY(q.ids) LIMIT cardinality(q.ids))
"""
# Which of the parents asked about (``q.ids``) are under an id that no message of the session has:
# its children (by the ``messages_by_parent`` index), theirs, and so on, until every one asked
# about is found (the walk is read as it goes: a parent near the id stops it early) or the subtree
# ends. Only those parents come back, never the subtree. UNION, not UNION ALL: an id already
# reached is not walked again, so a cycle already stored (published straight to the stream) ends
# the walk, which reads each of the session's messages at most once. Each step is one probe of the
# parent index (the lateral, fenced by OFFSET 0): a planner that estimates many children per id
# (ids shared by many sessions) would otherwise merge-join the session's whole parent index at
# every level of the walk, its depth times its size.


async def append_state(
    conn: Conn,
    tenant: str,
    session: str,
    message_id: str,
    parent_id: str | None,
    want_leaf: bool,
    ids_cap: int | None = None,
    *,
    leaf_parent: bool = False,
    chain_parents: Sequence[str] = (),
) -> AppendState:
    """Everything an append decides on, in one round trip; with ``ids_cap``, also every message
    id of the session when it has at most that many (an index-only scan of the primary key), and
    then, in a session that is not a single branch, its dangling parent ids (an index-only scan
    of the parent index, only under the cap; the set difference is taken here). Whether the
    session is erased is asked only when it has no row (a live session's append gains nothing),
    as :func:`services.writes.liveness.live_session` does.

    Whether the new id would be its own ancestor (:data:`_UNDER`) is asked only about the parents
    the append may take: ``parent_id`` when it exists, the latest leaf with ``leaf_parent`` (the
    parent omitted), and ``chain_parents`` (where the caller's own unapplied appends lead the
    parent to: the first ids above them). With none of those (a new root, an unknown parent) the
    walk is not made; nor when the session is a single branch (``sessions.single_branch``: every
    parent it names is one of its messages, so no new id has children) or no message names the
    id as its parent (one probe of the parent index): an append of a new id to a single-branch
    session, the usual one, reads nothing more for it."""
    cur = await conn.execute(
        f"""
        SELECT
          coalesce(x.deleted_at IS NOT NULL, false),
          e.parent_id, e.seq, e.body_sha256,
          CASE WHEN %(leaf)s THEN x.leaf_id END,
          pe.found,
          coalesce(x.last_seq, 0),
          k.ids,
          CASE WHEN e.body_sha256 IS NULL THEN e.content END,
          CASE WHEN x.id IS NULL THEN EXISTS (
            SELECT 1 FROM erasures WHERE tenant = %(t)s AND session_id = %(s)s) ELSE false END,
          u.under, g.parents
        FROM (SELECT 1) one
        LEFT JOIN sessions x ON x.tenant = %(t)s AND x.id = %(s)s
        LEFT JOIN messages e ON e.tenant = %(t)s AND e.session_id = %(s)s AND e.id = %(m)s
        CROSS JOIN LATERAL (SELECT %(p)s::text IS NOT NULL AND EXISTS (
            SELECT 1 FROM messages WHERE tenant = %(t)s AND session_id = %(s)s AND id = %(p)s) AS found OFFSET 0) pe
        CROSS JOIN LATERAL (SELECT CASE WHEN %(cap)s::int IS NOT NULL THEN (
            SELECT coalesce(array_agg(k.id), '{{}}') FROM (
              SELECT id FROM messages WHERE tenant = %(t)s AND session_id = %(s)s LIMIT %(cap)s::int + 1) k)
          END AS ids OFFSET 0) k
        CROSS JOIN LATERAL (SELECT CASE WHEN NOT coalesce(x.single_branch, true) AND cardinality(k.ids) <= %(cap)s THEN
            ARRAY(SELECT DISTINCT parent_id FROM messages WHERE tenant = %(t)s AND session_id = %(s)s
              AND parent_id IS NOT NULL)
          END AS parents) g
        CROSS JOIN LATERAL (SELECT ARRAY(SELECT DISTINCT unnest(array_remove(ARRAY[CASE WHEN %(lp)s THEN x.leaf_id END,
            CASE WHEN pe.found THEN %(p)s END] || %(cp)s::text[], NULL))) AS ids) q
        CROSS JOIN LATERAL (SELECT CASE WHEN e.id IS NULL AND cardinality(q.ids) > 0
            AND NOT coalesce(x.single_branch, true) AND EXISTS (
              SELECT 1 FROM messages WHERE tenant = %(t)s AND session_id = %(s)s AND parent_id = %(m)s)
          THEN ({_UNDER}) END AS under) u
        """,
        {
            "t": tenant,
            "s": session,
            "m": message_id,
            "p": parent_id,
            "leaf": want_leaf,
            "cap": ids_cap,
            "lp": leaf_parent,
            "cp": list(dict.fromkeys(chain_parents)),
        },
    )
    row = await cur.fetchone()
    assert row is not None
    ids = list(row[7]) if row[7] is not None and ids_cap is not None and len(row[7]) <= ids_cap else None
    # a row stores its hash only when it is not its body's own (migration 019): derived here, on
    # the rare append of an id that exists
    sha = row[3] if row[8] is None else body_hash(json.loads(row[8]))
    under = list(row[10]) if row[10] is not None else None
    dangling: list[str] | None = None
    if ids is not None:
        held = set(ids)
        dangling = [p for p in row[11] or () if p not in held]
    return AppendState(
        bool(row[0]), row[1], row[2], sha, row[4], bool(row[5]), int(row[6]), ids, bool(row[9]), under, dangling
    )


async def descends_from(conn: Conn, tenant: str, session: str, message_id: str, ancestor: str) -> bool:
    """Whether ``message_id`` is under ``ancestor`` (a child of it, or of one of its descendants).

    Walked down from ``ancestor`` (its children by the parent index, theirs, …) until
    ``message_id`` is reached: asked by a batch's next message when another writer's message
    became the latest leaf, where ``ancestor`` is the batch's previous message, just appended,
    whose subtree is the few messages written since (walking up from the leaf would read its
    whole path). UNION: a stored cycle ends the walk, each message read at most once."""
    cur = await conn.execute(
        """
        WITH RECURSIVE d(id) AS (
          SELECT id FROM messages WHERE tenant = %(t)s AND session_id = %(s)s AND parent_id = %(a)s
          UNION
          SELECT c.id FROM d CROSS JOIN LATERAL (
            SELECT id FROM messages WHERE tenant = %(t)s AND session_id = %(s)s AND parent_id = d.id OFFSET 0) c)
        SELECT EXISTS (SELECT 1 FROM d WHERE id = %(m)s)
        """,
        {"t": tenant, "s": session, "a": ancestor, "m": message_id},
    )
    row = await cur.fetchone()
    return bool(row and row[0])


_PAGE_COLS = "id, parent_id, role, body_sha256, created_at, seq, original_ref"
TREE_PAGE = pages.page_sql(_PAGE_COLS, "content", "messages", "seq")
"""A page of every message of a session (:func:`tree_page`): :func:`pages.page_params`."""
CHILDREN_PAGE = pages.page_sql(_PAGE_COLS, "content", "messages", "seq", "parent_id = %(m)s")
"""A page of a message's children (:func:`children_page`): :func:`pages.page_params` and ``m``."""


async def _message_page(conn: Conn, sql: str, params: dict[str, Any], limit: int) -> tuple[list[MessageRow], bool]:
    cur = await conn.execute(sql, params)
    rows, more = pages.cut(await cur.fetchall(), limit)
    return [MessageRow(i, p, r, body, sha, at, q, ref) for i, p, r, sha, at, q, ref, body in rows], more


async def children_page(
    conn: Conn, tenant: str, session: str, message_id: str, after_seq: int, limit: int
) -> tuple[list[MessageRow], bool]:
    """A page of the message's children in append order: those appended after ``after_seq``, at
    most ``limit`` and ending early at :data:`~projections.pages.PAGE_BYTES` of bodies; and
    whether more follow."""
    params = pages.page_params(tenant, session, after_seq, limit) | {"m": message_id}
    return await _message_page(conn, CHILDREN_PAGE, params, limit)


async def tree_page(conn: Conn, tenant: str, session: str, after_seq: int, limit: int) -> tuple[list[MessageRow], bool]:
    """A page of every message of the session, every branch, in append order (the whole tree a
    page at a time): those appended after ``after_seq``, at most ``limit`` and ending early at
    :data:`~projections.pages.PAGE_BYTES` of bodies; and whether more follow."""
    return await _message_page(conn, TREE_PAGE, pages.page_params(tenant, session, after_seq, limit), limit)


async def history(conn: Conn, tenant: str, session: str, leaf_id: str) -> list[MessageRow]:
    """Root-to-``leaf_id`` path, root first; an unknown leaf gives ``[]``.

    A deleted ancestor ends the path there (children keep their parent id, as the reference).
    """
    return await _path_rows(conn, tenant, session, leaf_id, _MESSAGE_COLS, MessageRow._make)


async def path_contents(conn: Conn, tenant: str, session: str, leaf_id: str) -> list[PathRow]:
    """:func:`history` with only ids and bodies: what a history read serves (:func:`path_from`)."""
    return (await path_from(conn, tenant, session, leaf_id))[1]


async def path_ids(conn: Conn, tenant: str, session: str, leaf_id: str) -> tuple[list[str], int]:
    """(the path's ids leaf first, the session's message count): the tree is walked in Python
    over the session's (id, parent_id) pairs, one narrow scan instead of one index probe per
    step; a repeated id (possible only after a delete and a re-append) ends the walk."""
    cur = await conn.execute(
        "SELECT id, parent_id FROM messages WHERE tenant = %s AND session_id = %s", (tenant, session)
    )
    return _walk(dict(await cur.fetchall()), leaf_id)


def _walk(parent: dict[str, str | None], leaf_id: str) -> tuple[list[str], int]:
    ids: list[str] = []
    seen: set[str] = set()
    node: str | None = leaf_id
    while node is not None and node in parent and node not in seen:
        ids.append(node)
        seen.add(node)
        node = parent[node]
    return ids, len(parent)


@dataclass(frozen=True, slots=True)
class SingleBranch:
    """A history read answered by :func:`single_branch`: the path is every message of the session."""

    leaf_id: str
    body: str  # the messages' stored JSON, root first, joined with ","
    count: int
    truncated: bool = False  # the path is longer: ``body`` is its recent end, ``limit`` messages


_SINGLE_BRANCH_SQL = """
WITH st AS MATERIALIZED (
  SELECT x.leaf_id AS leaf, coalesce(x.single_branch, false) AS single,
    (%(q)s::bigint IS NULL OR coalesce(x.last_seq >= %(q)s, false)
      OR EXISTS (SELECT 1 FROM checkpoints WHERE name = ANY(%(n)s) AND seq >= %(q)s)) AS fresh,
    %(ov)s AND EXISTS (SELECT 1 FROM overlays o WHERE o.tenant = %(t)s AND o.session_id = %(s)s) AS has_ov,
    EXISTS (SELECT 1 FROM reclaimed_outputs r WHERE r.tenant = %(t)s AND r.session_id = %(s)s) AS has_rc
  FROM (SELECT 1) one LEFT JOIN sessions x ON x.tenant = %(t)s AND x.id = %(s)s
)
SELECT st.leaf, m.content
FROM st LEFT JOIN LATERAL (
  SELECT content FROM chronicle_newest_messages(%(t)s, %(s)s, %(lim)s) AS content  -- newest first, its plan fixed (034)
  WHERE st.single AND st.fresh AND NOT st.has_rc AND NOT st.has_ov AND st.leaf IS NOT NULL
    AND (%(l)s::text IS NULL OR %(l)s = st.leaf)
) m ON true
"""
# When every message is the child of the one appended before it (``sessions.single_branch``, kept
# by the projector in the transaction that writes the rows), the newest is the session's only
# leaf, which is the latest leaf it keeps: the path to it is every message, in append order.


async def single_branch(
    conn: Conn,
    tenant: str,
    session: str,
    leaf_id: str | None,
    *,
    min_seq: int | None,
    checkpoints: Sequence[str],
    limit: int,
    overlays: bool,
) -> SingleBranch | None:
    """A history read in one statement (one snapshot, no transaction), when the session is a
    single branch (``sessions.single_branch``: its messages in append order each the child of
    the one before, the first a root) and the leaf asked for (``leaf_id``, or the latest leaf)
    is its newest message: the newest ``limit`` messages, ``truncated`` when there are more (the
    recent end, as :func:`path_from` with ``want`` gives it), read newest first and no further.
    None when the read needs :func:`path_from` and the overlays and unloaded outputs instead:
    another shape or leaf, none, a summary overlay (``overlays``: they are applied), an unloaded
    skill output, or a state older than ``min_seq`` (by the projector's ``checkpoints``, as
    :meth:`AppliedWaiter.send_applied_check`)."""
    cur = await conn.execute(
        _SINGLE_BRANCH_SQL,
        {
            "t": tenant,
            "s": session,
            "q": min_seq or None,
            "n": list(checkpoints),
            "ov": overlays,
            "lim": limit + 1,
            "l": leaf_id,
        },
    )
    rows = await cur.fetchall()
    if not rows or rows[0][1] is None:
        return None
    kept = rows[:limit]
    kept.reverse()  # root first
    return SingleBranch(str(rows[0][0]), ",".join([r[1] for r in kept]), len(kept), truncated=len(rows) > limit)


async def warm_reads(conn: Conn) -> None:
    """Run the statements every history read and append starts with once, for a session that
    cannot exist (ids are never empty), so that a new connection's first real request does not
    pay its server backend's first use of these tables and indexes (measured: 2.3-5 ms for the
    first single-branch read of a new connection, 0.6-0.8 ms once warm). Best effort: a
    connection that cannot run them (a schema not migrated yet) is served as it is."""
    with contextlib.suppress(psycopg.Error):
        await single_branch(conn, "", "", None, min_seq=None, checkpoints=[""], limit=1, overlays=True)
        await append_state(conn, "", "", "", "", want_leaf=True, ids_cap=1, leaf_parent=True)


PATH_PAGE = 2_000
"""Messages read per round trip by :func:`path_from`, newest first."""
LINKS_PER_ROW = 5
"""Rows without their bodies (:func:`path_from` without ``bodies``) read per round trip for each
message a page with bodies reads."""
_PATH_PAGE_SQL = "SELECT id, parent_id, content, seq FROM chronicle_messages_below(%s, %s, %s, %s)"  # migration 034
_PATH_LINKS_SQL = "SELECT id, parent_id, '', seq FROM chronicle_message_links_below(%s, %s, %s, %s)"  # migration 036


async def path_from(
    conn: Conn, tenant: str, session: str, leaf_id: str | None, want: int | None = None, *, bodies: bool = True
) -> tuple[str | None, list[PathRow]]:
    """(the leaf, the ids and bodies of the path to it, root first); ``leaf_id`` None: the latest leaf.
    Without ``bodies``, the ids alone (each row's ``content`` empty): the session's rows are read
    without their bodies, for a reader that loads the few it shows (:func:`bodies_of`).

    The session's messages are read newest first, a page at a time, and the path is walked
    as they come: a path is usually the newest messages (an agent appends under the latest
    leaf), so a session of up to :data:`PATH_PAGE` messages takes one round trip, sent with the
    leaf's query (and, in pipeline mode, with whatever the caller sent before). A walk that
    leaves the pages read so far reads the next (older) one; a parent missing once every page
    is read (deleted) or a repeated id ends the path. With ``want``, only the path's newest
    ``want`` rows (its recent end): the walk stops there, so a read of the recent end of a long
    session reads about ``want`` rows, not the whole path."""
    leaf_cur = (
        await conn.execute("SELECT leaf_id FROM sessions WHERE tenant = %s AND id = %s", (tenant, session))
        if leaf_id is None
        else None
    )
    page = PATH_PAGE if bodies else PATH_PAGE * LINKS_PER_ROW
    first = page if want is None else min(page, want + 1)  # a recent end: about what it needs
    page_sql = _PATH_PAGE_SQL if bodies else _PATH_LINKS_SQL
    cur = await conn.execute(page_sql, (tenant, session, 2**63 - 1, first))
    if leaf_cur is not None:
        row = await leaf_cur.fetchone()
        leaf_id = row[0] if row else None
    rows, size = await cur.fetchall(), first
    if leaf_id is None:
        return None, []
    path: list[PathRow] = []
    seen: set[str] = set()
    parent: dict[str, str | None] = {}
    content: dict[str, tuple[str, int]] = {}
    node: str | None = leaf_id
    enough = want if want is not None else -1
    while True:
        start = 0
        if not parent:  # the usual shape: the page's rows are the path, newest first
            for mid, pid, body, seq in rows:
                if mid != node or mid in seen or len(path) == enough:
                    break
                path.append(PathRow(mid, body, seq))
                seen.add(mid)
                node = pid
                start += 1
        for mid, pid, body, seq in rows[start:]:
            parent[mid] = pid
            content[mid] = (body, seq)
        while node is not None and node in parent and node not in seen and len(path) != enough:
            path.append(PathRow(node, *content[node]))
            seen.add(node)
            node = parent[node]
        if node is None or node in seen or len(rows) < size or len(path) == enough:
            break
        cur = await conn.execute(page_sql, (tenant, session, rows[-1][3], page))
        size = page
        rows = await cur.fetchall()
    path.reverse()
    return leaf_id, path


_MESSAGES_AT_SQL = "SELECT seq, content FROM chronicle_messages_at(%s, %s, %s)"  # migration 036


async def bodies_of(conn: Conn, tenant: str, session: str, rows: list[PathRow]) -> list[PathRow]:
    """``rows`` (walked without their bodies: :func:`path_from`) with their stored bodies, in
    that order (a row the session no longer holds is left out). Read by sequence: the session's
    rows below the newest of them, as many as they are (they usually are those rows: the recent
    end of a branch), then any not among those one by one (``chronicle_messages_at``, migration
    036). Asked by id, a planner without statistics may take ``messages_by_seq`` for the key and
    filter the session for each."""
    if not rows:
        return []
    needed = {r.seq for r in rows}
    cur = await conn.execute(_PATH_PAGE_SQL, (tenant, session, max(needed) + 1, len(needed)))
    found = {seq: body for _, _, body, seq in await cur.fetchall() if seq in needed}
    if missing := [seq for seq in needed if seq not in found]:
        cur = await conn.execute(_MESSAGES_AT_SQL, (tenant, session, missing))
        found.update(await cur.fetchall())
    return [PathRow(r.id, found[r.seq], r.seq) for r in rows if r.seq in found]


_PATH_STATS_SQL = (
    "SELECT (SELECT leaf_id FROM sessions WHERE tenant = %(t)s AND id = %(s)s), "
    "id, parent_id, role, octet_length(content) FROM messages WHERE tenant = %(t)s AND session_id = %(s)s"
)


async def path_stats(conn: Conn, tenant: str, session: str, leaf_id: str | None) -> tuple[str | None, list[RowStat]]:
    """(the leaf, the ``(id, role, bytes)`` of the path to it, root first); ``leaf_id`` None: the
    latest leaf. One statement (one snapshot) over the session's rows that carries no body:
    ``octet_length`` of a stored body is its size as kept, read without de-TOASTing it. The
    path is walked as :func:`path_from` walks it (a missing parent or a repeated id ends it),
    so the sizes are those of the bodies a history read serves, what its ``max_bytes`` counts."""
    cur = await conn.execute(_PATH_STATS_SQL, {"t": tenant, "s": session})
    rows = await cur.fetchall()
    if not rows:
        return None, []
    leaf = leaf_id if leaf_id is not None else rows[0][0]
    by_id = {row[1]: row for row in rows}
    path: list[RowStat] = []
    seen: set[str] = set()
    node: str | None = leaf
    while node is not None and node in by_id and node not in seen:
        _, mid, parent, role, size = by_id[node]
        path.append(RowStat(mid, role, size))
        seen.add(mid)
        node = parent
    path.reverse()
    return (leaf if path else None), path


async def _path_rows(
    conn: Conn, tenant: str, session: str, leaf_id: str, cols: str, make: Callable[[Any], T]
) -> list[T]:
    ids, total = await path_ids(conn, tenant, session, leaf_id)
    return await _rows_of(conn, tenant, session, ids, total, cols, make)


async def _rows_of(
    conn: Conn, tenant: str, session: str, ids: list[str], total: int, cols: str, make: Callable[[Any], T]
) -> list[T]:
    """The rows of a walked path (``ids`` leaf first), root first."""
    if not ids:
        return []
    if 2 * len(ids) >= total:  # most of the session: one sequential read beats a probe per id
        cur = await conn.execute(
            f"SELECT {cols} FROM messages WHERE tenant = %s AND session_id = %s", (tenant, session)
        )
    else:
        cur = await conn.execute(by_ids_sql(cols), (ids, tenant, session))
    by_id = {row[0]: row for row in await cur.fetchall()}
    out: list[T] = []
    for i in ids:  # leaf first: an ancestor deleted since the walk ends the path there
        if i not in by_id:
            break
        out.append(make(by_id[i]))
    out.reverse()
    return out


async def path_length(conn: Conn, tenant: str, session: str, leaf_id: str) -> int:
    """Rows on the path (no overlays applied); walks ids only, never the bodies."""
    return len((await path_ids(conn, tenant, session, leaf_id))[0])


async def search(
    conn: Conn, tenant: str, session: str | None, query: str, limit: int, timeout_s: float = SEARCH_TIMEOUT_S
) -> list[SearchHit]:
    """Every part of the query must match (:mod:`projections.search_query`: words in any order,
    phrases, prefixes; stop words are words); ranked by BM25 over the scope; snippet per hit.
    Its statements run at most ``timeout_s`` (:class:`~projections.search_bound.SearchTimedOut`).

    Ranking is bounded: at most ``SEARCH_CANDIDATES`` newest matches are ranked (document
    frequencies of a query of several words from the scope's newest ``SEARCH_SAMPLE`` messages),
    so a very common word costs about what a rare one does.
    """
    parts = sq.parse(query)
    if not parts:
        return []
    async with bounded(conn, timeout_s):
        return await _search(conn, tenant, session, parts, limit)


SEARCH_WINDOW = 20_000
"""Newest messages of the scope read first, in ``seq`` order, for the candidates: where they hold
``SEARCH_CANDIDATES`` matches (a common word), those are the newest matches and nothing else is
read; otherwise every match of the scope is (the word index), as before."""

_COLS = "m.session_id, m.id, m.role, m.content, m.text_bytes, m.content_tsv, m.created_at, m.seq"
_SCOPE = "m.tenant = %(t)s AND (%(s)s::text IS NULL OR m.session_id = %(s)s)"
# The newest window's plan is fixed, never a planner's guess from statistics (autovacuum may be
# off: with none, Postgres read every row of the tenant by its bitmap and sorted them): an index
# scan newest first, which stops at the candidates.
_PLAN_FIXED = (
    "SELECT set_config('enable_bitmapscan', 'off', true), set_config('enable_sort', 'off', true), "
    "set_config('enable_seqscan', 'off', true)"
)
_PLAN_FREE = "RESET enable_bitmapscan; RESET enable_sort; RESET enable_seqscan"


def newest_matches_sql(parts: list[sq.Part]) -> str:
    """The scope's newest ``cand`` matches among its newest ``window`` messages, (session, id)."""
    match = sq.match_sql(parts)
    return f"""
        SELECT r.session_id, r.id FROM (
            SELECT m.session_id, m.id, m.seq, m.content_tsv FROM messages m
            WHERE {_SCOPE} ORDER BY m.seq DESC LIMIT %(window)s
        ) r
        WHERE numnode({match}) > 0 AND r.content_tsv @@ {match}
        ORDER BY r.seq DESC
        LIMIT %(cand)s
    """


def search_sql(parts: list[sq.Part], *, newest: bool) -> str:
    """The search statement (:func:`search`'s, parameters as it passes them). ``newest``: the
    candidates are the messages named by ``ns``/``ni`` (what :func:`newest_matches_sql` found,
    each read by its key); otherwise the scope's newest ``cand`` matches by the word index."""
    match = sq.match_sql(parts)
    sample = f"SELECT m.content_tsv FROM messages m WHERE {_SCOPE} ORDER BY m.seq DESC LIMIT %(sample)s"
    cand = (
        f"""SELECT {_COLS} FROM unnest(%(ns)s::text[], %(ni)s::text[]) AS f(session_id, id)
                CROSS JOIN LATERAL (SELECT * FROM messages m
                  WHERE m.tenant = %(t)s AND m.session_id = f.session_id AND m.id = f.id
                    AND m.content_tsv @@ {match} OFFSET 0) m"""
        if newest
        else f"""SELECT {_COLS}
                FROM messages m
                WHERE {_SCOPE} AND numnode({match}) > 0 AND m.content_tsv @@ {match}
                ORDER BY m.seq DESC
                LIMIT %(cand)s"""
    )
    return f"""
            WITH cand AS MATERIALIZED (
                {cand}
            ),
            scored AS MATERIALIZED (  -- each frequency computed once, for the candidates only
                SELECT c.session_id, c.id, c.role, c.content, c.created_at, c.seq,
                       c.text_bytes::float8 AS len, {sq.tf_sql(parts, "c.content_tsv")}
                FROM cand c
            ),
            {sq.stats_sql(parts, sample)},
            ranked AS (
                SELECT scored.*, {sq.bm25_sql(parts, "scored.len", "stats", "scored")} AS rank
                FROM scored, stats
                ORDER BY rank DESC, scored.seq DESC LIMIT %(limit)s
            )
            SELECT r.session_id, r.id, r.role, t.text AS content,
                   chronicle_search.folded_snippet(%(cfg)s::regconfig, t.text, {match}) AS snippet,
                   r.rank::float8 AS rank, r.created_at
            FROM ranked r  -- the text is not stored (migration 017): derived for the hits only
            CROSS JOIN LATERAL (SELECT chronicle_search.message_text(r.content) AS text) t
            ORDER BY r.rank DESC, r.seq DESC
            """


async def _search(conn: Conn, tenant: str, session: str | None, parts: list[sq.Part], limit: int) -> list[SearchHit]:
    """Inside :func:`~projections.search_bound.bounded`'s transaction (the plan settings are local
    to it). The candidates are the scope's newest :data:`SEARCH_CANDIDATES` matches: looked for
    in its newest :data:`SEARCH_WINDOW` messages first, and only when fewer are there, in every
    match (earlier always: a word in 105,000 of a tenant's 206,000 messages took 525 ms)."""
    config = await search_languages.config_of(conn, tenant)  # the one its rows were indexed with
    params = {
        "t": tenant,
        "s": session,
        "window": SEARCH_WINDOW,
        "cand": SEARCH_CANDIDATES,
        "sample": SEARCH_SAMPLE,
        "limit": limit,
        **sq.params(parts, config),
    }
    await conn.execute(_PLAN_FIXED)
    found = await (await conn.execute(newest_matches_sql(parts), params)).fetchall()
    await conn.execute(_PLAN_FREE)
    newest = len(found) >= SEARCH_CANDIDATES
    if newest:
        params |= {"ns": [r[0] for r in found], "ni": [r[1] for r in found]}
    async with conn.cursor(row_factory=class_row(SearchHit)) as cur:
        await cur.execute(search_sql(parts, newest=newest), params)
        return await cur.fetchall()


async def checkpoints(conn: Conn) -> dict[str, int]:
    cur = await conn.execute("SELECT name, seq FROM checkpoints")
    return {str(name): int(seq) for name, seq in await cur.fetchall()}
