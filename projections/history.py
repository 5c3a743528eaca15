"""History projection: sessions registry and the message tree (with its FTS vector).

Pure core: :func:`plan` turns one event (and its resolved body) into row operations.
Thin shell: :func:`apply_ops` runs them on a connection inside the caller's transaction.
Every operation is idempotent given the checkpoint: an append of an existing id keeps the first
body, as the reference's contract says.

Reference: the Cloudflare Agents SDK Session API, §1.3 and §5 of docs/reference.md.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from psycopg import AsyncConnection, AsyncCursor

from events.blobs import BlobStore
from events.bodies import unpack_body
from events.catalog import (
    CompactionRecorded,
    MessageAppended,
    MessageBodyEvent,
    MessagesCleared,
    MessagesDeleted,
    MessageUpdated,
    SessionCreated,
    SessionDeleted,
    SessionEnded,
    SessionErased,
    SessionRenamed,
    SessionUsageAdded,
    overlay_id_in,
)
from events.envelope import Event
from events.ids import TENANT_SCOPE
from events.messages import JsonObject, body_hash, stored_json, text_of
from events.sealing import KeyLookup
from projections.search_query import CONFIG

NAME = "history"


@dataclass(frozen=True, slots=True)
class TouchSession:
    """Every event: make sure the session row exists and record the event's sequence."""

    tenant: str
    session: str
    at: datetime
    seq: int
    created_at: datetime
    created_seq: int


@dataclass(frozen=True, slots=True)
class CreateSession:
    tenant: str
    session: str
    name: str
    parent_session_id: str | None
    metadata: dict[str, Any]


@dataclass(frozen=True, slots=True)
class RenameSession:
    tenant: str
    session: str
    name: str


@dataclass(frozen=True, slots=True)
class AddUsage:
    """Add to the counters once per event id (``usage_applied``, migration 021)."""

    tenant: str
    session: str
    input_tokens: int
    output_tokens: int
    cost: float
    event_id: str
    seq: int


@dataclass(frozen=True, slots=True)
class EndSession:
    tenant: str
    session: str
    reason: str


@dataclass(frozen=True, slots=True)
class DeleteSession:
    tenant: str
    session: str
    at: datetime


@dataclass(frozen=True, slots=True)
class EraseSession:
    """The session's row and messages go (the log keeps only tombstones of them)."""

    tenant: str
    session: str


@dataclass(frozen=True, slots=True)
class InsertMessage:
    tenant: str
    session: str
    id: str
    parent_id: str | None
    role: str
    content: str
    body_sha256: str | None  # None when it is the stored body's own (:func:`row_hash`)
    text: str
    at: datetime
    seq: int
    original_ref: str | None = None
    # its id has the overlays' prefix, and whether an overlay recorded before it reads under it is
    # the overlays table's to say (:func:`summaries_in`, :func:`settle_summaries`)
    summary_check: bool = False


@dataclass(frozen=True, slots=True)
class LeaveOutSummary:
    """An append of a summary's id left out (:func:`summaries_in`): the parent it was appended
    under is kept (``left_out_summaries``, the first append's), for the messages appended under
    it to be stored under that parent instead (:func:`settle_summaries`)."""

    tenant: str
    session: str
    id: str
    parent_id: str | None
    seq: int


@dataclass(frozen=True, slots=True)
class UpdateMessage:
    tenant: str
    session: str
    id: str
    role: str
    content: str
    body_sha256: str | None
    text: str
    seq: int


@dataclass(frozen=True, slots=True)
class DeleteMessages:
    tenant: str
    session: str
    ids: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class ClearMessages:
    tenant: str
    session: str


Op = (
    TouchSession
    | CreateSession
    | RenameSession
    | AddUsage
    | EndSession
    | DeleteSession
    | EraseSession
    | InsertMessage
    | LeaveOutSummary
    | UpdateMessage
    | DeleteMessages
    | ClearMessages
)


store_json = stored_json


def row_hash(event_hash: str, body: JsonObject, *, own: bool = False) -> str | None:
    """What a row stores of its message's hash: nothing when it is the stored body's own, which
    :func:`projections.queries.append_state` derives on the rare re-append of an id (migration
    019: 65 B a row); the event's when it is not (an over-cap message's is its original's).
    ``own``: ``event_hash`` is known to be ``body``'s own (:func:`hash_is_own`), so the body is
    not hashed again (its canonical JSON and SHA-256: ~6-12 µs a 1 KB body, ~45-110 µs a 14 KB one)."""
    return None if own or event_hash == body_hash(body) else event_hash


def hash_is_own(event: MessageBodyEvent, body: JsonObject, admitted: bool) -> bool:
    """Whether ``event.body_sha256`` is known, without hashing, to be ``body``'s own: the event was
    admitted (:func:`events.admission.admit`), ``body`` is its inline message, and it has no
    ``original_ref``. Admission then either derived the hash from that body (the compact JSON
    left it out) or refused the event unless the body hashes to it (a sealed event, whose hash is
    always written, included). A claim-checked body (fetched: admission checks its bytes against
    the reference, not its hash against ``body_sha256``), an over-cap message (its hash is its
    original's) and an event nobody admitted are hashed."""
    return (
        admitted
        and event.message is not None
        and body is event.message
        and getattr(event, "original_ref", None) is None
    )


def summaries_in(items: Sequence[tuple[int, Event]]) -> dict[int, bool]:
    """What the events ``items`` (in stream order) say of their appends whose id is an overlay's
    message id (``compaction_<overlay id>``, as history shows a summary), by sequence: True when an
    overlay of its session recorded before it in ``items`` (after any clear or deletion of the
    session there) has that id: the append is not stored, history shows the summary there (a
    client's, or a direct publisher's, replay of it, or another body under its id: the first
    holder of an id keeps it, as for messages); False when its session was cleared or deleted
    before it in ``items`` and no overlay since has the id: the overlays recorded before the items
    are gone, so it is stored. Absent: the overlays table decides (:func:`settle_summaries`),
    as it holds the overlays recorded before the items. Pure: the same events decide the same
    in every batch they are cut into, so a rebuild equals the live read model."""
    recorded: dict[tuple[str, str], set[str]] = {}
    cleared: set[tuple[str, str]] = set()
    out: dict[int, bool] = {}
    for seq, event in items:
        key = (event.tenant, event.session)
        match event:
            case CompactionRecorded():
                recorded.setdefault(key, set()).add(event.overlay_id)
            case MessagesCleared() | SessionDeleted() | SessionErased():
                recorded.pop(key, None)
                cleared.add(key)
            case MessageAppended() if (overlay_id := overlay_id_in(event.message_id)) is not None:
                if overlay_id in recorded.get(key, ()):
                    out[seq] = True
                elif key in cleared:
                    out[seq] = False
            case _:
                pass
    return out


def _seq_of(item: tuple[int, Event]) -> int:
    return item[0]


async def settle_summaries(cur: AsyncCursor[Any], ops: Sequence[Op]) -> list[Op]:
    """``ops`` with the appends of a summary's id left out, and every message appended under one
    stored under the parent it was appended under instead, in order.

    An insert whose id an overlay recorded before it reads under (only those :func:`summaries_in`
    left to the overlays table are asked about: rare) is left out as the ones it decided are
    (:class:`LeaveOutSummary`). An earlier release stored such a summary, sent back by a client,
    as a message, and the messages appended after it name it as their parent: each such parent
    is replaced by the one the summary was appended under (the first append of its id, resolved
    the same way, so a chain of summaries is followed), from this batch's ops or, for a summary
    left out in an earlier batch, ``left_out_summaries`` (asked only about parents with the
    overlays' prefix: rare). A clear, deletion or erasure of the session forgets its summaries,
    as it clears their table. The same log gives the same rows in any batches it is cut into,
    so a rebuild equals the live read model."""
    known: dict[tuple[str, str, str], str | None] = {}  # left-out summaries: their (resolved) parent
    absent: set[tuple[str, str, str]] = set()  # asked of the table, not there
    cleared: set[tuple[str, str]] = set()  # the table's rows of these sessions are gone in this batch

    async def left_out(key: tuple[str, str, str]) -> bool:
        if key in known:
            return True
        if key in absent or key[:2] in cleared:
            return False
        await cur.execute(
            "SELECT parent_id FROM left_out_summaries WHERE tenant = %s AND session_id = %s AND id = %s", key
        )
        row = await cur.fetchone()
        if row is None:
            absent.add(key)
            return False
        known[key] = row[0]
        return True

    async def parent_of(tenant: str, session: str, parent: str | None) -> str | None:
        if parent is None or overlay_id_in(parent) is None:
            return parent
        key = (tenant, session, parent)
        return known[key] if await left_out(key) else parent

    out: list[Op] = []
    for op in ops:
        match op:
            case InsertMessage(summary_check=True):
                await cur.execute(
                    "SELECT 1 FROM overlays WHERE tenant = %s AND session_id = %s AND overlay_id = %s AND seq < %s",
                    (op.tenant, op.session, overlay_id_in(op.id), op.seq),
                )
                if await cur.fetchone() is not None:
                    op = LeaveOutSummary(op.tenant, op.session, op.id, op.parent_id, op.seq)
        match op:
            case LeaveOutSummary():
                op = replace(op, parent_id=await parent_of(op.tenant, op.session, op.parent_id))
                key = (op.tenant, op.session, op.id)
                if not await left_out(key):
                    known[key] = op.parent_id
                    absent.discard(key)
            case InsertMessage() if op.parent_id is not None and overlay_id_in(op.parent_id) is not None:
                op = replace(op, parent_id=await parent_of(op.tenant, op.session, op.parent_id))
            case ClearMessages() | DeleteSession() | EraseSession():
                cleared.add((op.tenant, op.session))
                for key in [k for k in known if k[:2] == (op.tenant, op.session)]:
                    del known[key]
            case _:
                pass
        out.append(op)
    return out


def plan(
    event: Event,
    seq: int,
    body: JsonObject | None = None,
    *,
    admitted: bool = False,
    summary: bool | None = None,
) -> list[Op]:
    """Row operations for one event at stream sequence ``seq``; ``body`` is the resolved body.
    ``admitted``: the contract admitted ``event`` (:func:`hash_is_own`; a projector's events all
    are); else a body's hash is checked against it by hashing. ``summary``: what
    :func:`summaries_in` says of an append (True: an overlay's message id, not stored, the parent
    it was appended under kept; None: the overlays table says, for an id with their prefix)."""
    t, s = event.tenant, event.session
    if isinstance(event, SessionErased):
        return [EraseSession(t, s)]  # no touch: the session's row must not come back
    ops: list[Op] = [TouchSession(t, s, event.occurred_at, seq, event.occurred_at, seq)]
    if s == TENANT_SCOPE:
        return ops  # the tenant-scope row only tracks how far tenant-level events are applied
    match event:
        case SessionCreated():
            ops.append(CreateSession(t, s, event.name, event.parent_session_id, dict(event.metadata)))
        case SessionRenamed():
            ops.append(RenameSession(t, s, event.name))
        case SessionUsageAdded():
            ops.append(AddUsage(t, s, event.input_tokens, event.output_tokens, event.cost, event.id, seq))
        case SessionEnded():
            ops.append(EndSession(t, s, event.reason))
        case SessionDeleted():
            ops.append(DeleteSession(t, s, event.occurred_at))
        case MessageAppended() if summary is not True:
            assert body is not None
            ops.append(
                InsertMessage(
                    t,
                    s,
                    event.message_id,
                    event.parent_id,
                    event.role,
                    store_json(body),
                    row_hash(event.body_sha256, body, own=hash_is_own(event, body, admitted)),
                    text_of(body),
                    event.occurred_at,
                    seq,
                    event.original_ref.model_dump_json() if event.original_ref else None,
                    summary is None and overlay_id_in(event.message_id) is not None,
                )
            )
        case MessageAppended():  # a summary's id: not stored, the parent it was appended under kept
            ops.append(LeaveOutSummary(t, s, event.message_id, event.parent_id, seq))
        case MessageUpdated():
            assert body is not None
            ops.append(
                UpdateMessage(
                    t,
                    s,
                    event.message_id,
                    event.role,
                    store_json(body),
                    row_hash(event.body_sha256, body, own=hash_is_own(event, body, admitted)),
                    text_of(body),
                    seq,
                )
            )
        case MessagesDeleted():
            ops.append(DeleteMessages(t, s, tuple(event.message_ids)))
        case MessagesCleared():
            ops.append(ClearMessages(t, s))
        case _:
            pass
    return ops


_SQL: dict[type[Any], str] = {
    CreateSession: (
        "UPDATE sessions SET name = %s, parent_session_id = %s, metadata = %s::jsonb "
        "WHERE tenant = %s AND id = %s AND deleted_at IS NULL"
    ),
    RenameSession: "UPDATE sessions SET name = %s WHERE tenant = %s AND id = %s AND deleted_at IS NULL",
    # An event id is applied once: its row in usage_applied goes in with the addition, and an id
    # already there adds nothing (each statement of a batch sees the rows of the ones before).
    # A counter saturates at the largest bigint instead of failing the projector's transaction.
    AddUsage: (
        "WITH u AS (SELECT %s::text AS t, %s::text AS s, %s::text AS eid, %s::bigint AS q, %s::bigint AS i, "
        "%s::bigint AS o, %s::double precision AS c), "
        "new AS (INSERT INTO usage_applied (tenant, session_id, event_id, seq, input_tokens, output_tokens, cost) "
        "SELECT u.t, u.s, u.eid, u.q, u.i, u.o, u.c FROM u WHERE EXISTS (SELECT 1 FROM sessions x "
        "WHERE x.tenant = u.t AND x.id = u.s AND x.deleted_at IS NULL) ON CONFLICT DO NOTHING RETURNING 1) "
        "UPDATE sessions SET input_tokens = input_tokens + least(u.i, 9223372036854775807 - input_tokens), "
        "output_tokens = output_tokens + least(u.o, 9223372036854775807 - output_tokens), "
        "estimated_cost = estimated_cost + u.c FROM u "
        "WHERE tenant = u.t AND id = u.s AND deleted_at IS NULL AND EXISTS (SELECT 1 FROM new)"
    ),
    EndSession: "UPDATE sessions SET end_reason = %s WHERE tenant = %s AND id = %s AND deleted_at IS NULL",
    DeleteSession: "UPDATE sessions SET deleted_at = %s WHERE tenant = %s AND id = %s AND deleted_at IS NULL",
    UpdateMessage: (
        "UPDATE messages SET original_ref = NULL, role = %s, content = %s, body_sha256 = %s, "
        "content_tsv = to_tsvector(search_config, chronicle_search.folded_words(v.txt)), "
        "text_bytes = octet_length(v.txt), "
        "updated_seq = %s FROM (SELECT %s::text AS txt) v WHERE tenant = %s AND session_id = %s AND id = %s"
    ),
    # the first append of a summary's id keeps its parent; of a deleted or unknown session, dropped
    LeaveOutSummary: (
        "INSERT INTO left_out_summaries (tenant, session_id, id, parent_id, seq) "
        "SELECT u.tenant, u.session_id, u.id, u.parent_id, u.seq FROM (VALUES (%s::text, %s::text, %s::text, "
        "%s::text, %s::bigint)) AS u(tenant, session_id, id, parent_id, seq) "
        "WHERE EXISTS (SELECT 1 FROM sessions x "
        "WHERE x.tenant = u.tenant AND x.id = u.session_id AND x.deleted_at IS NULL) "
        "ON CONFLICT (tenant, session_id, id) DO NOTHING"
    ),
    DeleteMessages: "DELETE FROM messages WHERE tenant = %s AND session_id = %s AND id = ANY(%s)",
    ClearMessages: (
        "WITH summaries AS (DELETE FROM left_out_summaries WHERE tenant = %s AND session_id = %s) "
        "DELETE FROM messages WHERE tenant = %s AND session_id = %s"
    ),
    EraseSession: (
        "WITH gone AS (DELETE FROM messages WHERE tenant = %s AND session_id = %s), "
        "usage AS (DELETE FROM usage_applied WHERE tenant = %s AND session_id = %s), "
        "summaries AS (DELETE FROM left_out_summaries WHERE tenant = %s AND session_id = %s) "
        "DELETE FROM sessions WHERE tenant = %s AND id = %s"
    ),
}


# A batch's merged touches go as one statement over arrays, not one Bind/Execute per session.
_TOUCH_ALL = (
    "INSERT INTO sessions (tenant, id, created_at, updated_at, created_seq, last_seq) "
    "SELECT * FROM unnest(%s::text[], %s::text[], %s::timestamptz[], %s::timestamptz[], %s::bigint[], %s::bigint[]) "
    "ON CONFLICT (tenant, id) DO UPDATE SET updated_at = excluded.updated_at, last_seq = excluded.last_seq"
)
# Inserts are copied into a temporary table and moved with one statement: COPY's row encoding
# runs in psycopg's C code, and Postgres binds no statement per row. With the touches above,
# this took the projector from ~420 to ~295 µs of Postgres CPU per 1 KB message (the plain
# executemany baseline: ~275).
_STAGE = (
    "CREATE TEMP TABLE IF NOT EXISTS history_stage (tenant text, session_id text, id text, parent_id text, "
    "role text, content text, body_sha256 text, indexed_text text, created_at timestamptz, seq bigint, "
    "original_ref text) ON COMMIT DELETE ROWS"
)
_COPY_STAGE = (
    "COPY history_stage (tenant, session_id, id, parent_id, role, content, body_sha256, indexed_text, created_at, "
    "seq, original_ref) FROM STDIN"
)
# The text itself is not stored (migration 017): its vector, with the tenant's configuration, and
# its length in bytes (BM25's document length) are. The vector is of its words (migration 024:
# words joined by punctuation are indexed as their parts, as the query side parses them), folded
# (migration 029: accents of Latin letters and compatibility forms, as the query side folds them), and of
# the text's first 100,000 characters only (migration 028: words cuts it, so that no text makes a
# vector over Postgres's 1 MiB, which refused the message).
_COLUMNS = (
    "tenant, session_id, id, parent_id, role, content, body_sha256, search_config, content_tsv, text_bytes, "
    "created_at, seq, updated_seq, original_ref"
)
_VALUES = (
    "u.tenant, u.session_id, u.id, u.parent_id, u.role, u.content, u.body_sha256, c.config, "
    "to_tsvector(c.config, chronicle_search.folded_words(u.indexed_text)), octet_length(u.indexed_text), u.created_at, "
    "u.seq, u.seq, u.original_ref::jsonb"
)
# each row's search configuration: its tenant's language, English when it has none
_WITH_CONFIG = (
    "CROSS JOIN LATERAL (SELECT coalesce((SELECT l.config FROM search_languages l WHERE l.tenant = u.tenant), "
    f"'{CONFIG}'::regconfig) AS config) c "
)
# a message of a deleted or unknown session is dropped
_OF_LIVE_SESSIONS = (
    "WHERE EXISTS (SELECT 1 FROM sessions x "
    "WHERE x.tenant = u.tenant AND x.id = u.session_id AND x.deleted_at IS NULL) "
)
_INSERT_STAGED = (
    f"INSERT INTO messages ({_COLUMNS}) SELECT {_VALUES} FROM history_stage u {_WITH_CONFIG}{_OF_LIVE_SESSIONS}"
    "ORDER BY u.seq ON CONFLICT (tenant, session_id, id) DO NOTHING"
)
_INSERT_ONE = (
    f"INSERT INTO messages ({_COLUMNS}) SELECT {_VALUES} FROM (VALUES (%s::text, %s::text, %s::text, %s::text, "
    "%s::text, %s::text, %s::text, %s::text, %s::timestamptz, %s::bigint, %s::text)) "
    "AS u(tenant, session_id, id, parent_id, role, content, body_sha256, indexed_text, created_at, seq, original_ref) "
    f"{_WITH_CONFIG}{_OF_LIVE_SESSIONS}ON CONFLICT (tenant, session_id, id) DO NOTHING"
)
# Below this many rows the temporary table's extra round trips cost more than they save.
COPY_MIN_ROWS = 32


async def insert_messages(cur: AsyncCursor[Any], ops: Sequence[InsertMessage]) -> None:
    """Insert a run of messages (a message of a deleted or unknown session is dropped)."""
    if len(ops) < COPY_MIN_ROWS:
        await cur.executemany(_INSERT_ONE, [params(op) for op in ops])
        return
    await cur.execute(_STAGE)
    await cur.execute("DELETE FROM history_stage")  # empty unless a run came earlier in this transaction
    async with cur.copy(_COPY_STAGE) as copy:
        for op in ops:
            await copy.write_row(insert_row(op))
    await cur.execute(_INSERT_STAGED)


def columns(rows: Sequence[tuple[Any, ...]]) -> list[list[Any]]:
    """Row tuples as one list per column (the arrays of an ``unnest`` statement)."""
    return [list(col) for col in zip(*rows, strict=True)]


def insert_row(op: InsertMessage) -> tuple[Any, ...]:
    """The columns of ``history_stage`` for one message (``COPY`` order)."""
    return (
        op.tenant,
        op.session,
        op.id,
        op.parent_id,
        op.role,
        op.content,
        op.body_sha256,
        op.text,
        op.at,
        op.seq,
        op.original_ref,
    )


def params(op: Op) -> tuple[Any, ...]:
    """Statement parameters of one operation (``_INSERT_ONE``'s for an insert)."""
    match op:
        case TouchSession():
            return (op.tenant, op.session, op.created_at, op.at, op.created_seq, op.seq)
        case CreateSession():
            return (op.name, op.parent_session_id, json.dumps(op.metadata), op.tenant, op.session)
        case RenameSession():
            return (op.name, op.tenant, op.session)
        case AddUsage():
            return (op.tenant, op.session, op.event_id, op.seq, op.input_tokens, op.output_tokens, op.cost)
        case EndSession():
            return (op.reason, op.tenant, op.session)
        case DeleteSession():
            return (op.at, op.tenant, op.session)
        case UpdateMessage():
            return (
                op.role,
                op.content,
                op.body_sha256,
                op.seq,
                op.text,
                op.tenant,
                op.session,
                op.id,
            )
        case DeleteMessages():
            return (op.tenant, op.session, list(op.ids))
        case LeaveOutSummary():
            return (op.tenant, op.session, op.id, op.parent_id, op.seq)
        case ClearMessages():
            return (op.tenant, op.session) * 2
        case EraseSession():
            return (op.tenant, op.session) * 4
        case InsertMessage():  # the single-row statement: the staged columns
            return insert_row(op)


def merge_touches(ops: Sequence[Op]) -> list[TouchSession]:
    """One touch per session: first event's time as creation, last event's sequence and time.

    Touches only create a missing row and advance ``updated_at``/``last_seq``, so running the
    merged touches first gives the same rows as running every touch in place.
    """
    merged: dict[tuple[str, str], tuple[TouchSession, TouchSession]] = {}
    for op in ops:
        if isinstance(op, TouchSession):
            key = (op.tenant, op.session)
            first, _ = merged.get(key, (op, op))
            merged[key] = (first, op)
    return [
        TouchSession(f.tenant, f.session, last.at, last.seq, f.created_at, f.created_seq) for f, last in merged.values()
    ]


SINGLE_BRANCH_OF = (
    "SELECT coalesce(bool_and(w.chained), true) FROM (SELECT m.parent_id IS NOT DISTINCT FROM "
    "lag(m.id) OVER (ORDER BY m.seq) AS chained FROM messages m WHERE m.tenant = u.t AND m.session_id = u.s) w"
)
"""Whether the session's messages, in append order, are one chain (each the child of the one
before, the first a root): ``sessions.single_branch``, computed from every row (``u.t``, ``u.s``)."""
_LATEST_LEAF = (
    "SELECT m.id FROM messages m WHERE m.tenant = u.t AND m.session_id = u.s AND NOT EXISTS "
    "(SELECT 1 FROM messages c WHERE c.tenant = m.tenant AND c.session_id = m.session_id AND c.parent_id = m.id) "
    "ORDER BY m.seq DESC LIMIT 1"
)
# The newest inserted message is the latest leaf (the highest sequence, and nothing can name it as
# a parent yet) unless the insert was dropped, or children of an earlier message with its id are
# still stored (a re-append after a delete): then, and after any delete or clear, the leaf is
# looked for the slow way. CASE evaluates the subquery only when it is reached.
_SET_LEAF = (
    "UPDATE sessions x SET leaf_id = CASE WHEN u.id IS NOT NULL "
    "AND EXISTS (SELECT 1 FROM messages m WHERE m.tenant = u.t AND m.session_id = u.s AND m.id = u.id "
    "AND m.seq = u.q) "
    "AND NOT EXISTS (SELECT 1 FROM messages c WHERE c.tenant = u.t AND c.session_id = u.s AND c.parent_id = u.id) "
    f"THEN u.id ELSE ({_LATEST_LEAF}) END, "
    # ``single_branch`` (on the old row: x.linear, x.leaf_id): see :func:`shape_changes`
    "single_branch = CASE WHEN u.mode IN ('appended', 'branched') AND (SELECT count(*) FROM messages m "
    "WHERE m.tenant = u.t AND m.session_id = u.s AND m.seq BETWEEN u.lo AND u.hi) = u.n "
    "THEN u.mode = 'appended' AND x.single_branch AND u.fp IS NOT DISTINCT FROM x.leaf_id "
    f"ELSE ({SINGLE_BRANCH_OF}) END "
    "FROM unnest(%s::text[], %s::text[], %s::text[], %s::bigint[], %s::text[], %s::text[], %s::bigint[], "
    "%s::bigint[], %s::int[]) AS u(t, s, id, q, mode, fp, lo, hi, n) "
    "WHERE x.tenant = u.t AND x.id = u.s"
)


def leaf_changes(ops: Sequence[Op]) -> list[tuple[str, str, str | None, int | None]]:
    """Per session whose tree the operations change: ``(tenant, session, newest insert, its seq)``,
    or ``(tenant, session, None, None)`` when something was removed (the leaf must be looked for)."""
    changes: dict[tuple[str, str], tuple[str | None, int | None]] = {}
    for op in ops:
        match op:
            case InsertMessage():
                _, newest = changes.get((op.tenant, op.session), ("", 0))
                if newest is not None and op.seq > newest:
                    changes[(op.tenant, op.session)] = (op.id, op.seq)
            case DeleteMessages() | ClearMessages() | DeleteSession():
                changes[(op.tenant, op.session)] = (None, None)
            case _:
                pass
    return [(t, s, leaf, seq) for (t, s), (leaf, seq) in sorted(changes.items())]


@dataclass(slots=True)
class _Shape:
    mode: str = "appended"  # appended | branched | recount
    first_parent: str | None = None
    expected: str | None = None
    lo: int = 0
    hi: int = 0
    n: int = 0


def shape_changes(ops: Sequence[Op]) -> dict[tuple[str, str], tuple[str, str | None, int, int, int]]:
    """Per session whose tree the operations change, how ``sessions.single_branch`` follows:
    ``(mode, first parent, lowest and highest insert sequence, inserts)``.

    ``appended``: only inserts, each the child of the one before; the session stays a single
    branch when it was one and the first insert's parent is its latest leaf (the newest message)
    before them. ``branched``: only inserts, one of them not under the one before: not a single
    branch. Either holds only when every insert was stored (the sequences ``lo..hi`` hold ``n``
    of the session's rows; an insert of an id already stored is dropped); otherwise, and after a
    delete or a clear (``recount``), the flag is computed again from every row."""
    shapes: dict[tuple[str, str], _Shape] = {}
    for op in ops:
        match op:
            case InsertMessage():
                shape = shapes.get((op.tenant, op.session))
                if shape is None:
                    shapes[(op.tenant, op.session)] = _Shape("appended", op.parent_id, op.id, op.seq, op.seq, 1)
                    continue
                if shape.mode == "appended" and op.parent_id != shape.expected:
                    shape.mode = "branched"
                shape.expected, shape.hi, shape.n = op.id, op.seq, shape.n + 1
            case DeleteMessages() | ClearMessages() | DeleteSession():
                shapes[(op.tenant, op.session)] = _Shape("recount")
            case _:
                pass
    return {k: (v.mode, v.first_parent, v.lo, v.hi, v.n) for k, v in shapes.items()}


async def apply_ops(conn: AsyncConnection[Any], ops: Sequence[Op]) -> None:
    """Apply a batch's operations: merged session touches first, then the rest in order, then
    each changed session's latest leaf.

    Consecutive operations of one kind go as one ``executemany``. A deleted session also loses
    its message rows, its applied usage ids and its left-out summaries (the log keeps them).
    """
    async with conn.cursor() as cur:
        rest = await settle_summaries(cur, [op for op in ops if not isinstance(op, TouchSession)])
        touches = sorted(merge_touches(ops), key=lambda t: (t.tenant, t.session))  # one lock order
        if touches:
            await cur.execute(_TOUCH_ALL, columns([params(t) for t in touches]))
        i = 0
        while i < len(rest):
            kind = type(rest[i])
            j = i
            while j < len(rest) and type(rest[j]) is kind:
                j += 1
            if kind is InsertMessage:
                await insert_messages(cur, [op for op in rest[i:j] if isinstance(op, InsertMessage)])
            else:
                await cur.executemany(_SQL[kind], [params(op) for op in rest[i:j]])
            if kind is DeleteSession:
                deleted = [(op.tenant, op.session) for op in rest[i:j] if isinstance(op, DeleteSession)]
                for table in ("messages", "usage_applied", "left_out_summaries"):
                    await cur.executemany(f"DELETE FROM {table} WHERE tenant = %s AND session_id = %s", deleted)
            i = j
        leaves = leaf_changes(rest)
        if leaves:
            shapes = shape_changes(rest)
            rows = [(*leaf, *shapes.get((leaf[0], leaf[1]), ("recount", None, 0, 0, 0))) for leaf in leaves]
            await cur.execute(_SET_LEAF, columns(rows))


class HistoryProjection:
    """Sessions and messages; bodies referenced by claim check are fetched before writing."""

    name = NAME

    def __init__(self, blobs: BlobStore | None = None, keys: KeyLookup | None = None) -> None:
        self._blobs = blobs
        self._keys = keys

    async def prepare(
        self, items: Sequence[tuple[int, Event]], batch: Sequence[tuple[int, Event]] | None = None
    ) -> list[list[Op]]:
        """One plan per item; claim-checked bodies are fetched here, outside any transaction. The
        items are admitted events (the runner's :class:`~projections.runner.Projection` contract):
        an inline body's hash, which admission derived or checked, is not computed again. Whether
        an append is a summary's id is decided over the whole ``batch`` the items are a slice of
        (the overlays table holds none of its overlays until it commits), in stream order."""
        plans: list[list[Op]] = []
        summaries = summaries_in(sorted(batch if batch is not None else items, key=_seq_of))
        for seq, event in items:
            body = await unpack_body(event, self._blobs, self._keys) if isinstance(event, MessageBodyEvent) else None
            plans.append(plan(event, seq, body, admitted=True, summary=summaries.get(seq)))
        return plans

    async def apply_prepared(self, conn: AsyncConnection[Any], plans: Sequence[list[Op]]) -> None:
        await apply_ops(conn, [op for ops in plans for op in ops])

    async def apply(self, conn: AsyncConnection[Any], items: Sequence[tuple[int, Event]]) -> None:
        await self.apply_prepared(conn, await self.prepare(items))
