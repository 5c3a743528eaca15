"""Reads of the tree: the history of a path (overlays applied), its rows' sizes, the latest leaf, a path's length."""

import json
from typing import Annotated, Any

from fastapi import APIRouter, Query, Response

from events.messages import stored_json
from projections import context_queries, queries
from projections.overlays import Overlay, Span, apply_overlays, overlay_json, send_spans, summaries
from projections.reclaimed import reclaim, reclaimed_in
from services.api import models as m
from services.api.deps import MAX_SEQ, ContainerDep, LeafId, MinSeq, Sid, Tenant, caught_up, check_id, require_session
from services.api.models import ok
from services.api.responses import JSON, joined_json, raw_json
from services.api.strict_json import StrictJsonRoute
from services.audit import readers as audit
from services.bootstrap import Container
from services.compaction.micro import recent_window, truncate_older_messages
from services.slots import AS_OF_WAIT_S

HISTORY_LIMIT = 10_000
"""How many messages a history answers by default (the recent end of a longer path)."""
MAX_HISTORY_LIMIT = 100_000
"""The most messages one history answers (``limit``'s bound)."""
router = APIRouter(route_class=StrictJsonRoute)


@router.get("/v1/sessions/{sid}/history", responses=ok(m.History))
async def history(
    sid: Sid,
    tenant: Tenant,
    c: ContainerDep,
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
    return await read_history(
        c,
        tenant,
        sid,
        leaf_id=leaf_id,
        min_seq=min_seq,
        as_of_seq=as_of_seq,
        compacted=compacted,
        truncate_older=truncate_older,
        keep_recent=keep_recent,
        max_tool_output_chars=max_tool_output_chars,
        max_text_chars=max_text_chars,
        max_bytes=max_bytes,
        min_recent=min_recent,
        limit=limit,
    )


async def read_history(
    c: Container,
    tenant: str,
    sid: str,
    *,
    leaf_id: str | None = None,
    min_seq: int | None = None,
    as_of_seq: int | None = None,
    compacted: bool = True,
    truncate_older: bool = False,
    keep_recent: int = 4,
    max_tool_output_chars: int = 500,
    max_text_chars: int = 10_000,
    max_bytes: int | None = None,
    min_recent: int = 1,
    limit: int = HISTORY_LIMIT,
) -> Response:
    """The history route's answer (the parameters as the route documents them, already bounded):
    the route and the hot path (services/api/hot.py) both serve this."""
    check_id("session", sid)
    if leaf_id is not None:
        check_id("message", leaf_id)
    head: dict[str, Any] = {}
    shown: list[str | Overlay]
    if as_of_seq is not None:  # folded from the log: the same view as the read models had then
        async with c.as_of_gate.slot(tenant, AS_OF_WAIT_S):  # bounded: a fold holds the session in memory
            state = await audit.session_as_of(c, tenant, sid, as_of_seq)
        leaf_id = leaf_id or state.latest_leaf()
        path = state.path_rows(leaf_id)
        raw = _window(path, max_bytes, min_recent, head)
        found = state.overlay_list() if compacted and raw else []
        shown = apply_overlays([r.id for r in raw], found)
        unloaded = reclaimed_in(state.reclaimed)
        head = {"as_of_seq": as_of_seq, **head}
        if not path:  # as the read of now: an empty path of a session that does not live is 404
            await caught_up(c, tenant, sid, min_seq)  # a session just made is live
            await require_session(c, tenant, sid)
    else:
        if max_bytes is None and not truncate_older:  # the usual read, in one statement when it can be
            async with c.pool.connection() as conn:
                single = await queries.single_branch(
                    conn,
                    tenant,
                    sid,
                    leaf_id,
                    min_seq=min_seq,
                    checkpoints=c.waiter.checkpoints_of(tenant, sid),
                    limit=limit,
                    overlays=compacted,
                )
            if single is not None:
                head = (
                    {"leaf_id": single.leaf_id, "truncated": True} if single.truncated else {"leaf_id": single.leaf_id}
                )
                return joined_json(head, single.body)
        wanted, leaf = min_seq, leaf_id
        while True:
            # The reads see one state; pipelined, BEGIN, COMMIT and the read-your-writes check
            # travel with the reads. A state older than min_seq is read again after waiting.
            # Overlays are read as spans first: only the summaries of those in force on the
            # path (after max_bytes' window) are loaded, in the same state.
            async with c.pool.connection() as conn, conn.pipeline(), queries.snapshot(conn):
                fresh = await c.waiter.send_applied_check(conn, tenant, sid, wanted) if wanted else None
                sent_spans = await send_spans(conn, tenant, sid) if compacted else None
                sent_reclaimed = await context_queries.send_reclaimed(conn, tenant, sid)
                spans = await sent_spans() if sent_spans is not None else []
                # a compacted path (without max_bytes, which counts every body): its ids, then the
                # bodies of what shows, never those its summaries stand over. Else, without
                # max_bytes, the path's recent end: limit + 1 rows of it (the one more says it was cut)
                links = bool(spans) and max_bytes is None
                want = limit + 1 if max_bytes is None and not links else None
                leaf_id, path = await queries.path_from(conn, tenant, sid, leaf, want, bodies=not links)
                unloaded = reclaimed_in(await sent_reclaimed())
                stale = fresh is not None and not await fresh()
                if not stale:
                    head = {}
                    raw = _window(path, max_bytes, min_recent, head)
                    in_force = apply_overlays([r.id for r in raw], spans)
                    if links:  # the recent end of what shows (an overlay counts as one message), its bodies read
                        if len(in_force) > limit:
                            in_force, head["truncated"] = in_force[-limit:], True
                        walked = {r.id: r for r in raw}
                        shows = [walked[i] for i in in_force if isinstance(i, str)]
                        raw = await queries.bodies_of(conn, tenant, sid, shows)
                    ids = [s.overlay_id for s in in_force if isinstance(s, Span)]
                    loaded = await summaries(conn, tenant, sid, ids)
                    shown = [loaded[s.overlay_id] if isinstance(s, Span) else s for s in in_force]
            if not stale:
                break
            await caught_up(c, tenant, sid, wanted)
            wanted = None  # applied now, and the read model never goes back
        if not path:
            await require_session(c, tenant, sid)
    contents: list[str] = []
    if not any(isinstance(item, Overlay) for item in shown) and unloaded.empty:  # the stored bodies as they are
        contents = [r.content for r in raw]
    else:
        by_id = {r.id: r for r in raw}
        for item in shown:
            if isinstance(item, Overlay):
                contents.append(overlay_json(item))
                continue
            row = by_id.get(item)
            if row is None:  # not read: a compacted path's bodies are read in its snapshot, so never
                continue
            outputs = unloaded.outputs(row.id, row.content)
            contents.append(reclaim(row.content, outputs) if outputs else row.content)
    if len(contents) > limit:  # the recent end, as max_bytes keeps it
        contents = contents[-limit:]
        head["truncated"] = True
    if truncate_older:
        parsed = [json.loads(x) for x in contents]
        cut = truncate_older_messages(parsed, keep_recent, max_tool_output_chars, max_text_chars)
        contents = [x if m is p else stored_json(m) for x, m, p in zip(contents, cut, parsed, strict=True)]
    return raw_json({"leaf_id": leaf_id if raw or shown else None, **head}, contents)


def _window(
    raw: list[queries.PathRow], max_bytes: int | None, min_recent: int, head: dict[str, Any]
) -> list[queries.PathRow]:
    """The rows ``max_bytes`` keeps (all without it; an empty path too: ``{[], false, 0}``, as the
    reference's), saying in ``head`` whether it cut and what the path held."""
    if max_bytes is None:
        return raw
    start, truncated, total = recent_window([(r.id, len(r.content.encode())) for r in raw], max_bytes, min_recent)
    head |= {"truncated": truncated, "total_content_bytes": total}
    return raw[start:]


@router.get("/v1/sessions/{sid}/history/stats", responses=ok(m.HistoryRowStats))
async def history_stats(
    sid: Sid, tenant: Tenant, c: ContainerDep, leaf_id: LeafId = None, min_seq: MinSeq = None
) -> Response:
    """Per-row ``{id, role, bytes}`` of the path root→leaf (default: the latest leaf), no overlays
    applied (the reference's ``getHistoryRowStats``): ``bytes`` is the stored JSON's UTF-8
    length, what ``max_bytes`` on the history counts, read in Postgres without the bodies."""
    check_id("session", sid)
    if leaf_id is not None:
        check_id("message", leaf_id)
    await caught_up(c, tenant, sid, min_seq)
    async with c.pool.connection() as conn:
        leaf_id, rows = await queries.path_stats(conn, tenant, sid, leaf_id)
    if not rows:
        await require_session(c, tenant, sid)
    body = {"leaf_id": leaf_id, "rows": [{"id": r.id, "role": r.role, "bytes": r.bytes} for r in rows]}
    return Response(json.dumps(body, ensure_ascii=False).encode(), media_type=JSON)


@router.get("/v1/sessions/{sid}/leaf", responses=ok(m.Leaf))
async def leaf(sid: Sid, tenant: Tenant, c: ContainerDep, min_seq: MinSeq = None) -> Response:
    check_id("session", sid)
    await caught_up(c, tenant, sid, min_seq)
    async with c.pool.connection() as conn:
        row = await queries.latest_leaf(conn, tenant, sid)
    if row is None:
        await require_session(c, tenant, sid)
        return Response('{"leaf_id": null, "message": null}', media_type=JSON)
    return Response(f'{{"leaf_id": {json.dumps(row.id)}, "message": {row.content}}}', media_type=JSON)


@router.get("/v1/sessions/{sid}/path-length", response_model=None, responses=ok(m.PathLength))
async def path_length(
    sid: Sid, tenant: Tenant, c: ContainerDep, leaf_id: LeafId = None, min_seq: MinSeq = None
) -> dict[str, Any]:
    check_id("session", sid)
    if leaf_id is not None:
        check_id("message", leaf_id)
    await caught_up(c, tenant, sid, min_seq)
    async with c.pool.connection() as conn:
        if leaf_id is None:
            leaf = await queries.latest_leaf(conn, tenant, sid)
            leaf_id = leaf.id if leaf else None
        length = await queries.path_length(conn, tenant, sid, leaf_id) if leaf_id else 0
    if not length:
        await require_session(c, tenant, sid)
    return {"leaf_id": leaf_id if length else None, "length": length}  # an unknown leaf: null, as history says
