"""Value types the SDK returns: plain frozen dataclasses built from the API's JSON."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from events.omitted import OMITTED, ParentId
from events.subjects import SubjectLayout

Message = dict[str, Any]
"""An AI SDK ``UIMessage``: ``{"id", "role", "parts": [...], ...}``; unknown fields round-trip."""


def parse_time(value: Any) -> datetime | None:
    """An ISO 8601 timestamp from the API (``Z`` accepted), or None."""
    if not isinstance(value, str) or not value:
        return None
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


@dataclass(frozen=True, slots=True)
class AppendResult:
    """What an append did: the message id, its resolved parent, the event's ``seq``, and whether it was new."""

    id: str
    parent_id: str | None
    seq: int
    created: bool


@dataclass(frozen=True, slots=True)
class RecentHistory:
    """A byte-budgeted recent end of the active path (the reference's ``getRecentHistory`` answer).

    ``messages`` end at the leaf, overlays applied where they start inside them; ``truncated``
    is True when they do not start at the root; ``total_content_bytes`` is the stored size of
    the whole path, the sum of :meth:`Session.get_history_row_stats`' ``bytes``.
    """

    messages: list[Message]
    truncated: bool
    total_content_bytes: int

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RecentHistory:
        """Build from a ``GET …/history?max_bytes=…`` answer (``{}``: an empty session)."""
        return cls(
            messages=list(data.get("messages") or []),
            truncated=bool(data.get("truncated")),
            total_content_bytes=int(data.get("total_content_bytes") or 0),
        )


@dataclass(frozen=True, slots=True)
class HistoryRowStat:
    """One stored row of a path, without its content (the reference's ``{id, role, bytes}``):
    ``bytes`` is its stored JSON's UTF-8 length."""

    id: str
    role: str
    bytes: int

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> HistoryRowStat:
        """Build from one entry of the API's ``rows``."""
        return cls(id=str(data["id"]), role=str(data.get("role") or ""), bytes=int(data.get("bytes") or 0))


@dataclass(frozen=True, slots=True)
class ErasureInfo:
    """An erased session (``SessionManager.list_erasures``): when, who asked (``tenant:<t>
    key:<12 hex>`` for an API key, ``operator (chronicle erase)``; None when recorded before this
    was kept), the reason given, and the sequence of its ``session.erased`` event when known."""

    session_id: str
    erased_at: datetime | None
    requested_by: str | None
    reason: str | None
    seq: int | None

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ErasureInfo:
        """Build from one entry of ``GET /v1/erasures``."""
        seq = data.get("seq")
        return cls(
            session_id=str(data["session_id"]),
            erased_at=parse_time(data.get("erased_at")),
            requested_by=data.get("requested_by"),
            reason=data.get("reason"),
            seq=int(seq) if seq is not None else None,
        )


@dataclass(frozen=True, slots=True)
class SessionInfo:
    """A registry entry (``SessionManager.get``/``list``)."""

    id: str
    name: str
    parent_session_id: str | None
    metadata: dict[str, Any]
    created_at: datetime | None
    updated_at: datetime | None
    seq: int
    input_tokens: int = 0
    output_tokens: int = 0
    estimated_cost: float = 0.0
    end_reason: str | None = None

    @property
    def model(self) -> str | None:
        """The reference's ``model`` column (kept in ``metadata``)."""
        value = self.metadata.get("model")
        return value if isinstance(value, str) else None

    @property
    def source(self) -> str | None:
        """The reference's ``source`` column (kept in ``metadata``)."""
        value = self.metadata.get("source")
        return value if isinstance(value, str) else None

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> SessionInfo:
        """Build from the API's session JSON."""
        return cls(
            id=str(data["id"]),
            name=str(data.get("name") or ""),
            parent_session_id=data.get("parent_session_id"),
            metadata=dict(data.get("metadata") or {}),
            created_at=parse_time(data.get("created_at")),
            updated_at=parse_time(data.get("updated_at")),
            seq=int(data.get("seq") or 0),
            input_tokens=int(data.get("input_tokens") or 0),
            output_tokens=int(data.get("output_tokens") or 0),
            estimated_cost=float(data.get("estimated_cost") or 0.0),
            end_reason=data.get("end_reason"),
        )


@dataclass(frozen=True, slots=True)
class SearchResult:
    """A full-text hit: the reference's ``{id, role, content, createdAt, sessionId}`` plus snippet and rank."""

    id: str
    role: str
    content: str
    session_id: str | None = None
    created_at: datetime | None = None
    snippet: str = ""
    rank: float = 0.0

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> SearchResult:
        """Build from one entry of the API's ``results``."""
        return cls(
            id=str(data["id"]),
            role=str(data.get("role") or ""),
            content=str(data.get("content") or ""),
            session_id=data.get("session_id"),
            created_at=parse_time(data.get("created_at")),
            snippet=str(data.get("snippet") or ""),
            rank=float(data.get("rank") or 0.0),
        )


@dataclass(frozen=True, slots=True)
class ContextBlock:
    """A context block as the session sees it now (reference ``ContextBlock``)."""

    label: str
    kind: str
    description: str | None
    content: str
    tokens: int
    max_tokens: int | None
    writable: bool

    @property
    def is_skill(self) -> bool:
        """True for a skills block (``[loadable]``)."""
        return self.kind == "skills"

    @property
    def is_searchable(self) -> bool:
        """True for a searchable block or the cross-session history block (``[searchable]``)."""
        return self.kind in ("searchable", "history")

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ContextBlock:
        """Build from one entry of the API's ``blocks``."""
        return cls(
            label=str(data["label"]),
            kind=str(data.get("kind") or ""),
            description=data.get("description"),
            content=str(data.get("content") or ""),
            tokens=int(data.get("tokens") or 0),
            max_tokens=data.get("max_tokens"),
            writable=bool(data.get("writable")),
        )


@dataclass(frozen=True, slots=True)
class SystemPrompt:
    """A frozen system prompt: its text, exact token count, version and event ``seq``.

    ``version`` is 1 at the first freeze and changes exactly when the text changes (a re-render
    to the same bytes keeps it, with its ``seq``): a changed version means a changed cached prefix.
    """

    prompt: str
    tokens: int
    version: int
    seq: int


@dataclass(frozen=True, slots=True)
class Compaction:
    """A summary overlay over ``from_message_id..to_message_id`` (reference ``StoredCompaction``)."""

    id: str
    message_id: str
    from_message_id: str
    to_message_id: str
    summary: str
    leaf_id: str | None = None
    tokens_before: int = 0
    tokens_after: int = 0
    summarizer: str = ""
    model: str | None = None
    created_at: datetime | None = None
    seq: int = 0
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Compaction:
        """Build from the API's overlay JSON."""
        known = {
            "id",
            "message_id",
            "from_message_id",
            "to_message_id",
            "summary",
            "leaf_id",
            "tokens_before",
            "tokens_after",
            "summarizer",
            "model",
            "created_at",
            "seq",
        }
        return cls(
            id=str(data["id"]),
            message_id=str(data.get("message_id") or ""),
            from_message_id=str(data["from_message_id"]),
            to_message_id=str(data["to_message_id"]),
            summary=str(data.get("summary") or ""),
            leaf_id=data.get("leaf_id"),
            tokens_before=int(data.get("tokens_before") or 0),
            tokens_after=int(data.get("tokens_after") or 0),
            summarizer=str(data.get("summarizer") or ""),
            model=data.get("model"),
            created_at=parse_time(data.get("created_at")),
            seq=int(data.get("seq") or 0),
            extra={k: v for k, v in data.items() if k not in known},
        )


@dataclass(frozen=True, slots=True)
class CompactionFailure:
    """A recorded summarizer failure (a ``compaction.failed`` event): one per failed
    :meth:`~chronicle_sdk.Session.compact`, and one per failed attempt of an automatic compaction
    (``attempt``: its number in the session's series of attempts; a later one may still have
    compacted it)."""

    seq: int
    leaf_id: str | None
    summarizer: str
    error: str
    attempt: int
    created_at: datetime | None = None

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> CompactionFailure:
        """Build from one entry of ``GET …/compaction-failures``."""
        return cls(
            seq=int(data.get("seq") or 0),
            leaf_id=data.get("leaf_id"),
            summarizer=str(data.get("summarizer") or ""),
            error=str(data.get("error") or ""),
            attempt=int(data.get("attempt") or 0),
            created_at=parse_time(data.get("created_at")),
        )


@dataclass(frozen=True, slots=True)
class NatsPublishing:
    """How the API key's tenant publishes straight to JetStream, as the server answers ``GET /v1/nats``.

    ``tenant`` is the tenant the key belongs to: the only one its NATS credentials may publish
    for. ``publish`` lists the subject patterns they allow; publish acks arrive under
    ``inbox_prefix``, as do replies to its commands, sent under ``command_prefix``. Bodies over
    ``payload_limit_bytes`` need the claim-check store, which only the server writes; messages over
    ``max_message_bytes`` are refused.
    """

    tenant: str
    stream: str
    subject_prefix: str
    partitions: int
    inbox_prefix: str
    publish: tuple[str, ...]
    payload_limit_bytes: int
    max_message_bytes: int
    max_event_bytes: int
    command_prefix: str = "chronicle.cmd"

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> NatsPublishing:
        """Build from the answer of ``GET /v1/nats``."""
        return cls(
            tenant=str(data["tenant"]),
            stream=str(data["stream"]),
            subject_prefix=str(data["subject_prefix"]),
            partitions=int(data["partitions"]),
            inbox_prefix=str(data["inbox_prefix"]),
            publish=tuple(str(p) for p in data.get("publish") or ()),
            payload_limit_bytes=int(data["payload_limit_bytes"]),
            max_message_bytes=int(data["max_message_bytes"]),
            max_event_bytes=int(data["max_event_bytes"]),
            command_prefix=str(data.get("command_prefix") or "chronicle.cmd"),
        )

    @property
    def layout(self) -> SubjectLayout:
        """The stream's subject layout (stream name, subject prefix, partition count)."""
        return SubjectLayout(stream=self.stream, prefix=self.subject_prefix, partitions=self.partitions)


__all__ = [
    "OMITTED",
    "AppendResult",
    "Compaction",
    "ContextBlock",
    "HistoryRowStat",
    "Message",
    "NatsPublishing",
    "ParentId",
    "RecentHistory",
    "SearchResult",
    "SessionInfo",
    "SystemPrompt",
]
