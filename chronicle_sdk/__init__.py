"""Chronicle SDK: the Cloudflare Agents "Session API", in Python, backed by Chronicle.

Moving an agent from the reference is a mechanical rename::

    async with ChronicleClient("http://127.0.0.1:8080", api_key) as client:
        session = (
            Session.create(client, "chat-123")
            .with_context("soul", provider=Readonly("You are a helpful assistant."))
            .with_context("memory", description="Learned facts", max_tokens=1100)
            .with_cached_prompt()
            .compact_after(100_000)
        )
        await session.append_message({"id": "m1", "role": "user", "parts": [{"type": "text", "text": "Hi"}]})
        prompt = await session.freeze_system_prompt()
        messages = to_openai_messages(await session.get_history(), prompt)
        tools = await session.tools()  # tools.openai(), tools.anthropic(), await tools.execute(name, args)

The package imports only ``events`` (the contract), ``pydantic`` and ``msgspec`` (the answers'
JSON); ``nats-py`` (and ``cryptography``, to seal events) for the direct JetStream path
(``nats_url``), ``httpx`` only when an httpx transport is passed in. It is its own
distribution, ``chronicle-sdk`` (``sdk/pyproject.toml``), without the server's dependencies:
``pip install ./sdk``, or ``pip install './sdk[nats]'`` for the direct path.
"""

from chronicle_sdk.client import ChronicleClient, Via
from chronicle_sdk.config import ObjectSource, Provider, Readonly, Searchable, Skills, Writable
from chronicle_sdk.connection import Connection
from chronicle_sdk.convert import UnconvertibleMessage, to_anthropic_messages, to_openai_messages
from chronicle_sdk.errors import (
    AmbiguousCredentials,
    AmbiguousIdempotencyKey,
    BlockNotFound,
    BudgetExceeded,
    ChronicleError,
    CompactionInProgress,
    Conflict,
    Contention,
    CursorOrderMismatch,
    EncryptionOff,
    EventIdTaken,
    Gone,
    HeaderTooLarge,
    IdempotencyKeyConflict,
    IdempotencyKeyReused,
    InvalidConfig,
    InvalidId,
    InvalidRequest,
    KeyedBlock,
    KeyUnavailable,
    MalformedJson,
    MessageConflict,
    MessageNotFound,
    MethodNotAllowed,
    NotFound,
    ObjectStorageUnavailable,
    ParentCycle,
    PayloadTooLarge,
    ProjectionTimeout,
    PromptUnstorable,
    RateLimited,
    ReadOnlyBlock,
    ReadOnlyKey,
    RequestTimeout,
    SearchTimeout,
    SeqNotReached,
    ServerError,
    SessionErased,
    SessionExists,
    SessionNotFound,
    SkillTooLarge,
    SourceMissing,
    SourceNotText,
    SummarizerFailed,
    TooManyStreams,
    TransientError,
    Unauthorized,
    Unavailable,
    UnknownCursor,
    UnknownParent,
    UnknownTool,
    UnsafeConfig,
    UnsupportedContentEncoding,
    UnsupportedMediaType,
)
from chronicle_sdk.manager import SessionManager, format_session_search
from chronicle_sdk.session import Session
from chronicle_sdk.tools import ToolDefinition, Tools
from chronicle_sdk.types import (
    OMITTED,
    AppendResult,
    Compaction,
    CompactionFailure,
    ContextBlock,
    ErasureInfo,
    HistoryRowStat,
    Message,
    NatsPublishing,
    RecentHistory,
    SearchResult,
    SessionInfo,
    SystemPrompt,
)

__all__ = [
    "OMITTED",
    "AmbiguousCredentials",
    "AmbiguousIdempotencyKey",
    "AppendResult",
    "BlockNotFound",
    "BudgetExceeded",
    "ChronicleClient",
    "ChronicleError",
    "Compaction",
    "CompactionFailure",
    "CompactionInProgress",
    "Conflict",
    "Connection",
    "Contention",
    "ContextBlock",
    "CursorOrderMismatch",
    "EncryptionOff",
    "ErasureInfo",
    "EventIdTaken",
    "Gone",
    "HeaderTooLarge",
    "HistoryRowStat",
    "IdempotencyKeyConflict",
    "IdempotencyKeyReused",
    "InvalidConfig",
    "InvalidId",
    "InvalidRequest",
    "KeyUnavailable",
    "KeyedBlock",
    "MalformedJson",
    "Message",
    "MessageConflict",
    "MessageNotFound",
    "MethodNotAllowed",
    "NatsPublishing",
    "NotFound",
    "ObjectSource",
    "ObjectStorageUnavailable",
    "ParentCycle",
    "PayloadTooLarge",
    "ProjectionTimeout",
    "PromptUnstorable",
    "Provider",
    "RateLimited",
    "ReadOnlyBlock",
    "ReadOnlyKey",
    "Readonly",
    "RecentHistory",
    "RequestTimeout",
    "SearchResult",
    "SearchTimeout",
    "Searchable",
    "SeqNotReached",
    "ServerError",
    "Session",
    "SessionErased",
    "SessionExists",
    "SessionInfo",
    "SessionManager",
    "SessionNotFound",
    "SkillTooLarge",
    "Skills",
    "SourceMissing",
    "SourceNotText",
    "SummarizerFailed",
    "SystemPrompt",
    "TooManyStreams",
    "ToolDefinition",
    "Tools",
    "TransientError",
    "Unauthorized",
    "Unavailable",
    "UnconvertibleMessage",
    "UnknownCursor",
    "UnknownParent",
    "UnknownTool",
    "UnsafeConfig",
    "UnsupportedContentEncoding",
    "UnsupportedMediaType",
    "Via",
    "Writable",
    "format_session_search",
    "to_anthropic_messages",
    "to_openai_messages",
]
