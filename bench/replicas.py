"""``chronicle bench api-replicas``: appends/s with 1, 2 and 4 API processes on one port.

The API processes share the port with SO_REUSEPORT (``CHRONICLE_API_REUSE_PORT``, what ``chronicle
up --api-processes N`` runs), one projector applies behind them. Two workloads, each at concurrency
10 with one keep-alive connection per client task (the kernel spreads connections over the
processes, not requests):

* W1: 10 sessions x 200 appends, one client task per session, each a chain (explicit ``parent_id``);
* W100: 100 sessions x 20 appends, ten client tasks each taking ten sessions in turn.

Baseline: the same workload on one API process, in the same run.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

from bench.client import BenchClient
from bench.data import Corpus
from bench.http_api import Appender
from bench.support import (
    BENCH_KEY,
    BenchOptions,
    Infra,
    Report,
    Target,
    bench_settings,
    scratch_database,
    service,
)
from projections.migrate import migrate
from services.ops.localstack import free_port
from services.ops.progress import Progress
from services.settings import Settings

CONCURRENCY = 10


@contextlib.asynccontextmanager
async def api_processes(cfg: Settings, infra: Infra, count: int) -> AsyncIterator[str]:
    """``count`` API processes on ``cfg.api_port`` (SO_REUSEPORT) and one projector; the base URL
    once the API answers ready and every process listens (a process listens once it has started)."""
    # no compactor or command service runs: readiness waits for none
    cfg = cfg.model_copy(update={"readiness_compactor": False, "readiness_commands": False})
    log = infra.tmp / "services.log"
    async with contextlib.AsyncExitStack() as stack:
        await stack.enter_async_context(service("projector", cfg, log))
        procs = [await stack.enter_async_context(service("api", cfg, log)) for _ in range(count)]
        base = f"http://{cfg.api_host}:{cfg.api_port}"
        deadline = time.monotonic() + 90
        while not await _ready(base) or listeners(cfg.api_port) < count:
            if any(p.returncode is not None for p in procs):
                raise RuntimeError(f"a chronicle api process exited; see {log}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"chronicle api did not become ready; see {log}")
            await asyncio.sleep(0.2)
        yield base


def listeners(port: int) -> int:
    """Sockets listening on ``port`` (Linux ``/proc/net/tcp``; each process with SO_REUSEPORT has
    its own)."""
    found = 0
    for table in (Path("/proc/net/tcp"), Path("/proc/net/tcp6")):
        with contextlib.suppress(OSError):
            for line in table.read_text().splitlines()[1:]:
                fields = line.split()
                if fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:
                    found += 1
    return found


async def _ready(base: str) -> bool:
    client = BenchClient(base)
    try:
        return (await client.get("/readyz")).status_code == 200
    except (OSError, asyncio.IncompleteReadError):
        return False
    finally:
        await client.aclose()


async def workload(base: str, sessions: int, appends: int, tag: str, corpus: Corpus) -> float:
    """Appends/s of ``sessions`` x ``appends`` chained appends by :data:`CONCURRENCY` client tasks
    (task ``t`` takes sessions ``t, t + CONCURRENCY, …`` in turn)."""
    headers = {"Authorization": f"Bearer {BENCH_KEY}"}
    clients = [BenchClient(base, headers) for _ in range(min(CONCURRENCY, sessions))]
    owned: list[Sequence[Appender]] = [
        [Appender(client, f"{tag}-{s}", corpus) for s in range(t, sessions, len(clients))]
        for t, client in enumerate(clients)
    ]

    async def run(appenders: Sequence[Appender]) -> None:
        for _ in range(appends):
            for appender in appenders:
                await appender.append()

    try:
        start = time.perf_counter()
        await asyncio.gather(*(run(a) for a in owned))
        return sessions * appends / (time.perf_counter() - start)
    finally:
        for client in clients:
            await client.aclose()


async def api_replicas(settings: Settings, infra: Infra, options: BenchOptions) -> Report:
    counts = (1, 2) if options.smoke else (1, 2, 4)
    w1 = (options.size(options.sessions, 10, 2), options.size(options.messages, 200, 5))
    w100 = (options.size(None, 100, 4), options.size(None, 20, 3))
    report = Report("api-replicas", {"api_processes": list(counts), "w1": w1, "w100": w100, "concurrency": CONCURRENCY})
    bar = Progress("api-replicas", enabled=options.progress)
    results: dict[int, dict[str, float]] = {}
    for i, count in enumerate(counts):
        async with scratch_database(infra) as db:
            cfg = bench_settings(settings, infra, db, api_port=free_port(), api_reuse_port=True, auto_migrate=False)
            await migrate(db)
            async with api_processes(cfg, infra, count) as base:
                corpus = Corpus(seed=5)
                await workload(base, 2, 3, "warm", corpus)
                results[count] = {
                    "w1_appends_per_s": round(await workload(base, *w1, "w1", corpus), 1),
                    "w100_appends_per_s": round(await workload(base, *w100, "w100", corpus), 1),
                }
        bar(i + 1, len(counts))
    bar.close()
    one = results[counts[0]]
    report.metrics = {f"api_processes_{n}": r for n, r in results.items()}
    report.baseline = {"api_processes_1": one}
    for n, r in results.items():
        for name, label in (("w1_appends_per_s", "W1"), ("w100_appends_per_s", "W100")):
            ratio = r[name] / one[name]
            report.ratio[f"{label} {n} processes / 1"] = round(ratio, 2)
            report.row(
                f"{label}: {n} API process(es)", f"{r[name]:,.0f} appends/s", f"{one[name]:,.0f}", f"{ratio:.2f}x"
            )
    most = results[counts[-1]]
    report.targets = [
        Target(
            f"W100 appends/s, {counts[-1]} API processes / 1",
            most["w100_appends_per_s"] / one["w100_appends_per_s"],
            ">=",
            1.0,
            "x",
        ),
    ]
    report.notes.append("one projector behind the APIs; the machine's cores are shared by every process")
    return report
