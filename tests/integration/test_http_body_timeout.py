"""A request's body is timed (``api_body_timeout_s``, ``api_body_min_bytes_per_s``;
services/api/body_timeout.py): a body that stalls, or trickles slower than the rate, is ``408
request_timeout`` (problem+json) once its time is up and the connection closes; nothing of it is
done (the append is not made). A body that comes steadily within its time is served, and so is a
large one that takes longer than the timeout at the rate. A client that hangs up mid-body is no
error. The rest of a body answered before it was read (a wrong key's 401) is timed by the HTTP
server (services/api/http_head.py): trickled on, the connection is closed after the timeout;
ended in time, the connection stays open. Each over real HTTP on raw sockets, to the API served
by uvicorn as ``chronicle api`` serves it, with a short timeout; with the hot paths (which read
the append's body themselves) and without."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest

from services.api.app import build_app
from services.bootstrap import Container
from tests.raw_http import AUTH, answer, append_body, appended_after, connect, history_ids
from tests.support import served

TIMEOUT_S = 1.5


@contextlib.asynccontextmanager
async def _served(stack: Container, hot_paths: bool, min_bytes_per_s: int) -> AsyncIterator[str]:
    settings = stack.settings.model_copy(
        update={
            "api_body_timeout_s": TIMEOUT_S,
            "api_body_min_bytes_per_s": min_bytes_per_s,
            "api_hot_paths": hot_paths,
        }
    )
    async with served(build_app(settings, stack), settings) as url:
        yield url


@pytest.fixture(params=[True, False], ids=["hot-paths", "routes"])
async def api(request: pytest.FixtureRequest, stack: Container) -> AsyncIterator[str]:
    """The whole body within the timeout, whatever its size."""
    async with _served(stack, request.param, 0) as url:
        yield url


def _append_head(sid: str, length: int) -> bytes:
    lines = [
        f"POST /v1/sessions/{sid}/messages HTTP/1.1",
        "Host: chronicle",
        f"Authorization: {AUTH}",
        "Content-Type: application/json",
        f"Content-Length: {length}",
    ]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def _message(mid: str, pad: int = 0) -> bytes:
    """An append's body; ``pad`` blanks after the JSON (still valid) make it larger."""
    return append_body(mid) + b" " * pad


async def _refused_in_time(reader: asyncio.StreamReader, since: float, allowed_s: float) -> dict[str, Any]:
    """The 408 answer, come within ``allowed_s`` (and not much before), then the connection's end."""
    status, headers, problem = await answer(reader, TIMEOUT_S + 10)
    elapsed = time.monotonic() - since
    assert (status, problem["code"]) == (408, "request_timeout"), problem
    assert headers["content-type"] == "application/problem+json"
    assert headers["connection"] == "close"
    assert allowed_s * 0.8 <= elapsed < allowed_s + 5
    assert await asyncio.wait_for(reader.read(), 10) == b""  # the server closed the connection
    return problem


async def test_a_body_that_stalls_is_408_once_the_timeout_is_up_and_nothing_is_appended(api: str, new_id: Any) -> None:
    sid = new_id("s")
    body = _message(new_id("m"))
    reader, writer = await connect(api)
    try:
        writer.write(_append_head(sid, len(body)) + body[:10])  # and never the rest
        await writer.drain()
        problem = await _refused_in_time(reader, time.monotonic(), TIMEOUT_S)
        assert "10 bytes" in problem["detail"]
    finally:
        writer.close()
    assert await appended_after(api, sid) == ["marker"]


async def test_a_body_that_never_starts_is_408(api: str, new_id: Any) -> None:
    sid = new_id("s")
    reader, writer = await connect(api)
    try:
        writer.write(_append_head(sid, 100))
        await writer.drain()
        await _refused_in_time(reader, time.monotonic(), TIMEOUT_S)
    finally:
        writer.close()
    assert await appended_after(api, sid) == ["marker"]


async def test_a_body_sent_steadily_within_the_timeout_is_served(api: str, new_id: Any) -> None:
    """Ten pieces, 30 ms apart: a third of the timeout in all."""
    sid, mid = new_id("s"), new_id("m")
    body = _message(mid, pad=200)
    reader, writer = await connect(api)
    try:
        writer.write(_append_head(sid, len(body)))
        step = len(body) // 10 + 1
        for i in range(0, len(body), step):
            writer.write(body[i : i + step])
            await writer.drain()
            await asyncio.sleep(TIMEOUT_S / 50)
        status, _, made = await answer(reader, TIMEOUT_S + 10)
        assert status == 201, made
    finally:
        writer.close()
    assert mid in await history_ids(api, sid, made["seq"])


@pytest.mark.parametrize("hot_paths", [True, False], ids=["hot-paths", "routes"])
async def test_a_body_at_the_rate_may_take_longer_than_the_timeout_one_slower_may_not(
    stack: Container, new_id: Any, hot_paths: bool
) -> None:
    """At 2000 bytes/s: 3000 bytes in six pieces 0.4 s apart (2 s, past the 1.5 s timeout, each
    piece well within the second it adds) are served; 20 bytes every 0.1 s (200 bytes/s, each
    piece adding 10 ms) are 408 a little after the timeout, however long the body would trickle."""
    async with _served(stack, hot_paths, 2000) as api:
        sid, mid = new_id("s"), new_id("m")
        body = _message(mid, pad=3000 - len(_message(mid)))
        reader, writer = await connect(api)
        try:
            writer.write(_append_head(sid, len(body)))
            for i in range(0, len(body), 500):
                writer.write(body[i : i + 500])
                await writer.drain()
                await asyncio.sleep(0.4)
            status, _, made = await answer(reader, TIMEOUT_S + 10)
            assert status == 201, made
        finally:
            writer.close()
        assert mid in await history_ids(api, sid, made["seq"])

        slow = _message(new_id("m"), pad=10_000)
        reader, writer = await connect(api)

        async def trickle() -> None:
            for i in range(20, len(slow), 20):
                writer.write(slow[i : i + 20])
                await asyncio.sleep(0.1)

        try:
            writer.write(_append_head(sid, len(slow)) + slow[:20])
            since = time.monotonic()
            trickling = asyncio.create_task(trickle())
            try:
                # the deadline grows 10 ms a piece: about 1.5 s / (1 - 0.1), under 2 s
                await _refused_in_time(reader, since, TIMEOUT_S)
            finally:
                trickling.cancel()
        finally:
            writer.close()
        assert await appended_after(api, sid) == [mid, "marker"]


async def test_a_client_hanging_up_mid_body_is_no_error(
    api: str, new_id: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """It hangs up before the timeout: the request ends at once (the DEBUG line says so), nothing
    is logged above DEBUG, and no 408 is attempted on the closed connection later."""
    caplog.set_level(logging.DEBUG, logger="chronicle.api")
    server_errors: list[str] = []  # uvicorn's logger does not reach the root logger (and caplog)
    handler = logging.Handler(logging.WARNING)
    handler.emit = lambda record: server_errors.append(record.getMessage())  # type: ignore[method-assign]
    logging.getLogger("uvicorn.error").addHandler(handler)
    try:
        await _hang_up_mid_body(api, new_id("s"), caplog)
    finally:
        logging.getLogger("uvicorn.error").removeHandler(handler)
    assert server_errors == []


async def _hang_up_mid_body(api: str, sid: str, caplog: pytest.LogCaptureFixture) -> None:
    _, writer = await connect(api)
    writer.write(_append_head(sid, 1000) + b'{"message": {"id": "m1"')
    await writer.drain()
    since = time.monotonic()
    writer.close()
    await writer.wait_closed()
    async with asyncio.timeout(10):  # the server saw the hang-up: its DEBUG line says so
        while not any("hung up" in r.getMessage() for r in caplog.records if r.name == "chronicle.api"):
            await asyncio.sleep(0.02)
    assert time.monotonic() - since < TIMEOUT_S  # not ended by the timeout
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []
    assert await appended_after(api, sid) == ["marker"]


async def test_the_rest_of_a_body_answered_before_it_was_read_is_timed_too(api: str, new_id: Any) -> None:
    """A wrong key is 401 before the body is read; a client that then trickles the body on (no key
    needed) has its connection closed once the timeout is up, not held for as long as it sends."""
    sid = new_id("s")
    reader, writer = await connect(api)
    head = _append_head(sid, 1_000_000).replace(AUTH.encode(), b"Bearer wrong")

    async def trickle() -> None:
        for _ in range(1000):
            writer.write(b" " * 10)
            await asyncio.sleep(0.05)

    try:
        writer.write(head + b'{"message": ')
        status, _, problem = await answer(reader)
        assert (status, problem["code"]) == (401, "unauthorized"), problem
        since = time.monotonic()
        trickling = asyncio.create_task(trickle())
        try:
            assert await asyncio.wait_for(reader.read(), TIMEOUT_S + 10) == b""
        finally:
            trickling.cancel()
        assert TIMEOUT_S * 0.8 <= time.monotonic() - since < TIMEOUT_S + 5
    finally:
        writer.close()


async def test_a_body_answered_unread_that_ends_in_time_leaves_the_connection_open(api: str, new_id: Any) -> None:
    """The rest of a 401's body comes at once: its timer stops, and the connection, idle past the
    time the timer would have closed it (within uvicorn's 5 s keep-alive), serves the next request."""
    sid = new_id("s")
    body = _message(new_id("m"))
    reader, writer = await connect(api)
    try:
        writer.write(_append_head(sid, len(body)).replace(AUTH.encode(), b"Bearer wrong") + body[:10])
        assert (await answer(reader))[0] == 401
        writer.write(body[10:])
        await writer.drain()
        await asyncio.sleep(TIMEOUT_S * 1.5)  # idle: the keep-alive timeout applies, not the body's
        writer.write(f"GET /v1/sessions HTTP/1.1\r\nHost: chronicle\r\nAuthorization: {AUTH}\r\n\r\n".encode())
        status, _, page = await answer(reader)
        assert status == 200, page
    finally:
        writer.close()
