"""``chronicle bench encryption``: what sealing costs (events/sealing.py), on against off.

The same messages, in the same run, twice: once with ``encryption`` off, once on (each mode on a
database and a stream of its own). For each mode:

* ingest: :meth:`Publisher.publish_many` (sealing each event when on) while a ``chronicle
  projector`` process (opening each event when on) applies them, until its checkpoint reaches the
  last sequence (as ``bench ingest`` measures it, with one projector);
* rebuild: :func:`rebuild_into` of the whole log into a fresh schema;
* history: ``reads`` history reads from the read model (the path the API serves: the same rows
  either way), and ``reads`` reads of a session's history as of its last event, which replay the
  session's log (opened when sealed).

The baseline of every "on" figure is the same figure "off"; the target is 0.9x or better. The
modes run off, on, on, off and each figure is the better of its two runs, so that a change in the
machine's load during the run weighs on both modes alike.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

from pydantic import SecretStr

from bench.data import TENANT, messages, to_event
from bench.ingest import _checkpoints, _consumers_ready, projector_processes
from bench.support import BenchOptions, Infra, Report, Target, bench_settings, fmt_rate, scratch_database
from events.catalog import MessageAppended
from projections import queries
from projections.keystore import new_kek_line
from projections.rebuild import rebuild_into
from services.audit.readers import session_as_of
from services.bootstrap import open_container
from services.ops.progress import Progress
from services.settings import Settings

CHUNK = 2000


@dataclass
class Measured:
    ingest_per_s: float
    rebuild_per_s: float
    history_per_s: float
    as_of_per_s: float
    ingest_cpu_us: float  # the publisher's CPU per event (this process): steadier than wall time
    rebuild_cpu_us: float


async def measure(
    settings: Settings, infra: Infra, events: list[MessageAppended], sealed: bool, reads: int, kek: str
) -> Measured:
    n = len(events)
    sessions = sorted({e.session for e in events})
    async with scratch_database(infra) as db:
        cfg = bench_settings(settings, infra, db, encryption=sealed, kek=SecretStr(kek))
        log = infra.tmp / f"sealing-projector-{'on' if sealed else 'off'}.log"
        async with open_container(cfg) as c, projector_processes(cfg, 1, log):
            await _consumers_ready(c, 1)
            start, cpu = time.perf_counter(), time.process_time()
            top = 0
            for i in range(0, n, CHUNK):
                results = await c.publisher.publish_many(events[i : i + CHUNK])
                top = max(top, *(r.seq for r in results))
            ingest_cpu = time.process_time() - cpu
            deadline = time.monotonic() + max(120.0, n / 100)
            while True:  # the projector process's checkpoint, polled as bench ingest polls it
                if (await _checkpoints(c, [cfg.projector_name]))[cfg.projector_name] >= top:
                    break
                if time.monotonic() > deadline:
                    raise TimeoutError("the projector did not reach the last sequence")
                await asyncio.sleep(0.02)
            ingest_s = time.perf_counter() - start

            start, cpu = time.perf_counter(), time.process_time()
            await rebuild_into(c.js, c.layout, db, "bench_rebuild", c.projections(), "bench-rebuild", keys=c.keys)
            rebuild_s = time.perf_counter() - start
            rebuild_cpu = time.process_time() - cpu

            picks = [sessions[i % len(sessions)] for i in range(reads)]
            start = time.perf_counter()
            for sid in picks:
                async with c.pool.connection() as conn:
                    leaf = await queries.latest_leaf(conn, TENANT, sid)
                    assert leaf is not None
                    await queries.history(conn, TENANT, sid, leaf.id)
            history_s = time.perf_counter() - start

            start = time.perf_counter()
            for sid in picks:
                state = await session_as_of(c, TENANT, sid, top)
                assert state.latest_leaf() is not None
            as_of_s = time.perf_counter() - start
    return Measured(
        n / ingest_s, n / rebuild_s, reads / history_s, reads / as_of_s, ingest_cpu / n * 1e6, rebuild_cpu / n * 1e6
    )


def best(runs: list[Measured]) -> Measured:
    """Each figure's best run (the least disturbed by the machine's other work)."""
    rates = ("ingest_per_s", "rebuild_per_s", "history_per_s", "as_of_per_s")
    costs = ("ingest_cpu_us", "rebuild_cpu_us")
    return Measured(
        *(max(getattr(r, f) for r in runs) for f in rates), *(min(getattr(r, f) for r in runs) for f in costs)
    )


async def encryption(settings: Settings, infra: Infra, options: BenchOptions) -> Report:
    n = options.size(options.messages, 50_000, 300)
    sessions = options.size(options.sessions, 500, 10)
    reads = options.size(options.requests, 200, 10)
    report = Report("encryption", {"messages": n, "sessions": sessions, "reads": reads})
    report.head = ("metric", "encryption on", "off (baseline)", "on / off")
    bar = Progress("prepare", enabled=options.progress)
    events = [to_event(m) for m in messages(n, sessions)]
    bar.close()
    kek = new_kek_line()
    runs: dict[bool, list[Measured]] = {False: [], True: []}
    for sealed in (False, True, True, False)[: 2 if options.smoke else 4]:  # ABBA: drift hits both alike
        runs[sealed].append(await measure(settings, infra, events, sealed, reads, kek))
    off, on = best(runs[False]), best(runs[True])
    pairs = {
        "ingest (publish -> checkpoint)": (on.ingest_per_s, off.ingest_per_s, " msg/s"),
        "rebuild_into": (on.rebuild_per_s, off.rebuild_per_s, " ev/s"),
        "history (read model)": (on.history_per_s, off.history_per_s, " reads/s"),
        "history as of (replays the log)": (on.as_of_per_s, off.as_of_per_s, " reads/s"),
    }
    for name, (value, base, unit) in pairs.items():
        ratio = value / base
        report.row(name, fmt_rate(value, unit), fmt_rate(base, unit), f"{ratio:.2f}x")
        report.ratio[name] = round(ratio, 3)
        report.targets.append(Target(f"{name}: on vs off", round(ratio, 3), ">=", 0.9, "x"))
    for name, (value, base) in {
        "ingest: the publisher's CPU per event": (on.ingest_cpu_us, off.ingest_cpu_us),
        "rebuild: this process's CPU per event": (on.rebuild_cpu_us, off.rebuild_cpu_us),
    }.items():
        report.row(name, f"{value:,.0f} µs", f"{base:,.0f} µs", f"{value / base:.2f}x")
    report.metrics = {"on": vars(on), "off": vars(off)}
    report.baseline = {"off": vars(off)}
    return report
