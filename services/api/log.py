"""The log as stored, and what a direct publisher needs: a session's events (NDJSON), its last
subject sequence, and the tenant's NATS subjects."""

import contextlib
import functools
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request
from fastapi.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from events import log as eventlog
from events.admission import MAX_WRITTEN_BYTES
from events.credentials import tenant_inbox_prefix, tenant_permissions
from events.sealing import kid_in
from services.api import following
from services.api import models as m
from services.api.deps import MAX_SEQ, ContainerDep, Sid, Tenant, check_id, key_digest, read_only
from services.api.keyring import KeyRing
from services.api.models import ok
from services.api.responses import NdjsonResponse
from services.api.strict_json import StrictJsonRoute
from services.audit import readers as audit
from services.bootstrap import Container
from services.errors import InvalidRequest

MAX_EVENTS_PAGE = 10_000
"""The most events one ``GET …/events`` answers (``limit``'s bound and default)."""
LAST_SEQ_HEADER = "Chronicle-Last-Seq"
"""A page's header: the sequence of the session's newest event when the read began (0: none)."""
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
            "`to_seq` is passed, `limit` events were sent, the session is deleted or erased or a reload of the "
            "API keys revoked the key; a blank line "
            f"every {following.KEEPALIVE_S:g} s while nothing comes"
        ),
    ] = False,
) -> StreamingResponse:
    """The session's events from ``from_seq``, at most ``limit``: a full page may have more
    after it (ask again with ``from_seq`` = its last ``seq`` + 1). ``follow``: what the reference
    broadcasts to a session's clients, as the log has it: the answer stays open and each new
    event is sent as it is stored (services/api/following.py)."""
    check_id("session", sid)
    if to_seq is not None and to_seq < from_seq:  # not an empty answer, which reads as "no events there"
        raise InvalidRequest(f"to_seq ({to_seq}) is below from_seq ({from_seq})")
    # asked before the answer starts: a data key that cannot be opened (KeyUnavailable: a KEK not
    # configured) is ``500 key_unavailable``, not an answer that shows nothing
    await c.keys.refresh([(tenant, sid)])
    if follow:
        keys: KeyRing = request.app.state.keys
        digest = key_digest(request)
        return following.followed(
            c,
            request.app.state.stopping,
            tenant,
            sid,
            from_seq,
            to_seq,
            limit,
            read_only=read_only(request),
            granted=functools.partial(keys.grants_to, digest, tenant),
        )
    # where the log ends for this read, said in a header: a page whose last line is at this
    # sequence (or at ``to_seq``) is the end, whatever its size
    end = await eventlog.last_seq(c.js, c.layout, c.layout.session_subject(tenant, sid))
    lines = _page(c, tenant, sid, from_seq, end if to_seq is None else min(to_seq, end), limit or MAX_EVENTS_PAGE)
    try:  # the first line too: whatever fails it is a problem answer, before any byte is sent
        first = await anext(lines, None)
    except BaseException:
        await lines.aclose()
        raise
    response = _PageResponse(first, lines)
    response.headers[LAST_SEQ_HEADER] = str(end)
    return response


async def _page(
    c: Container, tenant: str, sid: str, from_seq: int, to_seq: int | None, page: int
) -> AsyncGenerator[bytes, None]:
    """The page's lines. One that fails once the answer has begun (a data key that cannot be
    opened, met at a later event) ends the answer without its last chunk: the client sees it cut
    short, never a complete answer missing events (docs/http-api.md)."""
    subject = c.layout.session_subject(tenant, sid)
    async with contextlib.aclosing(eventlog.read(c.js, c.layout, subject, from_seq, to_seq, limit=page)) as read:
        n = 0
        async for ev in read:
            if (kid := kid_in(ev.data)) is not None:  # asked again if evicted or made since (a long page)
                await c.keys.load([(tenant, sid, kid)])
            yield audit.event_line(ev, c.layout, c.keys)
            n += 1
            if n == page:
                break


class _PageResponse(StreamingResponse):
    """The page's first line, made already, then the rest; the log's reader is closed when the
    answer is over however it ends (sent, cut short, the client gone before its first byte): its
    ordered consumer is unsubscribed then, not at collection."""

    def __init__(self, first: bytes | None, rest: AsyncGenerator[bytes, None]) -> None:
        super().__init__(_starting_with(first, rest), media_type=following.NDJSON)
        self._rest = rest

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self._rest.aclose()


PAGE_CHUNK_BYTES = 64 * 1024
"""A page's lines are sent in chunks of about this many bytes: one send a line (a write, a chunk
header and the middlewares' wrappers each) was about a third of the API's time for a page."""


async def _starting_with(first: bytes | None, rest: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    """The page's lines, ``first`` first, joined into chunks of :data:`PAGE_CHUNK_BYTES` or more
    (the last one smaller). A line that fails ends the answer there, after the lines made before
    it: the client sees them, then an answer cut short, as when each line was sent alone."""
    if first is None:
        return
    chunk, size = [first], len(first)
    try:
        async for line in rest:
            chunk.append(line)
            size += len(line)
            if size >= PAGE_CHUNK_BYTES:
                yield b"".join(chunk)
                chunk, size = [], 0
    except Exception:
        if chunk:
            yield b"".join(chunk)
        raise
    if chunk:
        yield b"".join(chunk)


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
