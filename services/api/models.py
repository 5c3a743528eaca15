"""The shapes of the API's successful answers, for the OpenAPI document only: routes build their
JSON directly (often spliced from stored text), and these models say what it holds. Schemathesis
checks every answer against them (tests/e2e/test_openapi_fuzz.py)."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, RootModel, WithJsonSchema

from events.commands import (
    Appended,
    BatchAppended,
    BlockWritten,
    Cleared,
    Compacted,
    ConfigJson,
    ConfigWritten,
    Ended,
    Forked,
    MessageJson,
    Overlay,
    Renamed,
    SystemPrompt,
    ToolResult,
    Updated,
    UsageAdded,
)
from events.commands import CreatedSession as SessionCreated
from events.commands import DeletedMessages as MessagesDeleted
from events.commands import DeletedSession as SessionDeleted
from events.context import LABEL_RE

Message = MessageJson
Config = ConfigJson
# the answers of writes are the command replies' (events/commands.py): one shape over HTTP and NATS
__all__ = [
    "Appended",
    "BatchAppended",
    "BlockWritten",
    "Cleared",
    "Compacted",
    "ConfigWritten",
    "Ended",
    "Forked",
    "MessagesDeleted",
    "Overlay",
    "Renamed",
    "SessionCreated",
    "SessionDeleted",
    "SystemPrompt",
    "ToolResult",
    "Updated",
    "UsageAdded",
]


class _Answer(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Session(SessionCreated):
    created_at: str
    updated_at: str
    input_tokens: int = Field(
        description="the sum of every `session.usage_added`'s input tokens (it stops at 2^63 - 1)"
    )
    output_tokens: int = Field(
        description="the sum of every `session.usage_added`'s output tokens (it stops at 2^63 - 1)"
    )
    estimated_cost: float = Field(description="the sum of every `session.usage_added`'s cost")
    end_reason: str | None = Field(description="why the session ended (`POST /v1/sessions/{sid}:end`), or null")


class Erased(_Answer):
    """The session's data key is destroyed and its rows dropped (``seq``: the ``session.erased`` event)."""

    id: str
    erased: bool
    seq: int
    objects_deleted: int


class ErasureEntry(_Answer):
    session_id: str = Field(description='the erased session ("": the tenant-level entries of an erased tenant)')
    erased_at: str
    requested_by: str | None = Field(
        description="who asked: `tenant:<t> key:<12 hex>` (an API key: the start of its SHA-256 as "
        "`CHRONICLE_API_KEYS` names it), `operator (chronicle erase)`; null for an erasure recorded before "
        "this was kept"
    )
    reason: str | None = Field(description="the reason the caller gave, as given")
    seq: int | None = Field(description="the sequence of its `session.erased` event, when known")


class ErasurePage(_Answer):
    erasures: list[ErasureEntry]
    next_cursor: str | None = Field(description="the next page's `cursor`, null on the last page")


class DataKey(_Answer):
    """The session's data key, for a direct publisher that seals its events (events/sealing.py)."""

    session_id: str
    kid: str
    key: str = Field(description="the 32-byte AES-256-GCM key, base64")


class ListedSession(Session):
    deleted_at: str | None = Field(
        default=None, description="when it was deleted: only in `deleted=true` lists, which hold deleted sessions"
    )


class SessionPage(_Answer):
    sessions: list[ListedSession]
    next_cursor: int | str | None = Field(
        description="the next page's `cursor` (an integer for `order=created`, a string for `order=recent`), "
        "null on the last page"
    )


class MessageRead(RootModel[Message]):
    """The stored message as sent."""


class MessagesExisting(_Answer):
    existing: list[str] = Field(description="the listed ids that are messages of the session, in the order given")


class MessagePage(_Answer):
    next_cursor: int | None
    messages: list[Message]


class History(_Answer):
    leaf_id: str | None
    as_of_seq: int | None = None
    truncated: bool | None = None
    total_content_bytes: int | None = None
    messages: list[Message]


class RowStat(_Answer):
    id: str
    role: str
    bytes: int = Field(ge=0, description="the stored JSON's UTF-8 length, as the history's max_bytes counts it")


class HistoryRowStats(_Answer):
    leaf_id: str | None
    rows: list[RowStat]


class Leaf(_Answer):
    leaf_id: str | None
    message: Message | None


class PathLength(_Answer):
    leaf_id: str | None
    length: int


class Compactions(_Answer):
    compactions: list[Overlay]
    next_cursor: int | None


class SearchResult(_Answer):
    id: str
    session_id: str
    role: str
    content: str
    snippet: str
    rank: float
    created_at: str


class SearchResults(_Answer):
    results: list[SearchResult]


class Seq(_Answer):
    seq: int


class WhoAmI(_Answer):
    tenant: str = Field(description="the tenant this API key selects")
    read_only: bool = Field(description="whether the key only reads (`chronicle keygen --read-only`)")


class NatsPublishing(_Answer):
    tenant: str
    stream: str
    subject_prefix: str
    partitions: int
    command_prefix: str
    inbox_prefix: str
    publish: list[str]
    payload_limit_bytes: int
    max_message_bytes: int
    max_event_bytes: int


class ConfigRead(_Answer):
    config: Config


class BlockView(_Answer):
    label: Annotated[str, WithJsonSchema({"type": "string", "pattern": LABEL_RE})]
    kind: str
    description: str | None
    content: str
    tokens: int
    max_tokens: int | None
    writable: bool


class Blocks(_Answer):
    as_of_seq: int | None = None
    blocks: list[BlockView]


class Tools(_Answer):
    format: str
    tools: list[dict[str, Any]]


class TreeNode(_Answer):
    id: str
    parent_id: str | None
    role: str
    seq: int
    created_at: str
    capped: bool
    unloaded: list[str]
    message: Message


class Tree(_Answer):
    leaf_id: str | None
    next_cursor: int | None
    messages: list[TreeNode]


class PromptVersion(_Answer):
    version: int
    reason: str
    tokens: int
    seq: int
    text: str


class Prompts(_Answer):
    prompts: list[PromptVersion]
    next_cursor: int | None


class CompactionFailure(_Answer):
    seq: int
    leaf_id: str
    summarizer: str
    error: str
    attempt: int
    created_at: str


class CompactionFailures(_Answer):
    failures: list[CompactionFailure]
    next_cursor: int | None


class QuarantinedEvent(_Answer):
    seq: int
    session_id: str | None
    reason: str
    detail: str
    recorded_at: str
    size: int


class QuarantineList(_Answer):
    quarantined: list[QuarantinedEvent]
    next_cursor: int | None


def ok(model: type[BaseModel], status: int = 200, description: str = "Done") -> dict[int | str, dict[str, Any]]:
    """The ``responses`` entry that documents ``model`` as the answer with ``status``."""
    return {status: {"model": model, "description": description}}
