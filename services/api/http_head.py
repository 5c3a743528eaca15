"""Bounds on what a client may make the API's HTTP server hold before a request reaches the app:
the request's head (request line and headers) is at most ``api_max_header_bytes``, and it must be
complete within ``api_header_timeout_s`` of its first byte; and, once the app has answered a
request without reading its body, the rest of the body must arrive within ``api_body_timeout_s``.

uvicorn's httptools protocol has neither: httptools buffers a header of any size (a 300 MiB
header was held whole and only then answered 401), and once a request's first byte has arrived
nothing times out (connections that send a header line every few seconds are held forever, until
the process runs out of file descriptors). :func:`head_bounded_protocol` subclasses that protocol,
counting what arrives and arming a timer in its parser callbacks; it is passed to
``uvicorn.Config(http=...)`` (services/ops/processes.py).

What it does, and why this way:

- **Size.** httptools joins a header's pieces in its own buffer and hands it over only once it is
  complete, so the bytes are counted as they are read, not in ``on_header``. A head still
  incomplete after a read has taken at least that read's bytes (and, when the read also carried
  the end of the previous request, at least those after its first); once that lower bound passes
  the limit the request is refused. A head that completes is measured exactly when what was read
  of it could be over the limit (a large body in the same read); otherwise not at all, so the
  usual request pays nothing for it. What a client makes the server hold is thus at most the limit
  and two reads (256 KB each).
- **Refusal.** ``431 Request Header Fields Too Large`` (``header_too_large``, problem+json,
  ``Connection: close``); nothing reaches the app. The server stops sending and drops what the
  client still sends for a moment before it closes (so that the client reads the answer instead of
  a reset), then closes.
- **Time.** From a connection's opening, and from the first byte of each later request (or of
  anything a client sends between requests that is not one), until the request's headers are
  complete; past it the connection is closed. A timer is armed only when a head spans more than
  one read (or at a connection's opening), never for a request whose head arrives in one read.
  Between requests uvicorn's keep-alive timeout (5 s) applies as before, and a request's body and
  the app's answer are not timed here (the body is, in the app: services/api/body_timeout.py).
- **Upgrades.** A request asking to upgrade (``Upgrade: websocket``, ``h2c``) is served as plain
  HTTP and logged by nobody (uvicorn warned twice for each, advising a WebSocket library, so any
  client without a key could fill the log); it is never handed to a WebSocket protocol, which
  would be served without these bounds.
- **A body answered unread.** An app that answers before it reads a request's body (a wrong key's
  ``401``) never reads the rest, so the app's body timeout does not run, and uvicorn's keep-alive
  timer is stopped by each read of it: a client trickling such a body held its connection, with
  no key, for as long as it sent. From the answer's end until the body's, a timer closes the
  connection after ``api_body_timeout_s``; a body that ends in time leaves the connection open.

If uvicorn's protocol no longer has the shape this is written against, :func:`head_bounded_protocol`
returns None and the caller serves with the plain protocol, warning (tests/e2e/test_http_head_bounds.py
fails then)."""

from __future__ import annotations

import asyncio
import inspect
import json
import logging
from typing import Any

from services.requests.problems import problem

LINGER_S = 1.0
"""How long a refused connection drops what its client still sends before it is closed."""

_OVERRIDDEN = (
    "connection_made",
    "connection_lost",
    "data_received",
    "on_message_begin",
    "on_headers_complete",
    "on_message_complete",
    "on_response_complete",
    "send_400_response",
    "_unsupported_upgrade_warning",
)
"""The methods of uvicorn's ``HttpToolsProtocol`` the subclass extends, with uvicorn's arguments."""
_SIGNATURES = {
    "connection_made": ["self", "transport"],
    "connection_lost": ["self", "exc"],
    "data_received": ["self", "data"],
    "on_message_begin": ["self"],
    "on_headers_complete": ["self"],
    "on_message_complete": ["self"],
    "on_response_complete": ["self"],
    "send_400_response": ["self", "msg"],
    "_unsupported_upgrade_warning": ["self"],
}


_UNHEARD = logging.Logger("chronicle.api.http_head.unheard", level=logging.CRITICAL + 1)
"""A logger that logs nothing: a refused connection's (what uvicorn would log of it is not so)."""


class HeadTooLarge(Exception):
    """Raised in a parser callback to stop httptools: the head is over the limit."""


def too_large_answer(limit: int) -> bytes:
    """The whole ``431`` answer, as bytes on the wire."""
    body = json.dumps(
        problem(
            431,
            "header_too_large",
            "Request Header Fields Too Large",
            f"the request line and headers are over {limit} bytes",
        )
    ).encode()
    head = (
        "HTTP/1.1 431 Request Header Fields Too Large\r\n"
        "content-type: application/problem+json\r\n"
        f"content-length: {len(body)}\r\n"
        "connection: close\r\n\r\n"
    )
    return head.encode("ascii") + body


def shape_mismatch(cls: type[Any]) -> str | None:
    """What of ``cls`` (uvicorn's ``HttpToolsProtocol``) is not as the subclass expects; None
    when all is."""
    for name in _OVERRIDDEN:
        method = getattr(cls, name, None)
        if not callable(method):
            return f"it has no {name}()"
        if list(inspect.signature(method).parameters) != _SIGNATURES[name]:
            return f"its {name}() takes other arguments"
    return None


def head_bounded_protocol(
    max_head_bytes: int, head_timeout_s: float, unread_body_timeout_s: float
) -> type[asyncio.Protocol] | None:
    """uvicorn's httptools protocol with the bounds of this module; None when uvicorn's protocol
    is not there or not the shape this was written against (the caller serves without them)."""
    try:
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
    except ImportError:
        return None
    if shape_mismatch(HttpToolsProtocol) is not None:
        return None
    answer = too_large_answer(max_head_bytes)
    base = HttpToolsProtocol  # its methods called as functions: cheaper than super() on every request

    class HeadBoundedProtocol(HttpToolsProtocol):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            base.__init__(self, *args, **kwargs)
            self._in_message = False  # from a request's first byte to its end (body included)
            self._in_head = False  # from its first byte until its headers are complete
            self._read = 0  # bytes of the read being parsed
            self._read_fresh = True  # that read began between two requests
            self._head_read = 0  # bytes of the reads that carried the current head, whole
            self._head_before = 0  # of those, at most this many came before the head began
            self._timer: asyncio.TimerHandle | None = None
            self._refused = False
            # HTTP/1.1 only: a request asking to upgrade is served as HTTP (RFC 9110 lets a server
            # ignore Upgrade), never handed to a WebSocket protocol a dependency may have installed,
            # which would be served without the bounds of this module
            self.ws_protocol_class = None

        def _unsupported_upgrade_warning(self) -> None:
            pass  # uvicorn warned twice per such request (advising a WebSocket library): any client could fill the log

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            base.connection_made(self, transport)
            self._timer = self.loop.call_later(head_timeout_s, self._timed_out)

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            base.connection_lost(self, exc)

        def data_received(self, data: bytes) -> None:
            if self._refused:
                return  # dropped: the client is told, and the connection closes shortly
            self._read = size = len(data)
            self._read_fresh = not self._in_message
            if self._in_head:
                self._head_read += size
            base.data_received(self, data)
            if self._in_head:
                if self._head_read - self._head_before > max_head_bytes:
                    self._refuse()
                    return
                if self._timer is None and self._answered():  # a pipelined head waits for the answer before it
                    self._timer = self.loop.call_later(head_timeout_s, self._timed_out)
            elif not self._in_message and self._timer is None and not self._refused and self._answered():
                # between requests, having read something that is no request (yet)
                self._timer = self.loop.call_later(head_timeout_s, self._timed_out)

        def on_message_begin(self) -> None:
            self._in_message = self._in_head = True
            self._head_read = self._read
            self._head_before = 0 if self._read_fresh else self._read
            self._read_fresh = False
            base.on_message_begin(self)

        def on_headers_complete(self) -> None:
            self._in_head = False
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
            if self._head_read > max_head_bytes and self._head_size() > max_head_bytes:
                self._refused = True  # send_400_response answers 431 instead
                self.logger = _UNHEARD  # uvicorn logs the parser's stop as an invalid request: it was none
                raise HeadTooLarge
            base.on_headers_complete(self)

        def on_message_complete(self) -> None:
            self._in_message = False
            if self._timer is not None:  # a body answered unread has ended in time
                self._timer.cancel()
                self._timer = None
            base.on_message_complete(self)

        def on_response_complete(self) -> None:
            base.on_response_complete(self)
            if self._in_head and self._timer is None and self._answered():
                # a head begun while the request before it was answered: timed from now
                self._timer = self.loop.call_later(head_timeout_s, self._timed_out)
            elif self._in_message and not self._in_head and self._timer is None:
                cycle = self.cycle  # the latest request's (not a pipelined one still to be answered)
                if cycle is not None and cycle.response_complete and not self.transport.is_closing():
                    self._timer = self.loop.call_later(unread_body_timeout_s, self._timed_out)  # body unread

        def send_400_response(self, msg: str) -> None:
            if self._refused:
                self._refuse()
            else:
                base.send_400_response(self, msg)

        def _answered(self) -> bool:
            """No request of this connection is being answered (its latest one is, or none came),
            and the connection is open: what a timer is armed on (a request answered slowly,
            a compaction's summary say, never has its answer cut by the next one's head)."""
            cycle = self.cycle
            return (cycle is None or cycle.response_complete) and not self.transport.is_closing()

        def _head_size(self) -> int:
            """The head's bytes as sent in the usual form (``name: value`` lines)."""
            size = len(self.parser.get_method()) + len(b" ") + len(self.url) + len(b" HTTP/1.1\r\n") + len(b"\r\n")
            for name, value in self.headers:
                size += len(name) + len(value) + 4
            return size

        def _refuse(self) -> None:
            self._refused = True
            self._in_head = False
            self._disarm()
            transport = self.transport
            if transport.is_closing():
                return
            if self.cycle is not None and not self.cycle.response_complete:
                transport.close()  # an answer is being written (pipelining): a 431 would cut into it
                return
            transport.write(answer)
            if transport.can_write_eof():
                transport.write_eof()  # the answer, then the end: the client reads it and closes
                self._timer = self.loop.call_later(LINGER_S, transport.close)
            else:
                transport.close()

        def _timed_out(self) -> None:
            self._timer = None
            if not self.transport.is_closing():
                self.transport.close()

        def _disarm(self) -> None:
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None

    return HeadBoundedProtocol
