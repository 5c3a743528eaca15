"""E2E fixtures: `chronicle api`, `chronicle projector` and `chronicle commands` as real processes,
spoken to over HTTP (and NATS)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import AsyncIterator, Iterator

import httpx
import pytest

from bench.support import settings_env
from services.ops.localstack import free_port, wait_for_port
from services.ops.natsconf import NatsAccess
from services.settings import Settings
from tests.conftest import KEYS, make_settings
from tests.support import nats_server, scratch_database


@pytest.fixture(scope="session")
def e2e_db(pg_admin: str) -> Iterator[str]:
    """A database of the e2e stack's own: one database holds one stream's read models."""
    with scratch_database(pg_admin) as url:
        yield url


@pytest.fixture(scope="session")
def api_settings(tmp_path_factory: pytest.TempPathFactory, e2e_db: str, s3_endpoint: str) -> Iterator[Settings]:
    """The e2e stack's settings, on a nats-server of its own configured from them: the operator
    and the NATS identities of tenant-a and tenant-b (derived from their API keys)."""
    port = free_port()
    settings = make_settings(f"nats://127.0.0.1:{port}", e2e_db, api_port=free_port(), s3_endpoint=s3_endpoint)
    with nats_server(tmp_path_factory.mktemp("e2e-nats"), NatsAccess.of(settings), port=port):
        yield settings


@pytest.fixture(scope="session")
def api_url(api_settings: Settings) -> Iterator[str]:
    env = settings_env(api_settings)
    subprocess.run([sys.executable, "-m", "services.ops.cli", "migrate"], env=env, check=True, capture_output=True)
    procs = [
        subprocess.Popen([sys.executable, "-m", "services.ops.cli", "projector"], env=env),
        subprocess.Popen([sys.executable, "-m", "services.ops.cli", "commands"], env=env),
        subprocess.Popen([sys.executable, "-m", "services.ops.cli", "api"], env=env),
    ]
    try:
        wait_for_port("127.0.0.1", api_settings.api_port, procs[-1], "chronicle api", timeout=30)
        yield f"http://127.0.0.1:{api_settings.api_port}"
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait(timeout=20)


@pytest.fixture
async def client(api_url: str) -> AsyncIterator[httpx.AsyncClient]:
    """Authenticated as tenant-a."""
    headers = {"Authorization": f"Bearer {KEYS['tenant-a']}"}
    async with httpx.AsyncClient(base_url=api_url, headers=headers, timeout=30) as c:
        yield c


@pytest.fixture
async def client_b(api_url: str) -> AsyncIterator[httpx.AsyncClient]:
    """Authenticated as tenant-b."""
    headers = {"Authorization": f"Bearer {KEYS['tenant-b']}"}
    async with httpx.AsyncClient(base_url=api_url, headers=headers, timeout=30) as c:
        yield c


@pytest.fixture
async def anon(api_url: str) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=api_url, timeout=30) as c:
        yield c
