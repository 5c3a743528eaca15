"""The log as stored, and what a direct publisher needs: a session's events (NDJSON), its last
subject sequence, and the tenant's NATS subjects."""

from collections.abc import AsyncIterator
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request
from fastapi.responses import StreamingResponse

from events import log as eventlog
from events.admission import MAX_WRITTEN_BYTES
from events.credentials import tenant_inbox_prefix, tenant_permissions
from events.sealing import kid_in
from services.api import following
from services.api import models as m
from services.api.deps import MAX_SEQ, ContainerDep, Sid, Tenant, check_id
from services.api.models import ok
from services.api.responses import NdjsonResponse
from services.api.strict_json import StrictJsonRoute
from services.audit import readers as audit

MAX_EVENTS_PAGE = 10_000
"""The most events one ``GET …/events`` answers (``limit``'s bound and default)."""
router = APIRouter(route_class=StrictJsonRoute)


@router.get("/v1/sessions/{sid}/events", response_class=NdjsonResponse)
async def events(
    sid: Sid,
    tenant: Tenant,
    c: ContainerDep,
    request: Request,
    from_seq: Annotated[int, Query(ge=1, le=MAX_SEQ)] = 1,
    to_seq: Annotated[int | None, Query(ge=1, le=MAX_SEQ)] = None,
    limit: Annotated[
        int | None,
        Query(ge=1, le=MAX_EVENTS_PAGE, description=f"default {MAX_EVENTS_PAGE:,} (one page); with `follow`: none"),
    ] = None,
    follow: Annotated[
        bool,
        Query(
            description="keep the answer open and send each new event of the session as it is stored, until "
            "`to_seq` is passed, `limit` events were sent or the session is deleted or erased; a blank line "
            f"every {following.KEEPALIVE_S:g} s while nothing comes"
        ),
    ] = False,
) -> StreamingResponse:
    """The session's events from ``from_seq``, at most ``limit``: a full page may have more
    after it (ask again with ``from_seq`` = its last ``seq`` + 1). ``follow``: what the reference
    broadcasts to a session's clients, as the log has it: the answer stays open and each new
    event is sent as it is stored (services/api/following.py)."""
    check_id("session", sid)
    if follow:
        return following.followed(c, request.app.state.stopping, tenant, sid, from_seq, to_seq, limit)
    subject = c.layout.session_subject(tenant, sid)
    page = limit or MAX_EVENTS_PAGE

    async def lines() -> AsyncIterator[bytes]:
        await c.keys.refresh([(tenant, sid)])
        read = eventlog.read(c.js, c.layout, subject, from_seq, to_seq)
        try:
            n = 0
            async for ev in read:
                if (kid := kid_in(ev.data)) is not None:  # asked again if evicted or made since (a long page)
                    await c.keys.load([(tenant, sid, kid)])
                yield audit.event_line(ev, c.layout, c.keys)
                n += 1
                if n == page:
                    break
        finally:
            await read.aclose()  # the ordered consumer is unsubscribed now, not at collection

    return StreamingResponse(lines(), media_type=following.NDJSON)


@router.get("/v1/sessions/{sid}/last-seq", response_model=None, responses=ok(m.Seq))
async def last_seq(sid: Sid, tenant: Tenant, c: ContainerDep) -> dict[str, int]:
    """The stream sequence of the session's newest event (0 when it has none): what a direct
    publisher sends as its expected last subject sequence."""
    check_id("session", sid)
    return {"seq": await c.publisher.last_subject_seq(tenant, sid)}


@router.get("/v1/nats", response_model=None, responses=ok(m.NatsPublishing))
async def nats_publishing(tenant: Tenant, c: ContainerDep) -> dict[str, Any]:
    """How this key's tenant publishes straight to JetStream and sends commands over NATS: its
    subjects, the command prefix, the inbox prefix its publish acks and replies arrive under (its
    NATS credentials are derived from the same key)."""
    layout = c.layout
    return {
        "tenant": tenant,
        "stream": layout.stream,
        "subject_prefix": layout.prefix,
        "partitions": layout.partitions,
        "command_prefix": layout.commands,
        "inbox_prefix": tenant_inbox_prefix(tenant),
        "publish": tenant_permissions(layout, tenant)["publish"]["allow"],
        "payload_limit_bytes": c.settings.payload_limit_bytes,
        "max_message_bytes": c.settings.max_message_bytes,
        "max_event_bytes": MAX_WRITTEN_BYTES,  # with the publisher's headers, under the server's max_payload
    }
