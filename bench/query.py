"""``chronicle bench history`` and ``chronicle bench search``: the read side.

The read model is loaded directly with ``COPY`` (the rows a projector would write, byte for byte:
see :mod:`bench.data`), since these benchmarks measure queries, not ingestion.
history: :func:`projections.queries.path_contents` (what ``GET …/history`` reads), the full-row
:func:`projections.queries.history`, and ``GET …/history`` of a long branch; baseline: a
plain ``SELECT content`` of the same session's rows.
search: :func:`projections.queries.search`, selective, common and stop words and two words, in a session and
tenant-wide; baseline: the same match unranked with ``LIMIT``.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Iterator
from typing import Any

import psycopg

from bench.client import Answer
from bench.data import (
    COMMON_QUERY,
    TENANT,
    Msg,
    add_sessions,
    chain,
    copy_rows,
    message_id,
    messages,
    session_name,
    to_row,
)
from bench.http_api import running_api
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
from projections import queries
from projections.migrate import migrate
from services.ops.localstack import free_port
from services.ops.progress import Progress
from services.settings import Settings

FTS_INDEX = (  # as migrations 010 and 018 make it
    "CREATE INDEX IF NOT EXISTS messages_fts ON messages USING gin (content_tsv) "
    "WITH (fastupdate = on, gin_pending_list_limit = 128)"
)


async def load(db: str, msgs: Iterator[Msg], total: int, show: bool | None, *, connections: int = 2) -> float:
    """``COPY`` messages into the read model over ``connections`` backends (the tsvector is
    computed by each backend), with the GIN index built once at the end. Returns seconds."""
    bar = Progress("load (COPY)", enabled=show)
    done = [0]
    seq = itertools.count(1)
    rows = (to_row(m, next(seq)) for m in msgs)

    def tick() -> None:
        done[0] += 1
        if done[0] % 1000 == 0:
            bar(done[0], total)

    start = time.perf_counter()
    async with await psycopg.AsyncConnection.connect(db, autocommit=True) as conn:
        await conn.execute("DROP INDEX IF EXISTS messages_fts")
        # The tasks share one generator: asyncio runs one ``next()`` at a time.
        await asyncio.gather(*(copy_rows(db, rows, on_row=tick) for _ in range(connections)))
        bar(total, total)
        bar.close()
        await conn.execute("SET maintenance_work_mem = '512MB'")
        await conn.execute(FTS_INDEX)
        await conn.execute("ANALYZE messages")
    return time.perf_counter() - start


async def history(settings: Settings, infra: Infra, options: BenchOptions) -> Report:
    sizes = (50, 200) if options.smoke else (1_000, 10_000)
    reps = options.size(options.requests, 200, 5)
    bg_n = options.size(options.messages, 20_000, 200)
    bg_sessions = options.size(options.sessions, 20, 4)
    report = Report("history", {"branches": list(sizes), "requests": reps, "other_messages": bg_n})
    async with scratch_database(infra) as db:
        cfg = bench_settings(settings, infra, db, api_port=free_port())
        await migrate(db)
        branches = {size: f"branch-{size}" for size in sizes}
        data = itertools.chain(
            messages(bg_n, bg_sessions, prefix="other-"), *(chain(name, size) for size, name in branches.items())
        )
        total = bg_n + sum(sizes)
        load_s = await load(db, data, total, options.progress, connections=1)
        names = [f"other-{session_name(i)}" for i in range(bg_sessions)] + list(branches.values())
        await add_sessions(db, names, total)
        report.metrics["load_rows_per_s"] = round(total / load_s, 1)

        meter = CpuMeter(infra.pids, db_name(db))
        async with await psycopg.AsyncConnection.connect(db, autocommit=True) as conn:
            for size, name in branches.items():
                leaf = message_id(size - 1)
                n = reps if size <= 1_000 else max(3, reps // 5)
                got = await queries.history(conn, TENANT, name, leaf)
                if len(got) != size:
                    raise RuntimeError(f"history of {name} has {len(got)} messages, expected {size}")

                async def hist(_: int, name: str = name, leaf: str = leaf) -> None:
                    await queries.path_contents(conn, TENANT, name, leaf)

                async def full(_: int, name: str = name, leaf: str = leaf) -> None:
                    await queries.history(conn, TENANT, name, leaf)

                async def plain(_: int, name: str = name) -> None:
                    cur = await conn.execute(
                        "SELECT content FROM messages WHERE tenant = %s AND session_id = %s", (TENANT, name)
                    )
                    await cur.fetchall()

                meter.reset()
                report.metrics[f"query_{size}"] = summary_ms(await timed(hist, n))
                report.cpu_s[f"queries.path_contents {size}"] = await meter.used()
                report.metrics[f"query_full_{size}"] = summary_ms(await timed(full, n))
                report.baseline[f"select_{size}"] = summary_ms(await timed(plain, n))

        async with running_api(cfg, infra, projector=False) as running:
            client = running.client
            for size, name in branches.items():
                leaf = message_id(size - 1)
                n = reps if size <= 1_000 else max(3, reps // 5)

                last: list[Answer] = []

                async def get(_: int, name: str = name, leaf: str | None = leaf, last: list[Answer] = last) -> None:
                    """Timed to the response's last byte, as HTTP load tools time a request; the
                    client's own JSON parse is measured apart, below."""
                    params = {"leaf_id": leaf} if leaf else {}
                    resp = await client.get(f"/v1/sessions/{name}/history", params=params)
                    resp.raise_for_status()
                    last[:] = [resp]

                await get(0)
                report.metrics[f"http_{size}"] = summary_ms(await timed(get, n))

                async def parse(_: int, size: int = size, last: list[Answer] = last) -> None:
                    if len(last[0].json()["messages"]) != size:
                        raise RuntimeError(f"GET history did not return {size} messages")

                report.metrics[f"client_parse_{size}"] = summary_ms(await timed(parse, n))

                async def get_latest(i: int, name: str = name) -> None:
                    await get(i, name, None)

                report.metrics[f"http_latest_leaf_{size}"] = summary_ms(await timed(get_latest, n))

    for size in sizes:
        q, http, latest = (report.metrics[f"{k}_{size}"] for k in ("query", "http", "http_latest_leaf"))
        base = report.baseline[f"select_{size}"]
        report.ratio[f"query_{size} p50 / select p50"] = round(q["p50"] / base["p50"], 2)
        report.ratio[f"http_{size} p50 / select p50"] = round(http["p50"] / base["p50"], 2)
        b = fmt_ms(base, "p50", "p95")
        whole = report.metrics[f"query_full_{size}"]
        report.row(
            f"path read (what GET reads), {size:,} p50 / p95",
            fmt_ms(q, "p50", "p95"),
            b,
            f"{q['p50'] / base['p50']:.1f}x",
        )
        report.row(
            f"queries.history (every column), {size:,} p50 / p95",
            fmt_ms(whole, "p50", "p95"),
            b,
            f"{whole['p50'] / base['p50']:.1f}x",
        )
        report.row(
            f"GET history?leaf_id, {size:,} p50 / p95",
            fmt_ms(http, "p50", "p95"),
            b,
            f"{http['p50'] / base['p50']:.1f}x",
        )
        report.row(
            f"GET history (latest leaf), {size:,} p50 / p95",
            fmt_ms(latest, "p50", "p95"),
            b,
            f"{latest['p50'] / base['p50']:.1f}x",
        )
        report.row(
            f"client's json.loads of that answer, {size:,} p50 / p95",
            fmt_ms(report.metrics[f"client_parse_{size}"], "p50", "p95"),
            "",
            "",
        )
    small = sizes[0]
    report.targets = [
        Target(f"path read p50, {small:,}-message branch", report.metrics[f"query_{small}"]["p50"], "<", 10.0, " ms"),
        Target(
            f"GET history p50 (to the last byte), {small:,}-message branch",
            report.metrics[f"http_{small}"]["p50"],
            "<",
            10.0,
            " ms",
        ),
    ]
    return report


UNRANKED = (
    "SELECT id FROM messages WHERE tenant = %s AND (%s::text IS NULL OR session_id = %s) "
    "AND content_tsv @@ plainto_tsquery('chronicle_search.english', %s) LIMIT %s"
)
COMMON_WORDS = (COMMON_QUERY, "water", "time", "work")
STOP_WORDS = ("the", "of", "and", "to")  # in nearly every message: the worst case of a bounded candidate set


async def search(settings: Settings, infra: Infra, options: BenchOptions) -> Report:
    m = options.size(options.messages, 1_000_000, 2_000)
    s = options.size(options.sessions, 1_000, 10)
    reps = options.size(options.requests, 50, 5)
    budget = 5.0 if options.smoke else 20.0
    limit = 20
    report = Report("search", {"messages": m, "sessions": s, "requests": reps, "limit": limit})
    samples: list[tuple[str, str]] = []

    def remember(msgs: Iterator[Msg]) -> Iterator[Msg]:
        for msg in msgs:
            if msg.index % 97 == 0:
                samples.append((msg.session, msg.rare[0]))
            yield msg

    async with scratch_database(infra) as db:
        await migrate(db)
        load_s = await load(db, remember(messages(m, s)), m, options.progress)
        await add_sessions(db, [session_name(i) for i in range(s)], m)
        report.metrics["load_rows_per_s"] = round(m / load_s, 1)
        report.metrics["load_s"] = round(load_s, 1)

        meter = CpuMeter(infra.pids, db_name(db))
        scenarios: dict[str, list[tuple[str | None, str]]] = {
            "selective_session": [(sess, w) for sess, w in samples],
            "selective_tenant": [(None, w) for _, w in samples],
            "common_session": [(session_name(i % s), COMMON_WORDS[i % 4]) for i in range(reps)],
            "common_tenant": [(None, COMMON_WORDS[i % 4]) for i in range(reps)],
            "stopword_session": [(session_name(i % s), STOP_WORDS[i % 4]) for i in range(reps)],
            "stopword_tenant": [(None, STOP_WORDS[i % 4]) for i in range(reps)],
            "two_words_tenant": [(None, f"{COMMON_WORDS[i % 4]} {w}") for i, (_, w) in enumerate(samples)],
        }
        async with await psycopg.AsyncConnection.connect(db, autocommit=True) as conn:
            for name, cases in scenarios.items():
                hits: list[int] = []

                async def ranked(i: int, cases: list[tuple[str | None, str]] = cases, hits: list[int] = hits) -> None:
                    session, q = cases[i % len(cases)]
                    hits.append(len(await queries.search(conn, TENANT, session, q, limit)))

                async def unranked(i: int, cases: list[tuple[str | None, str]] = cases) -> None:
                    session, q = cases[i % len(cases)]
                    cur = await conn.execute(UNRANKED, (TENANT, session, session, q, limit))
                    await cur.fetchall()

                meter.reset()
                stats: dict[str, Any] = summary_ms(await timed(ranked, reps, budget_s=budget))
                report.cpu_s[name] = await meter.used()
                stats["mean_hits"] = round(sum(hits) / max(len(hits), 1), 1)
                report.metrics[name] = stats
                report.baseline[name] = summary_ms(await timed(unranked, reps, budget_s=budget))

    for name in scenarios:
        q, base = report.metrics[name], report.baseline[name]
        report.ratio[f"{name} p50 / unranked p50"] = round(q["p50"] / base["p50"], 2)
        report.row(
            f"{name.replace('_', ', ')} p50 / p95 (hits {q['mean_hits']:g})",
            fmt_ms(q, "p50", "p95"),
            fmt_ms(base, "p50", "p95"),
            f"{q['p50'] / base['p50']:.1f}x",
        )
    report.row("load (COPY, 2 backends, GIN built after)", f"{report.metrics['load_rows_per_s']:,.0f} rows/s")
    report.targets = [
        Target("selective p95, session", report.metrics["selective_session"]["p95"], "<", 50.0, " ms"),
        Target("selective p95, tenant-wide", report.metrics["selective_tenant"]["p95"], "<", 50.0, " ms"),
    ]
    return report
