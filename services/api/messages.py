"""Messages: append (one or a chain), read, update, children, delete, clear."""

import logging
from typing import Annotated, Any

from fastapi import APIRouter, Header, Query, Response
from pydantic import ValidationError, WithJsonSchema

from events import ids
from events.admission import Refused
from events.blobs import BlobRef
from events.messages import UIMessage, stored_json
from events.omitted import OMITTED
from events.validation import validation_detail
from projections import context_queries, queries
from services.api import metrics
from services.api import models as m
from services.api.bodies import MAX_DELETE_IDS, AppendBatchBody, AppendBody, DeleteMessagesBody, UpdateBody
from services.api.deps import ContainerDep, Mid, MinSeq, Sid, Tenant, caught_up, check_id, no_nul, require_session
from services.api.models import ok
from services.api.responses import JSON, raw_json
from services.api.strict_json import StrictJsonRoute
from services.bootstrap import Container
from services.context.rules import reclaim, reclaimed_in
from services.errors import InvalidRequest, MessageNotFound
from services.writes.commands import AppendResult
from services.writes.decisions import ParentSpec

MAX_PAGE = 1000
"""The most children one read answers (``limit``'s bound and default)."""
_IDS_ITEM = {
    "type": "string",
    "minLength": 1,
    "maxLength": ids.MAX_MESSAGE_ID_LEN,
    "pattern": ids.MESSAGE_ID_LIST_PATTERN,
    "format": "chronicle-message-id-list",
    "description": "a message id, or several joined with ',' (an id that holds ',' needs POST …/messages:delete)",
}
log = logging.getLogger("chronicle.api")
router = APIRouter(route_class=StrictJsonRoute)


def _message(raw: dict[str, Any]) -> dict[str, Any]:
    """Validate the UIMessage shape; store the client's dict as sent (unknown fields kept)."""
    try:
        UIMessage.model_validate(raw)
    except ValidationError as exc:
        raise InvalidRequest(validation_detail(exc, prefix="message.")) from exc
    try:
        stored_json(raw).encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InvalidRequest("message contains invalid Unicode (a lone surrogate)") from exc
    no_nul(raw, "message")
    return raw


async def _delete_messages(c: Container, tenant: str, sid: str, wanted: list[str]) -> dict[str, Any]:
    if len(wanted) > MAX_DELETE_IDS:
        raise InvalidRequest(f"at most {MAX_DELETE_IDS} ids per request, not {len(wanted)}")
    w = await c.commands.delete_messages(tenant, sid, wanted)
    if w.ids:
        metrics.published("messages.deleted")
    return {"deleted": list(w.ids), "seq": w.seq}


@router.post(
    "/v1/sessions/{sid}/messages",
    status_code=201,
    response_model=None,
    responses=ok(m.Appended, 201) | ok(m.Appended, 200, "The same message again: the first answer, `created: false`"),
)
async def append(
    sid: Sid,
    body: AppendBody,
    tenant: Tenant,
    c: ContainerDep,
    response: Response,
    idempotency_key: Annotated[
        str | None,
        Header(
            alias="Idempotency-Key",
            min_length=1,
            max_length=128,
            pattern=r"^[!-~]+$",
            description="the client's name for this append, kept across its retries: a retry whose "
            "first attempt was stored answers `created: true` too",
        ),
    ] = None,
) -> dict[str, Any]:
    check_id("session", sid)
    message = _message(body.message)
    parent: ParentSpec = OMITTED
    if "parent_id" in body.model_fields_set:
        parent = check_id("message", body.parent_id) if body.parent_id is not None else None
    r: AppendResult = await c.commands.append(tenant, sid, message, parent, idempotency_key)
    if r.created:
        metrics.published("message.appended")
    else:
        response.status_code = 200
    return {"id": r.id, "parent_id": r.parent_id, "seq": r.seq, "created": r.created}


@router.post(
    "/v1/sessions/{sid}/messages:batch", status_code=201, response_model=None, responses=ok(m.BatchAppended, 201)
)
async def append_batch(sid: Sid, body: AppendBatchBody, tenant: Tenant, c: ContainerDep) -> dict[str, Any]:
    """Append a chain: the first message takes ``parent_id`` as a single append does (omitted:
    the latest leaf; ``null``: a new root), each next one is the child of the previous.

    Each message is its own event; a retried batch re-answers the appended ones (idempotent).
    """
    check_id("session", sid)
    messages = [_message(m) for m in body.messages]
    if len({m["id"] for m in messages}) != len(messages):
        raise InvalidRequest("message ids in a batch must be distinct")
    parent: ParentSpec = OMITTED
    if "parent_id" in body.model_fields_set:
        parent = check_id("message", body.parent_id) if body.parent_id is not None else None
    results: list[AppendResult] = []
    for message in messages:
        r = await c.commands.append(tenant, sid, message, parent)
        if r.created:
            metrics.published("message.appended")
        results.append(r)
        parent = r.id
    return {
        "messages": [{"id": r.id, "parent_id": r.parent_id, "seq": r.seq, "created": r.created} for r in results],
        "seq": max(r.seq for r in results),
    }


@router.get("/v1/sessions/{sid}/messages/{mid}", responses=ok(m.MessageRead))
async def get_message(
    sid: Sid, mid: Mid, tenant: Tenant, c: ContainerDep, min_seq: MinSeq = None, original: bool = False
) -> Response:
    """The stored message; ``original=true`` gives the untruncated one when it was over the row cap."""
    check_id("session", sid)
    check_id("message", mid)
    await caught_up(c, tenant, sid, min_seq)
    async with c.pool.connection() as conn:
        row = await queries.get_message(conn, tenant, sid, mid)
    if row is None:
        await require_session(c, tenant, sid)
        raise MessageNotFound(f"message {mid!r} is not in this session")
    if original and row.original_ref is not None:
        data = await c.originals.get(BlobRef.model_validate(row.original_ref))
        return Response(data, media_type=JSON)
    async with c.pool.connection() as conn:
        outputs = reclaimed_in(await context_queries.reclaimed(conn, tenant, sid)).outputs(row.id, row.content)
    return Response(reclaim(row.content, outputs) if outputs else row.content, media_type=JSON)


@router.put("/v1/sessions/{sid}/messages/{mid}", response_model=None, responses=ok(m.Updated))
async def update_message(sid: Sid, mid: Mid, body: UpdateBody, tenant: Tenant, c: ContainerDep) -> dict[str, Any]:
    check_id("session", sid)
    check_id("message", mid)
    message = _message(body.message)
    if message["id"] != mid:
        raise InvalidRequest("message.id must equal the id in the path")
    w = await c.commands.update(tenant, sid, message)
    metrics.published("message.updated")
    return {"id": mid, "seq": w.seq}


@router.get("/v1/sessions/{sid}/messages/{mid}/children", responses=ok(m.MessagePage))
async def children(
    sid: Sid,
    mid: Mid,
    tenant: Tenant,
    c: ContainerDep,
    min_seq: MinSeq = None,
    limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = MAX_PAGE,
    cursor: Annotated[int, Query(ge=0, le=2**63 - 1)] = 0,
) -> Response:
    """The message's children in append order, a page at a time (``next_cursor``: the next
    page's ``cursor``, null on the last one)."""
    check_id("session", sid)
    check_id("message", mid)
    await caught_up(c, tenant, sid, min_seq)
    async with c.pool.connection() as conn:
        rows = await queries.children(conn, tenant, sid, mid, cursor, limit)
    if not rows:
        await require_session(c, tenant, sid)
    nxt = rows[-1].seq if len(rows) == limit else None
    return raw_json({"next_cursor": nxt}, [r.content for r in rows])


@router.delete("/v1/sessions/{sid}/messages", response_model=None, responses=ok(m.MessagesDeleted))
async def delete_messages(
    sid: Sid,
    tenant: Tenant,
    c: ContainerDep,
    ids_: Annotated[
        list[Annotated[str, WithJsonSchema(_IDS_ITEM)]] | None, Query(alias="ids", max_length=MAX_DELETE_IDS)
    ] = None,
) -> dict[str, Any]:
    """Delete the listed messages (``ids``, at most :data:`MAX_DELETE_IDS`); clearing a whole
    session is its own operation (``POST …/messages:clear``): a forgotten parameter clears nothing."""
    check_id("session", sid)
    if ids_ is None:
        raise InvalidRequest("ids is required; to delete every message use POST /v1/sessions/{sid}/messages:clear")
    wanted = [check_id("message", i) for raw in ids_ for i in raw.split(",") if i]
    if not wanted:
        raise InvalidRequest("ids must name at least one message")
    return await _delete_messages(c, tenant, sid, wanted)


@router.post("/v1/sessions/{sid}/messages:delete", response_model=None, responses=ok(m.MessagesDeleted))
async def delete_listed_messages(sid: Sid, body: DeleteMessagesBody, tenant: Tenant, c: ContainerDep) -> dict[str, Any]:
    """The same delete with the ids in a JSON list: any id (one holding ',' too), and no URL to
    outgrow."""
    check_id("session", sid)
    return await _delete_messages(c, tenant, sid, [check_id("message", i) for i in body.ids])


@router.post("/v1/sessions/{sid}/messages:clear", response_model=None, responses=ok(m.Cleared))
async def clear_messages(sid: Sid, tenant: Tenant, c: ContainerDep) -> dict[str, Any]:
    """Delete every message of the session (``seq`` 0 when it never existed); a frozen prompt
    is re-rendered (blocks stay)."""
    check_id("session", sid)
    w = await c.commands.clear(tenant, sid)
    if w.seq == 0:
        return {"cleared": True, "seq": 0}
    metrics.published("messages.cleared")
    if await c.context.has_prompt(tenant, sid):
        try:
            await c.context.refresh_prompt(tenant, sid, "clear")
        except Refused as exc:  # the clear stands; the prompt in force stays until a refresh fits
            log.warning("after clearing %s/%s the prompt was not re-rendered: %s", tenant, sid, exc)
    return {"cleared": True, "seq": w.seq}
