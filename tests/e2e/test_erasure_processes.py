"""The outside-in trial, as ``chronicle up --api-processes 2`` runs it: a session erased through
one API process takes no write from another API process, nor from ``chronicle commands``, that
wrote to it before (``410 session_erased``), and no event lands after ``session.erased``. Real
processes (a projector, two APIs, the commands service), a nats-server, Postgres, encryption on."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Iterator

import httpx
import nats.errors
import pytest
from nats.aio.client import Client as NatsClient

from bench.support import settings_env
from services.ops.localstack import free_port, wait_for_port
from services.settings import Settings
from tests.conftest import KEYS, tenant_nats_settings
from tests.integration.test_commands_nats import connected, message, request
from tests.support import chronicle_cli


@pytest.fixture(scope="module")
def settings(tmp_path_factory: pytest.TempPathFactory, pg_admin: str, s3_endpoint: str) -> Iterator[Settings]:
    with tenant_nats_settings(tmp_path_factory.mktemp("erase-procs"), pg_admin, s3_endpoint, encryption=True) as s:
        yield s


def start(settings: Settings, role: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-m", "services.ops.cli", role], env=settings_env(settings))


@contextlib.asynccontextmanager
async def api_process(settings: Settings) -> AsyncIterator[httpx.AsyncClient]:
    """A ``chronicle api`` process and tenant-a's client of it. The machine is shared: a port
    picked free may be taken before the API binds it, so the API is asked who it is."""
    headers = {"Authorization": f"Bearer {KEYS['tenant-a']}"}
    for _ in range(3):
        mine = settings.model_copy(update={"api_port": free_port()})
        proc = start(mine, "api")
        try:
            wait_for_port("127.0.0.1", mine.api_port, proc, "chronicle api", timeout=30)
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{mine.api_port}", headers=headers) as c:
                if proc.poll() is None and (await c.get("/v1/nats")).status_code == 200:
                    yield c
                    return
        finally:
            proc.terminate()
            proc.wait(timeout=20)
    pytest.fail("the API never answered as this stack's")


@pytest.fixture(scope="module")
async def stack(settings: Settings) -> AsyncIterator[tuple[httpx.AsyncClient, httpx.AsyncClient, NatsClient]]:
    """The eraser's API, another API, and tenant-a's NATS connection to ``chronicle commands``."""
    assert chronicle_cli(settings, "migrate").returncode == 0
    procs = [start(settings, "projector"), start(settings, "commands")]
    try:
        async with (
            api_process(settings) as eraser,
            api_process(settings) as writer,
            connected(settings, "tenant-a") as (nc, _),
        ):
            for _ in range(300):  # the positive signal: the commands service answers
                with contextlib.suppress(nats.errors.NoRespondersError, nats.errors.TimeoutError):
                    status, _ = await request(nc, settings, "session.create", {"id": f"ready-{uuid.uuid4().hex[:8]}"})
                    assert status == 201
                    break
                await nc.flush()
            else:
                pytest.fail("chronicle commands never answered")
            yield eraser, writer, nc
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait(timeout=20)


async def test_processes_that_wrote_before_an_erasure_elsewhere_refuse_every_write(
    stack: tuple[httpx.AsyncClient, httpx.AsyncClient, NatsClient], settings: Settings
) -> None:
    eraser, writer, nc = stack
    sid = "s-" + uuid.uuid4().hex[:10]
    assert (await writer.post(f"/v1/sessions/{sid}/messages", json={"message": message("h1")})).status_code == 201
    for i in range(3):  # the commands service's chain then knows the session's ids
        status, body = await request(nc, settings, "append", {"session_id": sid, "message": message(f"u{i}")})
        assert status == 201, body
    erased = await eraser.post(f"/v1/sessions/{sid}:erase")
    assert erased.status_code == 200, erased.text
    answers = {
        "NATS append": await request(nc, settings, "append", {"session_id": sid, "message": message("u9")}),
        "NATS session.create": await request(nc, settings, "session.create", {"id": sid}),
    }
    for name, r in {
        "HTTP append": await writer.post(f"/v1/sessions/{sid}/messages", json={"message": message("h2")}),
        "HTTP create": await writer.post("/v1/sessions", json={"id": sid}),
    }.items():
        answers[name] = (r.status_code, r.json())
    assert {k: (s, b.get("code")) for k, (s, b) in answers.items()} == dict.fromkeys(answers, (410, "session_erased"))
    events = await eraser.get(f"/v1/sessions/{sid}/events")
    last = json.loads(events.text.splitlines()[-1])
    assert (last["seq"], last["event"]["type"]) == (erased.json()["seq"], "session.erased")
