"""Errors answer complete problem+json over a real server (uvicorn, h11) and keep the keep-alive
connection usable; a lost database answers 503 ``unavailable`` (the SDK retries it)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator

import httpx
import nats.errors
import psycopg
import psycopg_pool
import pytest
import uvicorn
from fastapi import FastAPI, Request
from starlette.types import Message, Receive, Scope, Send

from services.api.problems import CrashGuard, install
from services.ops.localstack import free_port


def _app() -> FastAPI:
    app = FastAPI()
    install(app)
    app.add_middleware(CrashGuard)

    @app.get("/peer")
    async def peer(request: Request) -> dict[str, int]:
        assert request.client is not None
        return {"port": request.client.port}

    @app.get("/bug")
    async def bug() -> None:
        raise RuntimeError("internal detail that must not leak")

    @app.get("/db-lost")
    async def db_lost() -> None:
        raise psycopg.OperationalError("server closed the connection unexpectedly")

    @app.get("/pool-timeout")
    async def pool_timeout() -> None:
        raise psycopg_pool.PoolTimeout("couldn't get a connection after 30.00 sec")

    @app.get("/nats-timeout")
    async def nats_timeout() -> None:
        raise nats.errors.TimeoutError

    return app


@pytest.fixture
async def base_url() -> AsyncIterator[str]:
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(_app(), host="127.0.0.1", port=port, log_level="critical", http="h11"))
    task = asyncio.create_task(server.serve())
    while not server.started:
        await asyncio.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        await task


@pytest.mark.parametrize(
    ("path", "status", "code"),
    [
        ("/bug", 500, "internal_error"),
        ("/db-lost", 503, "unavailable"),
        ("/pool-timeout", 503, "unavailable"),
        ("/nats-timeout", 503, "unavailable"),
    ],
)
async def test_an_error_keeps_the_connection_and_answers_a_problem(
    base_url: str, path: str, status: int, code: str
) -> None:
    async with httpx.AsyncClient(base_url=base_url) as client:
        port = (await client.get("/peer")).json()["port"]
        for _ in range(3):
            r = await client.get(path)
            assert r.status_code == status
            assert r.headers["content-type"] == "application/problem+json"
            body = r.json()
            assert body["code"] == code
            assert "internal detail" not in r.text
            assert (await client.get("/peer")).json()["port"] == port  # the same connection


async def _answering(scope: Scope, receive: Receive, send: Send) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"x" * 65_536})


@pytest.mark.parametrize(
    ("error", "raised"),
    [
        ("unable to perform operation on <TCPTransport closed=True reading=False>; the handler is closed", False),
        ("something else went wrong while writing", True),
    ],
    ids=["client-gone", "another-error"],
)
async def test_a_client_gone_while_its_answer_is_written_is_no_error(
    caplog: pytest.LogCaptureFixture, error: str, raised: bool
) -> None:
    """The soak's clients that closed without reading their answers: uvloop refuses the write on
    the transport it closed, and each was a traceback at ERROR. Only that refusal is quiet."""

    async def send(message: Message) -> None:
        if message["type"] == "http.response.body":
            raise RuntimeError(error)

    async def receive() -> Message:
        return {"type": "http.request", "body": b"", "more_body": False}

    scope: Scope = {"type": "http", "method": "GET", "path": "/history", "headers": []}
    guard = CrashGuard(_answering)
    with caplog.at_level(logging.DEBUG, logger="chronicle.api"):
        if raised:
            with pytest.raises(RuntimeError, match="something else"):
                await guard(scope, receive, send)
        else:
            await guard(scope, receive, send)
    levels = {r.levelno for r in caplog.records if r.name == "chronicle.api"}
    assert levels == ({logging.DEBUG} if not raised else set())
