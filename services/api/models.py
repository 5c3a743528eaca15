"""The shapes of the API's successful answers, for the OpenAPI document only: routes build their
JSON directly (often spliced from stored text), and these models say what it holds. Schemathesis
checks every answer against them (tests/e2e/test_openapi_fuzz.py)."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, RootModel, WithJsonSchema

from events.context import LABEL_RE
from services.api.deps import ConfigJson, MessageJson

Message = MessageJson
Config = ConfigJson


class _Answer(BaseModel):
    model_config = ConfigDict(extra="forbid")


class SessionCreated(_Answer):
    id: str
    name: str
    parent_session_id: str | None
    metadata: dict[str, Any]
    seq: int


class Session(SessionCreated):
    created_at: str
    updated_at: str


class SessionPage(_Answer):
    sessions: list[Session]
    next_cursor: int | None


class Renamed(_Answer):
    id: str
    name: str
    seq: int


class SessionDeleted(_Answer):
    id: str
    deleted: bool
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


class MessagesDeleted(_Answer):
    deleted: list[str]
    seq: int


class Cleared(_Answer):
    cleared: bool
    seq: int


class MessageRead(RootModel[Message]):
    """The stored message as sent."""


class MessagePage(_Answer):
    next_cursor: int | None
    messages: list[Message]


class History(_Answer):
    leaf_id: str | None
    as_of_seq: int | None = None
    truncated: bool | None = None
    total_content_bytes: int | None = None
    messages: list[Message]


class Leaf(_Answer):
    leaf_id: str | None
    message: Message | None


class PathLength(_Answer):
    leaf_id: str | None
    length: int


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


class Compactions(_Answer):
    compactions: list[Overlay]


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


class NatsPublishing(_Answer):
    tenant: str
    stream: str
    subject_prefix: str
    partitions: int
    inbox_prefix: str
    publish: list[str]
    payload_limit_bytes: int
    max_message_bytes: int
    max_event_bytes: int


class ConfigWritten(_Answer):
    config: Config
    seq: int


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


class BlockWritten(_Answer):
    label: str
    content: str
    tokens: int
    max_tokens: int | None
    seq: int


class Tools(_Answer):
    format: str
    tools: list[dict[str, Any]]


class ToolResult(_Answer):
    result: str
    seq: int


class SystemPrompt(_Answer):
    prompt: str | None
    tokens: int
    version: int
    seq: int


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


class CompactionFailure(_Answer):
    seq: int
    leaf_id: str
    summarizer: str
    error: str
    attempt: int
    created_at: str


class CompactionFailures(_Answer):
    failures: list[CompactionFailure]


class QuarantinedEvent(_Answer):
    seq: int
    session_id: str | None
    reason: str
    detail: str
    recorded_at: str
    size: int


class QuarantineList(_Answer):
    quarantined: list[QuarantinedEvent]


def ok(model: type[BaseModel], status: int = 200, description: str = "Done") -> dict[int | str, dict[str, Any]]:
    """The ``responses`` entry that documents ``model`` as the answer with ``status``."""
    return {status: {"model": model, "description": description}}
