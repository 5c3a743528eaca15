"""The log as stored, and what a direct publisher needs: a session's events (NDJSON), its last
subject sequence, and the tenant's NATS subjects."""

import json
from collections import Counter
from collections.abc import AsyncIterator
from typing import Annotated, Any

from fastapi import APIRouter, Query
from fastapi.responses import StreamingResponse

from events import log as eventlog
from events.admission import MAX_EVENT_BYTES
from events.catalog import SessionDeleted, SessionErased
from events.credentials import tenant_inbox_prefix, tenant_permissions
from events.sealing import kid_in
from services.api import models as m
from services.api.deps import MAX_SEQ, ContainerDep, Sid, Tenant, check_id
from services.api.models import ok
from services.api.responses import NdjsonResponse
from services.api.strict_json import StrictJsonRoute
from services.audit import readers as audit
from services.bootstrap import Container
from services.errors import TooManyStreams

MAX_EVENTS_PAGE = 10_000
"""The most events one ``GET …/events`` answers (``limit``'s bound and default)."""
FOLLOW_KEEPALIVE_S = 15.0
"""How long a followed answer stays silent before it sends a blank line."""
NDJSON = "application/x-ndjson"
ENDING_TYPES = frozenset({SessionDeleted.TYPE, SessionErased.TYPE})
_following: Counter[str] = Counter()
"""Followed answers open in this process, per tenant."""
router = APIRouter(route_class=StrictJsonRoute)


@router.get("/v1/sessions/{sid}/events", response_class=NdjsonResponse)
async def events(
    sid: Sid,
    tenant: Tenant,
    c: ContainerDep,
    from_seq: Annotated[int, Query(ge=1, le=MAX_SEQ)] = 1,
    to_seq: Annotated[int | None, Query(ge=1, le=MAX_SEQ)] = None,
    limit: Annotated[int, Query(ge=1, le=MAX_EVENTS_PAGE)] = MAX_EVENTS_PAGE,
    follow: Annotated[
        bool,
        Query(
            description="keep the answer open and send each new event of the session as it is stored, until "
            "`to_seq` or `limit` is reached or the session is deleted or erased; a blank line every "
            f"{FOLLOW_KEEPALIVE_S:g} s while nothing comes"
        ),
    ] = False,
) -> StreamingResponse:
    """The session's events from ``from_seq``, at most ``limit``: a full page may have more
    after it (ask again with ``from_seq`` = its last ``seq`` + 1). ``follow``: what the reference
    broadcasts to a session's clients, as the log has it: the answer stays open and each new
    event is sent as it is stored."""
    check_id("session", sid)
    subject = c.layout.session_subject(tenant, sid)
    if follow:
        return StreamingResponse(_followed(c, tenant, sid, subject, from_seq, to_seq, limit), media_type=NDJSON)

    async def lines() -> AsyncIterator[bytes]:
        await c.keys.refresh([(tenant, sid)])
        read = eventlog.read(c.js, c.layout, subject, from_seq, to_seq)
        try:
            n = 0
            async for ev in read:
                yield audit.event_line(ev, c.layout, c.keys)
                n += 1
                if n == limit:
                    break
        finally:
            await read.aclose()  # the ordered consumer is unsubscribed now, not at collection

    return StreamingResponse(lines(), media_type=NDJSON)


def _followed(
    c: Container, tenant: str, sid: str, subject: str, from_seq: int, to_seq: int | None, limit: int
) -> AsyncIterator[bytes]:
    """The lines of a followed session. The tenant's open answers are counted while the lines are
    sent (an answer whose client left before it began never counts), so the bound is checked here
    and may be passed by answers that start together."""
    allowed = c.settings.follow_streams_per_tenant
    if _following[tenant] >= allowed:
        raise TooManyStreams(f"tenant {tenant!r} already follows {allowed} event streams in this process")

    async def lines() -> AsyncIterator[bytes]:
        _following[tenant] += 1
        try:
            await c.keys.refresh([(tenant, sid)])
            sent = 0
            stream = eventlog.follow(c.js, c.layout, subject, from_seq, FOLLOW_KEEPALIVE_S)
            try:
                async for ev in stream:
                    if ev is None:
                        yield b"\n"  # a keep-alive: proxies close answers that stay silent
                        continue
                    if to_seq is not None and ev.seq > to_seq:
                        return
                    if (kid := kid_in(ev.data)) is not None:
                        await c.keys.load([(tenant, sid, kid)])  # a key made since the answer began
                    yield audit.event_line(ev, c.layout, c.keys)
                    sent += 1
                    if sent == limit or ev.seq == to_seq or _ends_session(ev.data):
                        return
            finally:
                await stream.aclose()
        finally:
            _following[tenant] -= 1

    return lines()


def _ends_session(data: bytes) -> bool:
    """Whether a stored event is its session's last: its deletion or erasure (writes are refused after them)."""
    try:
        kind = json.loads(data).get("type")
    except (ValueError, AttributeError):
        return False
    return kind in ENDING_TYPES


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
        "max_event_bytes": MAX_EVENT_BYTES,
    }
