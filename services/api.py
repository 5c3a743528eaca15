"""The HTTP API v1 (docs/http-api.md): commands publish events, queries read projections."""

import contextlib
import hmac
import json
import logging
from collections.abc import AsyncIterator
from typing import Annotated, Any

from fastapi import Body, FastAPI, Header, Query, Response
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import BaseModel, ConfigDict, Field, ValidationError, WithJsonSchema
from starlette.types import ASGIApp, Receive, Scope, Send

from events import ids
from events import log as eventlog
from events.admission import MAX_EVENT_BYTES, Refused
from events.blobs import BlobRef
from events.credentials import tenant_inbox_prefix, tenant_permissions
from events.messages import UIMessage, stored_json
from events.omitted import OMITTED
from events.validation import validation_detail
from projections import context_queries as cq
from projections import queries
from projections.overlays import Overlay, apply_overlays, overlay_json, overlays, send_overlays
from services import api_models as m
from services import audit, auditor_view, metrics, openapi
from services.api_audit import router as audit_router
from services.api_context import router as context_router
from services.api_models import ok
from services.bootstrap import Container, open_container
from services.commands import AppendResult, fork
from services.context import reclaim, reclaimed_in
from services.decisions import ParentSpec
from services.deps import (
    C,
    LeafId,
    Limit,
    MessageId,
    MessageJson,
    Mid,
    MinSeq,
    Q,
    SessionId,
    Sid,
    Tenant,
    caught_up,
    caught_up_all,
    check_id,
    no_nul,
    require_session,
    tenant_for,
)
from services.errors import ChronicleError, InvalidRequest, MessageNotFound, SummarizerFailed, Unauthorized
from services.microcompact import recent_window, truncate_older_messages
from services.problems import CrashGuard, from_error, install
from services.settings import Settings
from services.strict_json import StrictJsonRoute
from services.summarizers import SummarizerError

JSON = "application/json"
MAX_PAGE = 1000
"""The most children or events one read answers (``limit``'s bound and default)."""
MAX_EVENTS_PAGE = 10_000
"""The most events one ``GET …/events`` answers (``limit``'s bound and default)."""
MAX_DELETE_IDS = 1000
"""The most message ids one delete names."""
HISTORY_LIMIT = 10_000
"""How many messages a history answers by default (the recent end of a longer path)."""
MAX_HISTORY_LIMIT = 100_000
"""The most messages one history answers (``limit``'s bound)."""
MAX_SEQ = 2**63 - 1
"""The largest stream sequence a query parameter may name."""
_IDS_ITEM = {
    "type": "string",
    "minLength": 1,
    "maxLength": ids.MAX_MESSAGE_ID_LEN,
    "pattern": ids.MESSAGE_ID_LIST_PATTERN,
    "format": "chronicle-message-id-list",
    "description": "a message id, or several joined with ',' (an id that holds ',' needs POST …/messages:delete)",
}
log = logging.getLogger("chronicle.api")


def _examples(*examples: dict[str, Any]) -> ConfigDict:
    return ConfigDict(extra="forbid", json_schema_extra={"examples": list(examples)})


_MESSAGE = {"id": "m1", "role": "user", "parts": [{"type": "text", "text": "We deploy on Friday"}]}


class CreateSessionBody(BaseModel):
    model_config = _examples({"id": "demo", "name": "Demo", "metadata": {"team": "ops"}})
    id: SessionId | None = None
    name: str = Field(default="", max_length=512)
    parent_session_id: SessionId | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)


class RenameBody(BaseModel):
    model_config = _examples({"name": "Release planning"})
    name: str = Field(max_length=512)


class AppendBody(BaseModel):
    model_config = _examples({"message": _MESSAGE}, {"message": {**_MESSAGE, "id": "m0"}, "parent_id": None})
    message: MessageJson
    parent_id: MessageId | None = None


class ForkBody(BaseModel):
    model_config = _examples({"at_message_id": "m1", "name": "What if Thursday"})
    at_message_id: MessageId
    name: str | None = Field(default=None, max_length=512)
    id: SessionId | None = None


class CompactBody(BaseModel):
    model_config = _examples({}, {"leaf_id": "m1"})
    leaf_id: MessageId | None = None


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


class AppendBatchBody(BaseModel):
    model_config = _examples({"messages": [_MESSAGE, {**_MESSAGE, "id": "m2", "role": "assistant"}]})
    messages: list[MessageJson] = Field(min_length=1, max_length=1000)
    parent_id: MessageId | None = None


class DeleteMessagesBody(BaseModel):
    model_config = _examples({"ids": ["m1", "m2,with a comma"]})
    ids: list[MessageId] = Field(min_length=1, max_length=MAX_DELETE_IDS)


class UpdateBody(BaseModel):
    model_config = _examples({"message": _MESSAGE})
    message: MessageJson


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


OPS_PATHS = frozenset({"/metrics", "/readyz", "/docs", "/docs/oauth2-redirect", "/redoc", "/openapi.json"})
"""Operator routes: they show every tenant's totals, so ``CHRONICLE_OPS_KEY`` guards them."""


class ApiKeyAuth:
    """Checks the API key before anything reads the body (a bad key is 401 whatever the body) and
    puts the tenant in the request state; with an ops key, the operator routes need it. Plain ASGI:
    no response buffering or copying."""

    def __init__(self, app: ASGIApp, keys: dict[str, str], ops_key: str | None = None) -> None:
        self.app = app
        self.keys = keys
        self.ops_key = ops_key

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and self.ops_key is not None and scope["path"] in OPS_PATHS:
            header = next((v for k, v in scope["headers"] if k == b"authorization"), b"")
            if not hmac.compare_digest(header, f"Bearer {self.ops_key}".encode()):
                await from_error(Unauthorized("this route needs 'Authorization: Bearer <ops key>'"))(
                    scope, receive, send
                )
                return
        if scope["type"] == "http" and scope["path"].startswith("/v1/"):
            header = next((v for k, v in scope["headers"] if k == b"authorization"), b"")
            try:
                tenant = tenant_for(self.keys, header.decode("latin-1"))
            except ChronicleError as exc:
                await from_error(exc)(scope, receive, send)
                return
            scope.setdefault("state", {})["tenant"] = tenant
        await self.app(scope, receive, send)


class NdjsonResponse(StreamingResponse):
    media_type = "application/x-ndjson"


async def _delete_messages(c: Container, tenant: str, sid: str, wanted: list[str]) -> dict[str, Any]:
    if len(wanted) > MAX_DELETE_IDS:
        raise InvalidRequest(f"at most {MAX_DELETE_IDS} ids per request, not {len(wanted)}")
    w = await c.commands.delete_messages(tenant, sid, wanted)
    if w.ids:
        metrics.published("messages.deleted")
    return {"deleted": list(w.ids), "seq": w.seq}


def _raw_json(parts: dict[str, Any], raw_messages: list[str] | None = None) -> Response:
    """A JSON object whose ``messages`` member is spliced from stored JSON text (no re-parse)."""
    head = json.dumps(parts)[:-1]
    if raw_messages is None:
        return Response(head + "}", media_type=JSON)
    head += (", " if parts else "") + '"messages": ['
    # One join and one encode: a long history is a megabyte or more, and each copy shows.
    items = list(raw_messages) or [""]
    items[0] = head + items[0]
    items[-1] += "]}"
    return Response(",".join(items).encode(), media_type=JSON)


def _session_json(row: queries.SessionRow) -> dict[str, Any]:
    return {
        "id": row.id,
        "name": row.name,
        "parent_session_id": row.parent_session_id,
        "metadata": row.metadata,
        "created_at": row.created_at.isoformat(),
        "updated_at": row.updated_at.isoformat(),
        "seq": row.last_seq,
    }


def build_app(settings: Settings, container: Container | None = None) -> FastAPI:
    """The API; opens its own adapters from ``settings`` unless a container is injected."""
    keys = settings.tenants_by_key_hash()

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if container is not None:
            app.state.c = container
            yield
            return
        async with open_container(settings) as opened:
            app.state.c = opened
            yield

    app = FastAPI(title="Chronicle", version="1.0", lifespan=lifespan)
    app.router.route_class = StrictJsonRoute  # every JSON body parsed strictly, before the route runs
    app.state.keys = keys
    if container is not None:
        app.state.c = container  # usable without running the lifespan (in-process clients)
    install(app)
    openapi.install(app)

    ops_key = settings.ops_key.get_secret_value() if settings.ops_key is not None else None
    app.add_middleware(ApiKeyAuth, keys=keys, ops_key=ops_key)
    app.add_middleware(CrashGuard)  # outermost: no error drops the connection

    app.include_router(context_router)
    app.include_router(audit_router)
    auditor_view.install(app)

    # -- sessions --------------------------------------------------------------------------

    @app.post("/v1/sessions", status_code=201, response_model=None, responses=ok(m.SessionCreated, 201))
    async def create_session(body: CreateSessionBody, tenant: Tenant, c: C) -> dict[str, Any]:
        no_nul([body.name, body.metadata], "name and metadata")
        sid = check_id("session", body.id) if body.id is not None else None
        parent = check_id("session", body.parent_session_id) if body.parent_session_id is not None else None
        w = await c.commands.create_session(tenant, sid, body.name, parent, body.metadata)
        metrics.published("session.created")
        return {"id": w.ids[0], "name": body.name, "parent_session_id": parent, "metadata": body.metadata, "seq": w.seq}

    @app.get("/v1/sessions", response_model=None, responses=ok(m.SessionPage))
    async def list_sessions(
        tenant: Tenant,
        c: C,
        limit: Annotated[int, Query(ge=1, le=500)] = 50,
        cursor: Annotated[int | None, Query(ge=0, le=2**63 - 1)] = None,
        min_seq: MinSeq = None,
    ) -> dict[str, Any]:
        await caught_up_all(c, min_seq)
        async with c.pool.connection() as cx:
            rows = await queries.list_sessions(cx, tenant, limit, cursor)
        nxt = rows[-1].created_seq if len(rows) == limit else None
        return {"sessions": [_session_json(r) for r in rows], "next_cursor": nxt}

    @app.get("/v1/sessions/{sid}", response_model=None, responses=ok(m.Session))
    async def get_session(sid: Sid, tenant: Tenant, c: C, min_seq: MinSeq = None) -> dict[str, Any]:
        check_id("session", sid)
        await caught_up(c, tenant, sid, min_seq)
        return _session_json(await require_session(c, tenant, sid))

    @app.patch("/v1/sessions/{sid}", response_model=None, responses=ok(m.Renamed))
    async def rename_session(sid: Sid, body: RenameBody, tenant: Tenant, c: C) -> dict[str, Any]:
        no_nul(body.name, "name")
        check_id("session", sid)
        w = await c.commands.rename_session(tenant, sid, body.name)
        metrics.published("session.renamed")
        return {"id": sid, "name": body.name, "seq": w.seq}

    @app.delete("/v1/sessions/{sid}", response_model=None, responses=ok(m.SessionDeleted))
    async def delete_session(sid: Sid, tenant: Tenant, c: C) -> dict[str, Any]:
        check_id("session", sid)
        w = await c.commands.delete_session(tenant, sid)
        metrics.published("session.deleted")
        return {"id": sid, "deleted": True, "seq": w.seq}

    # -- messages --------------------------------------------------------------------------

    @app.post(
        "/v1/sessions/{sid}/messages",
        status_code=201,
        response_model=None,
        responses=ok(m.Appended, 201)
        | ok(m.Appended, 200, "The same message again: the first answer, `created: false`"),
    )
    async def append(
        sid: Sid,
        body: AppendBody,
        tenant: Tenant,
        c: C,
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

    @app.post(
        "/v1/sessions/{sid}/messages:batch", status_code=201, response_model=None, responses=ok(m.BatchAppended, 201)
    )
    async def append_batch(sid: Sid, body: AppendBatchBody, tenant: Tenant, c: C) -> dict[str, Any]:
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

    @app.get("/v1/sessions/{sid}/messages/{mid}", responses=ok(m.MessageRead))
    async def get_message(
        sid: Sid, mid: Mid, tenant: Tenant, c: C, min_seq: MinSeq = None, original: bool = False
    ) -> Response:
        """The stored message; ``original=true`` gives the untruncated one when it was over the row cap."""
        check_id("session", sid)
        check_id("message", mid)
        await caught_up(c, tenant, sid, min_seq)
        async with c.pool.connection() as cx:
            row = await queries.get_message(cx, tenant, sid, mid)
        if row is None:
            await require_session(c, tenant, sid)
            raise MessageNotFound(f"message {mid!r} is not in this session")
        if original and row.original_ref is not None:
            data = await c.originals.get(BlobRef.model_validate(row.original_ref))
            return Response(data, media_type=JSON)
        async with c.pool.connection() as cx:
            outputs = reclaimed_in(await cq.reclaimed(cx, tenant, sid)).outputs(row.id, row.content)
        return Response(reclaim(row.content, outputs) if outputs else row.content, media_type=JSON)

    @app.put("/v1/sessions/{sid}/messages/{mid}", response_model=None, responses=ok(m.Updated))
    async def update_message(sid: Sid, mid: Mid, body: UpdateBody, tenant: Tenant, c: C) -> dict[str, Any]:
        check_id("session", sid)
        check_id("message", mid)
        message = _message(body.message)
        if message["id"] != mid:
            raise InvalidRequest("message.id must equal the id in the path")
        w = await c.commands.update(tenant, sid, message)
        metrics.published("message.updated")
        return {"id": mid, "seq": w.seq}

    @app.get("/v1/sessions/{sid}/messages/{mid}/children", responses=ok(m.MessagePage))
    async def children(
        sid: Sid,
        mid: Mid,
        tenant: Tenant,
        c: C,
        min_seq: MinSeq = None,
        limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = MAX_PAGE,
        cursor: Annotated[int, Query(ge=0, le=2**63 - 1)] = 0,
    ) -> Response:
        """The message's children in append order, a page at a time (``next_cursor``: the next
        page's ``cursor``, null on the last one)."""
        check_id("session", sid)
        check_id("message", mid)
        await caught_up(c, tenant, sid, min_seq)
        async with c.pool.connection() as cx:
            rows = await queries.children(cx, tenant, sid, mid, cursor, limit)
        if not rows:
            await require_session(c, tenant, sid)
        nxt = rows[-1].seq if len(rows) == limit else None
        return _raw_json({"next_cursor": nxt}, [r.content for r in rows])

    @app.delete("/v1/sessions/{sid}/messages", response_model=None, responses=ok(m.MessagesDeleted))
    async def delete_messages(
        sid: Sid,
        tenant: Tenant,
        c: C,
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

    @app.post("/v1/sessions/{sid}/messages:delete", response_model=None, responses=ok(m.MessagesDeleted))
    async def delete_listed_messages(sid: Sid, body: DeleteMessagesBody, tenant: Tenant, c: C) -> dict[str, Any]:
        """The same delete with the ids in a JSON list: any id (one holding ',' too), and no URL to
        outgrow."""
        check_id("session", sid)
        return await _delete_messages(c, tenant, sid, [check_id("message", i) for i in body.ids])

    @app.post("/v1/sessions/{sid}/messages:clear", response_model=None, responses=ok(m.Cleared))
    async def clear_messages(sid: Sid, tenant: Tenant, c: C) -> dict[str, Any]:
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

    # -- reads -----------------------------------------------------------------------------

    @app.get("/v1/sessions/{sid}/history", responses=ok(m.History))
    async def history(
        sid: Sid,
        tenant: Tenant,
        c: C,
        leaf_id: LeafId = None,
        min_seq: MinSeq = None,
        as_of_seq: Annotated[int | None, Query(ge=0, le=MAX_SEQ)] = None,
        compacted: bool = True,
        truncate_older: bool = False,
        keep_recent: Annotated[int, Query(ge=0, le=10_000)] = 4,
        max_tool_output_chars: Annotated[int, Query(ge=1, le=MAX_SEQ)] = 500,
        max_text_chars: Annotated[int, Query(ge=1, le=MAX_SEQ)] = 10_000,
        max_bytes: Annotated[int | None, Query(ge=0, le=MAX_SEQ)] = None,
        min_recent: Annotated[int, Query(ge=0, le=MAX_SEQ)] = 1,
        limit: Annotated[int, Query(ge=1, le=MAX_HISTORY_LIMIT)] = HISTORY_LIMIT,
    ) -> Response:
        """Root-to-leaf path (default: the latest leaf), overlays applied unless ``compacted=false``.

        ``truncate_older`` returns a micro-compacted copy (older tool outputs and long texts cut,
        structure kept); ``max_bytes`` returns the byte-budgeted recent suffix with ``truncated``
        and ``total_content_bytes``. At most ``limit`` messages (the recent end, after overlays)
        are answered: a longer path adds ``truncated: true``. Stored messages are never changed
        by a read.
        """
        check_id("session", sid)
        if leaf_id is not None:
            check_id("message", leaf_id)
        head: dict[str, Any] = {}
        if as_of_seq is not None:  # folded from the log: the same view as the read models had then
            state = await audit.session_as_of(c, tenant, sid, as_of_seq)
            leaf_id = leaf_id or state.latest_leaf()
            raw = state.path_rows(leaf_id)
            found = state.overlay_list() if compacted and raw else []
            unloaded = reclaimed_in(state.reclaimed)
            head = {"as_of_seq": as_of_seq}
        else:
            wanted, leaf = min_seq, leaf_id
            while True:
                # The reads see one state; pipelined, BEGIN, COMMIT and the read-your-writes check
                # travel with the reads. A state older than min_seq is read again after waiting.
                async with c.pool.connection() as cx, cx.pipeline(), queries.snapshot(cx):
                    fresh = await c.waiter.send_applied_check(cx, tenant, sid, wanted) if wanted else None
                    sent_overlays = await send_overlays(cx, tenant, sid) if compacted else None
                    sent_reclaimed = await cq.send_reclaimed(cx, tenant, sid)
                    if leaf is None:
                        leaf_id, raw = await queries.latest_path_contents(cx, tenant, sid)
                    else:
                        raw = await queries.path_contents(cx, tenant, sid, leaf)
                    found = await sent_overlays() if sent_overlays is not None else []
                    unloaded = reclaimed_in(await sent_reclaimed())
                    stale = fresh is not None and not await fresh()
                if not stale:
                    break
                await caught_up(c, tenant, sid, wanted)
                wanted = None  # applied now, and the read model never goes back
            if not raw:
                await require_session(c, tenant, sid)
        if max_bytes is not None and raw:
            start, truncated, total = recent_window(
                [(r.id, len(r.content.encode())) for r in raw], max_bytes, min_recent
            )
            raw = raw[start:]
            head |= {"truncated": truncated, "total_content_bytes": total}
        by_id = {r.id: r for r in raw}
        contents: list[str] = []
        for item in apply_overlays(list(by_id), found):
            if isinstance(item, Overlay):
                contents.append(overlay_json(item))
                continue
            row = by_id[item]
            outputs = unloaded.outputs(row.id, row.content)
            contents.append(reclaim(row.content, outputs) if outputs else row.content)
        if len(contents) > limit:  # the recent end, as max_bytes keeps it
            contents = contents[-limit:]
            head["truncated"] = True
        if truncate_older:
            parsed = [json.loads(x) for x in contents]
            cut = truncate_older_messages(parsed, keep_recent, max_tool_output_chars, max_text_chars)
            contents = [x if m is p else stored_json(m) for x, m, p in zip(contents, cut, parsed, strict=True)]
        return _raw_json({"leaf_id": leaf_id if raw else None, **head}, contents)

    @app.post("/v1/sessions/{sid}/fork", status_code=201, response_model=None, responses=ok(m.Forked, 201))
    async def fork_session(sid: Sid, body: ForkBody, tenant: Tenant, c: C) -> dict[str, Any]:
        """A new session holding this one's history up to ``at_message_id`` (overlays carried over)."""
        check_id("session", sid)
        check_id("message", body.at_message_id)
        new_id = check_id("session", body.id) if body.id is not None else None
        forked = await fork(c.commands, tenant, sid, body.at_message_id, new_id, body.name)
        metrics.published("session.forked")
        return {"id": forked.id, "parent_session_id": sid, "messages": forked.messages, "seq": forked.seq}

    @app.post("/v1/sessions/{sid}/compact", response_model=None, responses=ok(m.Compacted))
    async def compact(
        sid: Sid, tenant: Tenant, c: C, body: Annotated[CompactBody | None, Body()] = None
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

    @app.get("/v1/sessions/{sid}/compactions", response_model=None, responses=ok(m.Compactions))
    async def compactions(sid: Sid, tenant: Tenant, c: C, min_seq: MinSeq = None) -> dict[str, Any]:
        """Every overlay of the session, superseded ones included, oldest first."""
        check_id("session", sid)
        await caught_up(c, tenant, sid, min_seq)
        async with c.pool.connection() as cx:
            found = await overlays(cx, tenant, sid)
        if not found:
            await require_session(c, tenant, sid)
        return {"compactions": [overlay_dict(o) for o in found]}

    @app.get("/v1/sessions/{sid}/leaf", responses=ok(m.Leaf))
    async def leaf(sid: Sid, tenant: Tenant, c: C, min_seq: MinSeq = None) -> Response:
        check_id("session", sid)
        await caught_up(c, tenant, sid, min_seq)
        async with c.pool.connection() as cx:
            row = await queries.latest_leaf(cx, tenant, sid)
        if row is None:
            await require_session(c, tenant, sid)
            return Response('{"leaf_id": null, "message": null}', media_type=JSON)
        return Response(f'{{"leaf_id": {json.dumps(row.id)}, "message": {row.content}}}', media_type=JSON)

    @app.get("/v1/sessions/{sid}/path-length", response_model=None, responses=ok(m.PathLength))
    async def path_length(
        sid: Sid, tenant: Tenant, c: C, leaf_id: LeafId = None, min_seq: MinSeq = None
    ) -> dict[str, Any]:
        check_id("session", sid)
        if leaf_id is not None:
            check_id("message", leaf_id)
        await caught_up(c, tenant, sid, min_seq)
        async with c.pool.connection() as cx:
            if leaf_id is None:
                leaf = await queries.latest_leaf(cx, tenant, sid)
                leaf_id = leaf.id if leaf else None
            length = await queries.path_length(cx, tenant, sid, leaf_id) if leaf_id else 0
        if not length:
            await require_session(c, tenant, sid)
        return {"leaf_id": leaf_id, "length": length}

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

    @app.get("/v1/sessions/{sid}/search", response_model=None, responses=ok(m.SearchResults))
    async def search_session(
        sid: Sid, q: Q, tenant: Tenant, c: C, limit: Limit = 20, min_seq: MinSeq = None
    ) -> dict[str, Any]:
        check_id("session", sid)
        await caught_up(c, tenant, sid, min_seq)
        async with c.pool.connection() as cx:
            hits = await queries.search(cx, tenant, sid, q, limit)
        if not hits:
            await require_session(c, tenant, sid)
        return _hits(hits)

    @app.get("/v1/search", response_model=None, responses=ok(m.SearchResults))
    async def search_tenant(q: Q, tenant: Tenant, c: C, limit: Limit = 20, min_seq: MinSeq = None) -> dict[str, Any]:
        await caught_up_all(c, min_seq)
        async with c.pool.connection() as cx:
            return _hits(await queries.search(cx, tenant, None, q, limit))

    @app.get("/v1/sessions/{sid}/events", response_class=NdjsonResponse)
    async def events(
        sid: Sid,
        tenant: Tenant,
        c: C,
        from_seq: Annotated[int, Query(ge=1, le=MAX_SEQ)] = 1,
        to_seq: Annotated[int | None, Query(ge=1, le=MAX_SEQ)] = None,
        limit: Annotated[int, Query(ge=1, le=MAX_EVENTS_PAGE)] = MAX_EVENTS_PAGE,
    ) -> StreamingResponse:
        """The session's events from ``from_seq``, at most ``limit``: a full page may have more
        after it (ask again with ``from_seq`` = its last ``seq`` + 1)."""
        check_id("session", sid)
        subject = c.layout.session_subject(tenant, sid)

        async def lines() -> AsyncIterator[bytes]:
            read = eventlog.read(c.js, c.layout, subject, from_seq, to_seq)
            try:
                n = 0
                async for ev in read:
                    yield audit.event_line(ev, c.layout)
                    n += 1
                    if n == limit:
                        break
            finally:
                await read.aclose()  # the ordered consumer is unsubscribed now, not at collection

        return StreamingResponse(lines(), media_type="application/x-ndjson")

    @app.get("/v1/sessions/{sid}/last-seq", response_model=None, responses=ok(m.Seq))
    async def last_seq(sid: Sid, tenant: Tenant, c: C) -> dict[str, int]:
        """The stream sequence of the session's newest event (0 when it has none): what a direct
        publisher sends as its expected last subject sequence."""
        check_id("session", sid)
        return {"seq": await c.publisher.last_subject_seq(tenant, sid)}

    @app.get("/v1/nats", response_model=None, responses=ok(m.NatsPublishing))
    async def nats_publishing(tenant: Tenant, c: C) -> dict[str, Any]:
        """How this key's tenant publishes straight to JetStream: its subjects, the inbox prefix
        its publish acks arrive under (its NATS credentials are derived from the same key)."""
        layout = c.layout
        return {
            "tenant": tenant,
            "stream": layout.stream,
            "subject_prefix": layout.prefix,
            "partitions": layout.partitions,
            "inbox_prefix": tenant_inbox_prefix(tenant),
            "publish": tenant_permissions(layout, tenant)["publish"]["allow"],
            "payload_limit_bytes": c.settings.payload_limit_bytes,
            "max_message_bytes": c.settings.max_message_bytes,
            "max_event_bytes": MAX_EVENT_BYTES,
        }

    # -- operations ------------------------------------------------------------------------

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/readyz", responses={503: {"description": "Not ready: `reasons` says why"}})
    async def readyz(c: C) -> JSONResponse:
        status = await metrics.readiness(c)
        return JSONResponse(status, status_code=200 if status["ready"] else 503)

    @app.get("/metrics", response_class=PlainTextResponse)
    async def prometheus(c: C) -> Response:
        await metrics.refresh(c)
        return Response(generate_latest(metrics.REGISTRY), media_type=CONTENT_TYPE_LATEST)

    return app
