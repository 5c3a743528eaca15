"""``chronicle bench ingest`` and ``chronicle bench rebuild``: the write path, end to end.

ingest: messages published with :meth:`Publisher.publish_many` while an in-process
:class:`ProjectorRunner` applies them; measured until the checkpoint reaches the last sequence.
rebuild: the same events replayed by :func:`rebuild_into` into a fresh schema.
Both compare with the same rows inserted by plain psycopg ``executemany`` into a scratch table
with the same columns, generated tsvector and GIN index (batches of 1,000, one transaction each).
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import time
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

from bench.data import TENANT, Row, baseline_insert, messages, to_event, to_row
from bench.support import (
    BenchOptions,
    CpuMeter,
    Infra,
    Report,
    Target,
    WalMeter,
    bench_settings,
    checkpoint,
    db_name,
    fmt_rate,
    percentile,
    scratch_database,
    service,
    summary_ms,
)
from events import log as eventlog
from events.admission import admit
from events.catalog import MessageAppended
from events.subjects import partition_of
from projections.migrate import migrate
from projections.rebuild import rebuild_into
from projections.runner import partition_checkpoint
from services.bootstrap import Container, open_container, worker_partitions
from services.ops.progress import Progress
from services.settings import Settings

CHUNK = 2000


def prepare(n: int, sessions: int, show: bool | None) -> tuple[list[MessageAppended], list[Row]]:
    """The events and the equivalent baseline rows (sequence ``i + 1`` for the i-th event)."""
    bar = Progress("prepare", enabled=show)
    events: list[MessageAppended] = []
    rows: list[Row] = []
    for m in messages(n, sessions):
        events.append(to_event(m))
        rows.append(to_row(m, m.index + 1))
        if m.index % 1000 == 0:
            bar(m.index, n)
    bar(n, n)
    bar.close()
    return events, rows


async def publish_all(
    c: Container, events: Sequence[MessageAppended], bar: Progress
) -> tuple[list[tuple[float, int]], dict[int, int]]:
    """Publish in chunks; returns (ack time of the chunk, its highest sequence) per chunk, and the
    highest sequence per partition."""
    acks: list[tuple[float, int]] = []
    last: dict[int, int] = {}
    parts = c.layout.partitions
    for start in range(0, len(events), CHUNK):
        chunk = events[start : start + CHUNK]
        results = await c.publisher.publish_many(chunk)
        acks.append((time.perf_counter(), max(r.seq for r in results)))
        for ev, r in zip(chunk, results, strict=True):
            p = partition_of(ev.tenant, ev.session, parts)
            last[p] = max(last.get(p, 0), r.seq)
        bar(start + len(results), len(events))
    return acks, last


async def _consumer_ready(c: Container, durable: str, timeout_s: float = 15.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with contextlib.suppress(Exception):
            await c.js.consumer_info(c.layout.stream, durable)
            return
        await asyncio.sleep(0.01)
    raise TimeoutError("the projector did not create its consumer")


async def count_messages(c: Container, schema: str = "public") -> int:
    async with c.pool.connection() as conn:
        cur = await conn.execute(f'SELECT count(*) FROM "{schema}".messages WHERE tenant = %s', (TENANT,))
        row = await cur.fetchone()
    return int(row[0]) if row else 0


async def _baseline(
    db: str, rows: list[Row], wal: WalMeter, meter: CpuMeter, report: Report, options: BenchOptions
) -> float:
    """Raw psycopg inserts of the same rows (the same-run baseline); returns the seconds it took."""
    bar = Progress("baseline insert", enabled=options.progress)
    await wal.reset()
    meter.reset()
    seconds = await baseline_insert(db, rows, progress=bar)
    bar.close()
    report.cpu_s["baseline"] = await meter.used()
    report.wal["baseline"] = await wal.used(len(rows))
    return seconds


@contextlib.asynccontextmanager
async def projector_processes(cfg: Settings, workers: int, log_path: Path) -> AsyncIterator[dict[str, int]]:
    """``chronicle projector`` child processes as ``chronicle up`` starts them: one, or ``workers``
    each with its share of the partitions; yields their pids by name."""
    async with contextlib.AsyncExitStack() as stack:
        pids: dict[str, int] = {}
        for w in range(workers):
            parts = worker_partitions(cfg.partitions, workers, w) if workers > 1 else None
            proc = await stack.enter_async_context(
                service("projector", cfg.model_copy(update={"projector_partitions": parts}), log_path)
            )
            pids[f"projector {w}" if workers > 1 else "projector"] = proc.pid
        yield pids


def checkpoint_names(cfg: Settings, workers: int) -> dict[str, int | None]:
    """The projector checkpoints to watch, with the partition each one covers (None: all)."""
    if workers == 1:
        return {cfg.projector_name: None}
    return {partition_checkpoint(cfg.projector_name, p): p for p in range(cfg.partitions)}


async def _consumers_ready(c: Container, count: int, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while len(await c.js.consumers_info(c.layout.stream)) < count:
        if time.monotonic() > deadline:
            raise TimeoutError("the projectors did not create their consumers")
        await asyncio.sleep(0.05)


async def _checkpoints(c: Container, names: Sequence[str]) -> dict[str, int]:
    async with c.pool.connection() as conn:
        cur = await conn.execute("SELECT name, seq FROM checkpoints WHERE name = ANY(%s)", (list(names),))
        got = {str(n): int(q) for n, q in await cur.fetchall()}
    return {n: got.get(n, 0) for n in names}


async def ingest(settings: Settings, infra: Infra, options: BenchOptions) -> Report:
    n = options.size(options.messages, 200_000, 300)
    sessions = options.size(options.sessions, 1_000, 10)
    workers = max(1, options.projector_workers)
    report = Report(
        "ingest",
        {
            "messages": n,
            "sessions": sessions,
            "projector_batch": settings.projector_batch,
            "projector_workers": workers,
        },
    )
    events, rows = prepare(n, sessions, options.progress)
    wal = WalMeter(infra.pg_admin)
    async with scratch_database(infra) as db:
        cfg = bench_settings(settings, infra, db)
        if workers > 1:  # one partition per worker: one subject filter each (several cost nats-server CPU)
            cfg = cfg.model_copy(update={"partitions": workers})
        await migrate(db)
        await checkpoint(infra.pg_admin)

        base_s = await _baseline(db, rows, wal, CpuMeter(infra.pids, db_name(db)), report, options)
        base_rate = n / base_s
        del rows

        async with (
            open_container(cfg) as c,
            projector_processes(cfg, workers, infra.tmp / "ingest-projector.log") as pids,
        ):
            watched = checkpoint_names(cfg, workers)
            names = list(watched)
            await _consumers_ready(c, workers)
            meter = CpuMeter({**infra.pids, **pids}, db_name(db))
            await checkpoint(infra.pg_admin)
            # the last sequence each projector must reach: known once everything is published
            targets: dict[str, int] = {}
            applied: list[tuple[float, int]] = []  # (time, lowest checkpoint) per poll
            lag_samples: list[int] = []
            done = asyncio.Event()
            bar = Progress("ingest (applied)", enabled=options.progress)

            async def poll() -> None:
                while True:
                    seqs = await _checkpoints(c, names)
                    now = time.perf_counter()
                    low = min(seqs.values())
                    applied.append((now, low))
                    info = await c.js.stream_info(c.layout.stream)
                    lag_samples.append(max(0, int(info.state.last_seq) - low))
                    bar(low, n)
                    if targets and all(seqs[k] >= v for k, v in targets.items()):
                        done.set()
                    await asyncio.sleep(0.05)

            await wal.reset()
            meter.reset()
            poller = asyncio.create_task(poll(), name="bench-checkpoint-poller")
            t0 = time.perf_counter()
            try:
                acks, last_by_partition = await publish_all(c, events, Progress("", enabled=False))
                t_pub = time.perf_counter()
                for name, part in watched.items():
                    targets[name] = acks[-1][1] if part is None else last_by_partition.get(part, 0)
                await asyncio.wait_for(done.wait(), timeout=max(120.0, n / 100))
                t_end = applied[-1][0]
                report.cpu_s["chronicle ingest"] = await meter.used()
                report.wal["chronicle ingest"] = await wal.used(n)
            finally:
                poller.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await poller
                bar.close()
            stored = await count_messages(c)

    ack_times = [t for t, _ in acks]
    ack_seqs = [s for _, s in acks]
    lag_s: list[float] = []
    for t_apply, seq in _advances(applied):
        i = min(bisect.bisect_left(ack_seqs, seq), len(acks) - 1)
        lag_s.append(max(0.0, t_apply - ack_times[i]))
    e2e = t_end - t0
    rate = n / e2e
    publish_rate = n / (t_pub - t0)
    lag_ms = summary_ms(lag_s)
    report.metrics = {
        "messages": n,
        "stored_rows": stored,
        "end_to_end_s": round(e2e, 3),
        "msgs_per_s": round(rate, 1),
        "publish_s": round(t_pub - t0, 3),
        "publish_per_s": round(publish_rate, 1),
        "drain_after_publish_s": round(t_end - t_pub, 3),
        "lag_events_p50": percentile(lag_samples, 50),
        "lag_events_p99": percentile(lag_samples, 99),
        "lag_events_max": max(lag_samples, default=0),
        "lag_ms_p50": lag_ms["p50"],
        "lag_ms_p99": lag_ms["p99"],
        "lag_ms_max": lag_ms["max"],
    }
    report.baseline = {"rows": n, "seconds": round(base_s, 3), "rows_per_s": round(base_rate, 1)}
    report.ratio = {"msgs_per_s / baseline rows_per_s": round(rate / base_rate, 3)}
    report.row(
        "end to end (publish -> checkpoint)",
        fmt_rate(rate, " msg/s"),
        fmt_rate(base_rate, " rows/s"),
        f"{rate / base_rate:.2f}x",
    )
    report.row("publish (publish_many)", fmt_rate(publish_rate, " msg/s"))
    report.row(
        "elapsed: publish / drain / total", f"{t_pub - t0:.1f} / {t_end - t_pub:.1f} / {e2e:.1f} s", f"{base_s:.1f} s"
    )
    report.row(
        "projection lag p50 / p99 (events)",
        f"{report.metrics['lag_events_p50']:,} / {report.metrics['lag_events_p99']:,}",
    )
    report.row("projection lag p50 / p99 (time)", f"{lag_ms['p50']:,.0f} / {lag_ms['p99']:,.0f} ms")
    report.row("projector processes", f"{workers}")
    report.row("rows in messages", f"{stored:,}")
    report.targets = [
        Target("end to end vs baseline", round(rate / base_rate, 3), ">=", 0.8, "x"),
        Target("end to end msg/s", round(rate, 1), ">=", 3000),
    ]
    if stored != n:
        report.notes.append(f"expected {n} rows in messages, found {stored}")
    return report


def _advances(samples: Sequence[tuple[float, int]]) -> list[tuple[float, int]]:
    """The polls at which the lowest checkpoint moved (when each applied sequence was first seen)."""
    out: list[tuple[float, int]] = []
    for t, seq in samples:
        if not out or seq > out[-1][1]:
            out.append((t, seq))
    return out


async def rebuild(settings: Settings, infra: Infra, options: BenchOptions) -> Report:
    n = options.size(options.messages, 200_000, 300)
    sessions = options.size(options.sessions, 1_000, 10)
    report = Report("rebuild", {"messages": n, "sessions": sessions})
    events, rows = prepare(n, sessions, options.progress)
    wal = WalMeter(infra.pg_admin)
    async with scratch_database(infra) as db:
        meter = CpuMeter(infra.pids, db_name(db))
        cfg = bench_settings(settings, infra, db)
        async with open_container(cfg) as c:
            bar = Progress("publish", enabled=options.progress)
            await publish_all(c, events, bar)
            bar.close()
            del events

            await checkpoint(infra.pg_admin)
            base_s = await _baseline(db, rows, wal, meter, report, options)
            base_rate = n / base_s
            del rows

            meter.reset()
            start = time.perf_counter()
            count = 0
            await c.keys.load_all()
            async for stored in eventlog.read(c.js, c.layout):
                admit(stored.data, stored.subject, c.layout, c.keys)  # as the projector reads (sealed: opened)
                count += 1
            read_s = time.perf_counter() - start
            report.cpu_s["read + decode"] = await meter.used()

            bar = Progress("rebuild", enabled=options.progress)
            await checkpoint(infra.pg_admin)
            await wal.reset()
            meter.reset()
            start = time.perf_counter()
            last = await rebuild_into(
                c.js, c.layout, db, "bench_rebuild", c.projections(), "bench-rebuild", progress=bar, keys=c.keys
            )
            rebuild_s = time.perf_counter() - start
            bar.close()
            report.cpu_s["rebuild"] = await meter.used()
            report.wal["rebuild"] = await wal.used(n)
            stored_rows = await count_messages(c, "bench_rebuild")

    rate = n / rebuild_s
    report.metrics = {
        "events": n,
        "last_seq": last,
        "stored_rows": stored_rows,
        "rebuild_s": round(rebuild_s, 3),
        "events_per_s": round(rate, 1),
        "read_decode_per_s": round(count / read_s, 1),
    }
    report.baseline = {"rows": n, "seconds": round(base_s, 3), "rows_per_s": round(base_rate, 1)}
    report.ratio = {"events_per_s / baseline rows_per_s": round(rate / base_rate, 3)}
    report.row("rebuild_into", fmt_rate(rate, " ev/s"), fmt_rate(base_rate, " rows/s"), f"{rate / base_rate:.2f}x")
    report.row("elapsed", f"{rebuild_s:.1f} s", f"{base_s:.1f} s")
    report.row("log read + decode only", fmt_rate(count / read_s, " ev/s"))
    report.row("rows in rebuilt messages", f"{stored_rows:,}")
    report.targets = [Target("rebuild vs ingest baseline", round(rate / base_rate, 3), ">=", 0.8, "x")]
    if stored_rows != n:
        report.notes.append(f"expected {n} rebuilt rows, found {stored_rows}")
    return report
