"""The writes a client asks for, whichever transport brought the request (HTTP routes in
services/api/, NATS commands in services/commands_nats/): checked, run through the command
handlers (services/writes/commands.py, the context and compaction services), answered with the
body both transports send. One code path, so both answer alike: the same result or the same error.
"""

from __future__ import annotations

import logging
from typing import Any

from pydantic import ValidationError

from events.admission import Refused
from events.commands import MAX_DELETE_IDS
from events.context import SessionConfig
from events.omitted import OMITTED
from events.validation import validation_detail
from projections import queries
from projections.overlays import Overlay
from services.bootstrap import Container
from services.compaction.lease import LeasesExhausted, SessionBusy
from services.compaction.summarizers import SummarizerError
from services.errors import (
    BatchFailed,
    ChronicleError,
    CompactionInProgress,
    InvalidConfig,
    InvalidRequest,
    MessageNotFound,
    RateLimited,
    SummarizerFailed,
)
from services.offload import off_loop, weigh_body
from services.requests.checks import check_id, checked_message, checked_size, field_error, invalid_fields, no_nul
from services.requests.limits import Charge
from services.writes.commands import fork
from services.writes.decisions import ParentSpec
from services.writes.liveness import live_session

Answer = dict[str, Any]
log = logging.getLogger("chronicle.requests")


def parent_spec(parent_id: str | None, given: bool) -> ParentSpec:
    """The parent an append names: omitted (the latest leaf), None (a new root) or a checked id."""
    if not given:
        return OMITTED
    return check_id("message", parent_id) if parent_id is not None else None


# -- sessions -----------------------------------------------------------------------------------


async def create_session(
    c: Container, tenant: str, sid: str | None, name: str, parent: str | None, metadata: dict[str, Any]
) -> tuple[bool, Answer]:
    """Whether the session was created now (False: a repeat of the create that made it, answered
    as it was: ``200`` where a creation is ``201``), and the answer."""
    no_nul([name, metadata], "name and metadata")
    sid = check_id("session", sid) if sid is not None else None
    parent = check_id("session", parent) if parent is not None else None
    w = await c.commands.create_session(tenant, sid, name, parent, metadata)
    return w.written, {"id": w.ids[0], "name": name, "parent_session_id": parent, "metadata": metadata, "seq": w.seq}


async def rename_session(c: Container, tenant: str, sid: str, name: str) -> Answer:
    no_nul(name, "name")
    check_id("session", sid)
    w = await c.commands.rename_session(tenant, sid, name)
    return {"id": sid, "name": name, "seq": w.seq}


async def add_usage(
    c: Container,
    tenant: str,
    sid: str,
    input_tokens: int,
    output_tokens: int,
    cost: float,
    request_key: str | None = None,
) -> tuple[bool, Answer]:
    """Whether an event was written (not a retry's, already stored; nothing when all three
    amounts are 0: a cached or failed LLM call reports no usage), and the answer."""
    check_id("session", sid)
    w = await c.commands.add_usage(tenant, sid, input_tokens, output_tokens, cost, request_key)
    return w.written, {
        "id": sid,
        "input_tokens": input_tokens,
        "output_tokens": output_tokens,
        "cost": cost,
        "seq": w.seq,
    }


async def end_session(c: Container, tenant: str, sid: str, reason: str) -> Answer:
    no_nul(reason, "reason")
    check_id("session", sid)
    w = await c.commands.end_session(tenant, sid, reason)
    return {"id": sid, "end_reason": reason, "seq": w.seq}


async def delete_session(c: Container, tenant: str, sid: str) -> Answer:
    check_id("session", sid)
    w = await c.commands.delete_session(tenant, sid)
    return {"id": sid, "deleted": True, "seq": w.seq}


async def fork_session(
    c: Container,
    tenant: str,
    sid: str,
    at_message_id: str,
    new_id: str | None,
    name: str | None,
    charge: Charge | None = None,
) -> Answer:
    """The fork (:func:`services.writes.commands.fork`); ``charge`` (its tenant's request limit)
    is charged the events it will publish past the first, before it publishes any."""
    check_id("session", sid)
    check_id("message", at_message_id)
    new_id = check_id("session", new_id) if new_id is not None else None
    forked = await fork(c.commands, c.eraser, tenant, sid, at_message_id, new_id, name, charge)
    return {"id": forked.id, "parent_session_id": sid, "messages": forked.messages, "seq": forked.seq}


# -- messages -----------------------------------------------------------------------------------


async def append(
    c: Container, tenant: str, sid: str, message: dict[str, Any], parent: ParentSpec, request_key: str | None
) -> Answer:
    """One message; ``created`` is false for the same message again (HTTP answers it with 200)."""
    check_id("session", sid)
    body = await off_loop(checked_message, message, new=True)
    r = await c.commands.append(tenant, sid, body, parent, request_key)
    return {"id": r.id, "parent_id": r.parent_id, "seq": r.seq, "created": r.created}


BATCH_CHUNK_BYTES = 1024 * 1024
"""A batch's messages are stored at most two chunks of this many bytes ahead of the projector: the
log is one order for every tenant, and the projection of a message costs about its text (a
batch of 1,000 messages of 95 KB took the projector ~16 s, during which every other tenant's
writes and ``min_seq`` reads waited behind it, 503 projection_timeout past the read wait)."""


async def append_batch(
    c: Container,
    tenant: str,
    sid: str,
    messages: list[dict[str, Any]],
    parent: ParentSpec,
    request_key: str | None = None,
    charge: Charge | None = None,
) -> Answer:
    """A chain: the first message takes ``parent`` as a single append does, each next one is the
    child of the previous, or of the latest leaf when another writer appended under the previous
    meanwhile (``follow``: the session stays one chain, see :meth:`Commands.append`) when this
    batch stored the previous one (after a replayed one, the next is its child, as the reference
    appends it: it may have had children before the batch came). Each message
    is its own event; a retried batch re-answers the appended ones (idempotent), as created when
    ``request_key`` (the client's ``Idempotency-Key``, one per batch) names the batch that stored them.

    Not atomic: a failure at a message (its parent would make a cycle, its id is taken by another
    body, the log is unavailable, …) leaves the messages before it stored, and is raised as
    :class:`BatchFailed` with them (``written``); a refusal of the request itself (ids not
    distinct, a message not valid) is raised before anything is written, as is a refusal of
    ``charge`` (its tenant's request limit, charged every message past the first: one event each,
    a message a retry re-answers included). A batch that fails at a message is given back the
    charge of the messages after it, never reached: one refused at its first (an unknown parent,
    a deleted session, a conflict) costs its one token, as an invalid one does.

    Paced: the messages are stored at most two chunks of :data:`BATCH_CHUNK_BYTES` ahead of the
    projector (a chunk is begun once the one before the last is applied); a projector that does
    not apply a chunk within the read wait ends the pacing, and the rest goes at once."""
    check_id("session", sid)
    sizes = await off_loop(lambda: [checked_size(m, new=True, loc=("messages", i)) for i, m in enumerate(messages)])
    bodies = messages
    if len({m["id"] for m in bodies}) != len(bodies):
        raise invalid_fields([field_error(("messages",), "message ids in a batch must be distinct")])
    if charge is not None:
        charge(len(bodies) - 1)
    answers: list[Answer] = []
    pacer, chunk = (
        c.commands.optimistic.pacer(tenant, sid),
        0,
    )  # chunks of BATCH_CHUNK_BYTES (services/writes/pacing.py)
    for i, body in enumerate(bodies):
        # a replayed previous message may have had children before this batch came (the
        # reference's "send the prefix again, then a regenerated answer"): its next message is
        # its child, a sibling of them, as the reference appends it; only after a message this
        # batch stored can what is under it have been appended meanwhile
        follow = i > 0 and bool(answers[-1]["created"])
        try:
            if chunk >= BATCH_CHUNK_BYTES:  # a chunk stored: at most two ahead of the projector
                pacer.stored(answers[-1]["seq"])
                chunk = 0
                await pacer.turn()
            chunk += sizes[i]
            weigh_body(sizes[i])  # each message's own steps leave the loop by its size, not the batch's
            r = await c.commands.append(tenant, sid, body, parent, request_key, follow=follow)
        except Exception as exc:  # the messages before it are stored: the answer says so (BatchFailed)
            if charge is not None and i < len(bodies) - 1:
                charge(-(len(bodies) - 1 - i))  # the messages after it publish nothing
            raise BatchFailed(exc, i, str(body["id"]), answers) from exc
        answers.append({"id": r.id, "parent_id": r.parent_id, "seq": r.seq, "created": r.created})
        parent = r.tail  # a compaction summary sent back: the last message it covers
    return {"messages": answers, "seq": max(a["seq"] for a in answers)}


async def update_message(c: Container, tenant: str, sid: str, mid: str | None, message: dict[str, Any]) -> Answer:
    """Replace a message's body; ``mid`` (the HTTP path's id), when given, must be the body's."""
    check_id("session", sid)
    if mid is not None:
        check_id("message", mid)
    body = await off_loop(checked_message, message, new=False)
    if mid is not None and body["id"] != mid:
        raise invalid_fields([field_error(("message", "id"), "must equal the id in the path")])
    w = await c.commands.update(tenant, sid, body)
    return {"id": body["id"], "seq": w.seq}


async def delete_messages(c: Container, tenant: str, sid: str, wanted: list[str]) -> Answer:
    check_id("session", sid)
    if len(wanted) > MAX_DELETE_IDS:
        raise InvalidRequest(f"at most {MAX_DELETE_IDS} ids per request, not {len(wanted)}")
    w = await c.commands.delete_messages(tenant, sid, [check_id("message", i) for i in wanted])
    return {"deleted": list(w.ids), "seq": w.seq}


async def clear_messages(c: Container, tenant: str, sid: str) -> Answer:
    """Delete every message (``seq`` 0 when the session never existed); a frozen prompt is
    re-rendered (blocks stay). ``seq`` is the re-rendered prompt's when one was recorded, so a
    read with it as ``min_seq`` sees the new prompt (read-your-writes, as the reference's clear
    replaces its snapshot before it returns)."""
    check_id("session", sid)
    w = await c.commands.clear(tenant, sid)
    if w.seq == 0:
        return {"cleared": True, "seq": 0}
    seq = w.seq
    # The clear is recorded: whatever fails from here on (a source gone, not text, S3 down, the
    # projector behind), it stands and is answered so; the prompt in force stays until a refresh works.
    try:
        if await c.context.has_prompt(tenant, sid):
            seq = max(seq, (await c.context.refresh_prompt(tenant, sid, "clear")).seq)
    except (ChronicleError, Refused) as exc:
        log.warning("after clearing %s/%s the prompt was not re-rendered: %s", tenant, sid, exc)
    except Exception:
        log.exception("after clearing %s/%s the prompt was not re-rendered", tenant, sid)
    return {"cleared": True, "seq": seq}


# -- compaction ---------------------------------------------------------------------------------


def overlay_json(o: Overlay) -> Answer:
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


async def compact(c: Container, tenant: str, sid: str, leaf: str | None) -> Answer:
    """Compact now: the overlay, or why nothing was compacted; :class:`CompactionInProgress` while
    another compaction of the session runs (in any process)."""
    check_id("session", sid)
    if leaf is not None:
        check_id("message", leaf)
    await c.commands.optimistic.catch_up(tenant, sid)
    async with c.pool.connection() as conn:
        # a session never written has nothing to compact: 404, as its reads are (not "no messages")
        await live_session(conn, tenant, sid, must_exist=True)
        if leaf is not None and await queries.get_message(conn, tenant, sid, leaf) is None:
            raise MessageNotFound(f"message {leaf!r} is not in this session")  # a compaction_… id neither
    try:
        # never waits: a compaction already running (the compactor's, or another request's) makes
        # this one 409, rather than a second summary once the first is recorded
        async with c.compaction.leases.hold(tenant, sid):
            outcome = await c.compaction.compact(tenant, sid, leaf)
    except SessionBusy as exc:
        raise CompactionInProgress(str(exc)) from exc
    except LeasesExhausted as exc:  # as many summaries at once as this process may hold connections for
        raise RateLimited(1.0, f"{exc}; try again shortly") from exc
    except SummarizerError as exc:
        raise SummarizerFailed(summarizer_detail(exc)) from exc
    if outcome.overlay is None:
        return {"compacted": False, "reason": outcome.reason, "seq": outcome.seq}
    return {"compacted": True, "overlay": overlay_json(outcome.overlay), "seq": outcome.seq}


SUMMARIZER_DETAIL_CHARS = 200


def summarizer_detail(exc: Exception) -> str:
    """What a client is told of a summarizer failure: its message, cut at
    :data:`SUMMARIZER_DETAIL_CHARS` (an upstream LLM's error body is not passed through whole;
    ``compaction.failed`` in the log keeps more of it)."""
    text = str(exc)
    return text if len(text) <= SUMMARIZER_DETAIL_CHARS else text[: SUMMARIZER_DETAIL_CHARS - 1] + "…"


# -- context ------------------------------------------------------------------------------------


def session_config(raw: Any) -> SessionConfig:
    try:
        return SessionConfig.model_validate(raw)
    except ValidationError as exc:
        raise InvalidConfig(validation_detail(exc, root="config")) from exc


async def configure(c: Container, tenant: str, sid: str, raw: Any) -> Answer:
    check_id("session", sid)
    no_nul(raw, "config")
    config = session_config(raw)
    seq = await c.context.configure(tenant, sid, config)
    return {"config": config.model_dump(mode="json", exclude_none=True), "seq": seq}


async def write_context(c: Container, tenant: str, sid: str, label: str, content: str, mode: str) -> Answer:
    check_id("session", sid)
    no_nul(content, "content")
    if mode not in ("replace", "append"):
        raise InvalidRequest("mode must be 'replace' or 'append'")
    result = await c.context.write(tenant, sid, label, content, "append" if mode == "append" else "replace", "api")
    return {
        "label": result.label,
        "description": result.description,
        "content": result.content,
        "tokens": result.tokens,
        "max_tokens": result.max_tokens,
        "seq": result.seq,
    }


async def run_tool(c: Container, tenant: str, sid: str, name: str, arguments: Any, tool_call_id: str | None) -> Answer:
    """Execute a tool with the LLM's arguments; failures come back as ``Error: …`` results (an
    erased or deleted session is the request's 410 or 404: the tools' own check)."""
    check_id("session", sid)
    args = arguments if arguments is not None else {}
    result = await c.context.execute(tenant, sid, name, args, tool_call_id)
    return {"result": result, "seq": await c.publisher.last_subject_seq(tenant, sid)}


async def refresh_prompt(c: Container, tenant: str, sid: str) -> Answer:
    check_id("session", sid)
    prompt = await c.context.refresh_prompt(tenant, sid)
    return {"prompt": prompt.text, "tokens": prompt.tokens, "version": prompt.version, "seq": prompt.seq}
