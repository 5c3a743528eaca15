"""readyz over HTTP: 503 with the reason once the projector stops while events wait."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
from collections.abc import Iterator

import httpx
import pytest

from bench.support import settings_env
from events.publisher import Publisher
from services.ops.localstack import free_port, wait_for_port
from services.settings import Settings
from tests.conftest import KEYS, make_settings, operator_nats
from tests.integration.helpers import appended
from tests.support import scratch_database

pytestmark = pytest.mark.skipif(
    "readiness_stall_s" not in Settings.model_fields, reason="the readiness_stall_s setting is not there yet"
)


@pytest.fixture
def own_settings(nats_url: str, pg_admin: str, s3_endpoint: str) -> Iterator[Settings]:
    with scratch_database(pg_admin) as db:
        yield make_settings(nats_url, db, api_port=free_port(), s3_endpoint=s3_endpoint, readiness_stall_s=1)


def start(command: str, settings: Settings) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-m", "services.ops.cli", command], env=settings_env(settings))


async def readyz_until(client: httpx.AsyncClient, status: int, timeout: float = 30) -> httpx.Response:
    """Poll readyz until it answers ``status`` (the positive signal), within ``timeout``."""
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        r = await client.get("/readyz")
        if r.status_code == status:
            return r
        assert asyncio.get_running_loop().time() < deadline, r.text
        await asyncio.sleep(0.2)


async def test_readyz_goes_503_when_the_projector_stops_while_events_wait(own_settings: Settings) -> None:
    env = settings_env(own_settings)
    subprocess.run([sys.executable, "-m", "services.ops.cli", "migrate"], env=env, check=True, capture_output=True)
    projector, api = start("projector", own_settings), start("api", own_settings)
    try:
        wait_for_port("127.0.0.1", own_settings.api_port, api, "chronicle api", timeout=30)
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{own_settings.api_port}", timeout=30) as client:
            nc = await operator_nats(own_settings.nats_url)
            try:
                pub = Publisher(nc.jetstream(), own_settings.layout())
                first = await pub.publish(appended("tenant-a", "ready", "m0", None))
                history = await client.get(
                    "/v1/sessions/ready/history",
                    params={"min_seq": first.seq},
                    headers={"Authorization": f"Bearer {KEYS['tenant-a']}"},
                )
                assert [m["id"] for m in history.json()["messages"]] == ["m0"]  # the projector runs
                await readyz_until(client, 200)
                projector.terminate()
                projector.wait(timeout=20)
                await pub.publish(appended("tenant-a", "ready", "m1", "m0"))
            finally:
                await nc.close()
            r = await readyz_until(client, 503)
            body = r.json()
            assert body["ready"] is False
            assert any("not advanced" in reason for reason in body["reasons"]), body
    finally:
        for p in (projector, api):
            p.terminate()
        for p in (projector, api):
            p.wait(timeout=20)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
async def test_the_api_stops_on_a_signal_as_the_other_processes_do(own_settings: Settings, sig: int) -> None:
    """Exit 0 once its adapters are closed, nothing on stderr (it opens them before it serves; the
    signal uvicorn raises again once it has stopped ended the process before they closed)."""
    api = subprocess.Popen(
        [sys.executable, "-m", "services.ops.cli", "api"], env=settings_env(own_settings), stderr=subprocess.PIPE
    )
    try:
        wait_for_port("127.0.0.1", own_settings.api_port, api, "chronicle api", timeout=30)
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{own_settings.api_port}", timeout=30) as client:
            assert (await client.get("/healthz")).status_code == 200
        api.send_signal(sig)
        _, err = api.communicate(timeout=20)
    finally:
        if api.poll() is None:
            api.kill()
            api.wait()
    assert api.returncode == 0, err.decode()
    assert err.decode().strip() == ""


async def test_readyz_names_the_compactor_once_its_process_is_killed(own_settings: Settings) -> None:
    """(A dead compactor left readyz at 200 while compaction requests waited for no one.) Killed
    with SIGKILL, it cleans nothing up: its presence ends with its connection."""
    settings = own_settings.model_copy(update={"readiness_compactor": True, "readiness_stall_s": 60.0})
    env = settings_env(settings)
    subprocess.run([sys.executable, "-m", "services.ops.cli", "migrate"], env=env, check=True, capture_output=True)
    procs = [start("projector", settings), start("api", settings), start("compactor", settings)]
    try:
        wait_for_port("127.0.0.1", settings.api_port, procs[1], "chronicle api", timeout=30)
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{settings.api_port}", timeout=30) as client:
            r = await readyz_until(client, 200)
            assert r.json()["compactor"] is True
            procs[2].kill()
            procs[2].wait(timeout=20)
            r = await readyz_until(client, 503)
            body = r.json()
            assert body["compactor"] is False
            assert [reason for reason in body["reasons"] if reason.startswith("no compactor is running")], body
    finally:
        for p in procs:
            if p.poll() is None:
                p.terminate()
        for p in procs:
            p.wait(timeout=20)
