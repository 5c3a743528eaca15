"""A Chronicle process run as the real CLI against a nats-server and a database of the test's own,
for the tests that do things to that server under it (reload it, kill it)."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import socket
import subprocess
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

from bench.support import service
from services.ops.localstack import free_port, start_nats
from services.ops.natsconf import NatsAccess, server_config, write_config
from services.settings import Settings
from tests.conftest import make_settings
from tests.support import chronicle_cli, scratch_database

READY = {
    "projector": "consuming",
    "compactor": "compactor taking",
    "commands": "commands answered on",
    "api": None,  # uvicorn logs nothing at the level the API runs it: its port says it is up
}
"""What each long-running process logs once it is up."""


class OwnNats:
    """A nats-server of the test's own, configured by ``access``."""

    def __init__(self, tmp: Path, port: int, access: NatsAccess) -> None:
        self.tmp, self.port, self.access = tmp, port, access
        self.proc = start_nats(port, tmp / "nats", tmp / "nats.log", access)

    async def reload(self, max_payload: int) -> None:
        """Reload the server with this ``max_payload``; returns once the server says it has it."""
        config = server_config(
            self.access,
            host="127.0.0.1",
            port=self.port,
            store_dir=str(self.tmp / "nats"),
            extra={"max_payload": max_payload},
        )
        log = self.tmp / "nats.log"
        seen = len(log.read_text())
        write_config(self.tmp / "nats.conf", config)
        self.proc.send_signal(signal.SIGHUP)
        async with asyncio.timeout(10):
            while f"Reloaded: max_payload = {max_payload}" not in log.read_text()[seen:]:
                await asyncio.sleep(0.05)

    def kill(self) -> None:
        """``kill -9``: the server is gone at once, its clients' sockets reset under them."""
        self.proc.kill()
        self.proc.wait(timeout=10)

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()


@contextlib.contextmanager
def own_stack_of(tmp: Path, pg_admin: str, s3_endpoint: str) -> Iterator[tuple[Settings, OwnNats]]:
    """Settings for a process on a nats-server and a migrated database of its own."""
    port = free_port()
    with scratch_database(pg_admin) as db:
        settings = make_settings(f"nats://127.0.0.1:{port}", db, api_port=free_port(), s3_endpoint=s3_endpoint)
        server = OwnNats(tmp, port, NatsAccess.of(settings))
        try:
            migrated = chronicle_cli(settings, "migrate", timeout=90)
            assert migrated.returncode == 0, migrated.stderr
            yield settings, server
        finally:
            server.stop()


@contextlib.asynccontextmanager
async def running(settings: Settings, command: str, output: Path) -> AsyncIterator[asyncio.subprocess.Process]:
    """``chronicle <command>`` as a process writing to ``output``, once it is up (its ready line,
    or the API's port); stopped on the way out if it is still running."""
    async with service(command, settings, output) as proc:
        async with asyncio.timeout(60):
            marker = READY[command]
            while not (marker in output.read_text() if marker else listening(settings.api_port)):
                assert proc.returncode is None, output.read_text()
                await asyncio.sleep(0.1)
        yield proc


def listening(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
    except OSError:
        return False
    return True
