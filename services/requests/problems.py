"""RFC 9457 problems: the one mapping from an error to ``status``, ``code``, ``title`` and
``detail``, for HTTP answers (services/api/problems.py) and NATS command replies alike."""

from __future__ import annotations

import logging
import math
from typing import Any

import nats.errors
import psycopg
from pydantic import ValidationError

from events.admission import Refused
from events.blobs import BlobNotFound
from events.ids import TENANT_SCOPE
from events.publisher import PublishFailed, lost_connection
from events.sealing import KeyDestroyed, KeyUnavailable
from events.validation import error_items, validation_detail
from projections.search_bound import SearchTimedOut
from services.errors import BatchFailed, ChronicleError, ErasedSession, ObjectStorageError, RateLimited, SearchTimeout

log = logging.getLogger("chronicle.requests")

PROBLEM_BASE = "https://chronicle.dev/problems/"
Problem = dict[str, Any]


def problem(status: int, code: str, title: str, detail: str, **extra: Any) -> Problem:
    return {"type": PROBLEM_BASE + code, "title": title, "status": status, "detail": detail, "code": code, **extra}


def invalid_request(errors: list[dict[str, Any]], *, root: str = "") -> Problem:
    """``422 invalid_request`` for a request's validation errors (``loc``, ``msg``, ``type``);
    ``root`` names, in the detail, an error of the whole request (an empty ``loc``)."""
    detail = validation_detail(errors, root=root)
    return problem(422, "invalid_request", "The request is not valid", detail, errors=errors)


def validation_errors(exc: ValidationError) -> list[dict[str, Any]]:
    return error_items(exc.errors(include_url=False))


def erased_detail(session: str) -> str:
    """Why a write meeting ``session``'s destroyed key is ``410 session_erased``: the session was
    erased, or (the tenant scope, which no request names) a tenant erasure erased the tenant's
    tenant-level entries, so a skill write (``set_context`` on a skills block, ``skills put``) has
    nowhere to go."""
    if session == TENANT_SCOPE:
        return (
            "the tenant's tenant-level entries (its skills index) were erased by a tenant erasure: "
            "it takes no more skills"
        )
    return f"session {session!r} was erased"


TRANSIENT_503 = ("unavailable", "projection_timeout", "contention")
"""The 503s that pass by themselves: each says ``retry_after`` 1 (and the HTTP answer ``Retry-After:
1``) unless it names its own. Not ``search_timeout`` (the same query would run as long again) nor
``object_storage`` (a bucket these credentials cannot use stays so), nor the ``unavailable`` of a
claim-checked body missing from object storage (:func:`_missing_blob`)."""


def problem_of(exc: BaseException) -> Problem | None:
    """The problem for an error a request may meet; None for one that is a bug (500). A transient
    503 (:data:`TRANSIENT_503`) says when to ask again: the event log's did not, the database's did."""
    found = _problem_of(exc)
    if found is not None and found["status"] == 503 and found["code"] in TRANSIENT_503 and not _missing_blob(exc):
        found.setdefault("retry_after", 1)
    return found


def _missing_blob(exc: BaseException) -> bool:
    """Whether ``exc`` (or the cause of a batch's failure) is a blob missing from object storage: it
    answers ``503 unavailable`` but does not pass, so it names no time to ask again."""
    return isinstance(exc.cause if isinstance(exc, BatchFailed) else exc, BlobNotFound)


def _problem_of(exc: BaseException) -> Problem | None:
    if isinstance(exc, BatchFailed):
        return batch_problem(exc)
    if isinstance(exc, RateLimited):  # when a request would be admitted, in seconds (ms, rounded up)
        retry_after = max(0.001, math.ceil(exc.retry_after_s * 1000) / 1000)
        return problem(exc.status, exc.code, exc.title, exc.detail, retry_after=retry_after)
    if isinstance(exc, ObjectStorageError):  # the tenant's 503 says why; the operator's log too
        log.warning("object storage failed: %s", exc.detail)
    if isinstance(exc, ChronicleError):
        return problem(exc.status, exc.code, exc.title, exc.detail, **exc.fields())
    if isinstance(exc, ValidationError):
        return invalid_request(validation_errors(exc))
    if isinstance(exc, PublishFailed):
        return problem(503, "unavailable", "The event log is unavailable", str(exc))
    if isinstance(exc, Refused):
        # the request passed the checks but would make an event the contract refuses
        status, code = (413, "payload_too_large") if exc.reason == "too_large" else (422, "invalid_request")
        return problem(status, code, "The request would make an event the log refuses", exc.detail, reason=exc.reason)
    if isinstance(exc, KeyDestroyed):  # the session's data key is destroyed: it takes no writes
        return problem_of(ErasedSession(erased_detail(exc.session)))
    if isinstance(exc, SearchTimedOut):
        return problem_of(SearchTimeout(exc.timeout_s))
    if isinstance(exc, KeyUnavailable):  # a data key this process cannot open: a configuration to fix
        log.error("a data key cannot be opened: %s", exc)
        return problem(500, "key_unavailable", "A data key cannot be opened", str(exc)[:300])
    if isinstance(exc, BlobNotFound):
        return problem(503, "unavailable", "Object storage is unavailable", str(exc))
    if isinstance(exc, psycopg.OperationalError):  # a lost connection, a pool timeout
        log.warning("database unavailable: %s", exc)
        # the pool answers DatabaseUnreachable within seconds while it knows the database is down
        return problem(503, "unavailable", "The database is unavailable", type(exc).__name__, retry_after=1)
    if isinstance(exc, nats.errors.Error):  # NATS timeouts, no responders, a closed connection
        log.warning("event log unavailable: %r", exc)
        return problem(503, "unavailable", "The event log is unavailable", type(exc).__name__)
    if lost_connection(exc):  # a write on a socket its server's end closed (nats-server killed): not a bug
        log.warning("connection lost: %r", exc)
        return problem(503, "unavailable", "A backing service is unavailable", type(exc).__name__, retry_after=1)
    return None


def batch_problem(exc: BatchFailed) -> Problem:
    """A batch's failure: its cause's problem (``500 internal_error`` for a bug, logged here: the
    answer still says what was written) with ``failed_index`` and ``written`` added, and a
    detail that names the failing message and says what of the batch is stored."""
    body = problem_of(exc.cause)
    if body is None:
        log.error("a batch failed at message %d", exc.failed_index, exc_info=exc.cause)
        body = internal_error(exc.cause)
    cause = str(body["detail"]).rstrip()
    cause += "" if cause.endswith(".") else "."
    where = f"{cause} It was message {exc.failed_index} of the batch ({exc.message_id!r})"
    # A refusal (4xx) is decided before anything of the message is sent: it was not written. A
    # failure below (5xx: the log unreachable, retries spent) may come after the message was
    # stored with its answer lost: it may be, and sending it again is harmless (appends replay).
    refused = int(body["status"]) < 500
    if not exc.written:
        detail = f"{where}; " + (
            "nothing of the batch was written."
            if refused
            else "no message before it was written, and it may have been: send the batch again (what is stored "
            "replays)."
        )
    else:
        n, last = len(exc.written), exc.written[-1]["id"]
        stored = f"message 0 ({last!r}) was" if n == 1 else f"messages 0-{n - 1} (the last {last!r}) were"
        failing = "it was not, nor the messages after it" if refused else "and it may have been"
        detail = (
            f"{where}; the batch's {stored} stored before it (`written`), {failing}: send it and the messages "
            f"after it again under parent_id {last!r}, or the whole batch again (its stored messages replay)."
        )
    return {**body, "detail": detail, "failed_index": exc.failed_index, "written": exc.written}


def internal_error(exc: BaseException) -> Problem:
    return problem(500, "internal_error", "Internal error", type(exc).__name__)
