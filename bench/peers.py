"""``chronicle bench peers``: Chronicle through its SDK, and in the same run the libraries agent
builders compare it with, on the same Postgres server (issue #13).

Workloads (``--scale`` or the size flags shrink them; ``--smoke`` runs tiny ones):

* W1: 10 sessions x 200 appends, 10 sessions at a time;
* W2: 1 session x 1,000 sequential appends;
* W3: 1 session x 10,000 sequential appends; for Chronicle once more on a new session after
  ``ANALYZE`` of its database (``--no-analyze`` skips it), since its append cost depended on
  planner statistics.

Each system (see :mod:`bench.backends`) gets a fresh scratch database per repeat (and
Chronicle a fresh stream and fresh API, projector and compactor processes), warms up with a few
appends, then runs the workloads in order on that database. Reported per workload: appends/s,
append p50/p99 of the first and the last 10 % of each session's appends, history read p50, CPU per
append per process (sampled from ``/proc``; the clock of the CPU meter stops when the system has
caught up), and storage per message (the growth of the database's tables with their indexes and
TOAST, plus the JetStream stream's bytes) as a multiple of the text. Values are medians over
``--repeats`` (default 3); the systems' order rotates from repeat to repeat.
"""

from __future__ import annotations

import functools
import statistics
import sys
from collections.abc import Sequence
from typing import Any

from bench.backends import SYSTEMS, System
from bench.peers_report import ANALYZED, fill
from bench.support import BenchOptions, CpuMeter, Infra, Report, db_name, postmaster_pid, scratch_database
from bench.workloads import MemoryBackend, Workload, append_all, measure, read_histories, texts
from services.ops.progress import Progress
from services.settings import Settings

WORKLOADS = ("W1", "W2", "W3")


def plan(options: BenchOptions) -> list[Workload]:
    """The workloads to run, at the sizes the options ask for."""
    p = options.peers

    def size(value: int | None, full: int, smoke: int) -> int:
        if value is not None:
            return value
        return max(1, round(options.size(None, full, smoke) * p.scale))

    reads = options.size(p.reads, 20, 3)
    w3 = size(p.w3_appends, 10_000, 40)
    out = {
        "W1": Workload(
            "W1",
            sessions=options.size(options.sessions, 10, 2),
            appends=size(p.appends, 200, 10),
            concurrency=options.size(p.concurrency, 10, 2),
            reads=reads,
        ),
        "W2": Workload("W2", sessions=1, appends=size(p.w2_appends, 1_000, 20), concurrency=1, reads=reads),
        "W3": Workload("W3", sessions=1, appends=w3, concurrency=1, reads=max(3, reads // 4)),
    }
    chosen = p.workloads or WORKLOADS
    unknown = set(chosen) - set(out)
    if unknown:
        raise ValueError(f"unknown workload(s) {sorted(unknown)}; choose from {', '.join(WORKLOADS)}")
    return [out[w] for w in WORKLOADS if w in chosen]


def workloads_for(system: System, workloads: list[Workload], analyze: bool) -> list[Workload]:
    """Chronicle runs W3 a second time after ``ANALYZE``; the peers do not depend on statistics.
    A system does not run sessions longer than its ``max_appends``."""
    out = [w for w in workloads if system.max_appends is None or w.appends <= system.max_appends]
    w3 = next((w for w in workloads if w.name == "W3"), None)
    if system.name == "chronicle" and analyze and w3 is not None:
        out.append(Workload(ANALYZED, 1, w3.appends, 1, w3.reads, analyze=True))
    return out


def _seed(workload: Workload) -> int:
    """The same texts for every system; W3 after ANALYZE reuses W3's."""
    return 1000 + WORKLOADS.index(workload.name.split()[0])


async def _warm_up(backend: MemoryBackend) -> None:
    """Connections, tables, caches: a few appends and reads outside the measurement."""
    warm = Workload("warmup", sessions=1, appends=20, concurrency=1, reads=2)
    await append_all(backend, warm, texts(warm.total, seed=1))
    await backend.settle()
    await read_histories(backend, warm)


async def run_system(
    settings: Settings,
    infra: Infra,
    system: System,
    workloads: list[Workload],
    postmaster: int | None,
    progress: bool | None,
) -> dict[str, dict[str, Any]]:
    """One repeat of every workload on one system, on a fresh database (and stack)."""
    out: dict[str, dict[str, Any]] = {}
    concurrency = max(w.concurrency for w in workloads)
    async with scratch_database(infra) as db, system.open(settings, infra, db, concurrency) as backend:
        await _warm_up(backend)
        meter = CpuMeter(dict(backend.processes), db_name(db), postmaster=postmaster)
        for w in workloads:
            bar = Progress(f"peers {system.name} {w.name}", enabled=progress)
            shown = functools.partial(bar, total=w.total)
            out[w.name] = await measure(backend, w, meter, seed=_seed(w), progress=shown)
            bar.close()
    return out


def median_of(values: Sequence[Any]) -> Any:
    """Element-wise median of equally shaped results (numbers: the median; anything else: the first)."""
    first = values[0]
    if isinstance(first, dict):
        keys = dict.fromkeys(k for v in values for k in v)
        return {k: median_of([v[k] for v in values if k in v]) for k in keys}
    if isinstance(first, int | float) and not isinstance(first, bool):
        return round(statistics.median(values), 3)
    return first


def _say(line: str, notes: list[str] | None = None) -> None:
    """A line on stderr (long runs are followed in logs); with ``notes``, also in the report."""
    print(f"chronicle bench peers: {line}", file=sys.stderr, flush=True)
    if notes is not None:
        notes.append(line)


def runnable(chosen: Sequence[str], workloads: list[Workload], notes: list[str]) -> list[System]:
    """The chosen systems that are installed; what is not, or not on every workload, is noted."""
    unknown = set(chosen) - set(SYSTEMS)
    if unknown:
        raise ValueError(f"unknown system(s) {sorted(unknown)}; choose from {', '.join(SYSTEMS)}")
    systems: list[System] = []
    for system in (SYSTEMS[name] for name in chosen):
        missing = system.missing()
        if missing:
            why = f"{', '.join(missing)} not installed (pip install -e ./sdk -e '.[dev,bench]')"
            _say(f"{system.label} ({system.name}) NOT measured: {why}", notes)
            continue
        systems.append(system)
        left_out = [w.name for w in workloads if w not in workloads_for(system, workloads, analyze=False)]
        if left_out:
            longest = f"{system.max_appends:,}"
            notes.append(f"{system.label} not run on {', '.join(left_out)} (over {longest} appends): {system.why_max}")
    return systems


async def peers(settings: Settings, infra: Infra, options: BenchOptions) -> Report:
    notes: list[str] = []
    workloads = plan(options)
    systems = runnable(options.peers.systems or tuple(SYSTEMS), workloads, notes)
    repeats = options.repeats or (1 if options.smoke else 3)
    postmaster = await postmaster_pid(infra.pg_admin)
    verbose = options.progress is not False

    runs: dict[str, list[dict[str, dict[str, Any]]]] = {s.name: [] for s in systems}
    for r in range(repeats):
        shift = r % max(1, len(systems))
        for system in systems[shift:] + systems[:shift]:
            wanted = workloads_for(system, workloads, options.peers.analyze)
            try:
                result = await run_system(settings, infra, system, wanted, postmaster, options.progress)
            except Exception as exc:
                if system.name == "chronicle":
                    raise
                # a peer that breaks (a new release, say) must not cost the run Chronicle's numbers
                _say(f"{system.label} FAILED and is left out: {type(exc).__name__}: {exc}", notes)
                systems.remove(system)
                del runs[system.name]
                continue
            runs[system.name].append(result)
            if verbose:
                done = ", ".join(f"{w} {m['appends_per_s']:,.0f}/s" for w, m in result.items())
                _say(f"repeat {r + 1}/{repeats} {system.name}: {done}")
    results = {name: median_of(per) for name, per in runs.items()}

    report = Report(
        "peers",
        {
            "repeats": repeats,
            "workloads": {w.name: f"{w.sessions}x{w.appends} at c={w.concurrency}" for w in workloads},
            "reads": workloads[0].reads if workloads else 0,
            "systems": [s.name for s in systems],
            "versions": {k: v for s in systems for k, v in s.versions().items()},
        },
    )
    fill(report, results, runs, systems, workloads, notes, postmaster is not None)
    return report
