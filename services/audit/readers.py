"""Audit and integrity over the log: replay, time travel, rebuild-and-swap, verify."""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass, field
from typing import Any

import psycopg

from events import log as eventlog
from events.admission import Refused, admit
from events.bodies import unpack_body
from events.catalog import MessageBodyEvent, SessionErased, SkillRemoved
from events.envelope import Event
from events.ids import TENANT_SCOPE
from events.messages import body_hash
from events.sealing import SEALED, KeyDestroyed, KeyLookup, kid_in, tombstone_of, unseal_fields
from events.subjects import SubjectLayout
from projections import context_queries, queries, search_languages
from projections.keystore import PgKeyStore
from projections.logbinding import (
    LogIdentity,
    LogMismatch,
    NeverBound,
    bind,
    check_log,
    database_of,
    highest_checkpoint,
    stream_identity,
)
from projections.quarantine import UNRECORDED, refusal_erased, storable_text
from projections.rebuild import (
    TABLES,
    Horizon,
    Reached,
    apply_range,
    catch_up_from,
    checksums,
    compared_rows,
    horizon_of,
    partition_horizons,
    quarantine_rows,
    rebuild_into,
    row_text,
)
from projections.runner import checkpoint_partition
from projections.search_languages import Language
from projections.timetravel import SessionState
from services.audit.quarantine import raw_text
from services.audit.shadows import held_shadow
from services.bootstrap import Container
from services.context.rules import object_key
from services.errors import AsOfPastLog
from services.storage.s3 import StoredObject
from services.terminal import safe_text

PROJECTION_TABLES: dict[str, tuple[str, ...]] = {
    "history": ("sessions", "messages", "usage_applied", "left_out_summaries"),
    "context": (
        "session_configs",
        "context_blocks",
        "search_entries",
        "skills_index",
        "loaded_skills",
        "reclaimed_outputs",
        "prompts",
    ),
    "overlays": ("overlays", "compaction_failures", "compaction_skips"),
}
PROJECTION_TABLES["all"] = tuple(t for name in ("history", "context", "overlays") for t in PROJECTION_TABLES[name])


async def session_events(
    c: Container, tenant: str, session: str, from_seq: int = 1, to_seq: int | None = None
) -> AsyncGenerator[eventlog.StoredEvent, None]:
    subject = c.layout.session_subject(tenant, session)
    await c.keys.refresh([(tenant, session)])
    async for stored in eventlog.read(c.js, c.layout, subject, from_seq, to_seq):
        if (kid := kid_in(stored.data)) is not None:  # asked again if evicted or made since (a long read)
            await c.keys.load([(tenant, session, kid)])
        yield stored


def read_event(stored: eventlog.StoredEvent, layout: SubjectLayout, keys: KeyLookup | None) -> Event | None:
    """The admitted event (sealed fields opened), None for a tombstone (an erased session's
    event: its key destroyed, or its erasure recorded; decided by the subject, so also for an
    event the contract refuses: its raw bytes are the session's; a refused event whose bytes name
    a session ``keys`` knows as erased too, as the projector decides), or :class:`Refused`."""
    try:
        event = admit(stored.data, stored.subject, layout, keys)
    except KeyDestroyed:
        return None
    except Refused:
        if keys is not None and refusal_erased(stored.subject, stored.data, layout, keys):
            return None  # a refused event of an erased session: as the projector, a tombstone
        raise
    if (
        keys is not None
        and isinstance(event, SessionErased)
        and not keys.erased(event.tenant, event.session)
        and not (isinstance(keys, PgKeyStore) and keys.proven(event))  # a proven one the projector records
    ):
        raise Refused("unrecorded_erasure", UNRECORDED)  # as the projector quarantines it
    if keys is not None and not isinstance(event, SessionErased) and keys.erased(event.tenant, event.session):
        return None
    return event


async def reached(c: Container, as_of_seq: int) -> None:
    """:class:`AsOfPastLog` unless the log has reached ``as_of_seq`` (every read as of a sequence
    asks: what it shows then never changes)."""
    last = await eventlog.last_seq(c.js, c.layout)
    if as_of_seq > last:
        raise AsOfPastLog(as_of_seq, last)


async def session_as_of(c: Container, tenant: str, session: str, as_of_seq: int) -> SessionState:
    """The session's messages as they were right after stream sequence ``as_of_seq``; events the
    contract refuses, or whose claim-checked body can never be had, are skipped, as the projector
    quarantines them. :class:`AsOfPastLog` for a sequence the log has not reached."""
    await reached(c, as_of_seq)
    state = SessionState()
    async for stored in session_events(c, tenant, session, 1, as_of_seq):
        try:
            event = read_event(stored, c.layout, c.keys)
            if event is None:  # a tombstone: nothing of an erased session is shown
                continue
            body = await unpack_body(event, c.blobs, c.keys) if isinstance(event, MessageBodyEvent) else None
        except Refused:  # BodyUnavailable included
            continue
        state.apply(stored.seq, event, body)
    return state


def stored_at(stored: eventlog.StoredEvent) -> str | None:
    """When the stream stored the event (ISO 8601, UTC): the server's clock, unlike the event's
    own ``occurred_at``, which its publisher wrote (a tenant publishing straight to the stream may
    write any time there)."""
    return stored.time.isoformat().replace("+00:00", "Z") if stored.time is not None else None


def replay_record(stored: eventlog.StoredEvent, layout: SubjectLayout, keys: KeyLookup | None) -> dict[str, Any]:
    """One replayed event as JSON: ``{"seq", "stored_at", "event"}`` (as stored, its sealed fields
    opened), for an erased session's event ``{"seq", "stored_at", "erased": <its envelope and
    ids>}``, or for an event the contract refuses ``{"seq", "stored_at", "subject", "refused":
    {"reason", "detail"}, "raw": {"text"|"base64": ...}}``."""
    head = {"seq": stored.seq, "stored_at": stored_at(stored)}
    try:
        event = read_event(stored, layout, keys)
    except Refused as exc:
        refused = {"reason": exc.reason, "detail": exc.detail}
        return {**head, "subject": stored.subject, "refused": refused, "raw": raw_text(stored.data)}
    if event is None:
        return {**head, "erased": tombstone_of(stored.data)}
    return {**head, "event": _opened(stored.data, keys)}


def _opened(data: bytes, keys: KeyLookup | None) -> dict[str, Any]:
    raw: dict[str, Any] = json.loads(data)
    return unseal_fields(raw, keys) if SEALED in raw else raw


def event_line(stored: eventlog.StoredEvent, layout: SubjectLayout, keys: KeyLookup | None) -> bytes:
    """One NDJSON line of ``GET /v1/sessions/{id}/events``: the stored bytes as they are when the
    contract admits them (always a JSON object then), with each raw CR or LF made a space (in JSON
    they can only be whitespace between tokens, which a direct publisher may write: spliced in, one
    event would be several lines; nothing else changes, where parsing and writing the event again
    would turn a number such as ``1e400`` into ``Infinity``, no JSON), written again only when its
    sealed fields are opened for the tenant; an erased session's event as its tombstone, else the
    refusal (never the raw bytes, which may not be JSON at all). Always exactly one line."""
    head = {"seq": stored.seq, "stored_at": stored_at(stored)}
    try:
        event = read_event(stored, layout, keys)
    except Refused as exc:
        refused = {"reason": exc.reason, "detail": storable_text(exc.detail)}
        return json.dumps({**head, "refused": refused}).encode() + b"\n"
    if event is None:
        return json.dumps({**head, "erased": tombstone_of(stored.data)}).encode() + b"\n"
    prefix = json.dumps(head).encode()[:-1] + b', "event": '  # the stored bytes spliced in as they are
    if b'"sealed"' in stored.data:  # the word may be anywhere (a metadata value): only a sealed event is opened
        raw: dict[str, Any] = json.loads(stored.data)
        if SEALED in raw:
            opened = json.dumps(unseal_fields(raw, keys), ensure_ascii=False, separators=(",", ":")).encode()
            return prefix + opened + b"}\n"
    if b"\n" in stored.data or b"\r" in stored.data:
        return prefix + stored.data.translate(_LINE_BREAKS_AS_SPACES) + b"}\n"
    return prefix + stored.data + b"}\n"


_LINE_BREAKS_AS_SPACES = bytes.maketrans(b"\r\n", b"  ")


def format_table_row(stored: eventlog.StoredEvent, layout: SubjectLayout, keys: KeyLookup | None) -> str:
    """One row of ``chronicle replay --format table``: its time is ``stored_at``, the stream's
    clock, as in the JSON lines (never the publisher's ``occurred_at``); its control characters
    escaped (:mod:`services.terminal`: a refusal's detail, an erased event's type are the tenant's)."""
    return safe_text(_table_row(stored, layout, keys))


def _table_row(stored: eventlog.StoredEvent, layout: SubjectLayout, keys: KeyLookup | None) -> str:
    record = replay_record(stored, layout, keys)
    head = f"{stored.seq:>8}  {record['stored_at'] or '':<32}"
    if "erased" in record:
        return f"{head}  {record['erased'].get('type', ''):<18}  ERASED"[:200]
    if "refused" in record:
        refused = record["refused"]
        return f"{head}  {'REFUSED':<18}  {refused['reason']}: {refused['detail']}"[:200]
    raw: dict[str, Any] = record["event"]
    detail = {k: v for k, v in raw.items() if k not in {"id", "type", "version", "tenant", "session", "occurred_at"}}
    for key in ("message",):
        if isinstance(detail.get(key), dict):
            detail[key] = f"<{len(json.dumps(detail[key]))} bytes>"
    return f"{head}  {raw['type']:<18}  {json.dumps(detail)[:120]}"


# -- rebuild ------------------------------------------------------------------------------


@dataclass
class RebuildReport:
    schema: str
    events: int
    seconds: float
    swapped_at_seq: int
    kept_old: str | None = None
    rebound: bool = False  # the read models belonged to another log: replaced, checkpoints reset
    first: bool = False  # the database held no read models (no checkpoint): built, checkpoints set
    stream_last_seq: int = 0  # the stream's last sequence at the swap: the projectors apply what follows the swap's
    quarantined: dict[str, int] = field(default_factory=dict)  # the quarantine after the swap, by reason


def live_horizon(c: Container, checkpoints: dict[str, int]) -> tuple[Horizon, int]:
    """How far the live projectors got: one checkpoint, or one per partition (``<name>.pNNN``)
    when partitioned projectors run; returns the horizon per subject and the highest of them."""
    name = c.settings.projector_name
    parts = [seq for n, seq in checkpoints.items() if checkpoint_partition(name, n) is not None]
    whole = checkpoints.get(name, 0)
    if not parts:
        return (lambda _subject: whole), whole
    return horizon_of(c.layout, partition_horizons(name, c.layout.partitions, checkpoints)), max([*parts, whole])


async def log_mismatch(c: Container) -> LogMismatch | None:
    """Why the read models do not belong to the stream (:func:`check_log`, recording nothing), or None."""
    async with c.pool.connection() as conn, conn.transaction():
        try:
            await check_log(conn, c.js, c.settings.stream, c.settings.projector_name, bind_empty=False)
        except LogMismatch as exc:
            return exc
    return None


async def rebuild_and_swap(
    c: Container,
    projection: str = "all",
    *,
    keep_old: bool = False,
    progress: Callable[[int, int], None] | None = None,
) -> RebuildReport:
    """Rebuild ``projection`` from sequence 1 into new tables while the old ones keep serving,
    then, under a short exclusive lock, catch up to the live checkpoints and swap atomically; the
    database is then bound to the stream it was rebuilt from (:mod:`projections.logbinding`).
    The quarantine is always rebuilt and swapped with them (keeping the live rows past the live
    checkpoint, which consumers ahead of the projector, the compactor, recorded), so a verify
    right after a rebuild compares equal.

    The new tables never hold an event past the live checkpoint of its partition (the single
    projector's, or the partitioned projectors' ``<name>.pNNN``), and the checkpoints are kept:
    the rebuild stops at the checkpoints read before it starts (each partition at its own, as
    ``verify`` does), then applies what the projectors applied meanwhile, in up to
    :data:`CATCH_UP_ROUNDS` rounds outside the lock and the rest under it, each event once
    (:func:`catch_up_from`: a checkpoint that did not move costs nothing, such as the single
    projector's, at 0 or long behind, while partitioned projectors run). The projectors then apply
    every later event once, to the new tables and to their compaction state (``compactor_*``,
    which no rebuild touches): a rebuild to the stream's end under checkpoints behind it would
    have them apply events the tables already hold again.

    When the read models belong to another log (:class:`LogMismatch`: no projector runs then),
    or the database holds none (no checkpoint of the projector: a new database, :class:`NeverBound`
    when it is not bound yet), only ``all`` may be rebuilt: every read-model table and the
    quarantine are replaced, the projector's checkpoints (and its compaction state, backfilled
    again from the read models) are reset to the sequence rebuilt, up to the stream's last one."""
    tables = (*PROJECTION_TABLES[projection], "quarantine")
    name = c.settings.projector_name
    # read models of another log, or none at all (a new database: NeverBound when not yet bound)
    refusal = await log_mismatch(c)
    first = isinstance(refusal, NeverBound)
    if refusal is None:
        async with c.pool.connection() as conn:
            if await highest_checkpoint(conn, name) is None:  # bound, but nothing applied yet
                first = True
                refusal = LogMismatch(
                    f"database {database_of(conn)} holds no read models (no checkpoint of projector {name!r})",
                    database=database_of(conn),
                    identity=await stream_identity(c.js, c.settings.stream),
                )
    if refusal is not None and projection != "all":
        raise refusal.restated(
            "only `chronicle rebuild --projection all` can rebuild read models of another log or of a new database"
        )
    replace = refusal is not None
    start = time.monotonic()
    # never past the live projectors: they apply every later event to the swapped tables (and,
    # once, to their compaction state, which no rebuild touches); what they apply meanwhile is
    # caught up. Read models of another log, or none: the whole log, the checkpoints reset to it.
    held = {} if replace else partition_horizons(name, c.layout.partitions, await _checkpoints(c))
    async with held_shadow(c.settings.database_url, "rebuild") as shadow:  # this run's own to drop
        old = "old_" + shadow.removeprefix("rebuild_")
        swapped = False
        try:
            built, live, identity = await _build_and_swap(
                c, shadow, old, tables, held, replace=replace, progress=progress
            )
            swapped = True
        finally:
            if not swapped:  # failed or interrupted before the swap committed: the live tables are untouched
                await drop_shadow(c.settings.database_url, shadow)
        async with await psycopg.AsyncConnection.connect(c.settings.database_url, autocommit=True) as conn:
            if not keep_old:
                await conn.execute(f'DROP SCHEMA "{old}" CASCADE')
            await conn.execute(f'DROP SCHEMA "{shadow}" CASCADE')
            cur = await conn.execute("SELECT reason, count(*) FROM quarantine GROUP BY reason ORDER BY reason")
            quarantined = {str(reason): int(n) for reason, n in await cur.fetchall()}
    return RebuildReport(
        shadow,
        max(built, live),
        time.monotonic() - start,
        live,
        old if keep_old else None,
        rebound=replace and not first,
        first=first,
        stream_last_seq=identity.last_seq,
        quarantined=quarantined,
    )


async def drop_shadow(conninfo: str, shadow: str) -> None:
    """Drop ``shadow`` (a ``rebuild_*`` or ``verify_*`` schema: a copy, never the live read models)
    if it exists, on a connection of its own: the one that failed may be unusable. A database
    that does not answer leaves it, with a warning that names it."""
    try:
        async with await psycopg.AsyncConnection.connect(conninfo, autocommit=True) as conn:
            await conn.execute(f'DROP SCHEMA IF EXISTS "{shadow}" CASCADE')
    except (psycopg.Error, OSError) as exc:
        logging.getLogger(__name__).warning("shadow schema %s left behind (%s): drop it by hand", shadow, exc)


async def stored_languages(c: Container) -> dict[str, Language]:
    """The search languages in force (the live database's, not this process's setting): a
    rebuild indexes as the live read models do. A database without Chronicle's tables keeps none:
    the setting's then, as a new database takes them."""
    try:
        async with c.pool.connection() as conn:
            return await search_languages.stored(conn)
    except psycopg.errors.UndefinedTable:
        return dict(c.settings.search_languages)


async def _build_and_swap(
    c: Container,
    shadow: str,
    old: str,
    tables: tuple[str, ...],
    held: Reached,
    *,
    replace: bool,
    progress: Callable[[int, int], None] | None,
) -> tuple[int, int, LogIdentity]:
    """:func:`rebuild_and_swap`'s rebuild into ``shadow``, catch-up and swap (the replaced tables
    into ``old``); returns (last sequence built, sequence swapped at, the stream's identity) once
    the swap has committed."""
    name = c.settings.projector_name
    languages = await stored_languages(c)
    built = await rebuild_into(
        c.js,
        c.layout,
        c.settings.database_url,
        shadow,
        c.projections(),
        name,
        to_seq=max(held.values()) if held else None,
        progress=progress,
        horizon=horizon_of(c.layout, held) if held else None,
        languages=languages,
        keys=c.keys,
    )
    if not replace:  # what they applied meanwhile, mostly outside the lock
        async with await psycopg.AsyncConnection.connect(c.settings.database_url, autocommit=True) as conn:
            await conn.execute(f'SET search_path TO "{shadow}"')
            for _ in range(CATCH_UP_ROUNDS):
                now = partition_horizons(name, c.layout.partitions, await _checkpoints(c))
                if (caught := await _catch_up(c, conn, held, now)) is None:
                    break
                held = caught
    async with await psycopg.AsyncConnection.connect(c.settings.database_url) as conn, conn.transaction():
        locked = ", ".join(f'public."{t}"' for t in (*tables, "checkpoints", "log_binding"))
        await conn.execute(f"LOCK TABLE {locked} IN ACCESS EXCLUSIVE MODE")
        identity = await stream_identity(c.js, c.settings.stream)
        if not replace:
            checkpoints = await queries.checkpoints(conn)
            horizon, live = live_horizon(c, checkpoints)
            await conn.execute(f'SET LOCAL search_path TO "{shadow}"')
            await _catch_up(c, conn, held, partition_horizons(name, c.layout.partitions, checkpoints))
            await _keep_quarantined_ahead(conn, shadow, horizon)
        else:  # nothing applies from this log: rebuilt up to its end, the checkpoints start there
            live = max(built, identity.last_seq)
            await conn.execute(f'SET LOCAL search_path TO "{shadow}"')
            await apply_range(conn, c.js, c.layout, c.projections(), name, built + 1, live, keys=c.keys)
            await conn.execute("SET LOCAL search_path TO public")
            await conn.execute("DELETE FROM checkpoints WHERE name = %s OR starts_with(name, %s)", (name, name + "."))
            await conn.execute("INSERT INTO checkpoints (name, seq) VALUES (%s, %s)", (name, live))
            for state in ("compactor_messages", "compactor_overlays", "compactor_sessions"):
                await conn.execute(f"DELETE FROM {state} WHERE worker = %s", (name,))
        await conn.execute(f'CREATE SCHEMA "{old}"')
        for table in tables:
            await conn.execute(f'ALTER TABLE public."{table}" SET SCHEMA "{old}"')
            await conn.execute(f'ALTER TABLE "{shadow}"."{table}" SET SCHEMA public')
        await conn.execute("SET LOCAL search_path TO public")
        await bind(conn, name, identity)
    return built, live, identity


CATCH_UP_ROUNDS = 8
"""At most this many catch-ups of a rebuilt schema before its swap, outside the exclusive lock:
each applies what the live projectors applied during the one before (the rebuild first), so the
lock only waits for what they applied during the last."""


async def _checkpoints(c: Container) -> dict[str, int]:
    async with c.pool.connection() as conn:
        return await queries.checkpoints(conn)


async def _catch_up(c: Container, conn: psycopg.AsyncConnection[Any], held: Reached, now: Reached) -> Reached | None:
    """Apply on ``conn`` (its search_path: a rebuilt schema, which holds each partition's events
    up to ``held``) each event the live projectors applied from there up to ``now``; returns what
    the schema then holds, or None when no partition moved (nothing read)."""
    first = catch_up_from(held, now)
    if first is None:
        return None
    await apply_range(
        conn,
        c.js,
        c.layout,
        c.projections(),
        c.settings.projector_name,
        first,
        max(now.values()),
        horizon=horizon_of(c.layout, now),
        since=horizon_of(c.layout, held),
        keys=c.keys,
    )
    return {p: max(seq, now[p]) for p, seq in held.items()}


async def _keep_quarantined_ahead(conn: psycopg.AsyncConnection[Any], shadow: str, horizon: Horizon) -> None:
    """Copy into ``shadow`` the live quarantine rows past their subject's ``horizon``: recorded by
    a consumer ahead of the projector (the compactor), which will not meet them again; the
    rebuild stops at the horizon, so it has none of them."""
    cur = await conn.execute("SELECT seq, subject FROM public.quarantine")
    ahead = [int(seq) for seq, subject in await cur.fetchall() if int(seq) > horizon(str(subject))]
    if ahead:
        columns = "seq, subject, reason, detail, raw, size, consumer, recorded_at, named_tenant, named_session"
        await conn.execute(
            f'INSERT INTO "{shadow}".quarantine ({columns}) SELECT {columns} FROM public.quarantine '
            "WHERE seq = ANY(%s) ON CONFLICT (seq) DO NOTHING",
            (ahead,),
        )


# -- verify -------------------------------------------------------------------------------


@dataclass
class VerifyReport:
    at_seq: int
    live: dict[str, tuple[int, str]]
    rebuilt: dict[str, tuple[int, str]]
    differences: dict[str, list[str]] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.live == self.rebuilt


async def _row_hashes(conn: psycopg.AsyncConnection[Any], schema: str, table: str) -> dict[str, tuple[str, str]]:
    key, text = TABLES[table], row_text(table)
    where = compared_rows(table)
    cur = await conn.execute(f'SELECT ({key})::text, md5({text}), {text} FROM "{schema}"."{table}" t {where}')
    return {str(k): (str(h), str(text)) for k, h, text in await cur.fetchall()}


async def kept_hashes(conn: psycopg.AsyncConnection[Any], schema: str) -> list[tuple[str, str]]:
    """``(message key, hash)`` of every message whose row keeps a hash that is not its stored
    body's own: what a rebuild must reproduce. A row written before migration 019 keeps its
    body's own hash where a rebuild stores none; the two mean the same."""
    out: list[tuple[str, str]] = []
    # a server-side cursor: in a database upgraded to 019 every older row keeps a hash, read with its body
    async with conn.transaction(), conn.cursor(name="kept_hashes") as cur:
        await cur.execute(
            f'SELECT (tenant, session_id, id)::text, body_sha256, content FROM "{schema}".messages '
            "WHERE body_sha256 IS NOT NULL ORDER BY tenant, session_id, id"
        )
        async for k, h, content in cur:
            if h != _content_hash(str(content)):
                out.append((str(k), str(h)))
    return out


def _content_hash(content: str) -> str | None:
    try:
        return body_hash(json.loads(content))
    except (ValueError, TypeError, RecursionError):
        return None


async def verify(c: Container, *, limit: int = 5, progress: Callable[[int, int], None] | None = None) -> VerifyReport:
    """Rebuild into a shadow schema up to the live checkpoint and compare table by table.

    The live side is read in one REPEATABLE READ snapshot taken before the rebuild, so a running
    projector does not make the comparison flap. Read models of another log (:class:`LogMismatch`)
    are refused, not compared: every table would differ for a reason a comparison cannot name
    (`chronicle rebuild --projection all` replaces them; `chronicle log show` tells which log).
    """
    mismatch = await log_mismatch(c)
    if mismatch is not None:
        raise mismatch.restated("nothing to verify against")
    async with held_shadow(c.settings.database_url, "verify") as shadow:  # this run's own to drop
        try:
            return await _verify_in(c, shadow, limit, progress)
        finally:  # whatever happened (a key missing, Ctrl-C): the shadow is a copy, never kept
            await drop_shadow(c.settings.database_url, shadow)


async def _verify_in(
    c: Container, shadow: str, limit: int, progress: Callable[[int, int], None] | None
) -> VerifyReport:
    """:func:`verify`'s rebuild into ``shadow`` and comparison (the caller drops ``shadow``)."""
    name = c.settings.projector_name
    languages = await stored_languages(c)
    async with await psycopg.AsyncConnection.connect(c.settings.database_url) as live_conn:
        await live_conn.set_isolation_level(psycopg.IsolationLevel.REPEATABLE_READ)
        async with live_conn.transaction():
            horizon, at = live_horizon(c, await queries.checkpoints(live_conn))
            await rebuild_into(
                c.js,
                c.layout,
                c.settings.database_url,
                shadow,
                c.projections(),
                name,
                to_seq=at,
                progress=progress,
                horizon=horizon,
                languages=languages,
                keys=c.keys,
            )
            live = await checksums(live_conn, "public")
            async with await psycopg.AsyncConnection.connect(c.settings.database_url, autocommit=True) as sh:
                rebuilt = await checksums(sh, shadow)
                # the live table also holds what consumers past the horizon (the compactor) met
                live_q = [r for r in await quarantine_rows(live_conn, "public") if r[0] <= horizon(r[1])]
                rebuilt_q = await quarantine_rows(sh, shadow)
                live["quarantine"], rebuilt["quarantine"] = _digest(live_q), _digest(rebuilt_q)
                live_h, rebuilt_h = await kept_hashes(live_conn, "public"), await kept_hashes(sh, shadow)
                live["message hashes"], rebuilt["message hashes"] = _digest(live_h), _digest(rebuilt_h)
                report = VerifyReport(at, live, rebuilt)
                if live_h != rebuilt_h:
                    diffs = [f"live:    {r}" for r in live_h if r not in rebuilt_h]
                    diffs += [f"rebuilt: {r}" for r in rebuilt_h if r not in live_h]
                    report.differences["message hashes"] = diffs[:limit]
                if live_q != rebuilt_q:
                    diffs = [f"live:    {r}" for r in live_q if r not in rebuilt_q]
                    diffs += [f"rebuilt: {r}" for r in rebuilt_q if r not in live_q]
                    report.differences["quarantine"] = diffs[:limit]
                for table in TABLES:
                    if live[table] == rebuilt[table]:
                        continue
                    a = await _row_hashes(live_conn, "public", table)
                    b = await _row_hashes(sh, shadow, table)
                    diffs = [f"live:    {a[k][1]}" for k in sorted(a) if k not in b or b[k][0] != a[k][0]]
                    diffs += [f"rebuilt: {b[k][1]}" for k in sorted(b) if k not in a or a[k][0] != b[k][0]]
                    report.differences[table] = diffs[:limit]
    return report


def _digest(rows: list[tuple[Any, ...]]) -> tuple[int, str]:
    """``(row count, md5 of the rows)``; no rows sum to ``""``, as a read-model table's (:func:`checksums`)."""
    return len(rows), hashlib.md5(repr(rows).encode(), usedforsecurity=False).hexdigest() if rows else ""


# -- skills index -------------------------------------------------------------------------


@dataclass
class SyncReport:
    indexed: int = 0
    removed: int = 0
    unchanged: int = 0


async def sync_skills(c: Container, tenant: str, bucket: str, prefix: str = "") -> SyncReport:
    """Bring the tenant's skills index in line with the bucket: record new or changed objects
    (by etag and description) and removed ones, so rendering never has to list the bucket."""
    if c.context.skills is None:
        raise RuntimeError("object storage is not configured")
    root = object_key(tenant, "")
    objects = [
        StoredObject(o.key[len(root) :], o.description, o.etag, o.size)
        for o in await c.context.skills.list(bucket, root + prefix)
    ]
    async with c.pool.connection() as conn:
        known = await context_queries.indexed_skills(conn, tenant, bucket)
        listing = dict(await context_queries.skill_listing(conn, tenant, bucket, prefix))
    report = SyncReport()
    seen: set[str] = set()
    for obj in objects:
        seen.add(obj.key)
        if known.get(obj.key) == obj.etag and listing.get(obj.key) == obj.description:
            report.unchanged += 1
            continue
        await c.context.record_skill(tenant, bucket, obj.key, obj.description, obj.etag, obj.size)
        report.indexed += 1
    for key in sorted(set(known) - seen):
        if key.startswith(prefix):
            await c.publisher.publish(SkillRemoved(tenant=tenant, session=TENANT_SCOPE, bucket=bucket, key=key))
            report.removed += 1
    await c.commands.optimistic.catch_up(tenant, TENANT_SCOPE)
    return report
