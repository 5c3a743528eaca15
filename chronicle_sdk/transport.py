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
import ssl
from collections.abc import Mapping
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


class TransportError(Exception):
    """The request failed below HTTP (connection, timeout, malformed answer)."""

    def __init__(self, message: str, *, unsent: bool) -> None:
        super().__init__(message)
        self.unsent = unsent


class Transport(Protocol):
    """What the client needs of HTTP: send one request, close."""

    async def send(self, method: str, target: str, headers: Mapping[str, str], body: bytes | None) -> Reply: ...

    async def aclose(self) -> None: ...


class _Stale(Exception):
    """A pooled connection ended before any byte of the answer arrived."""


class _Connection:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._reader = reader
        self._writer = writer

    async def exchange(self, request: bytes, method: str) -> tuple[Reply, bool]:
        """(the answer, whether the connection may be reused)."""
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
        if method == "HEAD" or status in (204, 304) or 100 <= status < 200:
            content = b""
        elif headers.get("transfer-encoding", "").lower() == "chunked":
            content = await self._chunked()
        elif "content-length" in headers:
            content = await self._reader.readexactly(int(headers["content-length"]))
        else:
            content, keep = await self._reader.read(), False
        return Reply(status, headers, content), keep

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
        self._slots = asyncio.Semaphore(max(1, max_connections))
        self._idle: list[_Connection] = []
        self._closed = False

    async def send(self, method: str, target: str, headers: Mapping[str, str], body: bytes | None) -> Reply:
        if self._closed:
            raise TransportError("the client is closed", unsent=True)
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

    async def aclose(self) -> None:
        with contextlib.suppress(Exception):
            await self._client.aclose()
