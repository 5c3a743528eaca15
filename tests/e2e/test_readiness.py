"""readyz over HTTP: 503 with the reason once the projector stops while events wait."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Callable, Iterator

import httpx
import pytest

from bench.support import settings_env
from events.publisher import Publisher
from services.compaction.queue import KIND, request
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


Proc = subprocess.Popen[bytes]


def start(command: str, settings: Settings) -> Proc:
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
    """Exit 0 once its adapters are closed, nothing on stderr but its start line (it opens them before it serves; the
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
    lines = err.decode().splitlines()
    assert [line for line in lines if " INFO chronicle: api keys: " not in line] == [], err.decode()
    assert len(lines) == 1, err.decode()  # its start line, naming the keys in force, and nothing else


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


async def oldest_wait_until(client: httpx.AsyncClient, done: Callable[[float], bool], timeout: float = 30) -> float:
    """Poll /metrics until ``chronicle_compaction_oldest_wait_seconds`` is ``done``."""
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        text = (await client.get("/metrics")).text
        line = next(x for x in text.splitlines() if x.startswith("chronicle_compaction_oldest_wait_seconds "))
        if done(waited := float(line.split()[1])):
            return waited
        assert asyncio.get_running_loop().time() < deadline, line
        await asyncio.sleep(0.2)


@contextlib.asynccontextmanager
async def serving(settings: Settings, *commands: str) -> AsyncIterator[tuple[httpx.AsyncClient, list[Proc]]]:
    """A migrated database, ``chronicle api`` and ``commands`` as processes, and a client of the
    API; at the end each is continued (one may be stopped) and terminated."""
    env = settings_env(settings)
    subprocess.run([sys.executable, "-m", "services.ops.cli", "migrate"], env=env, check=True, capture_output=True)
    procs = [start("api", settings)]
    try:
        procs += [start(command, settings) for command in commands]
        wait_for_port("127.0.0.1", settings.api_port, procs[0], "chronicle api", timeout=30)
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{settings.api_port}", timeout=30) as client:
            yield client, procs
    finally:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGCONT)
                p.terminate()
        for p in procs:
            p.wait(timeout=20)


async def request_waits(settings: Settings) -> None:
    """Put a compaction request on the work queue, as the projector does (of no session: a
    compactor that takes it finds nothing due and acknowledges it)."""
    nc = await operator_nats(settings.nats_url)
    try:
        layout = settings.layout()
        req = request("tenant-a", "hung-" + uuid.uuid4().hex[:8], None, 1, 1)
        subject = layout.work_subject(KIND, req.tenant, req.session)
        await nc.jetstream().publish(subject, req.to_json(), stream=layout.work_stream)
    finally:
        await nc.close()


async def test_readyz_names_a_hung_compactor_while_a_request_waits(own_settings: Settings) -> None:
    """(A SIGSTOPped compactor kept its presence lock: readyz said 200 while compaction requests
    waited for good.) The oldest request's wait makes it 503; SIGCONT, and it is taken and ready."""
    settings = own_settings.model_copy(
        update={"readiness_compactor": True, "readiness_compaction_wait_s": 1.0, "readiness_stall_s": 60.0}
    )
    async with serving(settings, "compactor") as (client, (_, compactor)):
        r = await readyz_until(client, 200)
        assert r.json()["compactor"] is True
        assert r.json()["compaction_oldest_wait_s"] == 0
        compactor.send_signal(signal.SIGSTOP)  # hung: its connections, its presence among them, stay open
        await request_waits(settings)
        r = await readyz_until(client, 503)
        body = r.json()
        assert body["compactor"] is True  # its presence is held all the while
        assert body["compaction_oldest_wait_s"] >= 1
        (reason,) = body["reasons"]
        assert reason.startswith("the oldest compaction request has waited"), body
        assert "hung or overloaded" in reason
        assert "restart the `chronicle compactor`" in reason
        compactor.send_signal(signal.SIGCONT)
        await readyz_until(client, 200)  # it asks for work again, and takes the request
        await oldest_wait_until(client, lambda waited: waited == 0)


async def test_readyz_names_a_commands_service_that_is_missing_or_hung(own_settings: Settings) -> None:
    """(Commands over NATS timed out, or had no responders, while readyz said 200.) None running:
    503, none runs; one running: 200; SIGSTOPped: 503, it does not answer; SIGCONT: 200; stopped:
    503 again."""
    settings = own_settings.model_copy(
        update={"readiness_commands": True, "command_prefix": f"c{uuid.uuid4().hex[:8]}.cmd"}
    )
    async with serving(settings) as (client, procs):
        r = await readyz_until(client, 503)
        assert r.json()["commands"] is False
        assert [x for x in r.json()["reasons"] if x.startswith("no commands service is running")], r.json()
        procs.append(commands := start("commands", settings))
        r = await readyz_until(client, 200)
        assert r.json()["commands"] is True
        up = f'chronicle_commands_up{{prefix="{settings.command_prefix}"}} 1.0'
        assert up in (await client.get("/metrics")).text.splitlines()
        commands.send_signal(signal.SIGSTOP)
        r = await readyz_until(client, 503)
        body = r.json()
        assert body["commands"] is False
        assert r.elapsed.total_seconds() < 5  # the ping's 2 s, beside the other probes, not after them
        assert body["reasons"] == [
            "the commands service does not answer (hung or overloaded): no answer to a ping within 2s, so "
            "commands over NATS time out; restart the `chronicle commands` processes"
        ], body
        commands.send_signal(signal.SIGCONT)
        await readyz_until(client, 200)
        commands.terminate()
        commands.wait(timeout=20)
        r = await readyz_until(client, 503)
        assert [x for x in r.json()["reasons"] if x.startswith("no commands service is running")], r.json()


async def test_readyz_asks_neither_where_the_settings_say_so(own_settings: Settings) -> None:
    """``readiness_commands`` false: no commands service runs and readyz is 200, ``commands`` null;
    ``readiness_compaction_wait_s`` 0: a hung compactor with a request waiting leaves it 200."""
    update = {"readiness_compactor": True, "readiness_compaction_wait_s": 0.0, "readiness_commands": False}
    settings = own_settings.model_copy(update={**update, "command_prefix": f"c{uuid.uuid4().hex[:8]}.cmd"})
    async with serving(settings, "compactor") as (client, (_, compactor)):
        r = await readyz_until(client, 200)
        assert r.json()["commands"] is None
        assert "chronicle_commands_up{" not in (await client.get("/metrics")).text  # not asked
        assert r.json()["compaction_oldest_wait_s"] is None  # not asked
        compactor.send_signal(signal.SIGSTOP)
        await request_waits(settings)
        await oldest_wait_until(client, lambda waited: waited > 2)  # /metrics still says how long it waits
        r = await client.get("/readyz")
        assert r.status_code == 200, r.text
