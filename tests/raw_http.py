"""HTTP on raw sockets, for the tests of what the API does with requests httpx will not send (a
head over a bound, a body that stalls, lies about its length or is cut off): a connection, one
answer read off it, and what a session holds once a marker appended after a refused request is
read (what the refused request would have appended is there by then)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx

from tests.conftest import KEYS

AUTH = f"Bearer {KEYS['tenant-a']}"
JSON = {"Content-Type": "application/json"}


def head(method: str, path: str, *, length: int | None = None, extra: str = "") -> bytes:
    """A request's head as tenant-a sends it, with a JSON body of ``length`` bytes declared (none
    declared when ``None``) and ``extra`` header lines (each ending in CRLF)."""
    declared = "" if length is None else f"Content-Length: {length}\r\n"
    return (
        f"{method} {path} HTTP/1.1\r\nHost: chronicle\r\nAuthorization: {AUTH}\r\n"
        f"Content-Type: application/json\r\n{extra}{declared}\r\n"
    ).encode()


async def connect(url: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    host, port = url.removeprefix("http://").split(":")
    return await asyncio.open_connection(host, int(port))


async def answer(reader: asyncio.StreamReader, timeout_s: float = 10) -> tuple[int, dict[str, str], dict[str, Any]]:
    """The status, headers (lower-case names) and JSON body (``{}`` when empty) of one answer,
    its head come within ``timeout_s``."""
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout_s)
    status_line, *lines = head.decode("latin-1").split("\r\n")[:-2]
    headers = {name.lower(): value.strip() for name, value in (line.split(":", 1) for line in lines)}
    body = await asyncio.wait_for(reader.readexactly(int(headers["content-length"])), 10)
    return int(status_line.split()[1]), headers, json.loads(body) if body else {}


def append_body(mid: str) -> bytes:
    return json.dumps({"message": {"id": mid, "role": "user", "parts": [{"type": "text", "text": "hi"}]}}).encode()


async def history_ids(url: str, sid: str, min_seq: int = 0) -> list[str]:
    """The ids of tenant-a's session ``sid`` once the read model has ``min_seq``; [] when there is no such session."""
    async with httpx.AsyncClient(base_url=url, headers={"Authorization": AUTH}) as client:
        r = await client.get(f"/v1/sessions/{sid}/history", params={"min_seq": min_seq})
    return [] if r.status_code == 404 else [m["id"] for m in r.json()["messages"]]


async def appended_after(url: str, sid: str) -> list[str]:
    """The session's message ids once a marker appended now (over httpx) is read."""
    async with httpx.AsyncClient(base_url=url, headers={"Authorization": AUTH}) as client:
        r = await client.post(f"/v1/sessions/{sid}/messages", content=append_body("marker"), headers=JSON)
    assert r.status_code == 201, r.text
    return await history_ids(url, sid, r.json()["seq"])
