"""RFC 9457 problem+json responses: the one place errors become HTTP."""

from __future__ import annotations

import logging
from typing import Any

import nats.errors
import psycopg
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from events.admission import Refused
from events.blobs import BlobNotFound
from events.publisher import PublishFailed
from events.validation import validation_detail
from services.errors import ChronicleError

log = logging.getLogger("chronicle.api")

PROBLEM_BASE = "https://chronicle.dev/problems/"
_HTTP_CODES = {401: "unauthorized", 404: "not_found", 405: "method_not_allowed", 413: "payload_too_large"}


def problem(status: int, code: str, title: str, detail: str, **extra: Any) -> JSONResponse:
    body = {"type": PROBLEM_BASE + code, "title": title, "status": status, "detail": detail, "code": code, **extra}
    headers = {"WWW-Authenticate": "Bearer"} if status == 401 else None
    return JSONResponse(body, status_code=status, media_type="application/problem+json", headers=headers)


def from_error(exc: ChronicleError) -> JSONResponse:
    return problem(exc.status, exc.code, exc.title, exc.detail)


def install(app: FastAPI) -> None:
    @app.exception_handler(ChronicleError)
    async def _chronicle(_: Request, exc: ChronicleError) -> JSONResponse:
        return from_error(exc)

    @app.exception_handler(RequestValidationError)
    async def _validation(_: Request, exc: RequestValidationError) -> JSONResponse:
        errors = [
            {"loc": [str(p) for p in e.get("loc", ())], "msg": str(e.get("msg", "")), "type": str(e.get("type", ""))}
            for e in exc.errors()
        ]
        if any(e["type"] == "json_invalid" for e in errors):
            return problem(400, "malformed_json", "The request body is not valid JSON", "invalid JSON", errors=errors)
        detail = validation_detail(errors)
        return problem(422, "invalid_request", "The request is not valid", detail, errors=errors)

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        code = _HTTP_CODES.get(exc.status_code, f"http_{exc.status_code}")
        return problem(exc.status_code, code, str(exc.detail), str(exc.detail))

    @app.exception_handler(PublishFailed)
    async def _publish(_: Request, exc: PublishFailed) -> JSONResponse:
        return problem(503, "unavailable", "The event log is unavailable", str(exc))

    @app.exception_handler(Refused)
    async def _refused(_: Request, exc: Refused) -> JSONResponse:
        # the request passed the API's checks but would make an event the contract refuses
        status, code = (413, "payload_too_large") if exc.reason == "too_large" else (422, "invalid_request")
        return problem(status, code, "The request would make an event the log refuses", exc.detail, reason=exc.reason)

    @app.exception_handler(BlobNotFound)
    async def _blob(_: Request, exc: BlobNotFound) -> JSONResponse:
        return problem(503, "unavailable", "Object storage is unavailable", str(exc))

    @app.exception_handler(psycopg.OperationalError)  # a lost connection, a pool timeout
    async def _database(_: Request, exc: psycopg.OperationalError) -> JSONResponse:
        log.warning("database unavailable: %s", exc)
        return problem(503, "unavailable", "The database is unavailable", type(exc).__name__)

    @app.exception_handler(nats.errors.Error)  # NATS timeouts, no responders, a closed connection
    async def _nats(_: Request, exc: nats.errors.Error) -> JSONResponse:
        log.warning("event log unavailable: %r", exc)
        return problem(503, "unavailable", "The event log is unavailable", type(exc).__name__)


class CrashGuard:
    """The outermost handler of unexpected errors: a complete ``500 internal_error`` answer, and
    nothing re-raised to the server, so the keep-alive connection stays usable. (Starlette's
    handler for ``Exception`` re-raises after answering, and uvicorn then closes the connection.)
    A response that had already started (a stream failing mid-way) cannot be turned into a
    problem: the error is re-raised and the server closes the connection, the only honest end."""

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
            await send(message)

        try:
            await self.app(scope, receive, tracked)
        except Exception as exc:
            if started:
                raise
            log.exception("unhandled error")
            await problem(500, "internal_error", "Internal error", type(exc).__name__)(scope, receive, send)
