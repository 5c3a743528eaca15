"""RFC 9457 problem+json responses: the one place errors become HTTP."""

from __future__ import annotations

import asyncio
import logging
import math
from typing import Any

import nats.errors
import psycopg
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect
from starlette.routing import Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from events.admission import Refused
from events.blobs import BlobNotFound
from events.publisher import PublishFailed
from events.sealing import KeyDestroyed, KeyUnavailable
from events.validation import error_items
from projections.search_bound import SearchTimedOut
from services.api.metrics import OBJECT_STORAGE_FAILED, SOURCES_MISSING
from services.errors import BatchFailed, ChronicleError, InvalidRequest, SourceMissing
from services.requests.problems import Problem, internal_error, invalid_request, problem_of
from services.requests.problems import problem as problem_body

log = logging.getLogger("chronicle.api")

_HTTP_CODES = {401: "unauthorized", 404: "not_found", 405: "method_not_allowed", 413: "payload_too_large"}
HANDLED = (
    BatchFailed,
    ChronicleError,
    PublishFailed,
    Refused,
    KeyDestroyed,
    KeyUnavailable,
    BlobNotFound,
    psycopg.OperationalError,
    nats.errors.Error,
    ConnectionError,  # a socket lost under a write (events.publisher.lost_connection)
    RuntimeError,  # uvloop's for the same; any other is re-raised to the crash guard (500)
    SearchTimedOut,
)
"""The errors answered with a problem of their own (:func:`services.requests.problems.problem_of`)."""


def problem(status: int, code: str, title: str, detail: str, **extra: Any) -> JSONResponse:
    return as_response(problem_body(status, code, title, detail, **extra))


def as_response(body: dict[str, Any]) -> JSONResponse:
    status = int(body["status"])
    headers = None
    if status == 401:
        headers = {"WWW-Authenticate": "Bearer"}
    elif status in (429, 503) and "retry_after" in body:  # whole seconds, rounded up (RFC 9110)
        headers = {"Retry-After": str(max(1, math.ceil(float(body.get("retry_after", 1)))))}
    return JSONResponse(body, status_code=status, media_type="application/problem+json", headers=headers)


def from_error(exc: ChronicleError) -> JSONResponse:
    return problem(exc.status, exc.code, exc.title, exc.detail, **exc.fields())


def http_problem_of(exc: BaseException) -> Problem | None:
    """:func:`problem_of` as an HTTP answer says it: the ``errors`` a check past the edge found
    in the body (a message's shape) have ``loc`` from the body's root; over HTTP they start with
    ``body``, as FastAPI's own validation errors do."""
    found = problem_of(exc)
    if found is not None and found["code"] == "object_storage":  # a batch's too (its cause's code)
        OBJECT_STORAGE_FAILED.inc()
    if found is not None and isinstance(exc, InvalidRequest) and exc.errors is not None:
        found["errors"] = [{**e, "loc": ["body", *e["loc"]]} for e in exc.errors]
    return found


async def _mapped(_: Request, exc: Exception) -> JSONResponse:
    body = http_problem_of(exc)
    if body is None:
        raise exc
    return as_response(body)


async def _source_missing(request: Request, exc: Exception) -> JSONResponse:
    SOURCES_MISSING.inc()  # the log line is the context service's (services/context/blocks.py)
    return await _mapped(request, exc)


def install(app: FastAPI) -> None:
    for kind in HANDLED:
        app.add_exception_handler(kind, _mapped)
    app.add_exception_handler(SourceMissing, _source_missing)

    @app.exception_handler(RequestValidationError)
    async def _validation(_: Request, exc: RequestValidationError) -> JSONResponse:
        errors = error_items(exc.errors())
        if any(e["type"] == "json_invalid" for e in errors):
            return problem(400, "malformed_json", "The request body is not valid JSON", "invalid JSON", errors=errors)
        return as_response(invalid_request(errors))

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        code = _HTTP_CODES.get(exc.status_code, f"http_{exc.status_code}")
        response = problem(exc.status_code, code, str(exc.detail), str(exc.detail))
        response.headers.update(exc.headers or {})
        if exc.status_code == 405 and (allowed := allowed_methods(request)):
            response.headers["Allow"] = allowed  # else the one Starlette gave (a mounted app's route)
        return response


_METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")


def allowed_methods(request: Request) -> str:
    """The ``Allow`` header of a 405 (RFC 9110): each method some route takes on this path (not
    only the first matching route's, which is what Starlette names); empty for a path inside a
    mounted app (the auditor view's static files), whose routes see another root path."""
    routes = request.app.router.routes
    allowed = [
        method
        for method in _METHODS
        if any(route.matches({**request.scope, "method": method})[0] is Match.FULL for route in routes)
    ]
    return ", ".join(allowed)


def stopped_unanswered() -> Problem:
    """The answer of a request the API stopped under (its graceful stop's time ran out, or the
    event log was gone: services/ops/processes.py, ``ApiServer``): it may have been carried out,
    as after any 503; a repeat replays what was stored."""
    return problem_body(
        503,
        "unavailable",
        "The API stopped before this request was answered",
        "the API process stopped while this request was waiting (on the event log, most likely: it was "
        "unreachable); it may have been carried out: send it again (a stored write answers as a replay)",
        retry_after=1,
    )


class _ClientGone(Exception):
    """The connection was closed under an answer being written: nobody is left to answer."""


CLOSED_TRANSPORT = "the handler is closed"
"""What uvloop says of a write on a transport closed before the server learnt the client left."""


class CrashGuard:
    """The outermost handler of unexpected errors: a complete ``500 internal_error`` answer, and
    nothing re-raised to the server, so the keep-alive connection stays usable. (Starlette's
    handler for ``Exception`` re-raises after answering, and uvicorn then closes the connection.)
    A response that had already started (a stream failing mid-way) cannot be turned into a
    problem: the error is re-raised and the server closes the connection, the only honest end. A
    client that hung up before its body arrived (``ClientDisconnect``), or while its answer was
    written (a write on the closed transport), is no error: nothing is answered, and it is logged
    at DEBUG only (each was a 76-line traceback at ERROR). A request the server cancels as it stops
    (its graceful stop's time ran out) is answered :func:`stopped_unanswered` (``503
    unavailable``), not left to uvicorn (a plain-text 500 and an "Exception in ASGI application"
    traceback each)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def tracked(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            try:
                await send(message)
            except RuntimeError as exc:
                if CLOSED_TRANSPORT not in str(exc):
                    raise
                raise _ClientGone from exc

        try:
            await self.app(scope, receive, tracked)
        except asyncio.CancelledError:
            stopping = getattr(scope["app"].state, "stopping", None) if "app" in scope else None
            if started or stopping is None or not stopping.is_set():
                raise
            # cut by the server's stop (its graceful timeout ran out): a 503 to retry, not uvicorn's plain 500
            log.debug("stopped before its answer: %s %s", scope["method"], scope["path"])
            await as_response(stopped_unanswered())(scope, receive, send)
        except ClientDisconnect:  # the client hung up mid-body: no one to answer, nothing went wrong
            log.debug("the client hung up before its request was read: %s %s", scope["method"], scope["path"])
        except _ClientGone:
            log.debug("the client hung up before its answer was written: %s %s", scope["method"], scope["path"])
        except Exception as exc:
            if started:
                raise
            log.exception("unhandled error")
            await as_response(internal_error(exc))(scope, receive, send)
