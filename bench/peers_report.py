"""The table, ratios and targets of ``chronicle bench peers``: medians per system, Chronicle / peer.

A ratio is Chronicle's value over the peer's, whatever the unit: above 1 is better for Chronicle
in appends/s, worse in latency, CPU and storage.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from bench.backends import System
from bench.support import Report, Target
from bench.workloads import Workload

ANALYZED = "W3 after ANALYZE"

Format = Callable[[float], str]


def _rate(v: float) -> str:
    return f"{v:,.0f}/s"


def _ms(v: float) -> str:
    return f"{v:.2f} ms"


def _bytes(v: float) -> str:
    return f"{v:,.0f} B"


def _times(v: float) -> str:
    return f"{v:.2f}x"


def _s(v: float) -> str:
    return f"{v:.2f} s"


CPU_PARTS = ("client", "api", "projector", "compactor", "nats-server", "postgres")

ROWS: tuple[tuple[str, tuple[str, ...], Format], ...] = (
    ("appends/s", ("appends_per_s",), _rate),
    ("append p50, all", ("append", "p50"), _ms),
    ("append p50, first 10 %", ("append_first_10pct", "p50"), _ms),
    ("append p99, first 10 %", ("append_first_10pct", "p99"), _ms),
    ("append p50, last 10 %", ("append_last_10pct", "p50"), _ms),
    ("append p99, last 10 %", ("append_last_10pct", "p99"), _ms),
    ("append p50 last/first 10 %", ("last_over_first_p50",), _times),
    ("history read p50", ("history", "p50"), _ms),
    ("CPU per append, all processes", ("cpu_ms_per_append", "total"), _ms),
    *((f"  CPU per append, {part}", ("cpu_ms_per_append", part), _ms) for part in CPU_PARTS),
    ("storage per message, Postgres", ("storage", "postgres_bytes_per_message"), _bytes),
    ("storage per message, log", ("storage", "log_bytes_per_message"), _bytes),
    ("storage per message / text", ("storage", "times_text"), _times),
    ("catch-up after the last append", ("settle_s",), _s),
)


def _get(data: dict[str, Any], path: Sequence[str]) -> float | None:
    for key in path:
        if not isinstance(data, dict) or key not in data:
            return None
        data = data[key]
    return float(data) if isinstance(data, int | float) else None


def fill(
    report: Report,
    results: dict[str, dict[str, dict[str, Any]]],
    runs: dict[str, list[dict[str, dict[str, Any]]]],
    systems: Sequence[System],
    workloads: Sequence[Workload],
    skipped: Sequence[str],
    postgres_local: bool,
) -> None:
    """Rows, ratios, targets, CPU phases and notes of the report, from the medians."""
    names = [s.name for s in systems]
    peers = [n for n in names if n != "chronicle"] if "chronicle" in names else []
    report.head = ("metric", *names, *(f"chronicle/{p}" for p in peers))
    order = [w.name for w in workloads] + ([ANALYZED] if any(ANALYZED in r for r in results.values()) else [])
    for w in order:
        sizes = {w2.name: w2 for w2 in workloads}.get(w.split()[0])
        for label, path, fmt in ROWS:
            values = {n: _get(results[n][w], path) if w in results[n] else None for n in names}
            if all(v is None or (path[0] == "settle_s" and v < 0.005) for v in values.values()):
                continue
            if label.startswith("history") and sizes is not None:
                label = f"{label} ({sizes.appends:,} messages)"
            cells = [fmt(v) if v is not None else "-" for v in values.values()]
            ratios: list[str] = []
            for p in peers:
                mine, theirs = values.get("chronicle"), values.get(p)
                if mine is not None and theirs:
                    ratios.append(f"{mine / theirs:.2f}x")
                    if mine > 0:
                        report.ratio[f"{w} {label.strip()}: chronicle/{p}"] = round(mine / theirs, 3)
                else:
                    ratios.append("-")
            report.cells(f"{w} {label}", *cells, *ratios)
    report.metrics = {**{n: results[n] for n in names if n not in peers}, "runs": runs}
    report.baseline = {p: results[p] for p in peers}
    report.targets = targets(results)
    for n in names:
        for w, data in results[n].items():
            report.cpu_s[f"{n} {w}"] = data["cpu_s"]
    report.notes.extend(skipped)
    labels = "; ".join(f"{s.name} = {s.label}" for s in systems)
    report.notes.append(f"systems: {labels}; medians of {report.params['repeats']} repeat(s)")
    if postgres_local:
        report.notes.append(
            "postgres CPU = this system's database's backends + the cluster's shared processes (WAL writer, "
            "checkpointer); other databases' backends on the same server are not counted"
        )
    else:
        report.notes.append("postgres CPU not measured: the Postgres server does not run on this machine")


def targets(results: dict[str, dict[str, dict[str, Any]]]) -> list[Target]:
    """Issue #13's targets, for what was measured (a ratio needs the Agents SDK's run)."""
    out: list[Target] = []
    mine, agents = results.get("chronicle", {}), results.get("agents", {})

    def ratio(workload: str, *path: str) -> float | None:
        if workload not in mine or workload not in agents:
            return None
        a, b = _get(mine[workload], path), _get(agents[workload], path)
        return round(a / b, 3) if a is not None and b else None

    checks = [
        ("W1 appends/s, Chronicle / Agents SDK", ratio("W1", "appends_per_s"), ">=", 1.2),
        ("W2 appends/s, Chronicle / Agents SDK", ratio("W2", "appends_per_s"), ">=", 1.0),
        ("W2 append p50, Chronicle / Agents SDK", ratio("W2", "append", "p50"), "<=", 1.0),
        ("history read p50 at W1's size, Chronicle / Agents SDK", ratio("W1", "history", "p50"), "<=", 1.0),
        ("history read p50 at W2's size, Chronicle / Agents SDK", ratio("W2", "history", "p50"), "<=", 1.0),
    ]
    for name, value, op, threshold in checks:
        if value is not None:
            out.append(Target(name, value, op, threshold, "x"))
    for w in ("W3", ANALYZED):
        if w in mine:
            flat = mine[w]["last_over_first_p50"]
            out.append(Target(f"{w}: append p50 last 10 % / first 10 %", flat, "<=", 1.2, "x"))
    if "W1" in mine:
        cpu, storage = mine["W1"]["cpu_ms_per_append"], mine["W1"]["storage"]
        compactor = cpu.get("compactor", 0.0)
        out.append(Target("W1 CPU per append, all processes", cpu["total"], "<=", 1.5, " ms"))
        out.append(Target("W1 compactor CPU per append (no session compacts)", compactor, "<=", 0.05, " ms"))
        out.append(Target("W1 storage per message, Postgres + log, / text", storage["times_text"], "<=", 6.0, "x"))
    return out
