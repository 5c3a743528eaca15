"""HTTP reads for auditors (and the view at ``/audit/``): a session's whole message tree, its
system prompt versions, its compaction failures, and the tenant's quarantined events."""

import json
from dataclasses import asdict
from typing import Annotated, Any, TypeVar

from fastapi import APIRouter, Query, Request, Response

from projections import context_queries, queries
from projections.overlays import failures
from projections.reclaimed import reclaim, reclaimed_in
from services.api import models as m
from services.api.deps import (
    MAX_SEQ,
    ContainerDep,
    MinSeq,
    SessionId,
    Sid,
    Tenant,
    caught_up,
    check_id,
    read_only,
    require_session,
)
from services.api.models import ok
from services.api.paging import MAX_PAGE, PageLimit, SeqCursor, more, page, session_page
from services.api.strict_json import StrictJsonRoute
from services.audit.quarantine import list_quarantined

router = APIRouter(route_class=StrictJsonRoute)
JSON = "application/json"
MAX_QUARANTINE = 500
"""The most quarantined events one read answers."""
T = TypeVar("T")
FIRST_VERSION = -(2**31)
"""The lowest prompt version the read model can hold (an ``integer`` column)."""


def tree_node(row: queries.MessageRow, unloaded: dict[str, str]) -> str:
    """One node of ``GET …/tree`` as JSON text, its ``message`` spliced from the stored JSON
    (with unloaded skills' outputs shown as their marker, as history reads show them)."""
    head = {
        "id": row.id,
        "parent_id": row.parent_id,
        "role": row.role,
        "seq": row.seq,
        "created_at": row.created_at.isoformat(),
        "capped": row.original_ref is not None,
        "unloaded": sorted(set(unloaded.values())),
    }
    content = reclaim(row.content, unloaded) if unloaded else row.content
    return json.dumps(head, ensure_ascii=False)[:-1] + ', "message": ' + content + "}"


@router.get("/v1/whoami", response_model=None, responses=ok(m.WhoAmI))
async def whoami(request: Request, tenant: Tenant) -> dict[str, Any]:
    """The tenant this API key selects, and whether the key only reads: how a client (the
    auditor's view) names whom it is signed in as; a read-only key may ask (``GET /v1/nats``,
    which says it too, is not for read-only keys)."""
    return {"tenant": tenant, "read_only": read_only(request)}


@router.get("/v1/sessions/{sid}/tree", responses=ok(m.Tree))
async def tree(
    sid: Sid,
    tenant: Tenant,
    c: ContainerDep,
    min_seq: MinSeq = None,
    cursor: SeqCursor = 0,
    limit: PageLimit = MAX_PAGE,
) -> Response:
    """Every message of every branch in append order, a page at a time (``next_cursor``: the next
    page's ``cursor``, null on the last one), with the latest leaf; each node says whether it was
    over the row cap (``capped``: ``GET …/messages/{mid}?original=true`` has the original) and
    which skills' outputs in it are unloaded. A page ends early at its bytes budget."""
    check_id("session", sid)
    await caught_up(c, tenant, sid, min_seq)
    async with c.pool.connection() as conn, queries.snapshot(conn):
        rows, follows = await queries.tree_page(conn, tenant, sid, cursor, limit)
        latest = await queries.latest_leaf(conn, tenant, sid)
        found = reclaimed_in(await context_queries.reclaimed(conn, tenant, sid) if rows else {})
    if not rows:
        await require_session(c, tenant, sid)
    head = {"leaf_id": latest.id if latest else None, "next_cursor": rows[-1].seq if follows else None}
    nodes = ",".join(tree_node(r, found.outputs(r.id, r.content)) for r in rows)
    return Response(json.dumps(head)[:-1] + ', "messages": [' + nodes + "]}", media_type=JSON)


@router.get("/v1/sessions/{sid}/prompts", response_model=None, responses=ok(m.Prompts))
async def prompts(
    sid: Sid,
    tenant: Tenant,
    c: ContainerDep,
    min_seq: MinSeq = None,
    cursor: Annotated[int | None, Query(ge=FIRST_VERSION, le=MAX_SEQ)] = None,
    limit: PageLimit = MAX_PAGE,
) -> dict[str, Any]:
    """The system prompt versions recorded for the session, oldest first, a page at a time
    (``next_cursor``: the next page's ``cursor``, the last version's number, null on the last
    page; a page ends early at its text budget); each was in force from its ``seq`` until the
    next version's. Without ``cursor``, from the first version, whatever its number (a
    publisher writing straight to the log may number one 0 or below)."""
    after = FIRST_VERSION - 1 if cursor is None else cursor
    found, follows = await session_page(
        c, tenant, sid, min_seq, lambda conn: context_queries.prompts(conn, tenant, sid, after, limit)
    )
    return {"prompts": [asdict(p) for p in found], "next_cursor": found[-1].version if follows else None}


@router.get("/v1/sessions/{sid}/compaction-failures", response_model=None, responses=ok(m.CompactionFailures))
async def compaction_failures(
    sid: Sid,
    tenant: Tenant,
    c: ContainerDep,
    min_seq: MinSeq = None,
    cursor: SeqCursor = 0,
    limit: PageLimit = MAX_PAGE,
) -> dict[str, Any]:
    """The recorded summarizer failures of the session (``compaction.failed``), oldest first, a
    page at a time (``next_cursor``: the next page's ``cursor``, the last one's ``seq``, null on
    the last page; a page ends early at its text budget)."""
    found, follows = await session_page(
        c, tenant, sid, min_seq, lambda conn: failures(conn, tenant, sid, cursor, limit)
    )
    return {
        "failures": [asdict(f) | {"created_at": f.created_at.isoformat()} for f in found],
        "next_cursor": found[-1].seq if follows else None,
    }


@router.get("/v1/quarantine", response_model=None, responses=ok(m.QuarantineList))
async def quarantine(
    tenant: Tenant,
    c: ContainerDep,
    session_id: Annotated[SessionId | None, Query()] = None,
    limit: Annotated[int, Query(ge=1, le=MAX_QUARANTINE)] = 50,
    cursor: Annotated[int | None, Query(ge=1, le=MAX_SEQ)] = None,
) -> dict[str, Any]:
    """The newest events stored under this tenant's subjects (``session_id``: that session's)
    that the projectors quarantined, newest first: the reason, never another tenant's; a page at
    a time (``next_cursor``: the next page's ``cursor``, null on the last one)."""
    if session_id is not None:
        check_id("session", session_id)
    async with c.pool.connection() as conn:
        rows = await list_quarantined(
            conn, c.layout, tenant=tenant, session=session_id, limit=more(limit), before=cursor
        )
    entries, last = page(rows, limit)
    return {
        "quarantined": [
            {
                "seq": e.seq,
                "session_id": e.session,
                "reason": e.reason,
                "detail": e.detail,
                "recorded_at": e.recorded_at.isoformat(),
                "size": e.size,
            }
            for e in entries
        ],
        "next_cursor": last.seq if last else None,
    }
