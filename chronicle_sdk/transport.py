"""The SDK's HTTP transport: HTTP/1.1 over pooled keep-alive asyncio connections.

A request is written as bytes and its answer read back (``Content-Length``, chunked, or up to
the end of the connection); nothing more. On this project's machines httpx's asynchronous client
spends 0.7-3 ms of client CPU per request, as much as the API's own work for an append; this
transport spends about 0.2 ms. TLS is ``ssl``'s (``https://`` base URLs).

Failures below HTTP raise :class:`TransportError`; ``unsent`` says the request certainly never
reached the server (no connection, no free connection slot), which makes any request safe to
retry. A pooled connection whose close has already arrived is dropped before it is used; one
that turns out closed only when the request is written is retried once on a fresh connection,
as other clients do, when the request may be repeated (``GET``, ``HEAD``, ``PUT``, ``DELETE``,
``OPTIONS``, or any request carrying an ``Idempotency-Key``).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
from collections.abc import AsyncGenerator, AsyncIterator, Mapping
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol
from urllib.parse import urlsplit

if TYPE_CHECKING:
    import httpx

_REPEATABLE = frozenset({"GET", "HEAD", "PUT", "DELETE", "OPTIONS"})
_MAX_HEAD = 64 * 1024  # bytes of status line and headers


@dataclass(frozen=True, slots=True)
class Reply:
    """An HTTP answer: status, headers (lower-case names) and the whole body."""

    status: int
    headers: Mapping[str, str]
    content: bytes


@dataclass(frozen=True, slots=True)
class Opened:
    """An answer being read as it comes: status, headers, and its body as lines (``lines``, when
    ``status`` is 200) or whole (``content``, an error answer)."""

    status: int
    headers: Mapping[str, str]
    content: bytes
    lines: AsyncIterator[bytes]


class TransportError(Exception):
    """The request failed below HTTP (connection, timeout, malformed answer)."""

    def __init__(self, message: str, *, unsent: bool) -> None:
        super().__init__(message)
        self.unsent = unsent


class Transport(Protocol):
    """What the client needs of HTTP: send one request, read one answer as it comes, close."""

    async def send(self, method: str, target: str, headers: Mapping[str, str], body: bytes | None) -> Reply: ...

    def stream(self, target: str, headers: Mapping[str, str], idle_s: float) -> AbstractAsyncContextManager[Opened]:
        """A GET whose answer's lines are read as they come (an answer that stays open), on a
        connection of its own; :class:`TransportError` when nothing arrives for ``idle_s``."""
        ...

    async def aclose(self) -> None: ...


async def ndjson_lines(chunks: AsyncIterator[bytes]) -> AsyncGenerator[bytes, None]:
    """The lines (without their ends) of a body arriving as ``chunks``, split on ``\\n`` only (a
    ``\\r`` before it dropped): never where ``str.splitlines()`` splits too (U+2028, U+2029, U+0085,
    form feed, …), which a JSON string may hold unescaped, so one NDJSON line stays one."""
    pending = b""
    async for data in chunks:
        *complete, pending = (pending + data).split(b"\n")
        for line in complete:
            yield line.rstrip(b"\r")
    if pending:
        yield pending


class _Stale(Exception):
    """A pooled connection ended before any byte of the answer arrived."""


class _Connection:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._reader = reader
        self._writer = writer
        self._loop = asyncio.get_running_loop()

    async def exchange(self, request: bytes, method: str) -> tuple[Reply, bool]:
        """(the answer, whether the connection may be reused)."""
        status, headers, keep = await self.head(request)
        if method == "HEAD" or status in (204, 304) or 100 <= status < 200:
            content = b""
        elif headers.get("transfer-encoding", "").lower() == "chunked":
            content = await self._chunked()
        elif "content-length" in headers:
            content = await self._reader.readexactly(int(headers["content-length"]))
        else:
            content, keep = await self._reader.read(), False
        return Reply(status, headers, content), keep

    async def lines(self, headers: Mapping[str, str], idle_s: float) -> AsyncIterator[bytes]:
        """The body's lines (without their ends) as they arrive; :class:`TimeoutError` when
        nothing arrives for ``idle_s``."""
        chunked = headers.get("transfer-encoding", "").lower() == "chunked"
        if not chunked and "content-length" in headers:  # a whole answer (an error's, say)
            async with asyncio.timeout(idle_s):
                body = await self._reader.readexactly(int(headers["content-length"]))
            for line in body.split(b"\n"):
                yield line.rstrip(b"\r")
            return
        chunks = self._chunks(chunked, idle_s)
        async with contextlib.aclosing(chunks), contextlib.aclosing(ndjson_lines(chunks)) as lines:
            async for line in lines:
                yield line

    async def _chunks(self, chunked: bool, idle_s: float) -> AsyncGenerator[bytes, None]:
        while True:
            async with asyncio.timeout(idle_s):
                if chunked:
                    size = int((await self._reader.readuntil(b"\r\n")).split(b";", 1)[0], 16)
                    data = (await self._reader.readexactly(size + 2))[:-2] if size else b""
                else:
                    data = await self._reader.read(65536)
            if not data:
                return
            yield data

    async def head(self, request: bytes) -> tuple[int, dict[str, str], bool]:
        """Send ``request``; (the answer's status, its headers, whether the connection may be reused)."""
        self._writer.write(request)
        try:
            head = await self._reader.readuntil(b"\r\n\r\n")
        except asyncio.IncompleteReadError as exc:
            if not exc.partial:
                raise _Stale from exc
            raise
        except asyncio.LimitOverrunError as exc:
            raise ValueError("the answer's headers are too long") from exc
        lines = head[:-4].split(b"\r\n")
        version, _, rest = lines[0].partition(b" ")
        status = int(rest[:3])
        headers: dict[str, str] = {}
        for line in lines[1:]:
            name, _, value = line.partition(b":")
            headers[name.strip().lower().decode("latin-1")] = value.strip().decode("latin-1")
        keep = headers.get("connection", "").lower() != "close" and version == b"HTTP/1.1"
        return status, headers, keep

    async def _chunked(self) -> bytes:
        parts: list[bytes] = []
        while size := int((await self._reader.readuntil(b"\r\n")).split(b";", 1)[0], 16):
            parts.append((await self._reader.readexactly(size + 2))[:-2])
        while await self._reader.readuntil(b"\r\n") != b"\r\n":  # trailers
            pass
        return b"".join(parts)

    def closed_by_peer(self) -> bool:
        """The server ended the connection while it was idle (its FIN has arrived)."""
        return self._reader.at_eof() or self._writer.is_closing()

    def close(self) -> None:
        if self._loop.is_closed():  # its loop is gone (an earlier asyncio.run): end the TCP connection
            sock = self._writer.get_extra_info("socket")
            with contextlib.suppress(OSError, AttributeError):
                sock.shutdown(socket.SHUT_RDWR)  # the socket itself is closed as its objects go
            return
        self._writer.close()


class Http11Transport:
    """HTTP/1.1 to one origin over at most ``max_connections`` pooled keep-alive connections."""

    def __init__(
        self,
        base_url: str,
        *,
        timeout_s: float,
        max_connections: int = 100,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        url = urlsplit(base_url)
        if url.scheme not in ("http", "https") or not url.hostname:
            raise ValueError(f"base_url must be an http:// or https:// URL, not {base_url!r}")
        self._host = url.hostname
        self._port = url.port or (443 if url.scheme == "https" else 80)
        self._ssl = (ssl_context or ssl.create_default_context()) if url.scheme == "https" else None
        self._prefix = url.path.rstrip("/")
        default_port = self._port == (443 if url.scheme == "https" else 80)
        host = f"[{self._host}]" if ":" in self._host else self._host
        self._host_header = host if default_port else f"{host}:{self._port}"
        self._timeout = timeout_s
        self._max_connections = max(1, max_connections)
        self._slots = asyncio.Semaphore(self._max_connections)
        self._idle: list[_Connection] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._closed = False

    def _bind(self) -> None:
        """Serve the running event loop. Connections belong to the loop that opened them: used
        from another (a later ``asyncio.run``, once the first one closed), the pool of the old
        one is closed, never reused."""
        loop = asyncio.get_running_loop()
        if loop is not self._loop:
            self._loop = loop
            stale, self._idle = self._idle, []
            for conn in stale:
                conn.close()
            self._slots = asyncio.Semaphore(self._max_connections)

    async def send(self, method: str, target: str, headers: Mapping[str, str], body: bytes | None) -> Reply:
        if self._closed:
            raise TransportError("the client is closed", unsent=True)
        self._bind()
        head = [f"{method} {self._prefix}{target} HTTP/1.1", f"Host: {self._host_header}"]
        head += [f"{k}: {v}" for k, v in headers.items()]
        if body is not None or method in ("POST", "PUT", "PATCH"):
            head.append(f"Content-Length: {len(body or b'')}")
        request = ("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + (body or b"")
        repeatable = method in _REPEATABLE or any(k.lower() == "idempotency-key" for k in headers)
        sent = False
        try:
            async with asyncio.timeout(self._timeout):
                async with self._slots:
                    while True:
                        while self._idle and self._idle[-1].closed_by_peer():
                            self._idle.pop().close()  # closed while idle: never written to
                        reused = bool(self._idle)
                        conn = self._idle.pop() if reused else await self._open()
                        sent = True
                        try:
                            reply, keep = await conn.exchange(request, method)
                        except _Stale:
                            conn.close()
                            if reused and repeatable:
                                continue  # the server had closed it while it was idle
                            raise TransportError("the server closed the connection", unsent=False) from None
                        except BaseException:
                            conn.close()
                            raise
                        if keep and not self._closed:
                            self._idle.append(conn)
                        else:
                            conn.close()
                        return reply
        except TimeoutError as exc:
            raise TransportError(f"no answer within {self._timeout} s", unsent=not sent) from exc
        except (OSError, EOFError, ValueError, IndexError) as exc:  # EOFError: IncompleteReadError
            raise TransportError(f"{type(exc).__name__}: {exc}", unsent=not sent) from exc

    @contextlib.asynccontextmanager
    async def stream(self, target: str, headers: Mapping[str, str], idle_s: float) -> AsyncIterator[Opened]:
        if self._closed:
            raise TransportError("the client is closed", unsent=True)
        self._bind()
        head = [f"GET {self._prefix}{target} HTTP/1.1", f"Host: {self._host_header}"]
        request = ("\r\n".join(head + [f"{k}: {v}" for k, v in headers.items()]) + "\r\n\r\n").encode("latin-1")
        conn: _Connection | None = None
        try:
            async with asyncio.timeout(self._timeout):
                conn = await self._open()
                status, found, _ = await conn.head(request)
                opened = Opened(status, found, b"", conn.lines(found, idle_s))
                if status != 200:  # an error answer: read whole
                    content = b"".join([line + b"\n" async for line in opened.lines])
                    opened = Opened(status, found, content, opened.lines)
        except TimeoutError as exc:
            if conn is not None:
                conn.close()
            raise TransportError(f"no answer within {self._timeout} s", unsent=conn is None) from exc
        except (OSError, EOFError, ValueError, IndexError, _Stale) as exc:
            if conn is not None:
                conn.close()
            raise TransportError(f"{type(exc).__name__}: {exc}", unsent=conn is None) from exc
        try:
            yield opened
        except (TimeoutError, OSError, EOFError, ValueError, IndexError) as exc:
            raise TransportError(f"the answer stopped: {type(exc).__name__}: {exc}", unsent=False) from exc
        finally:
            conn.close()

    async def _open(self) -> _Connection:
        try:
            reader, writer = await asyncio.open_connection(self._host, self._port, ssl=self._ssl, limit=_MAX_HEAD * 4)
        except OSError as exc:
            raise TransportError(f"cannot connect to {self._host}:{self._port}: {exc}", unsent=True) from exc
        return _Connection(reader, writer)

    async def aclose(self) -> None:
        self._closed = True
        while self._idle:
            self._idle.pop().close()


class HttpxTransport:
    """An httpx transport (``httpx.MockTransport``, ``httpx.ASGITransport``, …) behind :class:`Transport`."""

    def __init__(self, base_url: str, transport: httpx.AsyncBaseTransport, *, timeout_s: float) -> None:
        import httpx

        self._httpx = httpx
        self._client = httpx.AsyncClient(base_url=base_url, transport=transport, timeout=timeout_s)

    async def send(self, method: str, target: str, headers: Mapping[str, str], body: bytes | None) -> Reply:
        httpx = self._httpx
        try:
            resp = await self._client.request(method, target, content=body, headers=dict(headers))
        except httpx.TransportError as exc:
            unsent = isinstance(exc, httpx.ConnectError | httpx.ConnectTimeout | httpx.PoolTimeout)
            raise TransportError(f"{type(exc).__name__}: {exc}", unsent=unsent) from exc
        return Reply(resp.status_code, {k.lower(): v for k, v in resp.headers.items()}, resp.content)

    @contextlib.asynccontextmanager
    async def stream(self, target: str, headers: Mapping[str, str], idle_s: float) -> AsyncIterator[Opened]:
        httpx = self._httpx
        timeout = httpx.Timeout(self._client.timeout.connect, read=idle_s)
        try:
            async with self._client.stream("GET", target, headers=dict(headers), timeout=timeout) as resp:
                found = {k.lower(): v for k, v in resp.headers.items()}
                content = await resp.aread() if resp.status_code != 200 else b""
                lines = ndjson_lines(resp.aiter_bytes())  # not aiter_lines: it splits as str.splitlines()
                yield Opened(resp.status_code, found, content, lines)
        except httpx.TransportError as exc:
            unsent = isinstance(exc, httpx.ConnectError | httpx.ConnectTimeout | httpx.PoolTimeout)
            raise TransportError(f"{type(exc).__name__}: {exc}", unsent=unsent) from exc

    async def aclose(self) -> None:
        with contextlib.suppress(Exception):
            await self._client.aclose()
