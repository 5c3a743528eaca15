"""Each long-running process (`chronicle api`, `projector`, `compactor`, `commands`), run as the
real CLI, whose nats-server is killed (``kill -9``) under it and which is then stopped (SIGTERM,
as ``chronicle up`` stops the stack when its nats-server exits) before the server is back: it
stops at once, exit status 0, without a traceback, having logged a bounded number of lines about
reconnecting; the API answers the requests it had in flight ``503`` problem+json ``unavailable``
(docs/reliability.md).

An SRE trial saw, with four writers appending through the API: the in-flight appends answered a
plain ``500`` after the API's 10 s graceful stop (uvicorn cancelled them: "Exception in ASGI
application" tracebacks), the API and the projector exit 1 with a ``RuntimeError: unable to
perform operation on <TCPTransport closed=True>`` traceback (nats-py's close flushing onto the
lost socket), and a ``ConnectionRefusedError`` line per reconnect attempt per process (two a
second each)."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from services.settings import Settings
from tests.conftest import KEYS
from tests.e2e.own_nats import READY, OwnNats, own_stack_of, running

WRITERS = 4
DOWN_S = 3.0
"""How long the server is gone before the process is stopped: six reconnect attempts (0.5 s apart)."""
STOP_S = 6.0
"""How long the stop may take: the API's second for the requests in flight, closing, exiting (it
took the API's whole 10 s graceful stop and more)."""
RECONNECT_LINES = 2
"""The most lines an outage of :data:`DOWN_S` may log about failed reconnects (it logged one per
attempt: six)."""


@pytest.fixture
def own_stack(tmp_path: Path, pg_admin: str, s3_endpoint: str) -> Iterator[tuple[Settings, OwnNats]]:
    with own_stack_of(tmp_path, pg_admin, s3_endpoint) as stack:
        yield stack


async def _write(settings: Settings, answers: list[httpx.Response | Exception], done: asyncio.Event) -> None:
    """Append to a session of its own until ``done``, keeping each answer (or the error of a
    request not answered); a refused connection (the API stopped listening) ends it."""
    sid = f"s-{uuid.uuid4().hex[:8]}"
    async with httpx.AsyncClient(
        base_url=f"http://127.0.0.1:{settings.api_port}",
        headers={"Authorization": f"Bearer {KEYS['tenant-a']}"},
        timeout=30,
    ) as client:
        while not done.is_set():
            message = {"id": f"m{uuid.uuid4().hex[:8]}", "role": "user", "parts": [{"type": "text", "text": "hi"}]}
            try:
                answers.append(await client.post(f"/v1/sessions/{sid}/messages", json={"message": message}))
            except httpx.ConnectError:
                return
            except httpx.HTTPError as exc:
                answers.append(exc)
                return


def _shown(answer: httpx.Response | Exception) -> Any:
    if isinstance(answer, Exception):
        return repr(answer)
    return answer.status_code, answer.headers.get("content-type"), answer.text[:200]


@pytest.mark.parametrize("command", list(READY))
async def test_a_process_stopped_while_its_nats_server_is_killed_stops_at_once_without_a_traceback(
    own_stack: tuple[Settings, OwnNats], command: str
) -> None:
    settings, server = own_stack
    output = server.tmp / f"{command}.log"
    answers: list[httpx.Response | Exception] = []
    done = asyncio.Event()
    async with running(settings, command, output) as proc:
        writers = [
            asyncio.create_task(_write(settings, answers, done)) for _ in range(WRITERS if command == "api" else 0)
        ]
        if writers:
            async with asyncio.timeout(30):
                while sum(isinstance(a, httpx.Response) and a.status_code == 201 for a in answers) < 20:
                    await asyncio.sleep(0.05)
        server.kill()
        before = len(answers)  # what comes next was answered after the kill (a 201 stored just before it)
        await asyncio.sleep(DOWN_S)
        assert proc.returncode is None, output.read_text()
        proc.send_signal(signal.SIGTERM)
        began = time.monotonic()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(proc.wait(), STOP_S * 3)
        took = time.monotonic() - began
        done.set()
        async with asyncio.timeout(30):
            await asyncio.gather(*writers)
    said = output.read_text()
    assert proc.returncode == 0, said
    assert took < STOP_S, f"stopped in {took:.1f} s:\n{said}"
    assert "Traceback" not in said, said
    refused = [line for line in said.splitlines() if "refused" in line.lower()]
    assert len(refused) <= RECONNECT_LINES, said
    after = answers[before:]
    if command == "api":
        for answer in after:
            assert isinstance(answer, httpx.Response), _shown(answer)
            assert answer.status_code in (201, 503), _shown(answer)
        unavailable = [a for a in after if isinstance(a, httpx.Response) and a.status_code == 503]
        assert len(unavailable) >= WRITERS - 1, [_shown(a) for a in after]  # one may have been between requests
        for answer in unavailable:
            assert answer.headers["content-type"] == "application/problem+json", _shown(answer)
            assert answer.json()["code"] == "unavailable", _shown(answer)
