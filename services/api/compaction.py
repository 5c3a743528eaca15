"""Compaction: compact now, and the overlays recorded."""

from typing import Annotated, Any

from fastapi import APIRouter, Body

from projections.overlays import overlays
from services.api import models as m
from services.api.bodies import CompactBody
from services.api.deps import ContainerDep, MinSeq, Sid, Tenant, caught_up, check_id, require_session
from services.api.models import ok
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
async def compactions(sid: Sid, tenant: Tenant, c: ContainerDep, min_seq: MinSeq = None) -> dict[str, Any]:
    """Every overlay of the session, superseded ones included, oldest first."""
    check_id("session", sid)
    await caught_up(c, tenant, sid, min_seq)
    async with c.pool.connection() as conn:
        found = await overlays(conn, tenant, sid)
    if not found:
        await require_session(c, tenant, sid)
    return {"compactions": [writes.overlay_json(o) for o in found]}
