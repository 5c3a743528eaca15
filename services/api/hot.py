"""The two requests an agent makes most, served without FastAPI's routing and dependency
injection: appending one message (``POST /v1/sessions/{sid}/messages``) and reading a history
(``GET /v1/sessions/{sid}/history`` with at most ``leaf_id`` and ``min_seq``). FastAPI's layers
were about a fifth of the API's CPU per append (issue #13's profile).

Only a request this path accepts whole is served here, by the same functions the routes call
(:func:`services.api.messages.append_one`, :func:`services.api.history.read_history`), with
errors answered by the same mapping (:func:`services.api.problems.http_problem_of`). Anything
else, another route, a query parameter or header it does not take (an append takes no query), a
body that does not parse or validate, goes to the app unchanged (the body it read is handed on),
which answers it as it always did. It sits inside the key check (the tenant is known) and the crash guard."""

from __future__ import annotations

import re
from collections.abc import Awaitable
from urllib.parse import parse_qsl

from starlette.responses import JSONResponse, Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from services.api.bodies import AppendBody
from services.api.deps import IDEMPOTENCY_KEY_MAX, IDEMPOTENCY_KEY_PATTERN, MAX_SEQ
from services.api.history import read_history
from services.api.messages import append_one
from services.api.metrics import HOT_PATHS
from services.api.problems import as_response, http_problem_of
from services.bootstrap import Container
from services.offload import off_loop, weigh_body
from services.requests.strict_json import strict_loads

_APPEND = re.compile(r"/v1/sessions/([^/]+)/messages")
_HISTORY = re.compile(r"/v1/sessions/([^/]+)/history")
_KEY = re.compile(IDEMPOTENCY_KEY_PATTERN)
_SEQ = re.compile(r"[0-9]{1,19}")
_HISTORY_PARAMS = frozenset({"leaf_id", "min_seq"})
_SERVED = {route: HOT_PATHS.labels(route, "served") for route in ("append", "history")}
_HANDED_ON = {route: HOT_PATHS.labels(route, "handed_on") for route in ("append", "history")}


class HotPaths:
    """ASGI middleware: the hot requests answered here, every other request passed on."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        tenant = scope.get("state", {}).get("tenant") if scope["type"] == "http" else None
        if tenant is not None:
            method, path = scope["method"], scope["path"]
            if method == "POST" and (m := _APPEND.fullmatch(path)):
                await self._append(scope, receive, send, tenant, m.group(1))
                return
            if method == "GET" and (m := _HISTORY.fullmatch(path)):
                params = _history_params(scope["query_string"])
                if params is not None:
                    _SERVED["history"].inc()
                    leaf, seq = params
                    read = read_history(_container(scope), tenant, m.group(1), leaf_id=leaf, min_seq=seq)
                    await _answer(scope, receive, send, read)
                    return
                _HANDED_ON["history"].inc()
        await self.app(scope, receive, send)

    async def _append(self, scope: Scope, receive: Receive, send: Send, tenant: str, sid: str) -> None:
        body, more = await _read_body(receive)
        plain, key = _append_headers(scope["headers"])
        # a query: the route takes none, and refuses one (services/api/strict_json.py)
        parsed = None
        if plain and not more and not scope["query_string"]:
            weigh_body(len(body))  # a large one is parsed and checked off the loop (services/offload.py)
            parsed = await off_loop(_append_body, body)
        if parsed is None:
            _HANDED_ON["append"].inc()
            await self.app(scope, _replay(body, more, receive), send)
            return
        _SERVED["append"].inc()
        await _answer(scope, receive, send, _appended(_container(scope), tenant, sid, parsed, key))


async def _appended(c: Container, tenant: str, sid: str, body: AppendBody, key: str | None) -> Response:
    status, out = await append_one(c, tenant, sid, body, key)
    return JSONResponse(out, status_code=status)


def _container(scope: Scope) -> Container:
    c: Container = scope["app"].state.c
    return c


async def _answer(scope: Scope, receive: Receive, send: Send, work: Awaitable[Response]) -> None:
    """Run the request's work and send its answer, or the problem its error maps to; an error
    with no problem of its own is raised to the crash guard (500), as from a route."""
    try:
        response = await work
    except Exception as exc:
        problem = http_problem_of(exc)
        if problem is None:
            raise
        response = as_response(problem)
    await response(scope, receive, send)


async def _read_body(receive: Receive) -> tuple[bytes, bool]:
    """The whole body; ``more`` when the client went away before sending it all (the app is
    then handed what came, and its own reading meets the disconnect)."""
    chunks: list[bytes] = []
    while True:
        message = await receive()
        if message["type"] != "http.request":
            return b"".join(chunks), True
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            return b"".join(chunks), False


def _replay(body: bytes, more: bool, receive: Receive) -> Receive:
    """A ``receive`` that gives the app the body already read, then the client's own."""
    sent = False

    async def replayed() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": more}
        return await receive()

    return replayed


def _append_headers(headers: list[tuple[bytes, bytes]]) -> tuple[bool, str | None]:
    """Whether the headers are plain (a body declared once as JSON, at most one valid ``Idempotency-Key``), and
    the key (None without one); not plain: the app looks at them itself."""
    key: str | None = None
    json_body: bool | None = None
    for name, value in headers:
        if name == b"content-type":
            if json_body is not None:  # declared twice: the app refuses it (strict_json.py)
                return False, None
            json_body = value.split(b";", 1)[0].strip().lower() == b"application/json"
        elif name == b"idempotency-key":
            if key is not None:  # sent twice: the app refuses it (strict_json.py)
                return False, None
            key = value.decode("latin-1")
            if len(key) > IDEMPOTENCY_KEY_MAX or not _KEY.fullmatch(key):
                return False, None
    return bool(json_body), key


def _append_body(body: bytes) -> AppendBody | None:
    """The body as the route takes it, or None when the app must answer it."""
    try:
        return AppendBody.model_validate(strict_loads(body))
    except Exception:  # not JSON, refused by the strict parse, not valid: the app's answer
        return None


def _history_params(query: bytes) -> tuple[str | None, int | None] | None:
    """``leaf_id`` and ``min_seq`` when the query holds no other parameter and each at most
    once with a plain value; None when the app must read the query itself."""
    if not query:
        return None, None
    pairs = dict(parse_qsl(query.decode("latin-1"), keep_blank_values=True))
    if len(pairs) != query.count(b"&") + 1 or not pairs.keys() <= _HISTORY_PARAMS or "" in pairs.values():
        return None
    seq = pairs.get("min_seq")
    if seq is not None and (not _SEQ.fullmatch(seq) or int(seq) > MAX_SEQ):
        return None
    return pairs.get("leaf_id"), int(seq) if seq is not None else None
