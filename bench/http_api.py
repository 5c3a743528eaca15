"""``chronicle bench api``: HTTP latency of appends and read-your-writes against the real API.

``chronicle api`` and ``chronicle projector`` run as child processes (as in production: the client,
the API and the projector do not share an event loop); the client is
:class:`bench.client.BenchClient`, a minimal keep-alive HTTP/1.1 client in this process (so
the numbers are the server's, not a client library's).
Baseline: ``GET /healthz`` on the same server, same client, same run.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from bench.client import BenchClient
from bench.data import Corpus, message_id
from bench.support import (
    BENCH_KEY,
    BenchOptions,
    CpuMeter,
    Infra,
    Report,
    Target,
    bench_settings,
    db_name,
    fmt_ms,
    scratch_database,
    service,
    summary_ms,
    timed,
)
from projections.migrate import migrate
from services.ops.localstack import free_port
from services.ops.progress import Progress
from services.settings import Settings


@dataclass
class RunningApi:
    client: BenchClient
    pids: dict[str, int]


@contextlib.asynccontextmanager
async def running_api(
    cfg: Settings, infra: Infra, *, projector: bool, compactor: bool = False, commands: bool = False
) -> AsyncIterator[RunningApi]:
    """The API (and optionally a projector, a compactor and the command service, as ``chronicle
    up`` runs them) as child processes, and a client authenticated to it. Without a compactor,
    readiness does not wait for one; nor, without the command service, for that."""
    waits = {"readiness_compactor": cfg.readiness_compactor and compactor}
    cfg = cfg.model_copy(update={**waits, "readiness_commands": cfg.readiness_commands and commands})
    base = f"http://{cfg.api_host}:{cfg.api_port}"
    log = infra.tmp / "services.log"
    async with contextlib.AsyncExitStack() as stack:
        pids: dict[str, int] = {}
        if projector:
            proc = await stack.enter_async_context(service("projector", cfg, log))
            pids["projector process"] = proc.pid
        if compactor:
            proc = await stack.enter_async_context(service("compactor", cfg, log))
            pids["compactor process"] = proc.pid
        if commands:
            proc = await stack.enter_async_context(service("commands", cfg, log))
            pids["commands process"] = proc.pid
        api_proc = await stack.enter_async_context(service("api", cfg, log))
        pids["api process"] = api_proc.pid
        client = BenchClient(base, {"Authorization": f"Bearer {BENCH_KEY}"})
        stack.push_async_callback(client.aclose)
        deadline = time.monotonic() + 60
        while True:
            if api_proc.returncode is not None:
                raise RuntimeError(f"chronicle api exited with {api_proc.returncode}; see {log}")
            with contextlib.suppress(OSError, asyncio.IncompleteReadError):
                if (await client.get("/readyz")).status_code == 200:
                    break
            if time.monotonic() > deadline:
                raise RuntimeError(f"chronicle api did not become ready; see {log}")
            await asyncio.sleep(0.1)
        yield RunningApi(client, pids)


def _append_body(mid: str, parent: str | None, text: str) -> dict[str, Any]:
    return {"message": {"id": mid, "role": "user", "parts": [{"type": "text", "text": text}]}, "parent_id": parent}


def _appending(w: Appender) -> Callable[[int], Awaitable[int]]:
    return lambda _: w.append()


class Appender:
    """Appends ~1 KB messages to one session as a chain (explicit ``parent_id``), as an agent does."""

    def __init__(self, client: BenchClient, session: str, corpus: Corpus) -> None:
        self.client = client
        self.session = session
        self.corpus = corpus
        self.parent: str | None = None
        self.count = 0

    async def append(self) -> int:
        mid = message_id(self.count)
        text, _ = self.corpus.text()
        resp = await self.client.post(
            f"/v1/sessions/{self.session}/messages", json=_append_body(mid, self.parent, text)
        )
        if resp.status_code != 201:
            raise RuntimeError(f"append answered {resp.status_code}: {resp.text[:200]}")
        self.parent = mid
        self.count += 1
        return int(resp.json()["seq"])


async def api(settings: Settings, infra: Infra, options: BenchOptions) -> Report:
    r = options.size(options.requests, 500, 20)
    concurrency = 16
    report = Report("api", {"requests": r, "concurrency": concurrency})
    corpus = Corpus(seed=3)
    bar = Progress("api", enabled=options.progress)
    phases = 6
    async with scratch_database(infra) as db:
        cfg = bench_settings(settings, infra, db, api_port=free_port())
        await migrate(db)
        async with running_api(cfg, infra, projector=True) as running:
            client = running.client
            meter = CpuMeter({**infra.pids, **running.pids}, db_name(db))
            warm = Appender(client, "warmup", corpus)
            for _ in range(min(20, r)):
                await warm.append()
                await client.get("/healthz")
            bar(1, phases)

            async def health(_: int) -> None:
                (await client.get("/healthz")).raise_for_status()

            meter.reset()
            healthz = summary_ms(await timed(health, r))
            report.cpu_s["healthz"] = await meter.used()
            bar(2, phases)

            one = Appender(client, "c1-chain", corpus)
            meter.reset()
            c1 = summary_ms(await timed(lambda _: one.append(), r))
            report.cpu_s["append c=1"] = await meter.used()
            bar(3, phases)

            spread = [Appender(client, f"c1-spread-{i}", corpus) for i in range(r)]
            c1_spread = summary_ms(await timed(lambda i: spread[i].append(), r))
            bar(4, phases)

            workers = [Appender(client, f"c16-{i}", corpus) for i in range(concurrency)]
            each = max(1, r // concurrency)
            meter.reset()
            start = time.perf_counter()
            parts = await asyncio.gather(*(timed(_appending(w), each) for w in workers))
            c16_wall = time.perf_counter() - start
            report.cpu_s["append c=16"] = await meter.used()
            c16 = summary_ms([x for p in parts for x in p])
            bar(5, phases)

            reads: list[float] = []
            totals: list[float] = []
            writers: dict[int, Appender] = {}
            for i in range(r):
                if i // 10 not in writers:
                    writers[i // 10] = Appender(client, f"ryw-{i // 10}", corpus)
                w = writers[i // 10]
                start = time.perf_counter()
                seq = await w.append()
                mid = w.parent
                t_read = time.perf_counter()
                resp = await client.get(f"/v1/sessions/{w.session}/history", params={"leaf_id": mid, "min_seq": seq})
                end = time.perf_counter()
                body = resp.json()
                if resp.status_code != 200 or body["messages"][-1]["id"] != mid:
                    raise RuntimeError(f"read-your-write failed: {resp.status_code} {resp.text[:200]}")
                reads.append(end - t_read)
                totals.append(end - start)
            ryw_read, ryw_total = summary_ms(reads), summary_ms(totals)
            bar(6, phases)
            bar.close()

    report.metrics = {
        "append_c1": c1,
        "append_c1_spread": c1_spread,
        "append_c16": c16,
        "append_c16_per_s": round(concurrency * each / c16_wall, 1),
        "ryw_read": ryw_read,
        "ryw_total": ryw_total,
    }
    report.baseline = {"healthz": healthz}
    report.ratio = {
        "append_c1 p50 / healthz p50": round(c1["p50"] / healthz["p50"], 2),
        "append_c16 p50 / healthz p50": round(c16["p50"] / healthz["p50"], 2),
        "ryw_total p99 / healthz p99": round(ryw_total["p99"] / healthz["p99"], 2),
    }
    hz = fmt_ms(healthz, "p50", "p99")
    report.row("GET /healthz p50 / p99 (baseline)", hz, hz, "1.00x")
    report.row("append c=1, one session p50 / p99", fmt_ms(c1, "p50", "p99"), hz, f"{c1['p50'] / healthz['p50']:.1f}x")
    report.row(
        "append c=1, new session each p50 / p99",
        fmt_ms(c1_spread, "p50", "p99"),
        hz,
        f"{c1_spread['p50'] / healthz['p50']:.1f}x",
    )
    report.row(
        f"append c={concurrency} p50 / p99", fmt_ms(c16, "p50", "p99"), hz, f"{c16['p50'] / healthz['p50']:.1f}x"
    )
    report.row(f"append c={concurrency} throughput", f"{concurrency * each / c16_wall:,.0f} req/s")
    report.row("read-your-write: GET history?min_seq p50 / p99", fmt_ms(ryw_read, "p50", "p99"))
    report.row(
        "read-your-write: append + GET p50 / p99",
        fmt_ms(ryw_total, "p50", "p99"),
        hz,
        f"{ryw_total['p99'] / healthz['p99']:.1f}x (p99)",
    )
    report.targets = [
        Target("append p50 at c=1 (one session)", c1["p50"], "<", 3.0, " ms"),
        Target("read-your-write p99 (append + GET)", ryw_total["p99"], "<", 100.0, " ms"),
    ]
    return report
