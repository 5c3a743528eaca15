"""``chronicle bench compaction``: the compaction worker's cost to the write path.

ingest: sessions configured with ``compact_after`` (``SessionConfigured`` events), then messages
published with :meth:`Publisher.publish_many` while a ``chronicle projector`` child process applies
them (as in production, keeping the compaction state in its transaction and publishing the due
sessions' requests); measured until the projector's checkpoint reaches the last message. Run once
with :meth:`Container.compactor` running in this process (offline summarizer, taking the
requests; its counters are read here) and once without it, each on a fresh database and stream;
the run without is the baseline.
estimate: :meth:`CompactorState.apply` of one ``MessageAppended`` extending the active leaf of a
session with 100 and with 10,000 messages of history (``compactor_*`` rows loaded directly), to
show the per-append cost does not depend on history length; the baseline is the full re-sum of
the path that a branch switch costs.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

import psycopg

from bench.data import TENANT, Corpus, Msg, messages, session_name, to_event
from bench.ingest import CHUNK, _consumer_ready
from bench.support import (
    BenchOptions,
    CpuMeter,
    Infra,
    Report,
    Target,
    bench_settings,
    checkpoint,
    db_name,
    fmt_ms,
    fmt_rate,
    scratch_database,
    service,
    summary_ms,
    timed,
)
from events.catalog import MessageAppended, SessionConfigured
from events.context import CompactionConfig, SessionConfig
from projections.migrate import migrate
from projections.runner import read_checkpoint
from services.bootstrap import open_container
from services.compaction.state import CompactorState
from services.ops.progress import Progress
from services.settings import Settings
from services.tokens import TokenCounter

WORKER = "bench-estimate"


async def ingest_run(
    settings: Settings,
    infra: Infra,
    configs: list[SessionConfigured],
    events: list[MessageAppended],
    *,
    with_compactor: bool,
    show: bool | None,
) -> dict[str, Any]:
    """One ingest on a fresh database and stream; seconds, rates and compactor counters."""
    n = len(events)
    async with scratch_database(infra) as db:
        cfg = bench_settings(settings, infra, db)
        log_path = infra.tmp / "compaction-projector.log"
        # the projector in a process of its own, as in production; the compactor in this one
        async with open_container(cfg) as c, service("projector", cfg, log_path) as projector:
            meter = CpuMeter({**infra.pids, "projector process": projector.pid}, db_name(db))
            await checkpoint(infra.pg_admin)
            target = [2**62]
            done = asyncio.Event()

            async def watch() -> None:
                while True:
                    async with c.pool.connection() as conn:
                        if await read_checkpoint(conn, cfg.projector_name) >= target[0]:
                            done.set()
                    await asyncio.sleep(0.02)

            stop = asyncio.Event()
            tasks = [asyncio.create_task(watch(), name="bench-checkpoint-watch")]
            compactor = c.compactor() if with_compactor else None
            try:
                await _consumer_ready(c, "chronicle-" + cfg.projector_name.replace(".", "-"), 30.0)
                if compactor is not None:
                    tasks.append(asyncio.create_task(compactor.run(stop), name="bench-compactor"))
                published = await c.publisher.publish_many(configs)
                target[0] = max(p.seq for p in published)
                await asyncio.wait_for(done.wait(), timeout=120)
                done.clear()
                target[0] = 2**62
                bar = Progress("ingest + compactor" if with_compactor else "ingest", enabled=show)
                meter.reset()
                t0 = time.perf_counter()
                last = 0
                for start in range(0, n, CHUNK):
                    results = await c.publisher.publish_many(events[start : start + CHUNK])
                    last = max(r.seq for r in results)
                    bar(start + len(results), n)
                t_pub = time.perf_counter()
                target[0] = last
                await asyncio.wait_for(done.wait(), timeout=max(120.0, n / 100))
                t_end = time.perf_counter()
                cpu = await meter.used()
                bar.close()
                out: dict[str, Any] = {
                    "end_to_end_s": round(t_end - t0, 3),
                    "publish_s": round(t_pub - t0, 3),
                    "msgs_per_s": round(n / (t_end - t0), 1),
                    "cpu": cpu,
                }
                if compactor is not None:
                    for _ in range(int(max(120.0, n / 100) * 10)):
                        if await compactor.idle():
                            break
                        await asyncio.sleep(0.1)
                    out["compactor_idle_after_s"] = round(time.perf_counter() - t_end, 3)
                    out["compactions"] = compactor.work.compactions
                    out["compaction_failures"] = compactor.work.failures
                    async with c.pool.connection() as conn:
                        cur = await conn.execute("SELECT count(*) FROM overlays")
                        row = await cur.fetchone()
                    out["overlays_projected"] = int(row[0]) if row else 0
            finally:
                stop.set()
                tasks[0].cancel()
                for task in tasks:
                    with contextlib.suppress(Exception, asyncio.CancelledError):
                        await asyncio.wait_for(task, timeout=30)
    return out


async def estimate_cost(db: str, sizes: tuple[int, ...], reps: int, budget: float) -> dict[str, dict[str, float]]:
    """Per-append :meth:`CompactorState.apply` cost (and a full re-sum) at each history length."""
    counter = TokenCounter()
    state = CompactorState(WORKER, counter.count, None, adopt=False)
    corpus = Corpus(seed=17)
    texts = [corpus.text()[0] for _ in range(64)]
    out: dict[str, dict[str, float]] = {}
    seq = [10_000_000]
    async with await psycopg.AsyncConnection.connect(db, autocommit=True) as conn:
        for size in sizes:
            session = f"history-{size}"
            async with conn.transaction(), conn.cursor() as cur:
                cols = "worker, tenant, session_id, id, parent_id, tokens, seq"
                async with cur.copy(f"COPY compactor_messages ({cols}) FROM STDIN") as copy:
                    for k in range(size):
                        parent = f"h{k - 1:07d}" if k else None
                        await copy.write_row((WORKER, TENANT, session, f"h{k:07d}", parent, 250, k + 1))
                await cur.execute(
                    "INSERT INTO compactor_sessions (worker, tenant, session_id, leaf_id, estimate, compact_after, "
                    "seq) VALUES (%s, %s, %s, %s, %s, %s, %s)",
                    (WORKER, TENANT, session, f"h{size - 1:07d}", 250 * size, 10**9, size),
                )
            await conn.execute("ANALYZE compactor_messages")
            leaf = [f"h{size - 1:07d}"]

            def next_event(i: int, session: str = session, leaf: list[str] = leaf) -> MessageAppended:
                mid = f"a{i:07d}"
                body = {"id": mid, "role": "user", "parts": [{"type": "text", "text": texts[i % len(texts)]}]}
                ev = to_event(Msg(i, session, mid, leaf[0], body, ("", "")))
                leaf[0] = mid
                return ev

            async def append(i: int) -> None:
                event = next_event(i)
                seq[0] += 1
                async with conn.transaction():
                    await state.apply(conn, [(seq[0], event)])

            async def tokenise(i: int) -> None:
                counter.count(texts[i % len(texts)])

            async def resum(_: int, session: str = session, leaf: list[str] = leaf) -> None:
                seq[0] += 1
                async with conn.transaction():
                    await state.resum(conn, TENANT, session, seq[0], leaf[0])

            await append(10**6)  # warm: the first statement of each shape is planned
            out[f"append_{size}"] = summary_ms(await timed(append, reps, budget_s=budget))
            out[f"tokenise_{size}"] = summary_ms(await timed(tokenise, reps, budget_s=budget))
            out[f"resum_{size}"] = summary_ms(await timed(resum, max(3, reps // 10), budget_s=budget, minimum=1))
            cur = await conn.execute(
                "SELECT estimate FROM compactor_sessions WHERE worker = %s AND tenant = %s AND session_id = %s",
                (WORKER, TENANT, session),
            )
            row = await cur.fetchone()
            out[f"estimate_{size}"] = {"estimate": float(row[0]) if row else 0.0}
    return out


async def compaction(settings: Settings, infra: Infra, options: BenchOptions) -> Report:
    n = options.size(options.messages, 20_000, 300)
    sessions = options.size(options.sessions, 200, 10)
    reps = options.size(options.requests, 200, 5)
    budget = 5.0 if options.smoke else 20.0
    compact_after = 2_000 if options.smoke else 6_000
    sizes = (100, 10_000) if not options.smoke else (100, 1_000)
    report = Report(
        "compaction",
        {
            "messages": n,
            "sessions": sessions,
            "compact_after": compact_after,
            "histories": list(sizes),
            "requests": reps,
        },
    )
    policy = CompactionConfig(compact_after=compact_after, protect_head=2, tail_token_budget=2_000, min_tail_messages=2)
    configs = [
        SessionConfigured(tenant=TENANT, session=session_name(i), config=SessionConfig(compaction=policy))
        for i in range(sessions)
    ]
    events = [to_event(m) for m in messages(n, sessions)]
    without = await ingest_run(settings, infra, configs, events, with_compactor=False, show=options.progress)
    with_c = await ingest_run(settings, infra, configs, events, with_compactor=True, show=options.progress)
    report.cpu_s["ingest without compactor"] = without.pop("cpu")
    report.cpu_s["ingest with compactor"] = with_c.pop("cpu")
    report.metrics["ingest_with_compactor"] = with_c
    report.baseline["ingest_without_compactor"] = without

    async with scratch_database(infra) as db:
        await migrate(db)
        est = await estimate_cost(db, sizes, reps, budget)
    report.metrics.update({k: v for k, v in est.items() if k.startswith(("append", "estimate", "tokenise"))})
    report.baseline.update({k: v for k, v in est.items() if k.startswith("resum")})

    ratio = with_c["msgs_per_s"] / without["msgs_per_s"]
    small, large = sizes
    growth = est[f"append_{large}"]["p50"] / est[f"append_{small}"]["p50"]
    report.ratio["with / without compactor msgs_per_s"] = round(ratio, 3)
    report.ratio[f"append p50 at {large:,} / at {small:,}"] = round(growth, 2)
    report.row(
        "ingest end to end, compactor running",
        fmt_rate(with_c["msgs_per_s"], " msg/s"),
        fmt_rate(without["msgs_per_s"], " msg/s (no compactor)"),
        f"{ratio:.2f}x",
    )
    report.row("  elapsed with / without", f"{with_c['end_to_end_s']:.1f} s", f"{without['end_to_end_s']:.1f} s")
    report.row(
        "  compactions (failures), overlays projected",
        f"{with_c['compactions']:,} ({with_c['compaction_failures']}), {with_c['overlays_projected']:,}",
    )
    report.row("  compactor idle after the projector", f"{with_c['compactor_idle_after_s']:.2f} s")
    for size in sizes:
        report.row(
            f"estimate update per append, {size:,}-message history p50 / p95",
            fmt_ms(est[f"append_{size}"], "p50", "p95"),
            fmt_ms(est[f"resum_{size}"], "p50", "p95") + " (full re-sum)",
            f"{est[f'append_{size}']['p50'] / est[f'resum_{size}']['p50']:.2f}x",
        )
    report.row("  of which tiktoken of the ~1 KB message p50", fmt_ms(est[f"tokenise_{small}"], "p50"))
    report.targets = [
        Target("ingest with compactor vs without", round(ratio, 3), ">=", 0.9, "x"),
        Target(f"estimate update p50 at {large:,} / at {small:,} messages", round(growth, 2), "<", 1.5, "x"),
    ]
    if with_c["compactions"] == 0:
        report.notes.append("no compaction happened during the run: the threshold was never crossed")
    return report
