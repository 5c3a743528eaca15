"""The body timeout's middleware (services/api/body_timeout.py) on plain ASGI callables: which
requests it times, what it answers past the deadline (and what of the app's answer it drops),
and that a read once the body is whole is not timed. Over real HTTP:
tests/integration/test_http_body_timeout.py."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from pydantic import ValidationError
from starlette.types import Message, Receive, Scope, Send

from services.api.body_timeout import BodyTimeout, has_body
from services.settings import Settings

TIMEOUT_S = 0.05


def _scope(*headers: tuple[bytes, bytes]) -> Scope:
    return {"type": "http", "method": "POST", "path": "/v1/x", "headers": list(headers)}


class _Client:
    """The server's side of one request: ``receive`` gives ``parts`` (None: waits for good, a
    stalled client), then a disconnect; ``send`` records the answer."""

    def __init__(self, *parts: bytes | None) -> None:
        self.parts = list(parts)
        self.sent: list[Message] = []

    async def receive(self) -> Message:
        if not self.parts:
            return {"type": "http.disconnect"}
        part = self.parts.pop(0)
        if part is None:
            await asyncio.Event().wait()
        return {"type": "http.request", "body": part, "more_body": bool(self.parts)}

    async def send(self, message: Message) -> None:
        self.sent.append(message)

    def answer(self) -> tuple[int, dict[bytes, bytes], dict[str, Any]]:
        start, body = self.sent
        return start["status"], dict(start["headers"]), json.loads(body["body"])


async def _read_body(receive: Receive) -> bytes:
    chunks = []
    while True:
        message = await receive()
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            return b"".join(chunks)


async def _ok(send: Send) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"ok"})


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        ([], False),
        ([(b"content-length", b"0")], False),
        ([(b"host", b"x"), (b"content-length", b"12")], True),
        ([(b"transfer-encoding", b"chunked")], True),
    ],
)
def test_a_request_has_a_body_when_it_declares_one(headers: list[tuple[bytes, bytes]], expected: bool) -> None:
    assert has_body(headers) is expected


async def test_a_request_without_a_body_is_passed_on_untouched() -> None:
    seen: list[tuple[Receive, Send]] = []

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        seen.append((receive, send))

    client = _Client(b"")
    await BodyTimeout(app, TIMEOUT_S, 0)(_scope(), client.receive, client.send)
    assert seen == [(client.receive, client.send)]


async def test_a_stalled_body_is_408_and_the_apps_own_answer_is_dropped() -> None:
    """The app meets the timeout as an error from ``receive``; whatever it answers then (here it
    catches the error and answers 200) is replaced by the 408, with ``Connection: close``."""
    caught: list[Exception] = []

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await _read_body(receive)
        except Exception as exc:
            caught.append(exc)
            with pytest.raises(type(exc)):  # it stays timed out
                await receive()
        await _ok(send)

    client = _Client(b'{"a": ', None)
    scope = _scope((b"content-length", b"100"))
    async with asyncio.timeout(5):
        await BodyTimeout(app, TIMEOUT_S, 0)(scope, client.receive, client.send)
    assert len(caught) == 1
    status, headers, problem = client.answer()
    assert (status, problem["code"], problem["status"]) == (408, "request_timeout", 408)
    assert headers[b"connection"] == b"close"
    assert headers[b"content-type"] == b"application/problem+json"
    assert "6 bytes" in problem["detail"]


async def test_an_app_that_raises_on_the_timeout_is_answered_408() -> None:
    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        await _read_body(receive)
        await _ok(send)

    client = _Client(None)
    async with asyncio.timeout(5):
        await BodyTimeout(app, TIMEOUT_S, 0)(_scope((b"transfer-encoding", b"chunked")), client.receive, client.send)
    assert client.answer()[0] == 408


async def test_an_answer_begun_before_the_timeout_gets_the_error_raised_to_the_server() -> None:
    """A 408 cannot follow an answer begun: the server closes the connection on the error."""

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await _read_body(receive)

    client = _Client(None)
    with pytest.raises(Exception) as raised:  # noqa: PT011 (the error is private to the module)
        async with asyncio.timeout(5):
            await BodyTimeout(app, TIMEOUT_S, 0)(_scope((b"content-length", b"5")), client.receive, client.send)
    assert type(raised.value).__name__ == "_BodyTimedOut"
    assert [m["type"] for m in client.sent] == ["http.response.start"]


async def test_each_byte_come_extends_the_deadline_by_its_share_of_the_rate() -> None:
    """At 1000 bytes/s, a body whose first 500 bytes came at once has half a second more: a
    second part 0.2 s later is in time though the timeout alone (0.05 s) is long past."""

    async def late() -> Message:
        await asyncio.sleep(0.2)
        return {"type": "http.request", "body": b"b" * 10, "more_body": False}

    parts: list[Message] = [{"type": "http.request", "body": b"a" * 500, "more_body": True}]

    async def receive() -> Message:
        return parts.pop(0) if parts else await late()

    got: list[bytes] = []

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        got.append(await _read_body(receive))
        await _ok(send)

    client = _Client()
    await BodyTimeout(app, TIMEOUT_S, 1000)(_scope((b"content-length", b"510")), receive, client.send)
    assert got == [b"a" * 500 + b"b" * 10]
    assert client.sent[0]["status"] == 200


async def test_a_read_once_the_body_is_whole_is_not_timed() -> None:
    """After the body, a read waits for the client's disconnect (a streamed answer listens so):
    however long that takes, it is no timeout."""

    async def receive() -> Message:
        if not done:
            done.append(True)
            return {"type": "http.request", "body": b"{}", "more_body": False}
        await asyncio.sleep(TIMEOUT_S * 4)
        return {"type": "http.disconnect"}

    done: list[bool] = []
    later: list[Message] = []

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        await _read_body(receive)
        later.append(await receive())
        await _ok(send)

    client = _Client()
    await BodyTimeout(app, TIMEOUT_S, 0)(_scope((b"content-length", b"2")), receive, client.send)
    assert later == [{"type": "http.disconnect"}]
    assert client.sent[0]["status"] == 200


@pytest.mark.parametrize(
    "bad", [{"api_body_timeout_s": 0}, {"api_body_timeout_s": 3601}, {"api_body_min_bytes_per_s": -1}]
)
def test_the_body_timeout_settings_are_bounded(bad: dict[str, float]) -> None:
    with pytest.raises(ValidationError):
        Settings(**bad)  # type: ignore[arg-type]


def test_the_body_timeout_defaults() -> None:
    settings = Settings()
    assert (settings.api_body_timeout_s, settings.api_body_min_bytes_per_s) == (30.0, 64 * 1024)
