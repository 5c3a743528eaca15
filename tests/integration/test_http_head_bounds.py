"""A request's head is bounded (services/api/http_head.py): request line and headers over
``api_max_header_bytes`` are ``431 header_too_large`` and the connection closes, nothing reaching
the app (a valid key's append is not made); a head not complete within ``api_header_timeout_s`` of
its first byte (or of the connection's opening) has its connection closed. A head just at the bound,
a head that arrives in pieces within the time, a body that arrives slowly, and a pause between
requests are all served. Each over real HTTP on raw sockets, to the API served by uvicorn as
``chronicle api`` serves it, with a small bound and a short timeout. If uvicorn's protocol
changes shape, the first test fails (the API would serve without the bounds, warning)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from services.api.app import build_app
from services.api.http_head import head_bounded_protocol, shape_mismatch
from services.bootstrap import Container
from services.ops import processes
from services.settings import Settings
from tests.raw_http import AUTH, answer, append_body, appended_after, connect, history_ids
from tests.support import served

LIMIT = 8 * 1024
TIMEOUT_S = 0.5


@pytest.fixture
async def api(stack: Container) -> AsyncIterator[str]:
    settings = stack.settings.model_copy(update={"api_max_header_bytes": LIMIT, "api_header_timeout_s": TIMEOUT_S})
    async with served(build_app(settings, stack), settings) as url:
        yield url


def _head(method: str, path: str, *headers: str, size: int | None = None) -> bytes:
    """A request head; with ``size``, padded by an ``X-Pad`` header to exactly that many bytes."""
    lines = [f"{method} {path} HTTP/1.1", "Host: chronicle", f"Authorization: {AUTH}", *headers]
    head = ("\r\n".join(lines) + "\r\n\r\n").encode()
    if size is None:
        return head
    pad = size - len(head) - len("X-Pad: \r\n")
    assert pad >= 0
    return head[:-2] + b"X-Pad: " + b"p" * pad + b"\r\n\r\n"


async def _closed_after(reader: asyncio.StreamReader) -> float:
    """Seconds until the server closes the connection (reads nothing but its end)."""
    start = time.monotonic()
    assert await asyncio.wait_for(reader.read(), 10) == b""
    return time.monotonic() - start


@contextlib.contextmanager
def _uvicorn_warnings() -> Iterator[list[str]]:
    """The messages uvicorn's server logs at WARNING and above meanwhile."""
    seen: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: seen.append(record.getMessage())  # type: ignore[method-assign]
    uvicorn_log = logging.getLogger("uvicorn.error")
    level = uvicorn_log.level
    uvicorn_log.addHandler(handler)
    uvicorn_log.setLevel(logging.WARNING)
    try:
        yield seen
    finally:
        uvicorn_log.removeHandler(handler)
        uvicorn_log.setLevel(level)


async def _served_normally(url: str) -> None:
    async with httpx.AsyncClient(base_url=url, headers={"Authorization": AUTH}) as client:
        r = await client.get("/v1/sessions")
    assert r.status_code == 200, r.text


def test_uvicorns_protocol_is_the_shape_the_bounds_are_written_for() -> None:
    """A uvicorn upgrade that changes the protocol fails here (the API would serve unbounded)."""
    assert shape_mismatch(HttpToolsProtocol) is None
    protocol = processes.api_http_protocol(Settings())
    assert isinstance(protocol, type)
    assert issubclass(protocol, HttpToolsProtocol)


def test_a_protocol_of_another_shape_is_served_plain_with_a_warning(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    class Changed(HttpToolsProtocol):
        def on_headers_complete(self, extra: int = 0) -> None:
            pass

    assert shape_mismatch(Changed) == "its on_headers_complete() takes other arguments"
    monkeypatch.setattr(processes, "head_bounded_protocol", lambda size, timeout, body_timeout: None)
    with caplog.at_level(logging.WARNING, logger="chronicle"):
        assert processes.api_http_protocol(Settings()) == "httptools"
    assert "without a size bound or a timeout" in caplog.text
    assert head_bounded_protocol(LIMIT, TIMEOUT_S, TIMEOUT_S) is not None  # the real one is the right shape


@pytest.mark.parametrize("bounded", [True, False], ids=["head-bounded", "plain-httptools"])
def test_the_api_never_takes_a_websocket_protocol_even_where_one_is_installed(
    monkeypatch: pytest.MonkeyPatch, bounded: bool
) -> None:
    """The head-bounded protocol drops the WebSocket protocol; the plain one served where uvicorn's
    is of another shape took uvicorn's ``ws="auto"``, which hands an upgrade request to
    ``websockets`` or ``wsproto`` once a dependency installs one (stood in for here), unbounded."""
    import uvicorn.protocols.websockets.auto as ws_auto

    class InstalledWebSockets:
        pass

    monkeypatch.setattr(ws_auto, "AutoWebSocketsProtocol", InstalledWebSockets)
    if not bounded:
        monkeypatch.setattr(processes, "head_bounded_protocol", lambda size, timeout, body_timeout: None)

    async def app(scope: Any, receive: Any, send: Any) -> None:
        pass

    config = processes.api_config(app, Settings(), host="127.0.0.1", port=0)
    config.load()
    assert config.ws_protocol_class is None
    assert (config.http_protocol_class is not HttpToolsProtocol) is bounded


@pytest.mark.parametrize("over", [1, LIMIT, 4 * 1024 * 1024], ids=["one-byte", "twice", "4-MiB"])
async def test_a_head_over_the_bound_is_431_and_the_connection_closes(api: str, new_id: Any, over: int) -> None:
    """One byte over (the head complete in one read: measured), twice the bound and 4 MiB (refused
    as the head arrives, the rest never read). A valid key's append: nothing is appended."""
    sid, mid = new_id("s"), new_id("m")
    body = append_body(mid)
    head = _head(
        "POST",
        f"/v1/sessions/{sid}/messages",
        "Content-Type: application/json",
        f"Content-Length: {len(body)}",
        size=LIMIT + over,
    )
    reader, writer = await connect(api)
    try:
        writer.write(head + body)
        with contextlib.suppress(ConnectionError):  # the server stops reading the 4 MiB: it answers all the same
            await writer.drain()
        status, headers, problem = await answer(reader)
        assert (status, problem["code"]) == (431, "header_too_large"), problem
        assert str(LIMIT) in problem["detail"]
        assert headers["connection"] == "close"
        assert headers["content-type"] == "application/problem+json"
        assert await _closed_after(reader) < 5
    finally:
        writer.close()
    assert await appended_after(api, sid) == ["marker"]
    await _served_normally(api)


async def test_a_refusal_is_not_logged_as_an_invalid_request(api: str) -> None:
    """uvicorn logs what its parser stops on as "Invalid HTTP request received."; a head over the
    bound is no such request (its refusal is logged by nobody), a malformed one still is."""
    with _uvicorn_warnings() as seen:
        for request, status in [
            (_head("GET", "/v1/sessions", size=LIMIT + 1), 431),  # one read: measured, the parser stopped
            (b"GET /v1/sessions HTTP/1.1\r\nBad Header\r\n\r\n", 400),
        ]:
            reader, writer = await connect(api)
            try:
                writer.write(request)
                answer = await asyncio.wait_for(reader.read(), 10)  # to its end: the connection closes
                assert answer.split()[1] == str(status).encode(), answer
            finally:
                writer.close()
    assert seen == ["Invalid HTTP request received."]


async def test_a_head_over_the_bound_without_a_key_is_431_not_401(api: str) -> None:
    reader, writer = await connect(api)
    try:
        writer.write(b"GET /v1/sessions HTTP/1.1\r\nHost: chronicle\r\nCookie: " + b"c" * (2 * LIMIT) + b"\r\n\r\n")
        status, _, problem = await answer(reader)
        assert (status, problem["code"]) == (431, "header_too_large")
    finally:
        writer.close()


async def test_a_head_just_at_the_bound_is_served(api: str, new_id: Any) -> None:
    """Exactly ``api_max_header_bytes``: a GET, and an append whose body comes in the same write
    (the head is then measured exactly)."""
    sid, mid = new_id("s"), new_id("m")
    reader, writer = await connect(api)
    try:
        writer.write(_head("GET", "/v1/sessions", size=LIMIT))
        status, _, page = await answer(reader)
        assert status == 200, page
        body = append_body(mid) + b" " * (4 * LIMIT)  # JSON with trailing blanks: a large body, still valid
        head = _head(
            "POST",
            f"/v1/sessions/{sid}/messages",
            "Content-Type: application/json",
            f"Content-Length: {len(body)}",
            size=LIMIT,
        )
        writer.write(head + body)  # the same connection: its second request
        status, _, made = await answer(reader)
        assert status == 201, made
    finally:
        writer.close()
    assert mid in await history_ids(api, sid, made["seq"])


async def test_a_head_that_never_completes_is_closed_after_the_timeout(api: str) -> None:
    """A header line now and then (a slowloris): closed once the head has taken the timeout,
    however steadily it trickles."""
    reader, writer = await connect(api)
    try:
        writer.write(b"GET /v1/sessions HTTP/1.1\r\nHost: chronicle\r\n")
        start = time.monotonic()

        async def trickle() -> None:
            for i in range(100):
                await asyncio.sleep(TIMEOUT_S / 5)
                writer.write(f"X-Slow-{i}: x\r\n".encode())

        trickling = asyncio.create_task(trickle())
        assert await asyncio.wait_for(reader.read(), 10) == b""
        elapsed = time.monotonic() - start
        trickling.cancel()
        assert TIMEOUT_S * 0.8 <= elapsed < TIMEOUT_S + 5
    finally:
        writer.close()
    await _served_normally(api)


async def test_a_connection_that_sends_nothing_is_closed_after_the_timeout(api: str) -> None:
    reader, writer = await connect(api)
    try:
        assert TIMEOUT_S * 0.8 <= await _closed_after(reader) < TIMEOUT_S + 5
    finally:
        writer.close()


async def test_blank_lines_between_requests_do_not_hold_the_connection(api: str) -> None:
    """After an answer, bytes that make no request (blank lines, which the parser skips) take the
    connection out of the keep-alive timeout: they are timed as a head."""
    reader, writer = await connect(api)
    try:
        writer.write(_head("GET", "/v1/sessions"))
        assert (await answer(reader))[0] == 200
        start = time.monotonic()

        async def blank_lines() -> None:
            for _ in range(100):
                writer.write(b"\r\n")
                await asyncio.sleep(TIMEOUT_S / 5)

        sending = asyncio.create_task(blank_lines())
        assert await asyncio.wait_for(reader.read(), 10) == b""
        sending.cancel()
        assert time.monotonic() - start < TIMEOUT_S + 4  # well before the 5 s keep-alive timeout would, were it reset
    finally:
        writer.close()


async def test_a_head_in_pieces_within_the_time_and_a_pause_between_requests_are_served(api: str) -> None:
    """The timer runs only while a head is incomplete: a head sent in pieces within the timeout is
    served, and after its answer a pause longer than the head timeout (within keep-alive) is fine."""
    reader, writer = await connect(api)
    try:
        head = _head("GET", "/v1/sessions")
        for i in range(0, len(head), 16):
            writer.write(head[i : i + 16])
            await writer.drain()
            await asyncio.sleep(0.01)
        assert (await answer(reader))[0] == 200
        await asyncio.sleep(TIMEOUT_S * 2)  # idle: uvicorn's keep-alive (5 s) applies, not the head's timer
        writer.write(head)
        assert (await answer(reader))[0] == 200
    finally:
        writer.close()


async def test_a_body_that_arrives_slowly_is_not_cut_by_the_head_timeout(api: str, new_id: Any) -> None:
    sid, mid = new_id("s"), new_id("m")
    body = append_body(mid)
    reader, writer = await connect(api)
    try:
        writer.write(
            _head(
                "POST", f"/v1/sessions/{sid}/messages", "Content-Type: application/json", f"Content-Length: {len(body)}"
            )
        )
        writer.write(body[:10])
        await writer.drain()
        await asyncio.sleep(TIMEOUT_S * 2)  # past the head timeout, mid-body
        writer.write(body[10:])
        status, _, made = await answer(reader)
        assert status == 201, made
    finally:
        writer.close()
    assert mid in await history_ids(api, sid, made["seq"])


async def test_a_head_after_a_pipelined_body_is_measured_from_its_own_start(api: str, new_id: Any) -> None:
    """An append with a body of several times the bound, and in the same write half of a second
    request's head (at the bound in all): what came before that head does not count towards it."""
    sid, mid = new_id("s"), new_id("m")
    body = append_body(mid) + b" " * (3 * LIMIT)
    first = _head(
        "POST", f"/v1/sessions/{sid}/messages", "Content-Type: application/json", f"Content-Length: {len(body)}"
    )
    second = _head("GET", "/v1/sessions", size=LIMIT)
    reader, writer = await connect(api)
    try:
        writer.write(first + body + second[: LIMIT // 2])
        await writer.drain()
        await asyncio.sleep(0.05)  # most likely read apart from the rest (either way it must be served)
        writer.write(second[LIMIT // 2 :])
        status, _, made = await answer(reader)
        assert status == 201, made
        status, _, page = await answer(reader)
        assert status == 200, page
    finally:
        writer.close()


async def test_a_head_begun_while_a_slow_answer_is_written_is_timed_from_that_answers_end(stack: Container) -> None:
    """(The head timer ran from the next request's first byte even while the request before it
    was still being answered: an answer slower than the head timeout, a compaction's summary
    say, was lost with the connection when a pipelining client had sent part of its next head.)
    Here the first answer takes 3 head timeouts; the next head, begun at once and finished after
    that answer, is served. A head left unfinished is then closed after the timeout as ever."""
    settings = stack.settings.model_copy(update={"api_header_timeout_s": TIMEOUT_S})

    async def slow(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        if scope["path"] == "/slow":
            await asyncio.sleep(3 * TIMEOUT_S)
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
        await send({"type": "http.response.body", "body": b"{}"})

    second = _head("GET", "/next")
    async with served(slow, settings) as url:
        reader, writer = await connect(url)
        try:
            writer.write(_head("GET", "/slow") + second[:10])
            await writer.drain()
            status, _, _ = await answer(reader)
            assert status == 200
            writer.write(second[10:] + second[:10])
            await writer.drain()
            status, _, _ = await answer(reader)
            assert status == 200
            assert TIMEOUT_S * 0.8 < await _closed_after(reader) < TIMEOUT_S * 4  # the third head, unfinished
        finally:
            writer.close()


@pytest.mark.parametrize("protocol", ["websocket", "h2c"])
async def test_an_upgrade_request_is_served_as_http_and_logs_nothing(api: str, protocol: str) -> None:
    """The API speaks HTTP/1.1 only: a request asking to upgrade is answered as any other (RFC 9110
    lets a server ignore ``Upgrade``). uvicorn logged two warnings for each (one telling the operator
    to install a WebSocket library), so any client, with no key, could fill the log with them."""
    with _uvicorn_warnings() as seen:
        reader, writer = await connect(api)
        try:
            writer.write(_head("GET", "/v1/sessions", "Connection: Upgrade", f"Upgrade: {protocol}"))
            status, _, body = await answer(reader)
        finally:
            writer.close()
    assert status == 200, body
    assert "sessions" in body
    assert seen == []
