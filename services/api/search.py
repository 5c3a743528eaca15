"""Full-text search: in a session and across the tenant's sessions."""

from typing import Any

from fastapi import APIRouter

from projections import queries
from services.api import models as m
from services.api.deps import (
    ContainerDep,
    Limit,
    MinSeq,
    SearchQuery,
    Sid,
    Tenant,
    caught_up,
    caught_up_all,
    check_id,
    require_session,
)
from services.api.models import ok
from services.api.strict_json import StrictJsonRoute

router = APIRouter(route_class=StrictJsonRoute)


def _hits(hits: list[queries.SearchHit]) -> dict[str, Any]:
    return {
        "results": [
            {
                "id": h.id,
                "session_id": h.session_id,
                "role": h.role,
                "content": h.content,
                "snippet": h.snippet,
                "rank": h.rank,
                "created_at": h.created_at.isoformat(),
            }
            for h in hits
        ]
    }


@router.get("/v1/sessions/{sid}/search", response_model=None, responses=ok(m.SearchResults))
async def search_session(
    sid: Sid, q: SearchQuery, tenant: Tenant, c: ContainerDep, limit: Limit = 20, min_seq: MinSeq = None
) -> dict[str, Any]:
    check_id("session", sid)
    await caught_up(c, tenant, sid, min_seq)
    timeout_s = c.settings.search_timeout_s
    async with c.context.search_gate.slot(tenant, timeout_s), c.pool.connection() as conn:
        hits = await queries.search(conn, tenant, sid, q, limit, timeout_s)
    if not hits:
        await require_session(c, tenant, sid)
    return _hits(hits)


@router.get("/v1/search", response_model=None, responses=ok(m.SearchResults))
async def search_tenant(
    q: SearchQuery, tenant: Tenant, c: ContainerDep, limit: Limit = 20, min_seq: MinSeq = None
) -> dict[str, Any]:
    await caught_up_all(c, min_seq)
    timeout_s = c.settings.search_timeout_s
    async with c.context.search_gate.slot(tenant, timeout_s), c.pool.connection() as conn:
        return _hits(await queries.search(conn, tenant, None, q, limit, timeout_s))
