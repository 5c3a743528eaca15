"""``chronicle bench commands``: appends over NATS request/reply (``chronicle commands``) against
the same appends over HTTP (``chronicle api``), same run, same server processes and database.

Both paths run the same command handler; what differs is the transport: a keep-alive HTTP/1.1
request to the API against a core NATS request to the command service's queue group, answered on
the requester's inbox. The NATS client connects as the operator identity (the bench's NATS server
knows no tenant users; the subject names the bench tenant, as a tenant's own connection would).
Baselines: ``GET /healthz`` for HTTP and a NATS request to a no-op responder for NATS.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from typing import Any

import nats
import nats.errors
from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg

from bench.data import Corpus, message_id
from bench.http_api import Appender, running_api
from bench.support import (
    BenchOptions,
    CpuMeter,
    Infra,
    Report,
    Target,
    bench_settings,
    db_name,
    fmt_ms,
    scratch_database,
    summary_ms,
    timed,
)
from events.commands import STATUS_HEADER
from projections.migrate import migrate
from services.ops.localstack import free_port
from services.ops.progress import Progress
from services.settings import Settings

TENANT = "bench"
CONCURRENCY = 16


class NatsAppender:
    """Appends ~1 KB messages to one session as a chain over NATS request/reply."""

    def __init__(self, nc: NatsClient, subject: str, session: str, corpus: Corpus) -> None:
        self.nc = nc
        self.subject = subject
        self.session = session
        self.corpus = corpus
        self.parent: str | None = None
        self.count = 0

    async def append(self) -> int:
        mid = message_id(self.count)
        text, _ = self.corpus.text()
        body: dict[str, Any] = {
            "session_id": self.session,
            "message": {"id": mid, "role": "user", "parts": [{"type": "text", "text": text}]},
            "parent_id": self.parent,
        }
        reply = await self.nc.request(self.subject, json.dumps(body).encode(), timeout=30)
        status = (reply.headers or {}).get(STATUS_HEADER)
        if status != "201":
            raise RuntimeError(f"append over NATS answered {status}: {reply.data[:200]!r}")
        self.parent = mid
        self.count += 1
        return int(json.loads(reply.data)["seq"])


async def _concurrent(appenders: list[Any], each: int) -> tuple[list[float], float]:
    start = time.perf_counter()
    parts = await asyncio.gather(*(timed(_appending(a), each) for a in appenders))
    return [x for p in parts for x in p], time.perf_counter() - start


def _appending(a: Any) -> Callable[[int], Awaitable[int]]:
    return lambda _: a.append()


async def commands(settings: Settings, infra: Infra, options: BenchOptions) -> Report:
    r = options.size(options.requests, 500, 20)
    report = Report("commands", {"requests": r, "concurrency": CONCURRENCY})
    corpus = Corpus(seed=5)
    bar = Progress("commands", enabled=options.progress)
    phases = 5
    async with scratch_database(infra) as db:
        cfg = bench_settings(settings, infra, db, api_port=free_port())
        cfg = cfg.model_copy(update={"command_prefix": cfg.subject_prefix.removesuffix(".ev") + ".cmd"})
        await migrate(db)
        async with running_api(cfg, infra, projector=True, commands=True) as running:
            client = running.client
            nc = await nats.connect(infra.nats_url, nkeys_seed_str=infra.operator_seed)
            try:
                layout = cfg.layout()
                subject = layout.command_subject(TENANT, "append")
                echo_subject = f"{layout.commands}.bench-echo"

                async def echo(msg: Msg) -> None:
                    await msg.respond(b"{}")

                await nc.subscribe(echo_subject, cb=echo)
                meter = CpuMeter({**infra.pids, **running.pids}, db_name(db))
                await _wait_for_commands(nc, subject)
                warm_http, warm_nats = Appender(client, "warm-h", corpus), NatsAppender(nc, subject, "warm-n", corpus)
                for _ in range(min(20, r)):
                    await warm_http.append()
                    await warm_nats.append()
                bar(1, phases)

                async def health(_: int) -> None:
                    (await client.get("/healthz")).raise_for_status()

                async def nats_echo(_: int) -> None:
                    await nc.request(echo_subject, b"{}", timeout=10)

                healthz = summary_ms(await timed(health, r))
                echo_ms = summary_ms(await timed(nats_echo, r))
                bar(2, phases)

                # interleaved in blocks, so that a noisy moment hits both transports alike
                h1, n1 = Appender(client, "c1-http", corpus), NatsAppender(nc, subject, "c1-nats", corpus)
                http_c1: list[float] = []
                nats_c1: list[float] = []
                block = max(1, r // 10)
                meter.reset()
                for _ in range(0, r, block):
                    http_c1 += await timed(lambda _: h1.append(), block)
                    nats_c1 += await timed(lambda _: n1.append(), block)
                report.cpu_s["c=1, both"] = await meter.used()
                bar(3, phases)

                # two rounds in opposite orders (HTTP first, then NATS first): neither gets the warmer machine
                each = max(1, r // CONCURRENCY // 2)
                http_c16: list[float] = []
                nats_c16: list[float] = []
                http_wall = nats_wall = 0.0
                for rnd, order in enumerate((("http", "nats"), ("nats", "http"))):
                    for kind in order:
                        appenders: list[Any] = (
                            [Appender(client, f"c16-http-{rnd}-{i}", corpus) for i in range(CONCURRENCY)]
                            if kind == "http"
                            else [NatsAppender(nc, subject, f"c16-nats-{rnd}-{i}", corpus) for i in range(CONCURRENCY)]
                        )
                        meter.reset()
                        times, wall = await _concurrent(appenders, each)
                        report.cpu_s[f"{kind} c=16 round {rnd + 1}"] = await meter.used()
                        if kind == "http":
                            http_c16, http_wall = http_c16 + times, http_wall + wall
                        else:
                            nats_c16, nats_wall = nats_c16 + times, nats_wall + wall
                    bar(4 + rnd, phases)
                bar.close()
            finally:
                await nc.close()

    hc1, nc1 = summary_ms(http_c1), summary_ms(nats_c1)
    h16, n16 = summary_ms(http_c16), summary_ms(nats_c16)
    h_rate, n_rate = 2 * CONCURRENCY * each / http_wall, 2 * CONCURRENCY * each / nats_wall
    report.metrics = {
        "http_append_c1": hc1,
        "nats_append_c1": nc1,
        "http_append_c16": h16,
        "nats_append_c16": n16,
        "http_append_c16_per_s": round(h_rate, 1),
        "nats_append_c16_per_s": round(n_rate, 1),
    }
    report.baseline = {"healthz": healthz, "nats_echo": echo_ms}
    report.ratio = {
        "nats / http append c=1 p50": round(nc1["p50"] / hc1["p50"], 2),
        "nats / http append c=1 p99": round(nc1["p99"] / hc1["p99"], 2),
        "nats / http append c=16 throughput": round(n_rate / h_rate, 2),
    }
    report.row("GET /healthz p50 / p99 (HTTP floor)", fmt_ms(healthz, "p50", "p99"))
    report.row("NATS request to a no-op responder p50 / p99 (NATS floor)", fmt_ms(echo_ms, "p50", "p99"))
    report.row(
        "append c=1 p50 / p99: NATS vs HTTP",
        fmt_ms(nc1, "p50", "p99"),
        fmt_ms(hc1, "p50", "p99"),
        f"{nc1['p50'] / hc1['p50']:.2f}x",
    )
    report.row(
        f"append c={CONCURRENCY} p50 / p99: NATS vs HTTP",
        fmt_ms(n16, "p50", "p99"),
        fmt_ms(h16, "p50", "p99"),
        f"{n16['p50'] / h16['p50']:.2f}x",
    )
    report.row(
        f"append c={CONCURRENCY} throughput: NATS vs HTTP",
        f"{n_rate:,.0f} req/s",
        f"{h_rate:,.0f} req/s",
        f"{n_rate / h_rate:.2f}x",
    )
    # the same command handler behind a lighter transport: NATS should cost no more than HTTP
    report.targets = [
        Target("append c=1 p50, NATS / HTTP", round(nc1["p50"] / hc1["p50"], 3), "<=", 1.0, "x"),
        Target(f"append c={CONCURRENCY} throughput, NATS / HTTP", round(n_rate / h_rate, 3), ">=", 1.0, "x"),
    ]
    return report


async def _wait_for_commands(nc: NatsClient, subject: str, timeout_s: float = 60) -> None:
    """Until the command service answers (it starts next to the API)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            await nc.request(subject, b"{}", timeout=2)
            return
        except (nats.errors.NoRespondersError, nats.errors.TimeoutError):
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.2)
