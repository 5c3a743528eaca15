"""A minimal HTTP/1.1 keep-alive client for the latency benchmarks.

The benchmarks measure how long the server takes to answer, so the client must cost little: httpx's
asynchronous client spends about 1.4 ms of its own per request on this machine (its ``GET
/healthz`` floor), as much as the work being measured. This client writes the request bytes and
reads the answer (``Content-Length`` or chunked) over pooled asyncio connections, nothing more.
It is a measuring tool for loopback, not a general client (no TLS, redirects or compression).
"""

from __future__ import annotations

import asyncio
import json as jsonlib
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode, urlsplit


class HttpError(RuntimeError):
    pass


@dataclass(frozen=True, slots=True)
class Answer:
    status_code: int
    content: bytes

    @property
    def text(self) -> str:
        return self.content.decode("utf-8", "replace")

    def json(self) -> Any:
        return jsonlib.loads(self.content)

    def raise_for_status(self) -> None:
        if self.status_code >= 400:
            raise HttpError(f"HTTP {self.status_code}: {self.text[:200]}")


class _Conn:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer

    async def exchange(self, request: bytes) -> tuple[int, bytes, bool]:
        """(status, body, keep-alive) of one request."""
        self.writer.write(request)
        head = await self.reader.readuntil(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split(" ", 2)[1])
        headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:] if line)}
        if headers.get("transfer-encoding", "").lower() == "chunked":
            parts = []
            while size := int((await self.reader.readuntil(b"\r\n")).split(b";")[0], 16):
                parts.append(await self.reader.readexactly(size + 2))
            await self.reader.readuntil(b"\r\n")
            body = b"".join(p[:-2] for p in parts)
        else:
            body = await self.reader.readexactly(int(headers.get("content-length", "0")))
        return status, body, headers.get("connection", "").lower() != "close"

    def close(self) -> None:
        self.writer.close()


class BenchClient:
    """``get``/``post`` with default headers over a pool of keep-alive connections."""

    def __init__(self, base_url: str, headers: dict[str, str] | None = None) -> None:
        url = urlsplit(base_url)
        self._host = url.hostname or "127.0.0.1"
        self._port = url.port or 80
        extra = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
        self._headers = f"Host: {self._host}:{self._port}\r\n{extra}"
        self._idle: list[_Conn] = []

    async def request(self, method: str, path: str, body: bytes | None = None) -> Answer:
        conn = self._idle.pop() if self._idle else _Conn(*await asyncio.open_connection(self._host, self._port))
        head = f"{method} {path} HTTP/1.1\r\n{self._headers}"
        if body is not None:
            head += f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
        try:
            status, content, keep = await conn.exchange((head + "\r\n").encode("latin-1") + (body or b""))
        except BaseException:
            conn.close()
            raise
        if keep:
            self._idle.append(conn)
        else:
            conn.close()
        return Answer(status, content)

    async def get(self, path: str, params: dict[str, Any] | None = None) -> Answer:
        query = {k: ("true" if v is True else "false" if v is False else v) for k, v in (params or {}).items()}
        return await self.request("GET", f"{path}?{urlencode(query)}" if query else path)

    async def post(self, path: str, json: Any = None) -> Answer:
        return await self.request("POST", path, jsonlib.dumps(json).encode())

    async def aclose(self) -> None:
        while self._idle:
            self._idle.pop().close()
