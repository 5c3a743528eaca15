"""Each long-running process (`chronicle api`, `projector`, `compactor`, `commands`), run as the
real CLI, that is stopped (SIGTERM, as systemd, Kubernetes or ``chronicle up`` stop it) while its
Postgres does not answer and its nats-server has been killed (``kill -9``): it exits within
``EXIT_LIMIT_S`` (25 s), exit status 0, without a traceback
(services/ops/processes.py, ``Stopping``; docs/reliability.md).

The database is a listener of the test's own that takes connections and never answers (a host gone
behind a network partition, a Postgres stopped with SIGSTOP): a process starting meets it while it
migrates the database (``CHRONICLE_AUTO_MIGRATE``, the default) or, with that off, after it has
connected to NATS, while it opens its connection pool. A process so stopped ignored SIGTERM: the
migration's connection has no timeout, so it waited for good (only SIGKILL ended it); the pool
waited its 15 s, then the process exited 4 having said that Postgres did not answer. A process
already serving when Postgres goes silent (a proxy of the test's that stops passing anything) and
its nats-server is killed stops within the limit too (that one did before: the projector's runner
bounds its own stop)."""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from bench.support import service
from services.ops.localstack import free_port
from services.settings import Settings
from tests.e2e.own_nats import READY, OwnNats, own_stack_of, running

pytestmark = pytest.mark.timeout(120)

STOP_WAIT_S = 30.0
"""How long the test waits for the exit: the documented limit (25 s, ``EXIT_LIMIT_S``) and a margin."""


@pytest.fixture
def own_stack(tmp_path: Path, pg_admin: str, s3_endpoint: str) -> Iterator[tuple[Settings, OwnNats]]:
    with own_stack_of(tmp_path, pg_admin, s3_endpoint) as stack:
        yield stack


def _at_port(url: str, port: int) -> str:
    """The database URL ``url`` on 127.0.0.1:``port``."""
    parts = urlsplit(url)
    return parts._replace(netloc=f"{parts.username or 'postgres'}@127.0.0.1:{port}").geturl()


async def _kill_nats_and_stop(server: OwnNats, proc: asyncio.subprocess.Process, output: Path) -> None:
    """``kill -9`` of the nats-server, then SIGTERM: the process exits within the limit, status 0,
    without a traceback."""
    server.kill()
    proc.send_signal(signal.SIGTERM)
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(proc.wait(), STOP_WAIT_S)
    said = output.read_text()
    assert proc.returncode is not None, f"still running {STOP_WAIT_S:g} s after SIGTERM:\n{said}"
    assert proc.returncode == 0, said
    assert "Traceback" not in said, said


@contextlib.asynccontextmanager
async def silent_postgres() -> AsyncIterator[tuple[int, asyncio.Event]]:
    """A port that takes TCP connections and never answers one; the event is set at the first."""
    reached = asyncio.Event()
    held: list[asyncio.StreamWriter] = []

    async def hold(_: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        held.append(writer)
        reached.set()

    port = free_port()
    server = await asyncio.start_server(hold, "127.0.0.1", port)
    try:
        yield port, reached
    finally:
        for writer in held:
            writer.close()
        server.close()
        await server.wait_closed()


@pytest.mark.parametrize("migrating", [True, False], ids=["migrating", "opening-the-pool"])
@pytest.mark.parametrize("command", list(READY))
async def test_a_process_stopped_while_postgres_is_silent_and_nats_killed_exits_0_within_the_limit(
    own_stack: tuple[Settings, OwnNats], command: str, migrating: bool
) -> None:
    settings, server = own_stack
    output = server.tmp / f"{command}.log"
    async with silent_postgres() as (port, reached):
        silent = settings.model_copy(
            update={"database_url": _at_port(settings.database_url, port), "auto_migrate": migrating}
        )
        async with service(command, silent, output) as proc:
            async with asyncio.timeout(60):
                await reached.wait()  # it waits on the database now (with NATS connected, migrating off)
            await _kill_nats_and_stop(server, proc, output)


class FreezingProxy:
    """A TCP proxy to Postgres that can freeze: from :meth:`freeze` on nothing passes either way and
    no new connection reaches the server, every socket kept open (Postgres gone silent under a
    running process)."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port, self.frozen = host, port, asyncio.Event()
        self.tasks: set[asyncio.Task[None]] = set()
        self.writers: list[asyncio.StreamWriter] = []

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(OSError):
            while data := await reader.read(65536):
                if self.frozen.is_set():
                    await asyncio.Event().wait()  # held, never passed on
                writer.write(data)
                await writer.drain()

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.writers.append(writer)
        if self.frozen.is_set():
            return  # held open, never answered
        up_reader, up_writer = await asyncio.open_connection(self.host, self.port)
        self.writers.append(up_writer)
        for task in (
            asyncio.create_task(self._pipe(reader, up_writer)),
            asyncio.create_task(self._pipe(up_reader, writer)),
        ):
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)

    def freeze(self) -> None:
        self.frozen.set()


@contextlib.asynccontextmanager
async def freezing_proxy(url: str) -> AsyncIterator[tuple[str, FreezingProxy]]:
    """A database URL through a :class:`FreezingProxy` to ``url``'s server, and the proxy."""
    target = urlsplit(url)
    proxy = FreezingProxy(target.hostname or "127.0.0.1", target.port or 5432)
    port = free_port()
    server = await asyncio.start_server(proxy.handle, "127.0.0.1", port)
    try:
        yield _at_port(url, port), proxy
    finally:
        server.close()
        for task in list(proxy.tasks):
            task.cancel()
        await asyncio.gather(*proxy.tasks, return_exceptions=True)
        for writer in proxy.writers:
            writer.close()
        await server.wait_closed()


@pytest.mark.parametrize("command", list(READY))
async def test_a_serving_process_stopped_once_postgres_went_silent_and_nats_was_killed_exits_0_within_the_limit(
    own_stack: tuple[Settings, OwnNats], command: str
) -> None:
    settings, server = own_stack
    output = server.tmp / f"{command}.log"
    async with freezing_proxy(settings.database_url) as (url, proxy):
        through = settings.model_copy(update={"database_url": url})
        async with running(through, command, output) as proc:
            proxy.freeze()
            await _kill_nats_and_stop(server, proc, output)
