"""Messages: append (one or a chain), read, update, children, delete, clear."""

import logging
from typing import Annotated, Any

from fastapi import APIRouter, Query, Response
from pydantic import WithJsonSchema

from events import ids
from events.blobs import BlobNotFound, BlobRef
from events.commands import MAX_DELETE_IDS
from events.objects import NotTheOwner, is_sealed_object, open_object
from events.sealing import KeyUnavailable, SealBroken
from projections import context_queries, queries
from projections.reclaimed import reclaim, reclaimed_in
from services.api import models as m
from services.api.bodies import AppendBatchBody, AppendBody, DeleteMessagesBody, ExistsBody, UpdateBody
from services.api.deps import (
    ChargeDep,
    ContainerDep,
    Mid,
    MinSeq,
    Sid,
    Tenant,
    caught_up,
    check_id,
    idempotency_key,
    require_session,
)
from services.api.models import ok
from services.api.paging import MAX_PAGE, PageLimit, SeqCursor
from services.api.responses import JSON, raw_json
from services.api.strict_json import StrictJsonRoute
from services.bootstrap import Container
from services.errors import InvalidRequest, MessageNotFound, NotFound
from services.requests import writes

log = logging.getLogger("chronicle.api")

_IDS_ITEM = {
    "type": "string",
    "minLength": 1,
    "maxLength": ids.MAX_MESSAGE_ID_LEN,
    "pattern": ids.MESSAGE_ID_LIST_PATTERN,
    "format": "chronicle-message-id-list",
    "description": "a message id, or several joined with ',' (an id that holds ',' needs POST …/messages:delete)",
}
router = APIRouter(route_class=StrictJsonRoute)


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
        idempotency_key(
            "the client's name for this append, kept across its retries: a retry whose "
            "first attempt was stored answers `created: true` too; a key whose derived event id a message "
            "on another subject of the log holds is `409 idempotency_key_conflict`"
        ),
    ] = None,
) -> dict[str, Any]:
    status, out = await append_one(c, tenant, sid, body, idempotency_key)
    response.status_code = status
    return out


async def append_one(
    c: Container, tenant: str, sid: str, body: AppendBody, idempotency_key: str | None
) -> tuple[int, dict[str, Any]]:
    """The append route's status and answer: the route and the hot path (services/api/hot.py)
    both serve this."""
    parent = writes.parent_spec(body.parent_id, "parent_id" in body.model_fields_set)
    out = await writes.append(c, tenant, sid, body.message, parent, idempotency_key)
    return (201 if out["created"] else 200), out


@router.post(
    "/v1/sessions/{sid}/messages:batch", status_code=201, response_model=None, responses=ok(m.BatchAppended, 201)
)
async def append_batch(
    sid: Sid,
    body: AppendBatchBody,
    tenant: Tenant,
    c: ContainerDep,
    charge: ChargeDep,
    idempotency_key: Annotated[
        str | None,
        idempotency_key(
            "the client's name for this batch, kept across its retries: a retry whose first attempt stored "
            "messages answers them `created: true` too; a key whose derived event id a message on another "
            "subject of the log holds is `409 idempotency_key_conflict`"
        ),
    ] = None,
) -> dict[str, Any]:
    """Append a chain: the first message takes ``parent_id`` as a single append does (omitted:
    the latest leaf; ``null``: a new root), each next one is the child of the previous, or, when
    another writer appended under the previous meanwhile, of the latest leaf below it: the
    session stays one chain under concurrent writers.

    Each message is its own event; a retried batch re-answers the appended ones (idempotent), as
    created when it sends the first attempt's ``Idempotency-Key``. Not atomic: a failure part-way
    is the failing message's problem with ``failed_index`` and ``written`` (the batch's messages
    stored before it, as this answer lists them).

    Under a request limit it counts as one request per message: the messages past the first are
    charged once the batch is checked, before any is appended (``429 rate_limited`` refuses it whole);
    a failure part-way gives back the charge of the messages after the failing one.
    """
    parent = writes.parent_spec(body.parent_id, "parent_id" in body.model_fields_set)
    return await writes.append_batch(c, tenant, sid, body.messages, parent, idempotency_key, charge)


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
        gone = NotFound(f"message {mid!r} has no original this session can read")  # one answer: it learns nothing more
        try:  # a reference published straight to the log may name what is not this session's
            ref = BlobRef.model_validate(row.original_ref)
            data = await c.originals.get(ref)
        except BlobNotFound as exc:  # the operator's to know (a lost bucket: readyz and verify cannot see it)
            log.warning(
                "message %r of session %s/%s: its original %s is not in bucket %r (%s)",
                mid,
                tenant,
                sid,
                ref.key[:200],
                c.settings.originals_bucket,
                exc,
            )
            raise gone from None
        if is_sealed_object(data):  # the session's own key: a KEK this process lacks is 500 key_unavailable
            await c.keys.refresh([(tenant, sid)])
        try:
            data = open_object(data, c.keys, tenant, sid)
        except (NotTheOwner, SealBroken, KeyUnavailable):  # another session's object, or none it can open
            raise gone from None
        return Response(data, media_type=JSON)
    async with c.pool.connection() as conn:
        outputs = reclaimed_in(await context_queries.reclaimed(conn, tenant, sid)).outputs(row.id, row.content)
    return Response(reclaim(row.content, outputs) if outputs else row.content, media_type=JSON)


@router.post("/v1/sessions/{sid}/messages:exists", response_model=None, responses=ok(m.MessagesExisting))
async def existing_messages(
    sid: Sid, body: ExistsBody, tenant: Tenant, c: ContainerDep, min_seq: MinSeq = None
) -> dict[str, Any]:
    """Which of the listed ids (at most :data:`MAX_DELETE_IDS`) are messages of the session, in
    the order given, each once: one read for a whole list, where ``GET …/messages/{mid}`` answers
    one id with its body. A read (a read-only key may make it) that is a POST because its ids, any
    id as it is, fit no URL. ``404 session_not_found`` when none is and the session does not exist."""
    check_id("session", sid)
    wanted = list(dict.fromkeys(check_id("message", i) for i in body.ids))
    await caught_up(c, tenant, sid, min_seq)
    async with c.pool.connection() as conn:
        found = await queries.existing_ids(conn, tenant, sid, wanted)
    if not found:
        await require_session(c, tenant, sid)
    return {"existing": [i for i in wanted if i in found]}


@router.put("/v1/sessions/{sid}/messages/{mid}", response_model=None, responses=ok(m.Updated))
async def update_message(sid: Sid, mid: Mid, body: UpdateBody, tenant: Tenant, c: ContainerDep) -> dict[str, Any]:
    return await writes.update_message(c, tenant, sid, mid, body.message)


@router.get("/v1/sessions/{sid}/messages/{mid}/children", responses=ok(m.MessagePage))
async def children(
    sid: Sid,
    mid: Mid,
    tenant: Tenant,
    c: ContainerDep,
    min_seq: MinSeq = None,
    limit: PageLimit = MAX_PAGE,
    cursor: SeqCursor = 0,
) -> Response:
    """The message's children in append order, a page at a time (``next_cursor``: the next
    page's ``cursor``, null on the last one; a page ends early at its bytes budget)."""
    check_id("session", sid)
    check_id("message", mid)
    await caught_up(c, tenant, sid, min_seq)
    async with c.pool.connection() as conn:
        rows, follows = await queries.children_page(conn, tenant, sid, mid, cursor, limit)
    if not rows:
        await require_session(c, tenant, sid)
    return raw_json({"next_cursor": rows[-1].seq if follows else None}, [r.content for r in rows])


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
    return await writes.delete_messages(c, tenant, sid, wanted)


@router.post("/v1/sessions/{sid}/messages:delete", response_model=None, responses=ok(m.MessagesDeleted))
async def delete_listed_messages(sid: Sid, body: DeleteMessagesBody, tenant: Tenant, c: ContainerDep) -> dict[str, Any]:
    """The same delete with the ids in a JSON list: any id (one holding ',' too), and no URL to
    outgrow."""
    return await writes.delete_messages(c, tenant, sid, body.ids)


@router.post("/v1/sessions/{sid}/messages:clear", response_model=None, responses=ok(m.Cleared))
async def clear_messages(sid: Sid, tenant: Tenant, c: ContainerDep) -> dict[str, Any]:
    """Delete every message of the session (``seq`` 0 when it never existed); a frozen prompt
    is re-rendered (blocks stay)."""
    return await writes.clear_messages(c, tenant, sid)
