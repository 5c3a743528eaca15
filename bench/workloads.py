"""Workloads of ``chronicle bench peers``: sessions of sequential appends, each call timed, then reads.

A workload runs against a :class:`MemoryBackend` (Chronicle through its SDK, or a peer called as its
users call it). Each session is appended to sequentially, one message per call, as an agent adds
its turns; ``concurrency`` sessions run at once. The texts are generated before the clock starts
and are the same, in the same order, for every system. :func:`measure` adds what the run cost:
CPU per append of each process (the background work included: the clock of the CPU meter stops
only when the system has :meth:`MemoryBackend.settle`-d), storage per message, and history reads.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import psycopg

from bench.data import Corpus
from bench.support import CpuMeter, summary_ms

# ~200-character messages: the generator adds sentences until it passes this size, then two
# made-up words, ~45 characters more on average
TEXT_CHARS = 156


@dataclass(frozen=True)
class Workload:
    """``sessions`` x ``appends`` sequential appends, ``concurrency`` sessions at a time."""

    name: str
    sessions: int
    appends: int  # per session
    concurrency: int
    reads: int  # timed history reads after the appends
    analyze: bool = False  # ANALYZE the database before the appends

    @property
    def total(self) -> int:
        return self.sessions * self.appends

    def session(self, i: int) -> str:
        tag = self.name.lower().replace(" ", "-")
        return f"bench-{tag}-{i:03d}"


class MemoryBackend(Protocol):
    """One system under test, ready to take appends; the harness times each call."""

    name: str
    database: str  # the psycopg URL of the database it writes (its own scratch database)
    processes: Mapping[str, int]  # its server processes other than Postgres: name -> pid

    async def append(self, session: str, index: int, text: str) -> None:
        """Append message ``index`` (user on even, assistant on odd) to ``session``."""

    async def history(self, session: str) -> int:
        """Read the session's whole history as its users do; the number of messages."""

    async def settle(self) -> None:
        """Return when the background work of every append so far is done (projections applied)."""

    async def log_bytes(self) -> int:
        """Bytes of its event log, if it keeps one (0 for the peers)."""


def texts(count: int, *, seed: int, chars: int = TEXT_CHARS) -> list[str]:
    corpus = Corpus(seed, text_bytes=chars)
    return [corpus.text()[0] for _ in range(count)]


@dataclass
class Appended:
    """Durations (seconds) of each append, per session in append order, and the wall time."""

    wall_s: float
    latencies: list[list[float]]

    def decile(self, *, last: bool) -> list[float]:
        """The first (or last) 10 % of each session's appends, pooled."""
        out: list[float] = []
        for per in self.latencies:
            k = max(1, len(per) // 10)
            out.extend(per[-k:] if last else per[:k])
        return out


async def append_all(
    backend: MemoryBackend, workload: Workload, bodies: list[str], progress: Callable[[int], None] | None = None
) -> Appended:
    """Run the workload's appends: ``bodies[s * appends + k]`` is message ``k`` of session ``s``."""
    slots = asyncio.Semaphore(workload.concurrency)
    latencies: list[list[float]] = [[] for _ in range(workload.sessions)]
    done = 0

    async def session(s: int) -> None:
        nonlocal done
        async with slots:
            sid = workload.session(s)
            for k in range(workload.appends):
                start = time.perf_counter()
                await backend.append(sid, k, bodies[s * workload.appends + k])
                latencies[s].append(time.perf_counter() - start)
                done += 1
                if progress is not None:
                    progress(done)

    start = time.perf_counter()
    await asyncio.gather(*(session(s) for s in range(workload.sessions)))
    return Appended(time.perf_counter() - start, latencies)


async def read_histories(backend: MemoryBackend, workload: Workload) -> list[float]:
    """One untimed read of each session (it checks the count), then ``reads`` timed, round-robin."""
    for s in range(workload.sessions):
        seen = await backend.history(workload.session(s))
        if seen != workload.appends:
            raise RuntimeError(f"{backend.name}: {workload.session(s)} read {seen} messages, not {workload.appends}")
    out: list[float] = []
    for i in range(workload.reads):
        start = time.perf_counter()
        await backend.history(workload.session(i % workload.sessions))
        out.append(time.perf_counter() - start)
    return out


_USER_TABLES = """
SELECT c.relname, pg_total_relation_size(c.oid)
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE c.relkind IN ('r', 'm') AND n.nspname NOT IN ('pg_catalog', 'information_schema')
  AND n.nspname NOT LIKE 'pg\\_toast%' AND n.nspname NOT LIKE 'pg\\_temp%'
"""


async def table_bytes(conninfo: str) -> dict[str, int]:
    """Bytes of every table of the database, its indexes and TOAST included."""
    async with await psycopg.AsyncConnection.connect(conninfo, autocommit=True) as conn:
        cur = await conn.execute(_USER_TABLES)
        return {str(name): int(size) for name, size in await cur.fetchall()}


async def analyze(conninfo: str) -> None:
    async with await psycopg.AsyncConnection.connect(conninfo, autocommit=True) as conn:
        await conn.execute("ANALYZE")


# CpuMeter's components, as the report names them; Postgres is the benchmark database's backends
# (and autovacuum workers) plus the cluster's shared processes (WAL writer, checkpointer)
_COMPONENTS = {
    "bench process": "client",
    "api process": "api",
    "projector process": "projector",
    "compactor process": "compactor",
    "nats-server": "nats-server",
    "postgres": "postgres",
    "postgres autovacuum": "postgres",
    "postgres server": "postgres",
}


def cpu_per_append(cpu_s: Mapping[str, float], appends: int) -> dict[str, float]:
    """Milliseconds of CPU per append per component, and their ``total``."""
    out: dict[str, float] = {}
    for key, name in _COMPONENTS.items():
        if key in cpu_s:
            out[name] = out.get(name, 0.0) + cpu_s[key] * 1000 / max(appends, 1)
    out = {k: round(v, 3) for k, v in out.items()}
    out["total"] = round(sum(out.values()), 3)
    return out


async def measure(
    backend: MemoryBackend,
    workload: Workload,
    meter: CpuMeter,
    *,
    seed: int,
    progress: Callable[[int], None] | None = None,
) -> dict[str, Any]:
    """Run ``workload`` on ``backend``: appends, catching up, CPU, storage, then history reads."""
    bodies = texts(workload.total, seed=seed)
    if workload.analyze:
        await analyze(backend.database)
    tables0, log0 = await table_bytes(backend.database), await backend.log_bytes()
    meter.reset()
    appended = await append_all(backend, workload, bodies, progress)
    settle_start, polling = time.perf_counter(), time.process_time()
    await backend.settle()
    settle_s = time.perf_counter() - settle_start
    meter.exclude(time.process_time() - polling)  # the harness's polling, not the client's work
    cpu_s = await meter.used()
    tables1, log1 = await table_bytes(backend.database), await backend.log_bytes()
    reads = await read_histories(backend, workload)

    n = workload.total
    grown = {t: tables1[t] - tables0.get(t, 0) for t in tables1 if tables1[t] != tables0.get(t, 0)}
    pg, log = sum(grown.values()), log1 - log0
    text = sum(len(b.encode()) for b in bodies)
    first, last = summary_ms(appended.decile(last=False)), summary_ms(appended.decile(last=True))
    return {
        "appends": n,
        "appends_per_s": round(n / appended.wall_s, 1),
        "append": summary_ms([x for per in appended.latencies for x in per]),
        "append_first_10pct": first,
        "append_last_10pct": last,
        "last_over_first_p50": round(last["p50"] / first["p50"], 3) if first["p50"] else 0.0,
        "settle_s": round(settle_s, 3),
        "history_messages": workload.appends,
        "history": summary_ms(reads),
        "cpu_ms_per_append": cpu_per_append(cpu_s, n),
        "cpu_s": cpu_s,
        "storage": {
            "postgres_bytes_per_message": round(pg / n, 1),
            "log_bytes_per_message": round(log / n, 1),
            "bytes_per_message": round((pg + log) / n, 1),
            "text_bytes_per_message": round(text / n, 1),
            "times_text": round((pg + log) / text, 2),
            "postgres_tables_bytes": dict(sorted(grown.items(), key=lambda kv: -kv[1])),
        },
    }
