"""Commands over NATS request/reply: what a tenant sends to ``<commands>.<tenant>.<command>`` and
what comes back. The same writes as the HTTP API's, decided by the same server code; these models
are the contract a client in any language builds from (docs/asyncapi.yaml is generated from them).

A reply is the HTTP answer's JSON body, or the HTTP problem's (``code``, ``status``, ``detail``),
with the HTTP status in the ``Chronicle-Status`` header. The session a command acts on is a field
of the request; the tenant is the subject's, which the tenant's NATS credentials alone may use.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, WithJsonSchema

from events import ids
from events.catalog import MAX_END_REASON, MAX_ERASURE_REASON, MAX_USAGE_COST, MAX_USAGE_TOKENS
from events.limits import MAX_SESSION_NAME, MAX_TOOL_CALL_ID
from events.validation import NO_NUL_PATTERN, PRINTABLE_ASCII_PATTERN

STATUS_HEADER = "Chronicle-Status"
"""The reply header holding the HTTP status the same request answers over HTTP (201, 422, …)."""
MAX_DELETE_IDS = 1000
"""The most message ids one delete names."""
MAX_BATCH = 1000
"""The most messages one batch append holds."""

SessionId = Annotated[str, WithJsonSchema(ids.SESSION_ID_SCHEMA)]
MessageId = Annotated[str, WithJsonSchema(ids.MESSAGE_ID_SCHEMA)]
# Bodies the server validates itself (kept exactly as sent), documented as objects of that model:
# ``x-model`` becomes a reference to the model's schema in a document (:func:`model_refs`).
MessageJson = Annotated[dict[str, Any], WithJsonSchema({"type": "object", "x-model": "UIMessage"})]
ConfigJson = Annotated[dict[str, Any], WithJsonSchema({"type": "object", "x-model": "SessionConfig"})]
Name = Annotated[str, Field(max_length=MAX_SESSION_NAME)]


def _whole_number(value: object) -> object:
    """A JSON integer, or a number with no fraction (JSON Schema's ``integer``: ``1.0`` is one);
    never a boolean or a string (what pydantic's lax ``int`` would take)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError("must be a whole number")
    if isinstance(value, float):
        if not value.is_integer():
            raise ValueError("must be a whole number")
        return int(value)
    return value


Tokens = Annotated[Annotated[int, Field(ge=0, le=MAX_USAGE_TOKENS)], BeforeValidator(_whole_number)]


def _no_negative_zero(value: float) -> float:
    """``-0.0`` as ``0.0`` (a cost is stored and answered without a sign)."""
    return value + 0.0


Cost = Annotated[
    float, Field(ge=0, le=MAX_USAGE_COST, strict=True, allow_inf_nan=False), AfterValidator(_no_negative_zero)
]
EndReason = Annotated[str, Field(min_length=1, max_length=MAX_END_REASON)]
ErasureReason = Annotated[str, Field(max_length=MAX_ERASURE_REASON, pattern=NO_NUL_PATTERN)]
"""Why a session is erased: the caller's text, kept as given in the log and the erasures record
(it outlives the session: no personal data)."""
IdempotencyKey = Annotated[str, Field(min_length=1, max_length=128, pattern=PRINTABLE_ASCII_PATTERN)]


def model_refs(node: Any, ref_template: str = "#/components/schemas/{model}") -> Any:
    """``node`` (a JSON schema, or a document holding schemas) with each ``{"x-model": name}``
    placeholder replaced by a reference to that model's schema."""
    if isinstance(node, dict):
        if "x-model" in node:
            return {"$ref": ref_template.format(model=node["x-model"])}
        return {k: model_refs(v, ref_template) for k, v in node.items()}
    if isinstance(node, list):
        return [model_refs(v, ref_template) for v in node]
    return node


def _strict(*examples: dict[str, Any]) -> ConfigDict:
    return ConfigDict(extra="forbid", json_schema_extra={"examples": list(examples)})


_MESSAGE = {"id": "m1", "role": "user", "parts": [{"type": "text", "text": "We deploy on Friday"}]}


# -- requests ------------------------------------------------------------------------------------


class CreateSession(BaseModel):
    model_config = _strict({"id": "demo", "name": "Demo", "metadata": {"team": "ops"}})
    id: SessionId | None = None
    name: Name = ""
    parent_session_id: SessionId | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)


class RenameSession(BaseModel):
    model_config = _strict({"session_id": "demo", "name": "Release planning"})
    session_id: SessionId
    name: Name


class DeleteSession(BaseModel):
    model_config = _strict({"session_id": "demo"})
    session_id: SessionId


class AddUsage(BaseModel):
    """Add to the session's counters (all three 0: nothing is written, as the reference's
    ``addUsage`` adds nothing).
    ``idempotency_key`` is HTTP's ``Idempotency-Key``: the same in each retry of one call, so
    that a retry, however late (the applied usage events are recorded for the session's life),
    adds nothing again and answers the first ``seq``; the same key with other amounts is refused
    (``idempotency_key_reused``); a key whose derived event id another event of the log holds is
    ``idempotency_key_conflict``."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [
                {
                    "session_id": "demo",
                    "input_tokens": 1200,
                    "output_tokens": 350,
                    "cost": 0.0042,
                    "idempotency_key": "u-7",
                }
            ],
        },
    )
    session_id: SessionId
    input_tokens: Tokens = 0
    output_tokens: Tokens = 0
    cost: Cost = 0.0
    idempotency_key: IdempotencyKey | None = None


class EndSession(BaseModel):
    model_config = _strict({"session_id": "demo", "reason": "compaction"})
    session_id: SessionId
    reason: EndReason


class ForkSession(BaseModel):
    model_config = _strict({"session_id": "demo", "at_message_id": "m1", "name": "What if Thursday"})
    session_id: SessionId
    at_message_id: MessageId
    name: Name | None = None
    id: SessionId | None = None


class AppendMessage(BaseModel):
    """``parent_id`` omitted: the latest leaf; ``null``: a new root; an id: that message.
    ``idempotency_key`` is HTTP's ``Idempotency-Key``: the client's name for this append, the same
    in each of its retries, so that a retry whose first attempt was stored answers ``created``."""

    model_config = _strict({"session_id": "demo", "message": _MESSAGE, "idempotency_key": "9f2c41d0"})
    session_id: SessionId
    message: MessageJson
    parent_id: MessageId | None = None
    idempotency_key: IdempotencyKey | None = None


class AppendBatch(BaseModel):
    """A chain (see :class:`AppendMessage` for ``parent_id``). ``idempotency_key`` is HTTP's
    ``Idempotency-Key``: the client's name for this batch, the same in each of its retries, so that
    a retry whose first attempt stored messages answers them ``created`` too."""

    model_config = _strict({"session_id": "demo", "messages": [_MESSAGE, {**_MESSAGE, "id": "m2"}]})
    session_id: SessionId
    messages: list[MessageJson] = Field(min_length=1, max_length=MAX_BATCH)
    parent_id: MessageId | None = None
    idempotency_key: IdempotencyKey | None = None


class UpdateMessage(BaseModel):
    model_config = _strict({"session_id": "demo", "message": _MESSAGE})
    session_id: SessionId
    message: MessageJson


class DeleteMessages(BaseModel):
    model_config = _strict({"session_id": "demo", "ids": ["m1"]})
    session_id: SessionId
    ids: list[MessageId] = Field(min_length=1, max_length=MAX_DELETE_IDS)


class ClearMessages(BaseModel):
    model_config = _strict({"session_id": "demo"})
    session_id: SessionId


class Compact(BaseModel):
    model_config = _strict({"session_id": "demo"}, {"session_id": "demo", "leaf_id": "m1"})
    session_id: SessionId
    leaf_id: MessageId | None = None


class Configure(BaseModel):
    model_config = _strict({"session_id": "demo", "config": {"blocks": []}})
    session_id: SessionId
    config: ConfigJson


class WriteContext(BaseModel):
    model_config = _strict({"session_id": "demo", "label": "notes", "content": "Deploys on Fridays", "mode": "append"})
    session_id: SessionId
    label: str = Field(min_length=1)
    content: str = Field(max_length=1_000_000)
    mode: Literal["replace", "append"] = "replace"


class RunTool(BaseModel):
    """``arguments``: the LLM's arguments; ``tool_call_id``: the LLM's id of this call."""

    model_config = _strict({"session_id": "demo", "name": "search_context", "arguments": {"query": "friday"}})
    session_id: SessionId
    name: str = Field(min_length=1)
    arguments: Any = None
    tool_call_id: str | None = Field(default=None, min_length=1, max_length=MAX_TOOL_CALL_ID, pattern=NO_NUL_PATTERN)


class RefreshPrompt(BaseModel):
    model_config = _strict({"session_id": "demo"})
    session_id: SessionId


# -- replies ---------------------------------------------------------------------------------------


class _Answer(BaseModel):
    model_config = ConfigDict(extra="forbid")


class CreatedSession(_Answer):
    id: str
    name: str
    parent_session_id: str | None
    metadata: dict[str, Any]
    seq: int


class Renamed(_Answer):
    id: str
    name: str
    seq: int


class DeletedSession(_Answer):
    id: str
    deleted: bool
    seq: int


class UsageAdded(_Answer):
    """What was added (the totals are the session's: ``GET /v1/sessions/{sid}``)."""

    id: str
    input_tokens: int
    output_tokens: int
    cost: float
    seq: int


class Ended(_Answer):
    id: str
    end_reason: str
    seq: int


class Forked(_Answer):
    id: str
    parent_session_id: str
    messages: int
    seq: int


class Appended(_Answer):
    id: str
    parent_id: str | None
    seq: int
    created: bool


class BatchAppended(_Answer):
    messages: list[Appended]
    seq: int


class Updated(_Answer):
    id: str
    seq: int


class DeletedMessages(_Answer):
    deleted: list[str]
    seq: int


class Cleared(_Answer):
    cleared: bool
    seq: int


class Overlay(_Answer):
    id: str
    message_id: str
    from_message_id: str
    to_message_id: str
    leaf_id: str
    tokens_before: int
    tokens_after: int
    summarizer: str
    model: str | None
    summary: str
    created_at: str
    seq: int


class Compacted(_Answer):
    compacted: bool
    overlay: Overlay | None = None
    reason: str | None = None
    seq: int


class ConfigWritten(_Answer):
    config: ConfigJson
    seq: int


class BlockWritten(_Answer):
    label: str
    description: str | None = None  # absent in answers of servers before it was added
    content: str
    tokens: int
    max_tokens: int | None
    seq: int


class ToolResult(_Answer):
    result: str
    seq: int


class SystemPrompt(_Answer):
    prompt: str | None
    tokens: int
    version: int
    seq: int


class ProblemError(BaseModel):
    loc: list[str] = Field(
        description='Where the error is, from the request\'s root: `["session_id"]`, `["message", "role"]`; '
        '`[]` for the request itself (not a JSON object). Never under HTTP\'s `"body"`.'
    )
    msg: str
    type: str


class Problem(BaseModel):
    """An RFC 9457 problem: ``code`` is stable and what clients branch on; ``status`` is the HTTP
    status the same request answers over HTTP."""

    model_config = ConfigDict(extra="allow")

    type: str
    title: str
    status: int
    detail: str
    code: str
    errors: list[ProblemError] | None = None
    reason: str | None = None
    retry_after: float | None = Field(
        default=None,
        description="`rate_limited`: seconds until a request of this tenant would be admitted; `unavailable`, "
        "`projection_timeout`, `contention`: 1, ask again then (none for a claim-checked body missing from "
        "object storage)",
    )
    block: str | None = Field(default=None, description="`prompt_unstorable`: the label of the prompt's largest block")
    size: int | None = Field(default=None, description="`prompt_unstorable`: the prompt's size stored, in bytes")
    limit: int | None = Field(default=None, description="`prompt_unstorable`: the most bytes an event is stored as")
    failed_index: int | None = Field(
        default=None,
        description="a batch (`messages:batch`, `append_batch`) that failed part-way: the index of the message "
        "that failed; the messages after it were not written, nor it unless the failure is a 5xx (then it may "
        "have been, its answer lost)",
    )
    written: list[Appended] | None = Field(
        default=None,
        description="with `failed_index`: the batch's messages before it, which are stored, as the batch's answer "
        "lists them (`[]`: nothing of the batch was written)",
    )
    deleted: bool | None = Field(
        default=None,
        description="`session_not_found`: true when the session was deleted (absent for a session never written, "
        "or another tenant's)",
    )


# -- the commands ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Command:
    """One command: its subject's last tokens, its request, its successful reply, and the HTTP
    route that does the same."""

    name: str
    request: type[BaseModel]
    reply: type[BaseModel]
    http: str
    summary: str


COMMANDS: tuple[Command, ...] = (
    Command("session.create", CreateSession, CreatedSession, "POST /v1/sessions", "Create a session"),
    Command("session.rename", RenameSession, Renamed, "PATCH /v1/sessions/{sid}", "Rename a session"),
    Command("session.delete", DeleteSession, DeletedSession, "DELETE /v1/sessions/{sid}", "Delete a session"),
    Command("session.usage", AddUsage, UsageAdded, "POST /v1/sessions/{sid}/usage", "Add token usage and cost"),
    Command("session.end", EndSession, Ended, "POST /v1/sessions/{sid}:end", "Record why a session ended"),
    Command("session.fork", ForkSession, Forked, "POST /v1/sessions/{sid}/fork", "Fork a session at a message"),
    Command("append", AppendMessage, Appended, "POST /v1/sessions/{sid}/messages", "Append one message"),
    Command("append_batch", AppendBatch, BatchAppended, "POST /v1/sessions/{sid}/messages:batch", "Append a chain"),
    Command("update", UpdateMessage, Updated, "PUT /v1/sessions/{sid}/messages/{mid}", "Replace a message's body"),
    Command("delete", DeleteMessages, DeletedMessages, "POST /v1/sessions/{sid}/messages:delete", "Delete messages"),
    Command("clear", ClearMessages, Cleared, "POST /v1/sessions/{sid}/messages:clear", "Delete every message"),
    Command("compact", Compact, Compacted, "POST /v1/sessions/{sid}/compact", "Compact now"),
    Command("config.put", Configure, ConfigWritten, "PUT /v1/sessions/{sid}/config", "Set the session config"),
    Command("context.write", WriteContext, BlockWritten, "PUT /v1/sessions/{sid}/context/{label}", "Write a block"),
    Command("tool", RunTool, ToolResult, "POST /v1/sessions/{sid}/tools/{name}", "Run an LLM tool"),
    Command(
        "prompt.refresh", RefreshPrompt, SystemPrompt, "POST /v1/sessions/{sid}/system-prompt:refresh", "Re-render"
    ),
)
BY_NAME = {c.name: c for c in COMMANDS}
