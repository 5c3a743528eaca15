"""HTTP routes of context memory: config, blocks, application writes, tools, system prompt."""

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Body, Path, Query, Request
from pydantic import BaseModel, ConfigDict, Field, WithJsonSchema

from events.context import LABEL_RE, SessionConfig
from events.limits import MAX_TOOL_CALL_ID
from events.validation import NO_NUL_PATTERN
from projections import context_queries
from services.api import models as m
from services.api.deps import (
    MAX_SEQ,
    ConfigJson,
    ContainerDep,
    MinSeq,
    Sid,
    Tenant,
    caught_up,
    check_id,
    read_only,
    require_session,
)
from services.api.models import ok
from services.api.strict_json import StrictJsonRoute
from services.audit import readers as audit
from services.errors import ReadOnlyKey, SessionNotFound
from services.requests import writes
from services.slots import AS_OF_WAIT_S
from services.writes.liveness import live_session

ToolCallId = Annotated[str | None, Query(min_length=1, max_length=MAX_TOOL_CALL_ID, pattern=NO_NUL_PATTERN)]

router = APIRouter(route_class=StrictJsonRoute)
BlockLabel = Annotated[str, Path(), WithJsonSchema({"type": "string", "pattern": LABEL_RE})]
"""A block label (documented; an unknown one is ``404 block_not_found``)."""


class ContextWriteBody(BaseModel):
    model_config = ConfigDict(
        extra="forbid", json_schema_extra={"examples": [{"content": "The user deploys on Fridays", "mode": "append"}]}
    )
    content: str = Field(max_length=1_000_000)
    mode: Literal["replace", "append"] = "replace"


@router.put("/v1/sessions/{sid}/config", response_model=None, responses=ok(m.ConfigWritten))
async def put_config(sid: Sid, tenant: Tenant, c: ContainerDep, body: Annotated[ConfigJson, Body()]) -> dict[str, Any]:
    return await writes.configure(c, tenant, sid, body)


@router.get("/v1/sessions/{sid}/config", response_model=None, responses=ok(m.ConfigRead))
async def get_config(sid: Sid, tenant: Tenant, c: ContainerDep, min_seq: MinSeq = None) -> dict[str, Any]:
    check_id("session", sid)
    await caught_up(c, tenant, sid, min_seq)
    async with c.pool.connection() as conn:
        stored = await context_queries.config(conn, tenant, sid)
        if stored is None and not await context_queries.session_known(conn, tenant, sid):
            await live_session(conn, tenant, sid, must_exist=False)  # a deleted or erased one says so
            raise SessionNotFound(f"session {sid!r} does not exist")
    config = stored or SessionConfig()
    return {"config": config.model_dump(mode="json", exclude_none=True)}


@router.get("/v1/sessions/{sid}/context", response_model=None, responses=ok(m.Blocks))
async def get_context(
    sid: Sid,
    tenant: Tenant,
    c: ContainerDep,
    min_seq: MinSeq = None,
    as_of_seq: Annotated[int | None, Query(ge=0, le=MAX_SEQ)] = None,
) -> dict[str, Any]:
    """The blocks with their content and token counts; ``as_of_seq`` folds the configuration,
    writable contents and searchable entries from the log as they were after that sequence
    (object-storage texts, skill listings and the session count are read as they are now)."""
    check_id("session", sid)
    head: dict[str, Any] = {}
    if as_of_seq is not None:
        async with c.as_of_gate.slot(tenant, AS_OF_WAIT_S):  # bounded: a fold holds the session in memory
            state = await audit.session_as_of(c, tenant, sid, as_of_seq)
        async with c.pool.connection() as conn:
            blocks = await c.context.blocks(
                conn,
                tenant,
                sid,
                config=state.config or SessionConfig(),
                contents=state.contents,
                counts=state.entry_counts(),
            )
        head = {"as_of_seq": as_of_seq}
    else:
        await caught_up(c, tenant, sid, min_seq)
        sources = await c.context.sources(tenant, sid)
        async with c.pool.connection() as conn:
            blocks = await c.context.blocks(conn, tenant, sid, sources=sources)
    if not blocks:
        await require_session(c, tenant, sid)
    return {
        **head,
        "blocks": [
            {
                "label": b.label,
                "kind": b.kind,
                "description": b.description,
                "content": b.content,
                "tokens": b.tokens,
                "max_tokens": b.max_tokens,
                "writable": b.writable,
            }
            for b in blocks
        ],
    }


@router.put("/v1/sessions/{sid}/context/{label}", response_model=None, responses=ok(m.BlockWritten))
async def write_context(
    sid: Sid, label: BlockLabel, body: ContextWriteBody, tenant: Tenant, c: ContainerDep
) -> dict[str, Any]:
    return await writes.write_context(c, tenant, sid, label, body.content, body.mode)


@router.get("/v1/sessions/{sid}/tools", response_model=None, responses=ok(m.Tools))
async def get_tools(
    sid: Sid, tenant: Tenant, c: ContainerDep, format: Literal["openai", "anthropic"] = "openai", min_seq: MinSeq = None
) -> dict[str, Any]:
    check_id("session", sid)
    await caught_up(c, tenant, sid, min_seq)
    async with c.pool.connection() as conn:
        if not await context_queries.session_known(conn, tenant, sid):
            await live_session(conn, tenant, sid, must_exist=False)  # a deleted or erased one says so
            raise SessionNotFound(f"session {sid!r} does not exist")
    specs = await c.context.tools(tenant, sid)
    return {"format": format, "tools": [s.to(format) for s in specs]}


@router.post("/v1/sessions/{sid}/tools/{name}", response_model=None, responses=ok(m.ToolResult))
async def run_tool(
    sid: Sid,
    name: str,
    tenant: Tenant,
    c: ContainerDep,
    arguments: Annotated[Any, Body()] = None,
    tool_call_id: ToolCallId = None,
) -> dict[str, Any]:
    """Execute a tool with the LLM's arguments; failures come back as ``Error: …`` results.

    ``tool_call_id`` (the LLM's id for this call) lets a later ``unload_context`` reclaim a
    ``load_context`` output even before the message holding it is stored."""
    return await writes.run_tool(c, tenant, sid, name, arguments, tool_call_id)


@router.get("/v1/sessions/{sid}/system-prompt", response_model=None, responses=ok(m.SystemPrompt))
async def system_prompt(
    request: Request,
    sid: Sid,
    tenant: Tenant,
    c: ContainerDep,
    as_of_seq: Annotated[int | None, Query(ge=0, le=MAX_SEQ)] = None,
    min_seq: MinSeq = None,
) -> dict[str, Any]:
    """The frozen prompt (frozen on first call); ``as_of_seq`` gives the one in force then."""
    check_id("session", sid)
    # read-your-writes: a refresh (or a clear) just answered must be visible, and so must every
    # prompt recorded up to ``as_of_seq``
    if as_of_seq is not None:
        await audit.reached(c, as_of_seq)
    await caught_up(c, tenant, sid, max(min_seq or 0, as_of_seq or 0))
    if as_of_seq is not None:
        async with c.pool.connection() as conn:
            cur = await conn.execute(
                "SELECT text, tokens, version, seq FROM prompts WHERE tenant = %s AND session_id = %s AND seq <= %s "
                "ORDER BY version DESC LIMIT 1",
                (tenant, sid, as_of_seq),
            )
            row = await cur.fetchone()
        if row is None:  # none in force then: a live session's is null; an erased or unknown one is not found
            await require_session(c, tenant, sid)
            return {"prompt": None, "tokens": 0, "version": 0, "seq": 0}
        return {"prompt": row[0], "tokens": row[1], "version": row[2], "seq": row[3]}
    if read_only(request):  # the first read freezes (records) the prompt: a write
        prompt = await c.context.recorded_prompt(tenant, sid)
        if prompt is None:
            await require_session(c, tenant, sid)  # an unknown session is 404 as for any key
            raise ReadOnlyKey("this API key only reads: no prompt is frozen yet, and the first read freezes one")
    else:
        prompt = await c.context.frozen_prompt(tenant, sid)
    return {"prompt": prompt.text, "tokens": prompt.tokens, "version": prompt.version, "seq": prompt.seq}


@router.post("/v1/sessions/{sid}/system-prompt:refresh", response_model=None, responses=ok(m.SystemPrompt))
async def refresh_prompt(sid: Sid, tenant: Tenant, c: ContainerDep) -> dict[str, Any]:
    return await writes.refresh_prompt(c, tenant, sid)
