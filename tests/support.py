"""Test infrastructure: a pinned nats-server and a scratch Postgres database per test run."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import secrets
import subprocess
import sys
import tempfile
import uuid
from collections.abc import AsyncIterator, Iterator, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import nkeys
import psycopg
import uvicorn
from starlette.types import ASGIApp

from services.ops.localstack import (
    free_port,
    postgres_reachable,
    start_cluster_node,
    start_embedded_postgres,
    start_nats,
    wait_for_port,
    with_database,
)
from services.ops.natsconf import ClusterNode, NatsAccess
from services.ops.processes import ApiServer, api_config
from services.settings import Settings

DEFAULT_PG = "postgresql://postgres@127.0.0.1:5432/postgres"


@contextlib.contextmanager
def nats_server(
    tmp: Path, access: NatsAccess, *, port: int | None = None, extra: Mapping[str, Any] | None = None
) -> Iterator[str]:
    """A pinned nats-server configured as Chronicle runs it: no anonymous access, ``access``'s users."""
    port = port or free_port()
    proc = start_nats(port, tmp / "nats", tmp / "nats.log", access, extra)
    try:
        yield f"nats://127.0.0.1:{port}"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()


def chronicle_cli(settings: Any, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """``chronicle <args>`` as a process with exactly these settings (``CHRONICLE_*``); its result."""
    from bench.support import settings_env

    return subprocess.run(
        [sys.executable, "-m", "services.ops.cli", *args],
        env=settings_env(settings),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


@contextlib.asynccontextmanager
async def served(app: ASGIApp, settings: Settings | None = None) -> AsyncIterator[str]:
    """``app`` served by uvicorn on a free loopback port (real HTTP), with the HTTP protocol the
    API is served with (``settings``' bounds on a request's head, default ones without); yields its
    base URL."""
    port = free_port()
    config = api_config(app, settings or Settings(), host="127.0.0.1", port=port, log_level="error")
    stopping = getattr(getattr(app, "state", None), "stopping", None)  # Chronicle's API: its open answers end
    server = ApiServer(config, stopping) if isinstance(stopping, asyncio.Event) else uvicorn.Server(config)
    task = asyncio.create_task(server.serve())
    while not server.started:
        assert not task.done(), "uvicorn did not start"
        await asyncio.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        await task


@contextlib.contextmanager
def nats_cluster(tmp: Path, access: NatsAccess, *, size: int = 3) -> Iterator[list[str]]:
    """``size`` pinned nats-servers clustered on loopback (free ports, a fresh route password),
    configured as Chronicle runs them; their client URLs. JetStream may still be electing its
    meta leader when this yields (``services.bootstrap.when_jetstream_ready``)."""
    with nats_cluster_nodes(tmp, access, size=size) as nodes:
        yield [url for url, _ in nodes]


@contextlib.contextmanager
def nats_cluster_nodes(
    tmp: Path, access: NatsAccess, *, size: int = 3
) -> Iterator[list[tuple[str, subprocess.Popen[bytes]]]]:
    """:func:`nats_cluster`, each node's client URL with its process (to stop or kill one)."""
    nodes = [(free_port(), ClusterNode(f"n{i + 1}", "127.0.0.1", free_port())) for i in range(size)]
    password = secrets.token_urlsafe(16)
    procs: list[subprocess.Popen[bytes]] = []
    try:
        for i in range(size):
            procs.append(start_cluster_node(nodes, i, tmp, access, password))
        yield [(f"nats://127.0.0.1:{port}", proc) for (port, _), proc in zip(nodes, procs, strict=True)]
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()


@contextlib.contextmanager
def postgres_server(tmp: Path) -> Iterator[str]:
    """An admin URL: the machine's Postgres when reachable, else embedded-postgres."""
    url = os.environ.get("CHRONICLE_TEST_POSTGRES", DEFAULT_PG)
    if postgres_reachable(url):
        yield url
        return
    uri, server = start_embedded_postgres(tmp / "pg")
    try:
        yield uri
    finally:
        server.cleanup()


@contextlib.contextmanager
def scratch_database(admin_url: str) -> Iterator[str]:
    name = "chronicle_test_" + uuid.uuid4().hex[:12]
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield with_database(admin_url, name)
    finally:
        with psycopg.connect(admin_url, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@contextlib.contextmanager
def s3_server() -> Iterator[str]:
    """moto's standalone S3 server on a free loopback port (stands in for MinIO)."""
    port = free_port()
    exe = str(Path(sys.executable).parent / "moto_server")
    with tempfile.TemporaryDirectory(prefix="moto-") as tmp:
        # the request recorder (/moto-api/recorder/…) writes here, not into the working directory
        env = {**os.environ, "MOTO_RECORDER_FILEPATH": str(Path(tmp) / "recording.jsonl")}
        proc = subprocess.Popen(
            [exe, "-H", "127.0.0.1", "-p", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env
        )
        try:
            wait_for_port("127.0.0.1", port, proc, "moto_server")
            yield f"127.0.0.1:{port}"
        finally:
            proc.terminate()
            proc.wait(timeout=10)


async def nats_handshake(url: str, seed: str | None) -> str:
    """The server's answer to a CONNECT (signed with ``seed``'s NKey, or anonymous) and a PING,
    spoken on a plain socket (nats-py leaks the socket of a refused connection)."""
    host, port = url.removeprefix("nats://").rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        info = json.loads((await reader.readline()).decode().removeprefix("INFO "))
        assert info["auth_required"] is True
        options: dict[str, object] = {"verbose": False, "pedantic": False, "protocol": 1}
        if seed is not None:
            pair = nkeys.from_seed(bytearray(seed.encode()))
            options["nkey"] = pair.public_key.decode()
            options["sig"] = base64.urlsafe_b64encode(pair.sign(info["nonce"].encode())).decode().rstrip("=")
        writer.write(b"CONNECT " + json.dumps(options).encode() + b"\r\nPING\r\n")
        await writer.drain()
        return (await asyncio.wait_for(reader.readline(), 5)).decode().strip()
    finally:
        writer.close()
        await writer.wait_closed()


async def migrate_before(conn: Any, version: int) -> None:
    """Bring an empty database to the schema just before migration ``version`` (the state a
    database written by an older Chronicle is in), recorded as ``migrate`` records it."""
    from projections.migrate import migration_files

    await conn.execute(
        "CREATE TABLE schema_migrations (version int PRIMARY KEY, name text NOT NULL, "
        "applied_at timestamptz NOT NULL DEFAULT now())"
    )
    for number, name, sql in migration_files():
        if number < version:
            await conn.execute(sql.encode())
            await conn.execute("INSERT INTO schema_migrations (version, name) VALUES (%s, %s)", (number, name))


class Cuttable:
    """A TCP proxy on a free loopback port in front of the Postgres of ``db_url`` (real): ``cut()``
    drops every connection and refuses new ones, as a database that went away; ``silent = True``
    keeps every connection open and forwards nothing, as a network that drops packets;
    ``restore()`` accepts again. ``url`` is ``db_url`` through the proxy."""

    def __init__(self, db_url: str) -> None:
        parts = urlsplit(db_url)
        self.host, self.port = parts.hostname or "127.0.0.1", parts.port or 5432
        self.listen_port = free_port()
        user, _, _ = parts.netloc.rpartition("@")
        hostport = f"127.0.0.1:{self.listen_port}"
        self.url = urlunsplit(parts._replace(netloc=f"{user}@{hostport}" if user else hostport))
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self.silent = False

    async def restore(self) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", self.listen_port)

    async def cut(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None
        for w in list(self._writers):
            w.transport.abort()
        self._writers.clear()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(self.host, self.port)
        except OSError:
            writer.transport.abort()
            return
        self._writers |= {writer, up_writer}

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            with contextlib.suppress(OSError):
                while data := await src.read(65536):
                    if not self.silent:
                        dst.write(data)
                        await dst.drain()
            dst.transport.abort()

        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))
        self._writers -= {writer, up_writer}
