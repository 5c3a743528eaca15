"""A request's body is timed: it must be whole within ``api_body_timeout_s`` of the request
reaching the app (its headers read), plus ``1 / api_body_min_bytes_per_s`` seconds for each
byte of it that has arrived. A client that sends a request's headers and then its body slowly,
or never, held the request (and what was read of it, and its connection) for good: the HTTP
server times a request's head (services/api/http_head.py), not its body.

Plain ASGI middleware right inside the crash guard, so that every reader of a body (the hot paths,
the routes) reads it through the timed ``receive``. Only the reads of a body are timed, each
``receive()`` within the deadline as it stands then (``asyncio.timeout_at``: a timer per read that
waits, no task); a request without a body passes untouched, and once the body is whole a read
(a wait for the client's disconnect) is not timed. Past the deadline the read raises to the app,
whose answer (if it makes one) is dropped for ``408 request_timeout`` (problem+json,
``Connection: close``): nothing of the request is done, since nothing acts on a body it has not
read whole. An app that had begun its answer already (none of Chronicle's does) gets the error
raised to the server, which closes the connection."""

from __future__ import annotations

import asyncio

from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from services.api.guards import Refusal
from services.api.problems import from_error
from services.errors import RequestTimeout


class _BodyTimedOut(Exception):
    """Raised to the app by ``receive`` once the body is past its deadline."""


def timed_out(allowed_s: float, received: int) -> JSONResponse:
    """``408 request_timeout``; the connection is closed after it (what the client still sends of
    the body is not read)."""
    response = from_error(RequestTimeout(f"{received} bytes of the body arrived within {allowed_s:.3g} s, not its end"))
    response.headers["Connection"] = "close"
    return response


def has_body(headers: list[tuple[bytes, bytes]]) -> bool:
    """Whether the request declares a body (a ``Content-Length`` other than 0, or a
    ``Transfer-Encoding``): without one, the server hands the app an empty body at once."""
    for name, value in headers:
        if name == b"content-length":
            return value.strip() != b"0"
        if name == b"transfer-encoding":
            return True
    return False


class BodyTimeout:
    """Times the reads of a request's body (this module's docstring)."""

    def __init__(self, app: ASGIApp, timeout_s: float, min_bytes_per_s: int) -> None:
        self.app = app
        self.timeout_s = timeout_s
        self.s_per_byte = 1 / min_bytes_per_s if min_bytes_per_s > 0 else 0.0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not has_body(scope["headers"]):
            await self.app(scope, receive, send)
            return
        deadline = asyncio.get_running_loop().time() + self.timeout_s  # and s_per_byte for each byte come
        s_per_byte = self.s_per_byte
        received = 0
        whole = False
        refusal = Refusal()

        async def timed() -> Message:
            nonlocal received, whole
            if whole:
                return await receive()  # the body is read: a wait for the disconnect, not timed
            if refusal.response is not None:
                raise _BodyTimedOut
            try:
                async with asyncio.timeout_at(deadline + received * s_per_byte):
                    message = await receive()
            except TimeoutError:
                refusal.response = timed_out(self.timeout_s + received * s_per_byte, received)
                raise _BodyTimedOut from None
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                whole = not message.get("more_body", False)
            else:
                whole = True  # the client went away: every later read says so at once
            return message

        await refusal.run(self.app, scope, timed, send)
