"""Sessions: create, list, read, rename, delete, erase, fork; a session's data key."""

import base64
import logging
from datetime import UTC, datetime, timedelta
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Body, Query, Response

from events.ids import InvalidId, check_session
from projections import queries
from projections.queries import Conn
from services.api import models as m
from services.api.bodies import CreateSessionBody, EndBody, EraseBody, ForkBody, RenameBody, UsageBody
from services.api.deps import (
    MAX_SEQ,
    ChargeDep,
    ContainerDep,
    MinSeq,
    Requester,
    Sid,
    Tenant,
    caught_up,
    caught_up_all,
    check_id,
    idempotency_key,
    require_session,
)
from services.api.models import ok
from services.api.paging import more, page
from services.api.strict_json import StrictJsonRoute
from services.errors import CursorOrderMismatch, EncryptionOff, InvalidRequest, UnknownCursor
from services.requests import writes
from services.requests.checks import no_nul
from services.writes.liveness import live_session

router = APIRouter(route_class=StrictJsonRoute)
IdempotencyKeyHeader = Annotated[
    str | None,
    idempotency_key(
        "the client's name for this call, kept across its retries: a retry with the same amounts, however late, "
        "adds nothing again and answers the first `seq`; other amounts are `422 idempotency_key_reused`; a key "
        "whose derived event id another event of the log holds is `409 idempotency_key_conflict`"
    ),
]
log = logging.getLogger("chronicle.keys")


def _session_json(row: queries.SessionRow) -> dict[str, Any]:
    return {
        "id": row.id,
        "name": row.name,
        "parent_session_id": row.parent_session_id,
        "metadata": row.metadata,
        "created_at": row.created_at.isoformat(),
        "updated_at": row.updated_at.isoformat(),
        "input_tokens": row.input_tokens,
        "output_tokens": row.output_tokens,
        "estimated_cost": row.estimated_cost,
        "end_reason": row.end_reason,
        "seq": row.last_seq,
    }


@router.post(
    "/v1/sessions",
    status_code=201,
    response_model=None,
    responses=ok(m.SessionCreated, 201)
    | ok(m.SessionCreated, 200, "The same create again (same id, name, metadata and parent): the first answer"),
)
async def create_session(
    tenant: Tenant,
    c: ContainerDep,
    response: Response,
    body: Annotated[CreateSessionBody, Body(default_factory=CreateSessionBody)],
) -> dict[str, Any]:
    """Create a session; every field is optional, and an empty body is ``{}``. A live session at
    ``id`` with the same name, metadata and parent is this create made before: ``200`` with the
    first answer, nothing written (a retry of a create whose answer was lost)."""
    created, out = await writes.create_session(c, tenant, body.id, body.name, body.parent_session_id, body.metadata)
    response.status_code = 201 if created else 200
    return out


RECENT_CURSOR = "recent."
"""How a cursor of ``order=recent`` starts: ``recent.<last_seq>.<id>`` (a ``created`` cursor is
the integer ``created_seq``, as before ``order`` existed)."""
_SEQ = r"[1-9][0-9]*"  # any number of digits: one past the largest is unknown_cursor, however long
CURSOR_PATTERN = rf"^(?:{_SEQ}|recent\.{_SEQ}\..*)$"


def _cursor_of(order: str, cursor: str | None) -> int | tuple[int, str] | None:
    """The cursor (its form checked by :data:`CURSOR_PATTERN`) as the order's query takes it, or
    ``422 cursor_order_mismatch`` for one another order gave; ``422 unknown_cursor`` for one no
    list gives (a sequence past the largest, a session id that is none), never a first page."""
    if cursor is None:
        return None
    no_nul(cursor, "cursor")
    if cursor.startswith(RECENT_CURSOR):
        if order != "recent":
            raise CursorOrderMismatch("this cursor was given by order=recent; start order=created from its first page")
        seq, _, sid = cursor[len(RECENT_CURSOR) :].partition(".")
        return _listed_seq(seq), _listed_session(sid)
    if order != "created":
        raise CursorOrderMismatch("this cursor was given by order=created; start order=recent from its first page")
    return _listed_seq(cursor)


def _listed_seq(text: str) -> int:
    """A cursor's sequence (its digits checked by the pattern), at most the largest."""
    if int(text) > MAX_SEQ:
        raise UnknownCursor(f"cursor: no list gives a sequence past {MAX_SEQ}; pass next_cursor as it came")
    return int(text)


def _listed_session(sid: str) -> str:
    """A cursor's session id: one a list may show."""
    try:
        return check_session(sid)
    except InvalidId:
        raise UnknownCursor("cursor: no list gives it (it names no session); pass next_cursor as it came") from None


@router.get("/v1/sessions", response_model=None, responses=ok(m.SessionPage))
async def list_sessions(
    tenant: Tenant,
    c: ContainerDep,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
    order: Annotated[
        Literal["created", "recent"],
        Query(
            description="`created`: newest created first (the default). `recent`: most recently active "
            "first (the session's last event of any kind: append, rename, usage, ...), as the reference's "
            "`list()`"
        ),
    ] = "created",
    cursor: Annotated[
        str | None,
        Query(
            max_length=1024,
            pattern=CURSOR_PATTERN,
            description="`next_cursor` of the previous page, as it came; only valid with the `order` "
            "that gave it (else `422 cursor_order_mismatch`)",
        ),
    ] = None,
    min_seq: MinSeq = None,
    deleted: Annotated[
        bool,
        Query(
            description="`true`: the tenant's deleted sessions instead of its live ones, newest created first "
            "(`order=created` only), each with `deleted_at`: their events stay in the log (`GET …/events`, "
            "history `as_of_seq` before the deletion). Erased sessions are `GET /v1/erasures`"
        ),
    ] = False,
) -> dict[str, Any]:
    """Live sessions of the tenant, a page at a time (``next_cursor``: the next page's
    ``cursor``, null on the last one). Paging ``order=recent`` while sessions are active: no
    session is on two pages, and every session not active since the first page is on one; a
    session active again meanwhile moves before the pages already read, so the walk shows it
    only if it had already passed it (a new first page shows it first). ``deleted``: the deleted
    ones instead, by creation only."""
    if deleted and order != "created":
        raise InvalidRequest("deleted=true lists by creation only: leave order out, or order=created")
    after = _cursor_of(order, cursor)
    await caught_up_all(c, min_seq)
    async with c.pool.connection() as conn:
        if deleted:
            read = await queries.list_sessions(
                conn, tenant, more(limit), after if isinstance(after, int) else None, deleted=True
            )
        elif order == "recent":
            read = await queries.list_sessions_recent(
                conn, tenant, more(limit), after if isinstance(after, tuple) else None
            )
        else:
            read = await queries.list_sessions(conn, tenant, more(limit), after if isinstance(after, int) else None)
    rows, last = page(read, limit)
    nxt: int | str | None = None
    if last is not None:
        nxt = f"{RECENT_CURSOR}{last.last_seq}.{last.id}" if order == "recent" else last.created_seq
    shown = [_session_json(r) | ({"deleted_at": r.deleted_at.isoformat()} if r.deleted_at else {}) for r in rows]
    return {"sessions": shown, "next_cursor": nxt}


@router.get("/v1/sessions/{sid}", response_model=None, responses=ok(m.Session))
async def get_session(sid: Sid, tenant: Tenant, c: ContainerDep, min_seq: MinSeq = None) -> dict[str, Any]:
    check_id("session", sid)
    await caught_up(c, tenant, sid, min_seq)
    return _session_json(await require_session(c, tenant, sid))


@router.patch("/v1/sessions/{sid}", response_model=None, responses=ok(m.Renamed))
async def rename_session(sid: Sid, body: RenameBody, tenant: Tenant, c: ContainerDep) -> dict[str, Any]:
    return await writes.rename_session(c, tenant, sid, body.name)


@router.post("/v1/sessions/{sid}/usage", response_model=None, responses=ok(m.UsageAdded))
async def add_usage(
    sid: Sid,
    tenant: Tenant,
    c: ContainerDep,
    body: Annotated[UsageBody, Body(default_factory=UsageBody)],
    idempotency_key: IdempotencyKeyHeader = None,
) -> dict[str, Any]:
    """Add token usage and cost to the session's counters (``addUsage``): `input_tokens`,
    `output_tokens` and `estimated_cost` of the session add them up; all three 0 writes nothing
    (as the reference's). With an `Idempotency-Key` (the same in each retry of one
    call), a retry, however late (the applied usage events are recorded for the session's life),
    adds nothing again and answers the first `seq`; the same key with other amounts is `422
    idempotency_key_reused`; a key whose derived event id another event of the log holds (one
    published straight to the stream) is `409 idempotency_key_conflict`. Nothing is written in
    either case."""
    _, out = await writes.add_usage(c, tenant, sid, body.input_tokens, body.output_tokens, body.cost, idempotency_key)
    return out


@router.post("/v1/sessions/{sid}:end", response_model=None, responses=ok(m.Ended))
async def end_session(sid: Sid, body: EndBody, tenant: Tenant, c: ContainerDep) -> dict[str, Any]:
    """Record why the session ended (its `end_reason`; the SDK's `compact_and_split` records
    `compaction`). The session stays readable and writable; a later end replaces the reason."""
    return await writes.end_session(c, tenant, sid, body.reason)


@router.delete("/v1/sessions/{sid}", response_model=None, responses=ok(m.SessionDeleted))
async def delete_session(sid: Sid, tenant: Tenant, c: ContainerDep) -> dict[str, Any]:
    return await writes.delete_session(c, tenant, sid)


@router.post("/v1/sessions/{sid}:erase", response_model=None, responses=ok(m.Erased))
async def erase_session(
    sid: Sid, tenant: Tenant, requester: Requester, c: ContainerDep, body: EraseBody | None = None
) -> dict[str, Any]:
    """Erase the session for good (crypto-shredding): its data key is destroyed, so what the log
    holds of it can never be read again; every read-model row and stored object of it is dropped;
    the log keeps tombstones (ids, types, sequences, sizes). Answers once the projections have
    dropped the rows. Erasing again is harmless. Its writes and reads answer 410 afterwards (but
    its events: tombstones).

    The erasure records who asked (this API key: `tenant:<t> key:<12 hex>`) and the optional
    `reason`, in its `session.erased` event and in `GET /v1/erasures`; erasing again keeps the
    first record. A bad reason (over 500 characters, a NUL) is 422 and nothing is erased."""
    check_id("session", sid)
    reason = body.reason if body is not None else None
    done = await c.eraser.erase_session(tenant, sid, requested_by=requester, reason=reason)
    await c.waiter.wait_session(tenant, sid, done.seq)
    return {"id": sid, "erased": True, "seq": done.seq, "objects_deleted": done.objects_deleted}


ERASURE_CURSOR_PATTERN = r"^(?:0|[1-9][0-9]*)\..*$"
"""An erasures cursor: ``<erased_at in microseconds since the epoch>.<session id>``."""
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_LATEST_MICROS = (datetime.max.replace(tzinfo=UTC) - _EPOCH) // timedelta(microseconds=1)


async def _erasure_cursor(conn: Conn, tenant: str, cursor: str) -> tuple[datetime, str]:
    """``(erased_at, session id)`` of the erasure a cursor names, or ``422 unknown_cursor``:
    erasures are never forgotten, so a list gives a cursor of one of the tenant's erasures only."""
    no_nul(cursor, "cursor")
    micros, _, sid = cursor.partition(".")
    at = _EPOCH + timedelta(microseconds=int(micros)) if int(micros) <= _LATEST_MICROS else None
    if at is None or await queries.erased_at(conn, tenant, sid) != at:
        raise UnknownCursor(
            "cursor: no list gives it (it names no erasure of this tenant); pass next_cursor as it came"
        )
    return at, sid


@router.get("/v1/erasures", response_model=None, responses=ok(m.ErasurePage))
async def list_erasures(
    tenant: Tenant,
    c: ContainerDep,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
    cursor: Annotated[
        str | None,
        Query(max_length=1024, pattern=ERASURE_CURSOR_PATTERN, description="`next_cursor` of the previous page"),
    ] = None,
) -> dict[str, Any]:
    """The tenant's erased sessions, newest first, a page at a time (``next_cursor``: the next
    page's ``cursor``, null on the last one): when, who asked (`requested_by`), why (`reason`,
    as given) and the `seq` of its `session.erased` event (its tombstone in `GET
    /v1/sessions/{sid}/events`). Erased sessions are in no other list."""
    async with c.pool.connection() as conn:
        after = await _erasure_cursor(conn, tenant, cursor) if cursor is not None else None
        rows, last = page(await queries.list_erasures(conn, tenant, more(limit), after), limit)
    nxt = None
    if last is not None:
        nxt = f"{(last.erased_at - _EPOCH) // timedelta(microseconds=1)}.{last.session_id}"
    return {
        "erasures": [
            {
                "session_id": r.session_id,
                "erased_at": r.erased_at.isoformat(),
                "requested_by": r.requested_by,
                "reason": r.reason,
                "seq": r.seq,
            }
            for r in rows
        ],
        "next_cursor": nxt,
    }


@router.get("/v1/sessions/{sid}/data-key", response_model=None, responses=ok(m.DataKey))
async def data_key(sid: Sid, tenant: Tenant, c: ContainerDep) -> dict[str, Any]:
    """The session's data key (made if it has none), for an agent service that publishes sealed
    events straight to JetStream. Only the caller's tenant's sessions; every read is logged.
    404 ``encryption_off`` when this deployment does not seal; 410 when the session is erased;
    404 ``session_not_found`` when it was deleted (nothing can be written to it: no key is made)."""
    check_id("session", sid)
    if not c.keys.seal:
        raise EncryptionOff("this deployment does not seal events (CHRONICLE_ENCRYPTION is off)")
    async with c.pool.connection() as conn:
        await live_session(conn, tenant, sid, must_exist=False)
    key = await c.keys.key_of(tenant, sid, create=True)
    assert key is not None
    log.info("data key %s of session %r read by tenant %r", key.kid, sid, tenant)
    return {"session_id": sid, "kid": key.kid, "key": base64.b64encode(key.secret).decode("ascii")}


@router.post("/v1/sessions/{sid}/fork", status_code=201, response_model=None, responses=ok(m.Forked, 201))
async def fork_session(sid: Sid, body: ForkBody, tenant: Tenant, c: ContainerDep, charge: ChargeDep) -> dict[str, Any]:
    """A new session holding this one's history up to ``at_message_id`` (overlays carried over).
    Retried with the same ``id``, the same fork is completed and answered as the first call.

    Under a request limit it counts each event it publishes: the copies are charged once the
    source is read, before anything is published (``429 rate_limited`` refuses it whole)."""
    return await writes.fork_session(c, tenant, sid, body.at_message_id, body.id, body.name, charge)
