"""``bench peers``' pure parts: sizes, medians, deciles, CPU per append, targets (no I/O)."""

from __future__ import annotations

import pytest

from bench.backends import SYSTEMS, asyncpg_url
from bench.peers import median_of, plan, workloads_for
from bench.peers_report import ANALYZED, targets
from bench.support import BenchOptions, PeersOptions
from bench.workloads import Appended, cpu_per_append


def test_full_sizes_are_the_issues_and_scale_shrinks_the_defaults_only() -> None:
    full = {w.name: (w.sessions, w.appends, w.concurrency) for w in plan(BenchOptions())}
    assert full == {"W1": (10, 200, 10), "W2": (1, 1_000, 1), "W3": (1, 10_000, 1)}
    quick = plan(BenchOptions(peers=PeersOptions(scale=0.1, w2_appends=50, workloads=("W2", "W3"))))
    assert [(w.name, w.appends) for w in quick] == [("W2", 50), ("W3", 1_000)]
    with pytest.raises(ValueError, match="W4"):
        plan(BenchOptions(peers=PeersOptions(workloads=("W4",))))


def test_chronicle_reruns_w3_after_analyze_and_langgraph_skips_long_sessions() -> None:
    workloads = plan(BenchOptions())
    chronicle = workloads_for(SYSTEMS["chronicle"], workloads, analyze=True)
    assert [w.name for w in chronicle] == ["W1", "W2", "W3", ANALYZED]
    assert chronicle[-1].analyze
    assert chronicle[-1].appends == 10_000
    assert [w.name for w in workloads_for(SYSTEMS["chronicle"], workloads, analyze=False)] == ["W1", "W2", "W3"]
    assert [w.name for w in workloads_for(SYSTEMS["langgraph"], workloads, analyze=True)] == ["W1", "W2"]
    assert [w.name for w in workloads_for(SYSTEMS["agents"], workloads, analyze=True)] == ["W1", "W2", "W3"]


def test_median_of_nested_results() -> None:
    runs = [{"a": {"x": 1.0, "n": "k"}}, {"a": {"x": 5.0, "n": "k"}}, {"a": {"x": 3.0, "n": "k", "y": 2}}]
    assert median_of(runs) == {"a": {"x": 3.0, "n": "k", "y": 2}}


def test_deciles_are_per_session_then_pooled() -> None:
    appended = Appended(1.0, [[float(i) for i in range(20)], [float(100 + i) for i in range(20)]])
    assert appended.decile(last=False) == [0.0, 1.0, 100.0, 101.0]
    assert appended.decile(last=True) == [18.0, 19.0, 118.0, 119.0]
    assert Appended(1.0, [[7.0]]).decile(last=True) == [7.0]


def test_cpu_per_append_names_the_processes_and_sums_postgres() -> None:
    cpu = {
        "bench process": 1.0,
        "api process": 2.0,
        "postgres": 0.5,
        "postgres server": 0.25,
        "postgres autovacuum": 0.25,
        "postgres other dbs": 9.0,
        "machine": 20.0,
        "wall": 3.0,
    }
    assert cpu_per_append(cpu, 1000) == {"client": 1.0, "api": 2.0, "postgres": 1.0, "total": 4.0}


def test_targets_compare_with_the_agents_sdk_only_when_it_ran() -> None:
    w = {
        "appends_per_s": 600.0,
        "append": {"p50": 2.0},
        "history": {"p50": 1.0},
        "last_over_first_p50": 1.1,
        "cpu_ms_per_append": {"total": 1.4, "compactor": 0.0},
        "storage": {"times_text": 5.0},
    }
    alone = {t.name: t for t in targets({"chronicle": {"W1": w, "W3": w}})}
    assert set(alone) == {
        "W3: append p50 last 10 % / first 10 %",
        "W1 CPU per append, all processes",
        "W1 compactor CPU per append (no session compacts)",
        "W1 storage per message, Postgres + log, / text",
    }
    assert all(t.met for t in alone.values())
    peer = {**w, "appends_per_s": 1000.0}
    both = {t.name: t for t in targets({"chronicle": {"W1": w}, "agents": {"W1": peer}})}
    ratio = both["W1 appends/s, Chronicle / Agents SDK"]
    assert (ratio.value, ratio.met) == (0.6, False)


def test_asyncpg_url() -> None:
    assert asyncpg_url("postgresql://u:p@h:5/db") == "postgresql+asyncpg://u:p@h:5/db"
    with pytest.raises(ValueError, match="mysql"):
        asyncpg_url("mysql://h/db")
