"""Request bodies are bounded (``CHRONICLE_MAX_REQUEST_BYTES``, services/api/guards.py): a
``Content-Length`` over the bound is ``413 payload_too_large`` before any of the body is read, a
chunked body is refused as soon as it passes the bound, without waiting for its end; a body up to
the bound is served. A client that hangs up mid-body is no error (nothing logged above DEBUG).
Each over real HTTP on raw sockets (httpx cannot lie about a length or hang up mid-body), to the
API served by uvicorn with a small bound, with the hot paths and without."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from services.api.app import build_app
from services.bootstrap import Container
from tests.raw_http import AUTH, answer, connect, history_ids
from tests.support import served

LIMIT = 64 * 1024


@pytest.fixture(params=[True, False], ids=["hot-paths", "routes"])
async def api(request: pytest.FixtureRequest, stack: Container) -> AsyncIterator[str]:
    settings = stack.settings.model_copy(update={"max_request_bytes": LIMIT, "api_hot_paths": request.param})
    async with served(build_app(settings, stack)) as url:
        yield url


def _message(mid: str, text: str) -> dict[str, Any]:
    return {"id": mid, "role": "user", "parts": [{"type": "text", "text": text}]}


def _head(method: str, path: str, *headers: str) -> bytes:
    lines = [f"{method} {path} HTTP/1.1", "Host: chronicle", f"Authorization: {AUTH}", *headers]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


@pytest.mark.parametrize("path", ["/v1/sessions", "/v1/sessions/{sid}/messages", "/v1/sessions/{sid}/messages:batch"])
async def test_a_content_length_over_the_bound_is_413_before_the_body_is_sent(api: str, new_id: Any, path: str) -> None:
    sid = new_id("s")
    reader, writer = await connect(api)
    try:  # the headers alone: the answer comes without a byte of the body
        head = _head("POST", path.format(sid=sid), "Content-Type: application/json", "Content-Length: 10000000000")
        writer.write(head)
        await writer.drain()
        status, headers, body = await answer(reader)
        assert (status, body["code"]) == (413, "payload_too_large"), body
        assert str(LIMIT) in body["detail"]
        assert "10000000000" in body["detail"]
        assert headers["connection"] == "close"
        assert headers["content-type"] == "application/problem+json"
        assert await asyncio.wait_for(reader.read(), 10) == b""  # and the server closed the connection
    finally:
        writer.close()
    assert await history_ids(api, sid) == []


async def test_a_chunked_body_is_refused_once_it_passes_the_bound_without_reading_on(api: str, new_id: Any) -> None:
    sid = new_id("s")
    reader, writer = await connect(api)
    try:
        writer.write(
            _head(
                "POST", f"/v1/sessions/{sid}/messages", "Content-Type: application/json", "Transfer-Encoding: chunked"
            )
        )
        chunk = b"x" * 4096
        for _ in range(LIMIT // len(chunk) + 1):  # one chunk past the bound, and never the body's end
            writer.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
        await writer.drain()
        status, headers, body = await answer(reader)
        assert (status, body["code"]) == (413, "payload_too_large"), body
        assert headers["connection"] == "close"
    finally:
        writer.close()
    assert await history_ids(api, sid) == []


async def test_a_body_up_to_the_bound_is_served_and_one_byte_more_is_not(api: str, new_id: Any) -> None:
    sid = new_id("s")
    async with httpx.AsyncClient(base_url=api, headers={"Authorization": AUTH}) as client:

        def body(mid: str, extra: int) -> bytes:
            raw = json.dumps({"message": _message(mid, "")}).encode()
            return json.dumps({"message": _message(mid, "a" * (LIMIT - len(raw) + extra))}).encode()

        at_bound, over = body("m1", 0), body("m2", 1)
        assert (len(at_bound), len(over)) == (LIMIT, LIMIT + 1)
        json_type = {"Content-Type": "application/json"}
        r = await client.post(f"/v1/sessions/{sid}/messages", content=at_bound, headers=json_type)
        assert r.status_code == 201, r.text
        seq = r.json()["seq"]
        r = await client.post(f"/v1/sessions/{sid}/messages", content=over, headers=json_type)
        assert (r.status_code, r.json()["code"]) == (413, "payload_too_large")
    assert await history_ids(api, sid, seq) == ["m1"]


async def test_a_client_hanging_up_mid_body_is_logged_at_debug_only(
    api: str, new_id: Any, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="chronicle.api")
    sid = new_id("s")
    _, writer = await connect(api)
    head = _head("POST", f"/v1/sessions/{sid}/messages", "Content-Type: application/json", "Content-Length: 1000")
    writer.write(head + b'{"message": {"id": "m1"')
    await writer.drain()
    writer.close()
    await writer.wait_closed()
    async with asyncio.timeout(10):  # the server saw the hang-up: its DEBUG line says so
        while not any("hung up" in r.getMessage() for r in caplog.records if r.name == "chronicle.api"):
            await asyncio.sleep(0.02)
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []
    assert await history_ids(api, sid) == []
