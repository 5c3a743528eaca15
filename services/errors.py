"""Errors named for the situation, and the one table that maps them to HTTP problem codes."""

from __future__ import annotations

from typing import Any


class ChronicleError(Exception):
    """Base of every error a client may see; ``code`` is stable, ``status`` is the HTTP status."""

    code = "internal_error"
    status = 500
    title = "Internal error"

    def __init__(self, detail: str = "") -> None:
        super().__init__(detail or self.title)
        self.detail = detail or self.title

    def fields(self) -> dict[str, Any]:
        """Members of the problem beyond ``detail`` (none unless the error names some)."""
        return {}


def _error(name: str, code: str, status: int, title: str) -> type[ChronicleError]:
    return type(name, (ChronicleError,), {"code": code, "status": status, "title": title})


class InvalidRequest(ChronicleError):
    """The request fails validation. ``errors`` (``{loc, msg, type}``, ``loc`` from the root of the
    request's body: ``["message", "role"]``) when a check past the edge's own names fields, such
    as a message's shape: the problem then carries them as the edge's own validation does (over
    HTTP each ``loc`` starts with ``body``, as FastAPI's)."""

    code = "invalid_request"
    status = 422
    title = "The request is not valid"

    def __init__(self, detail: str = "", errors: list[dict[str, Any]] | None = None) -> None:
        super().__init__(detail)
        self.errors = errors

    def fields(self) -> dict[str, Any]:
        return {"errors": self.errors} if self.errors is not None else {}


MalformedJson = _error("MalformedJson", "malformed_json", 400, "The request body is not valid JSON")
UnsupportedMediaType = _error(
    "UnsupportedMediaType", "unsupported_media_type", 415, "The request body is not declared as JSON"
)
UnsupportedContentEncoding = _error(
    "UnsupportedContentEncoding", "unsupported_content_encoding", 415, "The request body's content coding is not taken"
)
"""A request whose ``Content-Encoding`` names a coding other than ``identity`` (gzip, …): refused
before its body is read (services/api/guards.py)."""
InvalidId = _error("InvalidId", "invalid_id", 422, "An id is not valid")
UnknownCursor = _error("UnknownCursor", "unknown_cursor", 422, "No list gives this cursor")
"""A cursor in its list's form that no page of the list gives (a sequence past the largest, an id
that is none, an erasure the tenant does not have): about what exists, not the request's form."""
CursorOrderMismatch = _error(
    "CursorOrderMismatch", "cursor_order_mismatch", 422, "The cursor was given by a list in another order"
)
Unauthorized = _error("Unauthorized", "unauthorized", 401, "Missing or unknown API key")
AmbiguousCredentials = _error(
    "AmbiguousCredentials", "ambiguous_credentials", 401, "The request carries more than one Authorization header"
)
"""Two credentials on one request (a proxy appending its own, a confused client): which one the
request acts as cannot be told, so it acts as none (services/api/auth.py)."""
ReadOnlyKey = _error("ReadOnlyKey", "read_only_key", 403, "This API key only reads")


class SessionNotFound(ChronicleError):
    """The session does not exist for the key's tenant (never written, another tenant's), or it
    was deleted: ``deleted`` then, and the problem says ``"deleted": true``, so that a client can
    tell a deleted session (its reads and writes fail alike) from one never written (which the
    reference's implicit sessions read as empty)."""

    code = "session_not_found"
    status = 404
    title = "Session not found"

    def __init__(self, detail: str = "", *, deleted: bool = False) -> None:
        super().__init__(detail)
        self.deleted = deleted

    def fields(self) -> dict[str, Any]:
        return {"deleted": True} if self.deleted else {}


ErasedSession = _error("ErasedSession", "session_erased", 410, "The session is erased")
SessionExists = _error("SessionExists", "session_exists", 409, "Session already exists")
MessageNotFound = _error("MessageNotFound", "message_not_found", 404, "Message not found")
UnknownParent = _error("UnknownParent", "unknown_parent", 422, "The parent message is not in this session")
MessageConflict = _error("MessageConflict", "message_conflict", 409, "A different message with this id exists")
ParentCycle = _error("ParentCycle", "parent_cycle", 409, "The message would be its own ancestor")
IdempotencyKeyReused = _error(
    "IdempotencyKeyReused", "idempotency_key_reused", 422, "This Idempotency-Key was used for a different request"
)
AmbiguousIdempotencyKey = _error(
    "AmbiguousIdempotencyKey",
    "ambiguous_idempotency_key",
    400,
    "The request carries more than one Idempotency-Key header",
)
"""Two keys on one request that takes one (an append, a usage call): which request it names cannot
be told, so it is refused, never resolved (a proxy may judge one and the app another; the first,
taken silently, made a retry under the second key a new request). Nothing was done."""
IdempotencyKeyConflict = _error(
    "IdempotencyKeyConflict",
    "idempotency_key_conflict",
    409,
    "The event id this Idempotency-Key derives is held by another event of the log",
)
PayloadTooLarge = _error("PayloadTooLarge", "payload_too_large", 413, "The message is too large")
RequestTooLarge = _error("RequestTooLarge", "payload_too_large", 413, "The request body is too large")
RequestTimeout = _error("RequestTimeout", "request_timeout", 408, "The request body did not arrive in time")
"""The body was not whole within the API's body timeout (services/api/body_timeout.py): nothing of
the request was done, so it may be sent again as it was."""
ProjectionTimeout = _error("ProjectionTimeout", "projection_timeout", 503, "The read model did not catch up in time")


class SearchTimeout(ChronicleError):
    """A search ran past ``CHRONICLE_SEARCH_TIMEOUT_S`` and Postgres cancelled it
    (projections/search_bound.py); nothing was changed, and the connection is as it was. No
    ``Retry-After``: the same query would most likely run as long again, holding a backend each
    time (clients that retry every 503 carrying one would repeat it)."""

    code = "search_timeout"
    status = 503
    title = "The search took too long"

    def __init__(self, timeout_s: float) -> None:
        super().__init__(
            f"the search ran past CHRONICLE_SEARCH_TIMEOUT_S ({timeout_s:g} s) and was cancelled: a query of fewer "
            "words, or of longer prefixes (a prefix of one or two letters matches many words), costs less"
        )


ContentionExhausted = _error("ContentionExhausted", "contention", 503, "Too many concurrent writers; retry")
Unavailable = _error("Unavailable", "unavailable", 503, "A backing service is unavailable")
NotFound = _error("NotFound", "not_found", 404, "Not found")
InvalidConfig = _error("InvalidConfig", "invalid_config", 422, "The session config is not valid")
UnsafeStoredConfig = _error(
    "UnsafeStoredConfig", "unsafe_config", 409, "The session config names an unsafe object key; PUT a new one"
)
SourceMissing = _error(
    "SourceMissing", "source_missing", 409, "A read-only block's object is missing; upload it or PUT a new config"
)
SourceNotText = _error(
    "SourceNotText", "source_not_text", 409, "A read-only block's object is not UTF-8 text; upload text or PUT a config"
)
EncryptionOff = _error("EncryptionOff", "encryption_off", 404, "This deployment does not seal events")
BlockNotFound = _error("BlockNotFound", "block_not_found", 404, "No block with this label")
ReadOnlyBlock = _error("ReadOnlyBlock", "readonly_block", 409, "The block is read-only")
KeyedBlock = _error("KeyedBlock", "keyed_block", 409, "The block holds keyed entries")
BudgetExceeded = _error("BudgetExceeded", "budget_exceeded", 422, "The block would exceed its token budget")
PromptTooLarge = _error(
    "PromptTooLarge", "payload_too_large", 413, "The write would make the system prompt too large to store"
)
"""A block write, config PUT or skill put after which the session's prompt could not be recorded
and would be longer than before (services/context/prompt_size.py); nothing was written."""
SkillTooLarge = _error("SkillTooLarge", "skill_too_large", 413, "The skill document is larger than a skill may be")
"""A skill document over ``CHRONICLE_MAX_SKILL_BYTES``: a put of one stores nothing, a load of one
stored larger loads nothing (services/context/skills.py)."""
UnknownTool = _error("UnknownTool", "unknown_tool", 404, "No such tool for this session")


class ObjectStorageError(ChronicleError):
    """Object storage could not be used (services/storage/s3.py)."""

    code = "object_storage"
    status = 503
    title = "Object storage failed"


class BucketUnusable(ObjectStorageError):
    """The object store answered, refusing a request about one bucket (``AccessDenied``, a bucket
    in another region, a key it would not delete), or the client refused the bucket's name before
    sending anything: that bucket cannot be used with these credentials, while the store can (a
    tenant's erasure cleans the other buckets and names this one: services/context/tenant_space.py)."""


TooManyStreams = _error(
    "TooManyStreams", "too_many_streams", 429, "This tenant follows as many event streams as this process allows"
)


class RateLimited(ChronicleError):
    """The tenant is over its request limit (services/requests/limits.py); nothing was done."""

    code = "rate_limited"
    status = 429
    title = "Too many requests for this tenant"

    def __init__(self, retry_after_s: float, detail: str = "") -> None:
        super().__init__(detail)
        self.retry_after_s = retry_after_s


class PromptUnstorable(ChronicleError):
    """The session's system prompt, rendered from its blocks, is more than one event may be stored
    as (an object behind a read-only source grew, or skills were put to the tenant's index): no
    freeze or refresh can record it. ``block`` is its largest block; ``size`` its stored bytes,
    ``limit`` the most an event may have (services/context/prompt_size.py)."""

    code = "prompt_unstorable"
    status = 409
    title = "The system prompt is too large to store; shorten or leave out a block"

    def __init__(self, detail: str, block: str, size: int, limit: int) -> None:
        super().__init__(detail)
        self.block, self.size, self.limit = block, size, limit

    def fields(self) -> dict[str, Any]:
        return {"block": self.block, "size": self.size, "limit": self.limit}


class AsOfPastLog(ChronicleError):
    """An ``as_of`` sequence the log has not reached: its state is not known yet (answered, it
    would change as the log grows). About what the log holds, not the request's form: no schema
    can say it, so it is not ``invalid_request``."""

    code = "seq_not_reached"
    status = 422
    title = "The log has not reached this sequence"

    def __init__(self, seq: int, last: int) -> None:
        super().__init__(f"as_of_seq: {seq} is past the log's last sequence ({last}): no state as of it yet")
        self.seq, self.last = seq, last


class BatchFailed(Exception):
    """A batch (``messages:batch``, the ``append_batch`` command) that failed at its message
    ``failed_index`` for ``cause``: the messages before it are stored (``written``, as the batch's
    answer lists its messages), those after it are not, and the failing one is not, unless the
    cause is a failure below (a 5xx: it may be stored with its answer lost). Batches are not
    atomic: the answer is the cause's problem (its status, code and members) with the batch's
    partial result added, and a detail that says what was written
    (services/requests/problems.py)."""

    def __init__(self, cause: Exception, failed_index: int, message_id: str, written: list[dict[str, Any]]) -> None:
        super().__init__(str(cause))
        self.cause, self.failed_index, self.message_id, self.written = cause, failed_index, message_id, written


CompactionInProgress = _error(
    "CompactionInProgress",
    "compaction_in_progress",
    409,
    "Another compaction of this session is running; read its overlay from …/compactions, or retry",
)
SummarizerFailed = _error("SummarizerFailed", "summarizer_failed", 502, "The summarizer failed; recorded, retry later")
