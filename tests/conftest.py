"""Shared fixtures: real NATS JetStream and real Postgres, started once per run."""

from __future__ import annotations

import asyncio
import contextlib
import os
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import nats
import psycopg
import pytest
from nats.aio.client import Client as NatsClient

from events.credentials import nkey_public_key, tenant_inbox_prefix, tenant_nkey_seed
from events.subjects import SubjectLayout
from projections.keystore import new_kek_line
from services.bootstrap import Container, open_container
from services.ops.localstack import free_port, with_database
from services.ops.natsconf import NatsAccess
from services.settings import Settings, api_key_entry, new_operator_seed
from tests.support import nats_server, postgres_server, s3_server, scratch_database

KEYS = {"tenant-a": "key-a-" + uuid.uuid4().hex, "tenant-b": "key-b-" + uuid.uuid4().hex}
READ_ONLY_KEY = "key-a-ro-" + uuid.uuid4().hex
"""A read-only key of tenant-a (an auditor's): every stack accepts it."""
OPERATOR_SEED = new_operator_seed()  # Chronicle's own NATS identity in this test run
TEST_KEK = new_kek_line()  # the key-encryption key of the stacks that seal
SEALING = os.environ.get("CHRONICLE_TEST_ENCRYPTION") == "1"
"""``CHRONICLE_TEST_ENCRYPTION=1`` runs every stack of the suite with encryption on (its default
here is off, as a deployment's; the erasure tests turn it on themselves)."""


@pytest.fixture(scope="session")
def nats_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The run's shared nats-server: the operator identity only (tests of tenant credentials
    start a server of their own, configured for their settings with :func:`tenant_nats`)."""
    access = NatsAccess((nkey_public_key(OPERATOR_SEED),), SubjectLayout())
    with nats_server(tmp_path_factory.mktemp("nats"), access) as url:
        yield url


async def operator_nats(url: str) -> NatsClient:
    """A connection as Chronicle's operator identity (what the services use)."""
    return await nats.connect(url, nkeys_seed_str=OPERATOR_SEED)


async def tenant_nats(url: str, tenant: str, key: str | None = None) -> NatsClient:
    """A connection with ``tenant``'s NATS credentials (derived from its API key)."""
    seed = tenant_nkey_seed(key if key is not None else KEYS[tenant])
    return await nats.connect(url, nkeys_seed_str=seed, inbox_prefix=tenant_inbox_prefix(tenant), allow_reconnect=False)


@pytest.fixture(scope="session")
def s3_endpoint() -> Iterator[str]:
    with s3_server() as endpoint:
        yield endpoint


@pytest.fixture(scope="session")
def pg_admin(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with postgres_server(tmp_path_factory.mktemp("pg")) as url:
        yield url


def make_settings(nats_url: str, db_url: str, **overrides: object) -> Settings:
    tag = uuid.uuid4().hex[:8]
    base: dict[str, object] = {
        "nats_url": nats_url,
        "database_url": db_url,
        "stream": f"T{tag}",
        "subject_prefix": f"t{tag}.ev",
        "blob_bucket": f"b{tag}",
        "partitions": 4,
        "projector_name": f"projector-{tag}",
        "api_keys": [
            *(api_key_entry(t, k) for t, k in KEYS.items()),
            api_key_entry("tenant-a", READ_ONLY_KEY, read_only=True),
        ],
        "nats_nkey_seed": OPERATOR_SEED,
        "read_wait_timeout_s": 10.0,
        "data_dir": "/nonexistent",
        "s3_access_key": "testing",
        "s3_secret_key": "testing",
        "s3_region": "us-east-1",
        "readiness_compactor": False,  # most tests run no compactor; the readiness tests of one set it
        "readiness_commands": False,  # nor a commands service
        "compaction_backoff_s": (0.5, 1.0),  # a failed or abandoned summary is retried within the tests' waits
        "kek": TEST_KEK,
        "encryption": SEALING,
    }
    base.update(overrides)
    return Settings.model_validate(base)


@pytest.fixture(scope="session")
def db_url(pg_admin: str) -> Iterator[str]:
    with scratch_database(pg_admin) as url:
        yield url


@pytest.fixture
def fresh_db(pg_admin: str) -> Iterator[str]:
    """A database of its own, for tests that drop or compare whole read models."""
    with scratch_database(pg_admin) as url:
        yield url


@pytest.fixture
def backup(pg_admin: str) -> Iterator[Callable[[str], str]]:
    """``take(url)``: a copy of that database as it is now (the stack using it stopped), as a
    restore of last night's backup gives it back; dropped at the end."""
    made: list[str] = []

    def take(url: str) -> str:
        source = psycopg.conninfo.conninfo_to_dict(url)["dbname"]
        name = f"chronicle_backup_{uuid.uuid4().hex[:12]}"
        with psycopg.connect(pg_admin, autocommit=True) as conn:
            conn.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s AND pid <> pg_backend_pid()",
                (source,),
            )
            conn.execute(f'CREATE DATABASE "{name}" TEMPLATE "{source}"')
        made.append(name)
        return with_database(pg_admin, name)

    yield take
    with psycopg.connect(pg_admin, autocommit=True) as conn:
        for name in made:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@contextlib.asynccontextmanager
async def running_stack(settings: Settings, *, projector: bool = True) -> AsyncIterator[Container]:
    async with open_container(settings) as c:
        stop = asyncio.Event()
        task = asyncio.create_task(c.projector().run(stop)) if projector else None
        try:
            yield c
        finally:
            stop.set()
            if task is not None:
                await asyncio.wait_for(task, timeout=15)


@contextlib.contextmanager
def tenant_nats_settings(tmp: Path, pg_admin: str, s3_endpoint: str, **overrides: object) -> Iterator[Settings]:
    """Settings with a scratch database, command subjects of their own, and a nats-server of their
    own configured from them (the tenants' NKeys: requests and publishing as a tenant)."""
    port = free_port()
    with scratch_database(pg_admin) as db:
        s = make_settings(
            f"nats://127.0.0.1:{port}",
            db,
            s3_endpoint=s3_endpoint,
            command_prefix=f"c{uuid.uuid4().hex[:8]}.cmd",
            **overrides,
        )
        with nats_server(tmp, NatsAccess.of(s), port=port):
            yield s


@pytest.fixture(scope="session")
async def stack(nats_url: str, db_url: str, s3_endpoint: str) -> AsyncIterator[Container]:
    """API-less stack shared by integration tests: container + an in-process projector."""
    async with running_stack(make_settings(nats_url, db_url, s3_endpoint=s3_endpoint)) as c:
        yield c


@pytest.fixture
def new_id() -> Callable[[str], str]:
    def make(prefix: str) -> str:
        return f"{prefix}-{uuid.uuid4().hex[:12]}"

    return make


@pytest.fixture(scope="session")
def tmp_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("chronicle")
