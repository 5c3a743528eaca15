"""Compaction: compact now, and the overlays recorded."""

from typing import Annotated, Any

from fastapi import APIRouter, Body

from projections.overlays import Overlay, overlays
from services.api import metrics
from services.api import models as m
from services.api.bodies import CompactBody
from services.api.deps import ContainerDep, MinSeq, Sid, Tenant, caught_up, check_id, require_session
from services.api.models import ok
from services.api.strict_json import StrictJsonRoute
from services.compaction.summarizers import SummarizerError
from services.errors import SummarizerFailed

router = APIRouter(route_class=StrictJsonRoute)


def overlay_dict(o: Overlay) -> dict[str, Any]:
    return {
        "id": o.overlay_id,
        "message_id": o.message_id,
        "from_message_id": o.from_message_id,
        "to_message_id": o.to_message_id,
        "leaf_id": o.leaf_id,
        "tokens_before": o.tokens_before,
        "tokens_after": o.tokens_after,
        "summarizer": o.summarizer,
        "model": o.model,
        "summary": o.summary,
        "created_at": o.created_at.isoformat(),
        "seq": o.seq,
    }


@router.post("/v1/sessions/{sid}/compact", response_model=None, responses=ok(m.Compacted))
async def compact(
    sid: Sid, tenant: Tenant, c: ContainerDep, body: Annotated[CompactBody | None, Body()] = None
) -> dict[str, Any]:
    """Compact now: the overlay, or why nothing was compacted."""
    check_id("session", sid)
    leaf = body.leaf_id if body else None
    if leaf is not None:
        check_id("message", leaf)
    try:
        outcome = await c.compaction.compact(tenant, sid, leaf)
    except SummarizerError as exc:
        raise SummarizerFailed(str(exc)) from exc
    if outcome.overlay is None:
        return {"compacted": False, "reason": outcome.reason, "seq": outcome.seq}
    metrics.published("compaction.recorded")
    return {"compacted": True, "overlay": overlay_dict(outcome.overlay), "seq": outcome.seq}


@router.get("/v1/sessions/{sid}/compactions", response_model=None, responses=ok(m.Compactions))
async def compactions(sid: Sid, tenant: Tenant, c: ContainerDep, min_seq: MinSeq = None) -> dict[str, Any]:
    """Every overlay of the session, superseded ones included, oldest first."""
    check_id("session", sid)
    await caught_up(c, tenant, sid, min_seq)
    async with c.pool.connection() as conn:
        found = await overlays(conn, tenant, sid)
    if not found:
        await require_session(c, tenant, sid)
    return {"compactions": [overlay_dict(o) for o in found]}
