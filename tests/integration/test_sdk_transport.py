"""The SDK's HTTP/1.1 transport against scripted servers on loopback: framing, keep-alive, and
each way a connection fails."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import socket
import socketserver
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

from chronicle_sdk.transport import Http11Transport, TransportError

Script = Callable[[asyncio.StreamReader, asyncio.StreamWriter, int], Awaitable[None]]


@contextlib.asynccontextmanager
async def serving(script: Script) -> AsyncIterator[tuple[str, list[int]]]:
    """A server running ``script`` for each request; yields its URL and the connection numbers seen."""
    seen: list[int] = []
    connections = 0

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal connections
        connections += 1
        number = connections
        try:
            while True:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except (asyncio.IncompleteReadError, ConnectionError):
                    return
                length = next(
                    (
                        int(line.split(b":")[1])
                        for line in head.split(b"\r\n")
                        if line.lower().startswith(b"content-length")
                    ),
                    0,
                )
                await reader.readexactly(length)
                seen.append(number)
                await script(reader, writer, len(seen))
                if writer.is_closing():
                    return
        finally:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}", seen
    finally:
        server.close()


def answer(body: bytes, *extra: str) -> bytes:
    head = ["HTTP/1.1 200 OK", f"Content-Length: {len(body)}", "Content-Type: application/json", *extra]
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


async def test_keep_alive_reuses_one_connection() -> None:
    async def script(_r: asyncio.StreamReader, w: asyncio.StreamWriter, n: int) -> None:
        w.write(answer(b'{"n": %d}' % n))

    async with serving(script) as (url, seen):
        t = Http11Transport(url, timeout_s=5)
        replies = [await t.send("GET", "/x?a=1", {}, None) for _ in range(5)]
        await t.aclose()
    assert [r.content for r in replies] == [b'{"n": %d}' % i for i in range(1, 6)]
    assert seen == [1, 1, 1, 1, 1]
    assert replies[0].headers["content-type"] == "application/json"


async def test_chunked_and_close_delimited_bodies() -> None:
    async def script(_r: asyncio.StreamReader, w: asyncio.StreamWriter, n: int) -> None:
        if n == 1:
            w.write(
                b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n6;ext=1\r\n world\r\n0\r\n\r\n"
            )
        else:
            w.write(b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\nuntil the end")
            await w.drain()
            w.close()

    async with serving(script) as (url, seen):
        t = Http11Transport(url, timeout_s=5)
        first = await t.send("GET", "/", {}, None)
        second = await t.send("GET", "/", {}, None)
        third = await t.send("GET", "/", {}, None)  # the closed connection is not reused
        await t.aclose()
    assert first.content == b"hello world"
    assert second.content == b"until the end"
    assert third.content == b"until the end"
    assert seen == [1, 1, 2]


async def test_a_connection_closed_while_idle_is_retried_when_the_request_may_repeat() -> None:
    async def script(_r: asyncio.StreamReader, w: asyncio.StreamWriter, n: int) -> None:
        w.write(answer(b"{}"))
        await w.drain()
        w.close()  # as a server's keep-alive timeout would, without saying Connection: close

    async with serving(script) as (url, seen):
        t = Http11Transport(url, timeout_s=5)
        await t.send("GET", "/", {}, None)
        await asyncio.sleep(0.05)  # let the close arrive
        again = await t.send("GET", "/", {}, None)
        keyed = await t.send("POST", "/", {"Idempotency-Key": "k"}, b"{}")
        await asyncio.sleep(0.05)
        plain = await t.send("POST", "/", {}, b"{}")  # the close had arrived: a fresh connection
        await t.aclose()
    assert again.status == 200
    assert keyed.status == 200
    assert plain.status == 200
    assert len(seen) == 4


async def test_a_close_that_arrives_with_the_request_fails_a_request_that_may_not_repeat() -> None:
    """The server reads the request and closes without answering: a POST without a key is not
    retried, and the caller learns it may have been received."""

    async def script(_r: asyncio.StreamReader, w: asyncio.StreamWriter, n: int) -> None:
        if n == 1:
            w.write(answer(b"{}"))
        else:
            w.close()

    async with serving(script) as (url, seen):
        t = Http11Transport(url, timeout_s=5)
        await t.send("GET", "/", {}, None)
        with pytest.raises(TransportError) as failed:
            await t.send("POST", "/", {}, b"{}")
        await t.aclose()
    assert failed.value.unsent is False
    assert len(seen) == 2


async def test_refused_connection_is_unsent() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    t = Http11Transport(f"http://127.0.0.1:{port}", timeout_s=5)
    with pytest.raises(TransportError) as failed:
        await t.send("POST", "/", {}, b"{}")
    assert failed.value.unsent is True


async def test_no_answer_times_out_as_sent() -> None:
    async def script(_r: asyncio.StreamReader, _w: asyncio.StreamWriter, _n: int) -> None:
        await asyncio.sleep(10)

    async with serving(script) as (url, _seen):
        t = Http11Transport(url, timeout_s=0.2)
        with pytest.raises(TransportError) as failed:
            await t.send("GET", "/", {}, None)
        await t.aclose()
    assert failed.value.unsent is False
    assert "no answer" in str(failed.value)


async def test_malformed_answer_is_a_transport_error() -> None:
    async def script(_r: asyncio.StreamReader, w: asyncio.StreamWriter, _n: int) -> None:
        w.write(b"garbage\r\n\r\n")

    async with serving(script) as (url, _seen):
        t = Http11Transport(url, timeout_s=5)
        with pytest.raises(TransportError):
            await t.send("GET", "/", {}, None)
        await t.aclose()


def test_base_url_must_be_http() -> None:
    with pytest.raises(ValueError, match="http"):
        Http11Transport("ftp://example.org", timeout_s=1)


# A closed loop's transports cannot be closed through it: the transport ends their TCP connections
# (shutdown, which the server sees) and their socket objects close the descriptors when collected,
# with the ResourceWarning asyncio gives every transport it did not close itself.
@pytest.mark.filterwarnings("ignore::ResourceWarning", "ignore::pytest.PytestUnraisableExceptionWarning")
def test_a_transport_used_from_a_later_event_loop_connects_again_and_ends_the_old_connection() -> None:
    """``asyncio.run`` per call (a synchronous program, a task runner): a connection pooled by a
    loop that has closed cannot be used (its writes need that loop); the next loop opens its own,
    and the old one's TCP connection is ended, not left open at the server."""
    ended: list[int] = []
    opened: list[int] = []

    class Handler(socketserver.StreamRequestHandler):
        def handle(self) -> None:
            number = len(opened) + 1
            opened.append(number)
            while True:
                head = b""
                while not head.endswith(b"\r\n\r\n"):
                    byte = self.rfile.read(1)
                    if not byte:  # the client ended the connection
                        ended.append(number)
                        return
                    head += byte
                self.wfile.write(answer(b'{"connection": %d}' % number))
                self.wfile.flush()

    with socketserver.ThreadingTCPServer(("127.0.0.1", 0), Handler) as server:
        server.daemon_threads = True
        threading.Thread(target=server.serve_forever, daemon=True).start()
        t = Http11Transport(f"http://127.0.0.1:{server.server_address[1]}", timeout_s=5)
        first = asyncio.run(t.send("GET", "/a", {}, None))
        second = asyncio.run(t.send("GET", "/b", {}, None))  # raised "Event loop is closed" before
        asyncio.run(t.aclose())
        del t
        gc.collect()  # the old loops' socket objects, collected here (within the filter), not later
        deadline = time.monotonic() + 5
        while len(ended) < 2 and time.monotonic() < deadline:  # the server threads see each end
            time.sleep(0.01)
        server.shutdown()
    assert (first.content, second.content) == (b'{"connection": 1}', b'{"connection": 2}')
    assert sorted(ended) == [1, 2]
