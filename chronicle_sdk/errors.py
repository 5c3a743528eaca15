"""Typed exceptions, one per stable problem ``code`` of the Chronicle HTTP API.

Every error the SDK raises is a :class:`ChronicleError` carrying the server's ``code``,
HTTP ``status`` and ``detail`` (the server's message). Errors are grouped by what a caller
usually does about them: :class:`Conflict` (409), :class:`NotFound` (404; :class:`Gone`, 410,
is one: what the request names existed and never will again),
:class:`InvalidRequest` (422/400/413: fix the request) and :class:`TransientError` (the SDK
already retried, with backoff, before raising it). :class:`RateLimited` (429) is transient: the
tenant is over its rate limit, nothing of the refused request was written, and the SDK waits at
least its ``retry_after`` before each retry (one over a minute is raised at once).
"""

from __future__ import annotations

from typing import Any, ClassVar

from chronicle_sdk.types import AppendResult


class ChronicleError(Exception):
    """Base of every SDK error: ``code`` (stable), ``status`` (HTTP; 0 when no answer came) and ``detail``.

    An append of a chain (:meth:`chronicle_sdk.Session.append_all`, ``messages:batch``) is not
    atomic: its error has ``failed_index``, the index in the chain of the first message not
    written (the one that failed, or the first of a request refused whole), and ``written``, the
    messages before it, which are stored (as :class:`~chronicle_sdk.AppendResult`, in chain
    order; empty when nothing of the chain was). After a :class:`TransientError` (no answer, or
    a 5xx) messages of the request that failed may have been stored too. Either way the chain
    may be appended again whole (idempotent by message id), or from ``failed_index`` under
    ``written[-1].id``; under a rate limit go on from ``failed_index``: the whole chain again is
    charged for its stored messages again (one token each), and may be refused at the same place.
    A chain sent in several requests, or published straight to JetStream, says in its message
    too how many of its messages are stored and how to go on. Via JetStream ``written`` is the
    unbroken prefix of the chain whose publishes were acknowledged (an ack that came back for a
    later message is not counted): the messages from ``failed_index`` on were published with
    the one that failed (pipelined), so they may be stored too, and that one may be when its ack
    was lost with the connection; which of them are cannot be known from the client, and the
    message says so. Any other error has ``failed_index`` None and ``written`` empty."""

    default_code: ClassVar[str] = "internal_error"

    def __init__(
        self, detail: str = "", *, code: str | None = None, status: int = 0, problem: dict[str, Any] | None = None
    ) -> None:
        self.code = code or self.default_code
        self.status = status
        self.detail = detail or self.code
        self.problem: dict[str, Any] = problem or {}
        index = self.problem.get("failed_index")
        self.failed_index: int | None = index if isinstance(index, int) and not isinstance(index, bool) else None
        self.written: list[AppendResult] = _written(self.problem.get("written"))
        super().__init__(self.detail)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(code={self.code!r}, status={self.status}, detail={self.detail!r})"


def _written(items: Any) -> list[AppendResult]:
    """A problem's ``written`` (a batch's messages stored before it failed) as append results."""
    if not isinstance(items, list):
        return []
    return [
        AppendResult(str(w["id"]), w.get("parent_id"), int(w["seq"]), bool(w.get("created", True)))
        for w in items
        if isinstance(w, dict) and "id" in w and isinstance(w.get("seq"), int)
    ]


class Conflict(ChronicleError):
    """409: the request contradicts stored state (base of every 409 error)."""

    default_code = "conflict"


class NotFound(ChronicleError):
    """404: something named in the request does not exist (base of every 404 error)."""

    default_code = "not_found"


class Gone(NotFound):
    """410: what the request names existed and is gone for good (base of every 410 error)."""

    default_code = "gone"


class InvalidRequest(ChronicleError):
    """422/400: the request is not valid; sending it again will fail again."""

    default_code = "invalid_request"


class TransientError(ChronicleError):
    """A failure that may pass (connection, 502/503/504); raised only after the bounded retries."""

    default_code = "unavailable"


class Unauthorized(ChronicleError):
    """401: missing or unknown API key."""

    default_code = "unauthorized"


class AmbiguousCredentials(Unauthorized):
    """401: the request carried more than one ``Authorization`` header (a proxy adding its own,
    say); the server acts as neither key, and nothing was done."""

    default_code = "ambiguous_credentials"


class ReadOnlyKey(ChronicleError):
    """403: the API key only reads (an auditor's, ``chronicle keygen --read-only``): writes, the
    data key and NATS publishing need a full key; nothing was done."""

    default_code = "read_only_key"


class UnknownParent(InvalidRequest):
    """``parent_id`` names a message that is not in this session (the reference silently made a root)."""

    default_code = "unknown_parent"


class MessageConflict(Conflict):
    """A different message with this id is already stored (the same body again is an idempotent no-op)."""

    default_code = "message_conflict"


class ParentCycle(Conflict):
    """The appended message would be its own ancestor: its id is a deleted message's whose
    descendants are still stored (children keep their parent id), and the parent (given, or the
    latest leaf when omitted) is one of them. Nothing was written; append it under another
    parent, as a new root (``parent_id=None``), or with a new id."""

    default_code = "parent_cycle"


class SessionExists(Conflict):
    """A session with this id already exists (deleted sessions keep their id)."""

    default_code = "session_exists"


class ReadOnlyBlock(Conflict):
    """The context block is read-only (reference: ``Block "<l>" is readonly``)."""

    default_code = "readonly_block"


class KeyedBlock(Conflict):
    """The block holds keyed entries (skills, searchable); write them with the ``set_context`` tool."""

    default_code = "keyed_block"


class SessionNotFound(NotFound):
    """The session does not exist or was deleted (:attr:`deleted` tells which)."""

    default_code = "session_not_found"

    @property
    def deleted(self) -> bool:
        """The session was deleted (the problem's ``deleted``): its reads raise, as its writes do.
        False for one that was never written (or is another tenant's), which a
        :class:`~chronicle_sdk.Session` reads as empty, as the reference's implicit sessions."""
        return self.problem.get("deleted") is True


class SessionErased(Gone):
    """The session was erased (crypto-shredded): its writes and reads raise this (but
    :meth:`~chronicle_sdk.Session.get_events`, its tombstones), and its id cannot be used again."""

    default_code = "session_erased"


class EncryptionOff(NotFound):
    """The deployment does not seal events: a session has no data key to give (``GET …/data-key``)."""

    default_code = "encryption_off"


class UnsafeConfig(Conflict):
    """The stored session config names an unsafe object key (stored before keys were checked); PUT a new one."""

    default_code = "unsafe_config"


class IdempotencyKeyConflict(Conflict):
    """The event id the ``Idempotency-Key`` derives (``POST …/usage``) is held by another event of
    the log, one published straight to the stream under it; nothing was written. Use another key."""

    default_code = "idempotency_key_conflict"


class SourceNotText(Conflict):
    """A read-only block's (or a skill's) ``source`` object is not UTF-8 text: upload it as text,
    or PUT a config without it."""

    default_code = "source_not_text"


class SourceMissing(Conflict):
    """A read-only block's ``source`` object is not in its bucket: upload it, or PUT a config without it."""

    default_code = "source_missing"


class PromptUnstorable(Conflict):
    """The session's system prompt, rendered from its blocks, is too large to store (one event's
    bound): an object behind a read-only block grew, or skills were put to the tenant's index.
    Raised by the first :meth:`~chronicle_sdk.Session.get_system_prompt` (nothing is frozen) and
    by :meth:`~chronicle_sdk.Session.refresh_system_prompt` (the prompt in force stays). The
    detail says by how much, and what room its largest block has: shorten that block (a write
    that shortens a block is always taken) or PUT a config that does."""

    default_code = "prompt_unstorable"

    @property
    def block(self) -> str | None:
        """The prompt's largest block (its label)."""
        given = self.problem.get("block")
        return given if isinstance(given, str) else None

    @property
    def size(self) -> int | None:
        """The prompt's size as it would be stored, in bytes."""
        given = self.problem.get("size")
        return given if isinstance(given, int) and not isinstance(given, bool) else None

    @property
    def limit(self) -> int | None:
        """The most bytes an event may be stored as."""
        given = self.problem.get("limit")
        return given if isinstance(given, int) and not isinstance(given, bool) else None


class EventIdTaken(Conflict):
    """A direct publish (``via="jetstream"``) was answered "duplicate" by JetStream, but the message
    holding the event's id is not on this session's subject: someone publishing straight to the
    stream on their own subjects took the id first (JetStream deduplicates across the whole
    stream). Nothing of this write was stored; the events before it in a chain may be. Raised by
    the SDK itself (``status`` 0): the server answers its own such writes with
    :class:`IdempotencyKeyConflict` or writes them under a fresh id."""

    default_code = "event_id_taken"


class MessageNotFound(NotFound):
    """The message is not in this session."""

    default_code = "message_not_found"


class BlockNotFound(NotFound):
    """No context block with this label (reference: ``Block "<l>" not found``)."""

    default_code = "block_not_found"


class UnknownTool(NotFound):
    """No tool of this name for this session."""

    default_code = "unknown_tool"


class BudgetExceeded(InvalidRequest):
    """The block would exceed its ``max_tokens`` (reference: ``Block "<l>" exceeds maxTokens: n > max``)."""

    default_code = "budget_exceeded"


class CursorOrderMismatch(InvalidRequest):
    """A session list's ``cursor`` was given by a list in the other ``order``; start that order
    from its first page."""

    default_code = "cursor_order_mismatch"


class UnknownCursor(InvalidRequest):
    """A list's ``cursor`` in its form that no page of the list gives (a sequence past the largest,
    an id that is none, an erasure the tenant does not have): pass ``next_cursor`` as it came."""

    default_code = "unknown_cursor"


class SeqNotReached(InvalidRequest):
    """``as_of_seq`` past the log's last sequence: the state then is not known yet."""

    default_code = "seq_not_reached"


class AmbiguousIdempotencyKey(InvalidRequest):
    """400: the request carried more than one ``Idempotency-Key`` header (an append, a usage call);
    the server takes neither, and nothing was done."""

    default_code = "ambiguous_idempotency_key"


class IdempotencyKeyReused(InvalidRequest):
    """The ``Idempotency-Key`` was used for a request with other values (``POST …/usage`` with
    other amounts, for as long as the session lives); nothing was written. Use a new key per call."""

    default_code = "idempotency_key_reused"


class InvalidConfig(InvalidRequest):
    """The session config is not valid (for example a skills bucket that does not exist)."""

    default_code = "invalid_config"


class InvalidId(InvalidRequest):
    """A session or message id is empty, too long or holds refused characters."""

    default_code = "invalid_id"


class MalformedJson(InvalidRequest):
    """The request body is not valid JSON."""

    default_code = "malformed_json"


class MethodNotAllowed(InvalidRequest):
    """405: the route exists, not with this method (a client older or newer than the server)."""

    default_code = "method_not_allowed"


class PayloadTooLarge(InvalidRequest):
    """The message is larger than the server's ``max_message_bytes``, or a request body larger
    than its ``max_request_bytes`` (the SDK cuts chains into batches well under the default); or
    a change after which the session's system prompt would be too large to store, nothing
    written: a block write (:meth:`~chronicle_sdk.Session.replace_context_block`,
    :meth:`~chronicle_sdk.Session.append_context_block`) or the builder's config (sent before
    the first call), the detail saying the room left. A change that shortens the prompt is
    always taken. (The ``set_context`` tool answers the same words as its ``Error: …`` result.)"""

    default_code = "payload_too_large"


class SkillTooLarge(PayloadTooLarge):
    """A skill document over the server's ``max_skill_bytes`` (``CHRONICLE_MAX_SKILL_BYTES``, 1 MiB
    by default): nothing stored. The ``set_context`` tool answers such a put, and ``load_context``
    a document stored larger before the bound (nothing loaded), as an ``Error: …`` result in the
    same words; ``chronicle skills put`` exits 2 naming this code."""

    default_code = "skill_too_large"


class HeaderTooLarge(InvalidRequest):
    """``431``: the request line and headers are over the server's ``api_max_header_bytes``
    (64 KiB by default): nothing reached the API; a request the SDK builds never is."""

    default_code = "header_too_large"


class UnsupportedMediaType(InvalidRequest):
    """The body was not sent as JSON (``415``: ``Content-Type`` other than ``application/json``)."""

    default_code = "unsupported_media_type"


class UnsupportedContentEncoding(InvalidRequest):
    """The body was sent with a content coding (``415``: ``Content-Encoding`` other than
    ``identity``, such as gzip): the server takes bodies as they are; the SDK never codes one."""

    default_code = "unsupported_content_encoding"


class ProjectionTimeout(TransientError):
    """The read model did not catch up with ``min_seq`` in time."""

    default_code = "projection_timeout"


class SearchTimeout(ChronicleError):
    """503: a search ran past the server's search timeout (``CHRONICLE_SEARCH_TIMEOUT_S``) and was
    cancelled. Not retried: the same query would most likely run as long again (each try holding
    a database connection for the whole timeout). A query of fewer words, or of longer prefixes
    (one of one or two letters matches many words), costs less; or search again later."""

    default_code = "search_timeout"


class Contention(TransientError):
    """Too many concurrent writers on one session; nothing was written."""

    default_code = "contention"


class RequestTimeout(TransientError):
    """408: the request's body did not reach the server whole within its body timeout (a slow or
    stalled link); nothing was done, so any request may be sent again."""

    default_code = "request_timeout"


MAX_RETRY_AFTER_S = 60.0
"""The longest ``retry_after`` the SDK waits out (a call before its retry, :meth:`Session.follow_events
<chronicle_sdk.Session.follow_events>` before it resumes): a :class:`RateLimited` asking for more is
raised at once, for the caller to decide (a sleep of minutes inside one call looks like a hang)."""


class RateLimited(TransientError):
    """429: the tenant is over its rate limit; nothing of the refused request was written, so it may
    be sent again. An :meth:`~chronicle_sdk.Session.append_all` of more than one request (over
    1,000 messages) may be refused after its first requests were stored: a batch of N messages
    takes N of the tenant's tokens, so the next request's ``retry_after`` can pass
    ``MAX_RETRY_AFTER_S`` and be raised at once. Its ``written`` and ``failed_index`` then say
    what of the chain is stored, and its message how to go on (``append_all(messages[i:],
    parent_id=written[-1].id)`` once ``retry_after`` has passed)."""

    default_code = "rate_limited"

    def __init__(
        self,
        detail: str = "",
        *,
        code: str | None = None,
        status: int = 0,
        problem: dict[str, Any] | None = None,
        retry_after_header: str | None = None,
    ) -> None:
        super().__init__(detail, code=code, status=status, problem=problem)
        self._header = retry_after_header

    @property
    def retry_after(self) -> float | None:
        """Seconds until the server would admit a request: the problem's ``retry_after``, else the
        ``Retry-After`` header's seconds (a bare 429 from a proxy); ``None`` when neither says."""
        given = self.problem.get("retry_after")
        if isinstance(given, int | float) and not isinstance(given, bool) and given > 0:
            return float(given)
        header = (self._header or "").strip()
        return float(header) if header.isdigit() else None  # an HTTP-date is not read


class Unavailable(TransientError):
    """A backing service (NATS, Postgres, object storage) is unavailable, or the connection failed."""

    default_code = "unavailable"


class ObjectStorageUnavailable(Unavailable):
    """Object storage (S3) failed or is not configured for what the request needs (a skill document)."""

    default_code = "object_storage"


class TooManyStreams(ChronicleError):
    """429: this tenant follows as many event streams as the server process allows; close one
    first (not retried: waiting does not end a stream)."""

    default_code = "too_many_streams"


class CompactionInProgress(Conflict):
    """409: another compaction of the session is running (the compactor's, or another ``compact()``);
    nothing was summarised. Its overlay appears in ``compactions()`` when it is recorded; retry
    ``compact()`` after it to compact further."""

    default_code = "compaction_in_progress"


class SummarizerFailed(ChronicleError):
    """The summarizer failed during ``compact()``; the failure is recorded and the session is unchanged."""

    default_code = "summarizer_failed"


class ServerError(ChronicleError):
    """An unexpected server error (500)."""

    default_code = "internal_error"


class KeyUnavailable(ServerError):
    """500: the session's data key cannot be opened by the server (its key-encryption key is not
    configured there: a KEK rotated in the wrong order, a process not restarted). Nothing was
    written or read; not retried: an operator must fix the server's configuration."""

    default_code = "key_unavailable"


BY_CODE: dict[str, type[ChronicleError]] = {
    cls.default_code: cls
    for cls in (
        Unauthorized,
        AmbiguousCredentials,
        ReadOnlyKey,
        UnknownParent,
        MessageConflict,
        ParentCycle,
        SessionExists,
        ReadOnlyBlock,
        KeyedBlock,
        SessionNotFound,
        SessionErased,
        EncryptionOff,
        UnsafeConfig,
        IdempotencyKeyConflict,
        SourceMissing,
        SourceNotText,
        PromptUnstorable,
        EventIdTaken,
        MethodNotAllowed,
        ObjectStorageUnavailable,
        TooManyStreams,
        MessageNotFound,
        BlockNotFound,
        UnknownTool,
        BudgetExceeded,
        CursorOrderMismatch,
        UnknownCursor,
        SeqNotReached,
        IdempotencyKeyReused,
        AmbiguousIdempotencyKey,
        InvalidConfig,
        InvalidId,
        MalformedJson,
        PayloadTooLarge,
        SkillTooLarge,
        HeaderTooLarge,
        UnsupportedMediaType,
        UnsupportedContentEncoding,
        ProjectionTimeout,
        SearchTimeout,
        Contention,
        RequestTimeout,
        RateLimited,
        Unavailable,
        SummarizerFailed,
        CompactionInProgress,
        InvalidRequest,
        NotFound,
        Gone,
        KeyUnavailable,
        ServerError,
    )
}

BY_STATUS: dict[int, type[ChronicleError]] = {
    400: InvalidRequest,
    401: Unauthorized,
    403: ReadOnlyKey,
    404: NotFound,
    405: MethodNotAllowed,
    408: RequestTimeout,
    409: Conflict,
    410: Gone,
    413: PayloadTooLarge,
    415: UnsupportedMediaType,
    422: InvalidRequest,
    431: HeaderTooLarge,
    429: RateLimited,
    500: ServerError,
    502: TransientError,
    503: Unavailable,
    504: TransientError,
}

TRANSIENT_STATUS = frozenset({502, 503, 504})


def error_from_problem(status: int, body: Any, *, retry_after: str | None = None) -> ChronicleError:
    """The typed error for an HTTP error answer (``application/problem+json`` or anything else);
    ``retry_after``: the answer's ``Retry-After`` header, if it had one."""
    problem = body if isinstance(body, dict) else {}
    code = problem.get("code") if isinstance(problem.get("code"), str) else None
    detail = problem.get("detail") if isinstance(problem.get("detail"), str) else None
    if detail is None:
        detail = problem.get("title") if isinstance(problem.get("title"), str) else None
    cls = BY_CODE.get(code or "")
    if cls is None:
        cls = BY_STATUS.get(status) or (TransientError if status >= 500 else ChronicleError)
    text = detail if detail is not None else (body if isinstance(body, str) and body else f"HTTP {status}")
    if issubclass(cls, RateLimited):
        return cls(
            str(text), code=code or cls.default_code, status=status, problem=problem, retry_after_header=retry_after
        )
    return cls(str(text), code=code or cls.default_code, status=status, problem=problem)


__all__ = [
    "BY_CODE",
    "AmbiguousCredentials",
    "AmbiguousIdempotencyKey",
    "BlockNotFound",
    "BudgetExceeded",
    "ChronicleError",
    "CompactionInProgress",
    "Conflict",
    "Contention",
    "CursorOrderMismatch",
    "EncryptionOff",
    "EventIdTaken",
    "Gone",
    "HeaderTooLarge",
    "IdempotencyKeyConflict",
    "IdempotencyKeyReused",
    "InvalidConfig",
    "InvalidId",
    "InvalidRequest",
    "KeyedBlock",
    "MalformedJson",
    "MessageConflict",
    "MessageNotFound",
    "MethodNotAllowed",
    "NotFound",
    "ObjectStorageUnavailable",
    "PayloadTooLarge",
    "ProjectionTimeout",
    "PromptUnstorable",
    "RateLimited",
    "ReadOnlyBlock",
    "RequestTimeout",
    "SearchTimeout",
    "SeqNotReached",
    "ServerError",
    "SessionErased",
    "SessionExists",
    "SessionNotFound",
    "SkillTooLarge",
    "SummarizerFailed",
    "TooManyStreams",
    "TransientError",
    "Unauthorized",
    "Unavailable",
    "UnknownCursor",
    "UnknownParent",
    "UnknownTool",
    "UnsafeConfig",
    "UnsupportedContentEncoding",
    "UnsupportedMediaType",
    "error_from_problem",
]
