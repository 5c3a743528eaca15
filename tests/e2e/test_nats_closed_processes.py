"""Each long-running process (`chronicle api`, `projector`, `compactor`, `commands`), run as the
real CLI, stops with exit status 4 when its NATS connection is closed for good, its last line
saying so (``chronicle <process>: NATS at …: the connection was closed for good (…)``), no
traceback (services/ops/processes.py, ``stopped_if_nats_closes``; docs/reliability.md).

A connection is closed for good, never reconnected, when the server answers a protocol error by
closing it: stopping the server would not do (once connected, a process reconnects for as long as
it runs). Each process runs against a nats-server of the test's own, whose ``max_payload`` is then
lowered by a configuration reload (the server applies it to open connections; the clients still
hold the old bound): the next message the process sends over it (the projector's and the
compactor's next pull, the command service's reply, the API's event) closes its connection."""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import nats
import pytest

from services.ops.cli import UNREACHABLE_EXIT
from services.settings import Settings
from tests.conftest import KEYS, OPERATOR_SEED
from tests.e2e.own_nats import READY, OwnNats, own_stack_of, running

LOWERED_MAX_PAYLOAD = 16
"""Under anything a process sends but a pull's ack or a PING (which carry no payload)."""
DEFAULT_MAX_PAYLOAD = 1024 * 1024
EXIT_WAIT_S = 20
"""A process stops within a few seconds of its connection's close (the watch looks every second)."""
ATTEMPTS = 3


@pytest.fixture
def own_stack(tmp_path: Path, pg_admin: str, s3_endpoint: str) -> Iterator[tuple[Settings, OwnNats]]:
    with own_stack_of(tmp_path, pg_admin, s3_endpoint) as stack:
        yield stack


async def _nudge(command: str, settings: Settings) -> None:
    """What makes an idle process send a message: an append to the API, a command to the command
    service (its reply); the projector and the compactor pull every second of their own."""
    if command == "api":
        message = {"id": f"m{uuid.uuid4().hex[:8]}", "role": "user", "parts": [{"type": "text", "text": "hi"}]}
        with contextlib.suppress(httpx.HTTPError):  # answered 503 (its event was not published), or gone
            async with httpx.AsyncClient(
                base_url=f"http://127.0.0.1:{settings.api_port}",
                headers={"Authorization": f"Bearer {KEYS['tenant-a']}"},
                timeout=5,
            ) as client:
                await client.post(f"/v1/sessions/s-{uuid.uuid4().hex[:8]}/messages", json={"message": message})
    elif command == "commands":
        nc = await nats.connect(settings.nats_url, nkeys_seed_str=OPERATOR_SEED, allow_reconnect=False)
        try:  # a request within the lowered bound; the problem it is answered with is not
            with contextlib.suppress(nats.errors.Error, TimeoutError):
                await nc.request(settings.layout().command_subject("tenant-a", "append"), b"{}", timeout=1)
        finally:
            await nc.close()


@pytest.mark.parametrize("command", list(READY))
async def test_a_process_whose_nats_connection_closes_for_good_exits_4_in_one_line(
    own_stack: tuple[Settings, OwnNats], command: str
) -> None:
    """The server's close may reach a client that is sending at that moment as a reset: it then
    reconnects, learns the lowered bound and never goes over it again (the process stays up, as it
    should). That attempt is given up, the bound restored, and the process started anew."""
    settings, server = own_stack
    tried: list[str] = []
    for attempt in range(ATTEMPTS):
        output = server.tmp / f"{command}-{attempt}.log"
        async with running(settings, command, output) as proc:
            await server.reload(LOWERED_MAX_PAYLOAD)
            if await _exited(proc, command, settings):
                break
        tried.append(output.read_text())
        await server.reload(DEFAULT_MAX_PAYLOAD)
    else:
        pytest.fail(f"still running {EXIT_WAIT_S} s after its connection's close, {ATTEMPTS} times:\n" + tried[-1])
    said = output.read_text()
    assert proc.returncode == UNREACHABLE_EXIT, said
    assert "Traceback" not in said, said
    last = said.strip().splitlines()[-1]
    assert last.startswith(f"chronicle {command}: NATS at {settings.nats_url}: the connection was closed for good ("), (
        last
    )
    assert "maximum payload violation" in last
    assert last.endswith("the process stopped; start it again"), last


async def _exited(proc: asyncio.subprocess.Process, command: str, settings: Settings) -> bool:
    """Whether ``proc`` exits within :data:`EXIT_WAIT_S`, nudged (:func:`_nudge`) meanwhile."""
    deadline = time.monotonic() + EXIT_WAIT_S
    while proc.returncode is None and time.monotonic() < deadline:
        await _nudge(command, settings)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(proc.wait(), 1)
    return proc.returncode is not None
