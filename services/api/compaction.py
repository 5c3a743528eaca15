"""Compaction: compact now, and the overlays recorded."""

from typing import Annotated, Any

from fastapi import APIRouter, Body

from projections.overlays import overlay_page
from services.api import models as m
from services.api.bodies import CompactBody
from services.api.deps import ContainerDep, MinSeq, Sid, Tenant
from services.api.models import ok
from services.api.paging import MAX_PAGE, PageLimit, SeqCursor, session_page
from services.api.strict_json import StrictJsonRoute
from services.requests import writes

router = APIRouter(route_class=StrictJsonRoute)


@router.post("/v1/sessions/{sid}/compact", response_model=None, responses=ok(m.Compacted))
async def compact(
    sid: Sid, tenant: Tenant, c: ContainerDep, body: Annotated[CompactBody | None, Body()] = None
) -> dict[str, Any]:
    """Compact now: the overlay, or why nothing was compacted."""
    return await writes.compact(c, tenant, sid, body.leaf_id if body else None)


@router.get("/v1/sessions/{sid}/compactions", response_model=None, responses=ok(m.Compactions))
async def compactions(
    sid: Sid,
    tenant: Tenant,
    c: ContainerDep,
    min_seq: MinSeq = None,
    cursor: SeqCursor = 0,
    limit: PageLimit = MAX_PAGE,
) -> dict[str, Any]:
    """The overlays of the session, superseded ones included, oldest first, a page at a time
    (``next_cursor``: the next page's ``cursor``, the last one's ``seq``, null on the last page;
    a page ends early at its summaries' budget)."""
    found, follows = await session_page(
        c, tenant, sid, min_seq, lambda conn: overlay_page(conn, tenant, sid, cursor, limit)
    )
    return {"compactions": [writes.overlay_json(o) for o in found], "next_cursor": found[-1].seq if follows else None}
