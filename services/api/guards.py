"""Checks of a request's form, made before anything reads it: a body over the size the API reads
(``413 payload_too_large``), a body sent with a content coding (``415
unsupported_content_encoding``), a path that is not UTF-8 once percent-decoded (``422
invalid_id``) and a query that is not (``422 invalid_request``). Plain ASGI middleware inside
the key check (a bad key is 401 whatever the request)."""

from __future__ import annotations

from collections.abc import Callable
from urllib.parse import unquote_to_bytes

from starlette.responses import JSONResponse, Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from services.api.problems import from_error
from services.errors import InvalidId, InvalidRequest, RequestTooLarge, UnsupportedContentEncoding


class _RefusedMidBody(Exception):
    """Raised to the app by a counted ``receive`` (:class:`CountedReceive`) once its body is
    refused (past the size limit, weighing more than the tenant's bucket may owe): the guard
    answers its refusal in place of whatever the app made of it."""


def too_large(limit: int, detail: str) -> JSONResponse:
    """``413 payload_too_large``; the connection is closed after it (the rest of the body is
    never read, so the connection could not carry another request)."""
    response = from_error(RequestTooLarge(f"{detail}; the limit is {limit} bytes"))
    response.headers["Connection"] = "close"
    return response


def declared_length(headers: list[tuple[bytes, bytes]]) -> int | None:
    for name, value in headers:
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:  # the HTTP server refuses it before the app runs
                return None
    return None


def chunked(headers: list[tuple[bytes, bytes]]) -> bool:
    return any(name == b"transfer-encoding" for name, _ in headers)


class BodyLimit:
    """Refuses a body over ``limit`` bytes: at once when its ``Content-Length`` says so, else
    (chunked) as soon as what arrived passes it, without reading further. The app's own answer
    to a body cut short is replaced by the 413. A request with a ``Content-Length`` within the
    bound, or with no body, passes untouched (the server reads no more than was declared)."""

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = declared_length(scope["headers"])
        if declared is not None and declared > self.limit:
            await too_large(self.limit, f"Content-Length is {declared} bytes")(scope, receive, send)
            return
        if declared is not None or not chunked(scope["headers"]):  # the server reads at most what was declared
            await self.app(scope, receive, send)
            return

        def refuse(received: int) -> Response | None:
            return too_large(self.limit, f"the body passed {self.limit} bytes") if received > self.limit else None

        await Refusal().run_counted(self.app, scope, receive, send, refuse)


class Refusal:
    """A refusal that a guard's ``receive`` makes mid-body, raising to the app: :meth:`run` drops
    the app's own answer to the body it could not read for ``response``, and swallows what the
    app raised. An app that had begun its answer already gets its error raised to the server,
    which closes the connection (a refusal cannot follow an answer begun)."""

    def __init__(self) -> None:
        self.response: Response | None = None
        self._started = False

    async def run(self, app: ASGIApp, scope: Scope, receive: Receive, send: Send) -> None:
        """``app`` with ``receive`` (the guard's, which sets :attr:`response` as it refuses)."""

        async def tracked(message: Message) -> None:
            if self.response is not None and not self._started:
                return  # the app's answer to a body it could not read: the refusal replaces it
            self._started = self._started or message["type"] == "http.response.start"
            await send(message)

        try:
            await app(scope, receive, tracked)
        except Exception:
            if self.response is None or self._started:
                raise
        if self.response is not None and not self._started:
            await self.response(scope, receive, send)

    async def run_counted(
        self, app: ASGIApp, scope: Scope, receive: Receive, send: Send, refuse: Callable[[int], Response | None]
    ) -> None:
        """:meth:`run` with ``receive`` counted: ``refuse``, given the body's bytes received so
        far after each part of it, answers the refusal that ends the read (``None``: read on)."""
        await self.run(app, scope, CountedReceive(receive, self, refuse), send)


class CountedReceive:
    """A ``receive`` that counts the body's bytes as they arrive (:attr:`received`) and, given a
    :class:`Refusal` and its ``refuse``, refuses the body mid-way (raising to the app; every later
    read raises too)."""

    def __init__(
        self,
        receive: Receive,
        refusal: Refusal | None = None,
        refuse: Callable[[int], Response | None] | None = None,
    ) -> None:
        self._receive = receive
        self._refusal = refusal
        self._refuse = refuse
        self.received = 0

    async def __call__(self) -> Message:
        refusal = self._refusal
        if refusal is not None and refusal.response is not None:
            raise _RefusedMidBody
        message = await self._receive()
        if message["type"] == "http.request":
            self.received += len(message.get("body", b""))
            if refusal is not None and self._refuse is not None:
                refusal.response = self._refuse(self.received)
                if refusal.response is not None:
                    raise _RefusedMidBody
        return message


def content_codings(headers: list[tuple[bytes, bytes]]) -> list[str]:
    """The codings a request's ``Content-Encoding`` headers name, in order (``identity`` left out)."""
    named = (c.strip().lower() for name, value in headers if name == b"content-encoding" for c in value.split(b","))
    return [c.decode("latin-1") for c in named if c and c != b"identity"]


class ContentEncoding:
    """Refuses a request whose body is sent with a content coding (``Content-Encoding: gzip``, any
    but ``identity``), before anything reads it: ``415 unsupported_content_encoding`` naming the
    coding, with ``Accept-Encoding: identity`` (RFC 9110 §12.5.3). The API takes bodies as sent;
    a coded one was read as text and answered ``400 malformed_json``, "not UTF-8"."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and (codings := content_codings(scope["headers"])):
            named = ", ".join(codings)[:100]
            refusal = UnsupportedContentEncoding(
                f"the body is sent with Content-Encoding {named!r}; send it as it is, without a content coding"
            )
            response = from_error(refusal)
            response.headers["Accept-Encoding"] = "identity"
            await response(scope, receive, send)
            return
        await self.app(scope, receive, send)


def _utf8(raw: bytes) -> bool:
    if raw.isascii() and b"%" not in raw:  # the usual path and query: nothing to decode
        return True
    try:
        unquote_to_bytes(raw).decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


class Utf8Path:
    """Refuses a path or query that is not UTF-8 once percent-decoded (``%FF``, an overlong or
    surrogate encoding): the server (or Starlette, for the query) would decode each bad byte to
    U+FFFD, so different paths and parameters, and the ids in them, would name one thing (a
    ``DELETE …/messages?ids=%FF`` would delete the message named U+FFFD)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            raw = scope.get("raw_path")
            if raw is not None and not _utf8(raw.split(b"?", 1)[0]):  # (some servers keep the query there)
                await from_error(InvalidId("the path is not valid UTF-8 once percent-decoded"))(scope, receive, send)
                return
            if not _utf8(scope.get("query_string", b"")):
                refusal = InvalidRequest("the query string is not valid UTF-8 once percent-decoded")
                await from_error(refusal)(scope, receive, send)
                return
        await self.app(scope, receive, send)


class HeadAsGet:
    """``HEAD`` answered as ``GET`` without its body (load balancers and probes send ``HEAD
    /healthz``, ``/readyz``, ``/audit/``): FastAPI's routes take only the methods they declare, so
    every HEAD was 405. The status and the headers, ``Content-Length`` included, are the GET's;
    the first part of the body ends the answer (an answer that stays open included)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "HEAD":
            await self.app(scope, receive, send)
            return
        ended = False

        async def without_body(message: Message) -> None:
            nonlocal ended
            if ended:
                return
            if message["type"] == "http.response.body":
                ended = True
                message = {"type": "http.response.body", "body": b"", "more_body": False}
            await send(message)

        await self.app({**scope, "method": "GET"}, receive, without_body)
