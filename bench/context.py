"""``chronicle bench context``: context memory, with an in-process container and projector.

frozen prompt: :meth:`ContextService.frozen_prompt` after the first freeze, in-process and as
``GET …/system-prompt`` (the API as a child process on the same database).
set_context: :meth:`ContextService.execute` appending to a writable block, end to end (the
conditional append of the event and the projector applying it), in-process and as
``POST …/tools/set_context``.
search_context: :meth:`ContextService.execute` over a searchable block whose ``search_entries``
rows are loaded directly with ``COPY`` (the query side is measured, not indexing).
Baselines: a trivial ``SELECT 1`` round trip and the same full-text match run directly, unranked.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

import psycopg

from bench.data import COMMON_QUERY, TENANT, Corpus
from bench.http_api import running_api
from bench.ingest import _consumer_ready
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
from events.context import SearchableBlock, SessionConfig, WritableBlock
from projections import context_queries
from services.bootstrap import open_container
from services.ops.localstack import free_port
from services.ops.progress import Progress
from services.settings import Settings

SESSION = "ctx-bench"
WRITABLE = "notes"
SEARCHABLE = "kb"
ENTRY_BYTES = 400
UNRANKED = (
    "SELECT key FROM search_entries WHERE tenant = %s AND session_id = %s AND label = %s "
    "AND content_tsv @@ plainto_tsquery('chronicle_search.english', %s) LIMIT 10"
)
COMMON_WORDS = (COMMON_QUERY, "water", "time", "work")


async def load_entries(db: str, n: int, show: bool | None) -> tuple[float, list[str]]:
    """``COPY`` ``n`` entries into the searchable block, GIN built after; (seconds, rare words)."""
    corpus = Corpus(seed=13, text_bytes=ENTRY_BYTES)
    samples: list[str] = []
    bar = Progress("load search_entries (COPY)", enabled=show)
    start = time.perf_counter()
    async with await psycopg.AsyncConnection.connect(db, autocommit=True) as conn:
        await conn.execute("DROP INDEX IF EXISTS search_entries_fts")
        async with conn.transaction(), conn.cursor() as cur:
            cols = "tenant, session_id, label, key, content, created_seq, updated_seq"
            async with cur.copy(f"COPY search_entries ({cols}) FROM STDIN") as copy:
                for i in range(n):
                    text, rare = corpus.text()
                    if i % 97 == 0:
                        samples.append(rare[0])
                    await copy.write_row((TENANT, SESSION, SEARCHABLE, f"e{i:07d}", text, 1, 1))
                    if i % 1000 == 0:
                        bar(i, n)
        bar(n, n)
        bar.close()
        await conn.execute("SET maintenance_work_mem = '512MB'")
        await conn.execute(  # as migrations 010 and 018 define it
            "CREATE INDEX IF NOT EXISTS search_entries_fts ON search_entries USING gin (content_tsv) "
            "WITH (fastupdate = on, gin_pending_list_limit = 128)"
        )
        await conn.execute("ANALYZE search_entries")
    return time.perf_counter() - start, samples


async def context(settings: Settings, infra: Infra, options: BenchOptions) -> Report:
    n = options.size(options.messages, 100_000, 500)
    reps = options.size(options.requests, 200, 5)
    budget = 5.0 if options.smoke else 20.0
    report = Report("context", {"search_entries": n, "requests": reps})
    async with scratch_database(infra) as db:
        cfg = bench_settings(settings, infra, db, api_port=free_port())
        async with open_container(cfg) as c:
            load_s, samples = await load_entries(db, n, options.progress)
            report.metrics["load_rows_per_s"] = round(n / load_s, 1)
            runner = c.projector()
            stop = asyncio.Event()
            task = asyncio.create_task(runner.run(stop), name="bench-projector")
            meter = CpuMeter(infra.pids, db_name(db))
            try:
                await _consumer_ready(c, runner.durable)
                config = SessionConfig(
                    blocks=[
                        WritableBlock(label=WRITABLE, description="notes", max_tokens=100_000_000),
                        SearchableBlock(label=SEARCHABLE, description="knowledge base"),
                    ]
                )
                await c.context.configure(TENANT, SESSION, config)
                first = await c.context.frozen_prompt(TENANT, SESSION)  # the freeze itself
                ctx = c.context

                async def frozen(_: int) -> None:
                    got = await ctx.frozen_prompt(TENANT, SESSION)
                    if got.version != first.version:
                        raise RuntimeError("the frozen prompt changed")

                meter.reset()
                report.metrics["frozen_prompt"] = summary_ms(await timed(frozen, reps, budget_s=budget))
                report.cpu_s["frozen_prompt"] = await meter.used()

                async def append(i: int) -> None:
                    args = {
                        "label": WRITABLE,
                        "content": f"note {i}: prefers short answers",
                        "action": "append",
                    }
                    out = await ctx.execute(TENANT, SESSION, "set_context", args)
                    if out.startswith("Error"):
                        raise RuntimeError(out)

                meter.reset()
                report.metrics["set_context_append"] = summary_ms(await timed(append, reps, budget_s=budget))
                report.cpu_s["set_context_append"] = await meter.used()

                scenarios = {
                    "search_selective": samples,
                    "search_common": list(COMMON_WORDS),
                }
                async with await psycopg.AsyncConnection.connect(db, autocommit=True) as conn:

                    async def select1(_: int) -> None:
                        await (await conn.execute("SELECT 1")).fetchone()

                    report.baseline["select_1"] = summary_ms(await timed(select1, reps, budget_s=budget))
                    for name, words in scenarios.items():
                        hits: list[int] = []

                        async def tool(i: int, words: list[str] = words, hits: list[int] = hits) -> None:
                            out = await ctx.execute(
                                TENANT, SESSION, "search_context", {"label": SEARCHABLE, "query": words[i % len(words)]}
                            )
                            if out.startswith("Error"):
                                raise RuntimeError(out)
                            hits.append(out.count("\n[e"))

                        async def direct(i: int, words: list[str] = words) -> None:
                            await context_queries.search_entries(
                                conn, TENANT, SESSION, SEARCHABLE, words[i % len(words)]
                            )

                        async def unranked(i: int, words: list[str] = words) -> None:
                            cur = await conn.execute(UNRANKED, (TENANT, SESSION, SEARCHABLE, words[i % len(words)]))
                            await cur.fetchall()

                        meter.reset()
                        stats: dict[str, Any] = summary_ms(await timed(tool, reps, budget_s=budget))
                        report.cpu_s[name] = await meter.used()
                        stats["mean_hits"] = round(sum(hits) / max(len(hits), 1) + 1, 1)  # the first has no "\n"
                        report.metrics[name] = stats
                        report.metrics[f"{name}_query"] = summary_ms(await timed(direct, reps, budget_s=budget))
                        report.baseline[f"{name}_unranked"] = summary_ms(await timed(unranked, reps, budget_s=budget))

                async with running_api(cfg, infra, projector=False) as running:
                    client = running.client

                    async def get_prompt(_: int) -> None:
                        resp = await client.get(f"/v1/sessions/{SESSION}/system-prompt")
                        resp.raise_for_status()
                        if resp.json()["version"] != first.version:
                            raise RuntimeError("the frozen prompt changed")

                    async def post_append(i: int) -> None:
                        args = {"label": WRITABLE, "content": f"http note {i}", "action": "append"}
                        resp = await client.post(f"/v1/sessions/{SESSION}/tools/set_context", json=args)
                        resp.raise_for_status()
                        if resp.json()["result"].startswith("Error"):
                            raise RuntimeError(resp.json()["result"])

                    await get_prompt(0)
                    report.metrics["http_frozen_prompt"] = summary_ms(await timed(get_prompt, reps, budget_s=budget))
                    report.metrics["http_set_context_append"] = summary_ms(
                        await timed(post_append, reps, budget_s=budget)
                    )
                async with c.pool.connection() as conn2:
                    block = (await context_queries.block_contents(conn2, TENANT, SESSION)).get(WRITABLE, "")
                report.metrics["writable_block_lines"] = block.count("\n") + 1
            finally:
                stop.set()
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(task, timeout=30)

    m, b = report.metrics, report.baseline
    sel1 = b["select_1"]

    def ratio(stats: dict[str, float], base: dict[str, float]) -> str:
        return f"{stats['p50'] / base['p50']:.1f}x" if base["p50"] else ""

    rows = [
        ("frozen_prompt (in-process) p50 / p95", "frozen_prompt", sel1),
        ("GET system-prompt p50 / p95", "http_frozen_prompt", sel1),
        ("set_context append (in-process) p50 / p95", "set_context_append", sel1),
        ("POST tools/set_context append p50 / p95", "http_set_context_append", sel1),
    ]
    for label, key, base in rows:
        report.row(label, fmt_ms(m[key], "p50", "p95"), fmt_ms(base, "p50", "p95") + " (SELECT 1)", ratio(m[key], base))
        report.ratio[f"{key} p50 / select_1 p50"] = round(m[key]["p50"] / max(base["p50"], 1e-6), 2)
    for name in ("search_selective", "search_common"):
        base = b[f"{name}_unranked"]
        kind = name.split("_")[1]
        report.row(
            f"search_context tool, {kind} p50 / p95 (hits {m[name]['mean_hits']:g})",
            fmt_ms(m[name], "p50", "p95"),
            fmt_ms(base, "p50", "p95") + " (unranked)",
            ratio(m[name], base),
        )
        report.row(
            f"  context_queries.search_entries, {kind}",
            fmt_ms(m[f"{name}_query"], "p50", "p95"),
            fmt_ms(base, "p50", "p95") + " (unranked)",
            ratio(m[f"{name}_query"], base),
        )
        report.ratio[f"{name} p50 / unranked p50"] = round(m[name]["p50"] / max(base["p50"], 1e-6), 2)
    report.row("load search_entries (COPY, GIN built after)", f"{m['load_rows_per_s']:,.0f} rows/s")
    report.targets = [
        Target("frozen prompt read p50 (in-process)", m["frozen_prompt"]["p50"], "<", 5.0, " ms"),
        Target("frozen prompt read p50 (HTTP)", m["http_frozen_prompt"]["p50"], "<", 5.0, " ms"),
        Target("set_context append p50, end to end", m["set_context_append"]["p50"], "<", 10.0, " ms"),
        Target(f"search_context p95 over {n:,} entries, selective", m["search_selective"]["p95"], "<", 50.0, " ms"),
        Target(f"search_context p95 over {n:,} entries, common words", m["search_common"]["p95"], "<", 50.0, " ms"),
    ]
    return report
