"""Every benchmark runs in smoke mode (tiny sizes) so it cannot rot. No timing assertions."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from bench.backends import SYSTEMS
from bench.cli import BENCHMARKS, run_one
from bench.support import BenchOptions, PeersOptions
from tests.conftest import make_settings

COMMON_KEYS = {"benchmark", "params", "environment", "metrics", "baseline", "ratio", "targets", "cpu_s"}


def positive(stats: dict[str, Any], *keys: str) -> None:
    for key in keys:
        assert stats[key] > 0, f"{key} = {stats[key]!r}"


async def smoke(name: str, nats_url: str, pg_admin: str, out: Path, **more: Any) -> dict[str, Any]:
    options = BenchOptions(smoke=True, out=out, nats_url=nats_url, postgres_url=pg_admin, progress=False, **more)
    report = await run_one(make_settings(nats_url, pg_admin), name, options)
    data: dict[str, Any] = json.loads(out.read_text())
    assert data == json.loads(json.dumps(report.as_dict()))
    assert set(data) >= COMMON_KEYS
    assert data["benchmark"] == name
    assert data["params"]["smoke"] is True
    assert data["targets"], "every benchmark states its targets"
    for target in data["targets"]:
        assert {"name", "value", "op", "threshold", "met"} <= set(target)
        # what a target bounds from above may reach 0 (the compactor's cost for sessions that never compact)
        assert target["value"] > 0 or (target["op"] in {"<", "<="} and target["value"] == 0)
    assert all(v > 0 for v in data["ratio"].values())
    return data


def test_every_benchmark_is_covered() -> None:
    assert set(BENCHMARKS) == {
        "ingest",
        "api",
        "commands",
        "history",
        "search",
        "rebuild",
        "context",
        "compaction",
        "peers",
        "api-replicas",
        "encryption",
    }


async def test_ingest_smoke(nats_url: str, pg_admin: str, tmp_path: Path) -> None:
    data = await smoke("ingest", nats_url, pg_admin, tmp_path / "ingest.json")
    m = data["metrics"]
    assert m["stored_rows"] == m["messages"] == data["params"]["messages"]
    positive(m, "msgs_per_s", "publish_per_s", "end_to_end_s")
    assert m["lag_events_p99"] >= m["lag_events_p50"] >= 0
    positive(data["baseline"], "rows_per_s")


async def test_encryption_smoke(nats_url: str, pg_admin: str, tmp_path: Path) -> None:
    data = await smoke("encryption", nats_url, pg_admin, tmp_path / "encryption.json")
    for mode in ("on", "off"):
        positive(data["metrics"][mode], "ingest_per_s", "rebuild_per_s", "history_per_s", "as_of_per_s")
    assert len(data["targets"]) == 4


async def test_api_smoke(nats_url: str, pg_admin: str, tmp_path: Path) -> None:
    data = await smoke("api", nats_url, pg_admin, tmp_path / "api.json")
    for key in ("append_c1", "append_c1_spread", "append_c16", "ryw_read", "ryw_total"):
        positive(data["metrics"][key], "n", "p50", "p99")
    positive(data["baseline"]["healthz"], "n", "p50", "p99")


async def test_commands_smoke(nats_url: str, pg_admin: str, tmp_path: Path) -> None:
    data = await smoke("commands", nats_url, pg_admin, tmp_path / "commands.json")
    for key in ("http_append_c1", "nats_append_c1", "http_append_c16", "nats_append_c16"):
        positive(data["metrics"][key], "n", "p50", "p99")
    positive(data["metrics"], "http_append_c16_per_s", "nats_append_c16_per_s")
    positive(data["baseline"]["healthz"], "n", "p50", "p99")
    positive(data["baseline"]["nats_echo"], "n", "p50", "p99")


async def test_api_replicas_smoke(nats_url: str, pg_admin: str, tmp_path: Path) -> None:
    data = await smoke("api-replicas", nats_url, pg_admin, tmp_path / "api-replicas.json")
    for count in data["params"]["api_processes"]:
        positive(data["metrics"][f"api_processes_{count}"], "w1_appends_per_s", "w100_appends_per_s")


async def test_history_smoke(nats_url: str, pg_admin: str, tmp_path: Path) -> None:
    data = await smoke("history", nats_url, pg_admin, tmp_path / "history.json")
    for size in data["params"]["branches"]:
        positive(data["metrics"][f"query_{size}"], "p50", "p95")
        positive(data["metrics"][f"http_{size}"], "p50", "p95")
        positive(data["baseline"][f"select_{size}"], "p50", "p95")


async def test_search_smoke(nats_url: str, pg_admin: str, tmp_path: Path) -> None:
    data = await smoke("search", nats_url, pg_admin, tmp_path / "search.json")
    for key in ("selective_session", "selective_tenant", "common_session", "common_tenant"):
        positive(data["metrics"][key], "p50", "p95", "mean_hits")
        positive(data["baseline"][key], "p50", "p95")
    assert data["metrics"]["common_tenant"]["mean_hits"] == data["params"]["limit"]


async def test_rebuild_smoke(nats_url: str, pg_admin: str, tmp_path: Path) -> None:
    data = await smoke("rebuild", nats_url, pg_admin, tmp_path / "rebuild.json")
    m = data["metrics"]
    assert m["stored_rows"] == m["events"] == data["params"]["messages"]
    positive(m, "events_per_s", "read_decode_per_s")
    positive(data["baseline"], "rows_per_s")


async def test_context_smoke(nats_url: str, pg_admin: str, tmp_path: Path) -> None:
    data = await smoke("context", nats_url, pg_admin, tmp_path / "context.json")
    m = data["metrics"]
    for key in ("frozen_prompt", "http_frozen_prompt", "set_context_append", "http_set_context_append"):
        positive(m[key], "n", "p50", "p95")
    for key in ("search_selective", "search_common"):
        positive(m[key], "p50", "p95", "mean_hits")
        positive(m[f"{key}_query"], "p50", "p95")
        positive(data["baseline"][f"{key}_unranked"], "p50", "p95")
    positive(data["baseline"]["select_1"], "p50")
    # every append (in-process and over HTTP) added one line to the writable block
    assert m["writable_block_lines"] == m["set_context_append"]["n"] + m["http_set_context_append"]["n"]


async def test_compaction_smoke(nats_url: str, pg_admin: str, tmp_path: Path) -> None:
    data = await smoke("compaction", nats_url, pg_admin, tmp_path / "compaction.json")
    m, b = data["metrics"], data["baseline"]
    positive(m["ingest_with_compactor"], "msgs_per_s", "end_to_end_s", "compactions", "overlays_projected")
    assert m["ingest_with_compactor"]["compaction_failures"] == 0
    positive(b["ingest_without_compactor"], "msgs_per_s", "end_to_end_s")
    for size in data["params"]["histories"]:
        positive(m[f"append_{size}"], "n", "p50", "p95")
        positive(b[f"resum_{size}"], "p50")


def _workload_shape(result: dict[str, Any], appends: int) -> None:
    assert result["appends"] == appends
    positive(result, "appends_per_s")
    for key in ("append", "append_first_10pct", "append_last_10pct", "history"):
        positive(result[key], "n", "p50", "p99")
    positive(result, "last_over_first_p50")
    # a cheap process can show 0 at smoke sizes (CPU time is counted in 10 ms ticks)
    assert all(v >= 0 for v in result["cpu_ms_per_append"].values())
    positive(result["cpu_ms_per_append"], "total")
    storage = result["storage"]
    positive(storage, "text_bytes_per_message")
    assert storage["bytes_per_message"] >= storage["postgres_bytes_per_message"] >= 0


async def test_peers_smoke_chronicle_alone(
    nats_url: str, pg_admin: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Chronicle's side of ``bench peers``; a peer that is not installed, or that fails, is named
    and left out (the real peers, from the ``bench`` extra, are in the next test)."""

    @contextlib.asynccontextmanager
    async def broken(*args: object) -> AsyncIterator[Any]:
        raise RuntimeError("this peer does not start")
        yield

    absent = dataclasses.replace(SYSTEMS["agents"], modules=("no_such_module_for_chronicle_bench",))
    monkeypatch.setitem(SYSTEMS, "agents", absent)
    monkeypatch.setitem(SYSTEMS, "langgraph", dataclasses.replace(SYSTEMS["langgraph"], modules=(), open=broken))
    peers = PeersOptions(systems=("chronicle", "agents", "langgraph"))
    data = await smoke("peers", nats_url, pg_admin, tmp_path / "peers.json", peers=peers)
    assert data["params"]["systems"] == ["chronicle"]
    notes = "\n".join(data["notes"])
    assert "(agents) NOT measured: no_such_module_for_chronicle_bench not installed" in notes
    assert "FAILED and is left out: RuntimeError: this peer does not start" in notes
    mine = data["metrics"]["chronicle"]
    assert set(mine) == {"W1", "W2", "W3", "W3 after ANALYZE"}
    sizes = {"W1": 2 * 10, "W2": 20, "W3": 40, "W3 after ANALYZE": 40}
    for workload, appends in sizes.items():
        _workload_shape(mine[workload], appends)
        assert {"client", "api", "projector", "compactor", "postgres"} <= set(mine[workload]["cpu_ms_per_append"])
        positive(mine[workload]["storage"], "log_bytes_per_message")
    assert mine["W1"]["history_messages"] == 10
    assert data["baseline"] == {}
    assert len(data["metrics"]["runs"]["chronicle"]) == data["params"]["repeats"] == 1
    names = {t["name"] for t in data["targets"]}
    assert "W3 after ANALYZE: append p50 last 10 % / first 10 %" in names
    assert "W1 CPU per append, all processes" in names


async def test_peers_smoke_with_the_peers(nats_url: str, pg_admin: str, tmp_path: Path) -> None:
    """Needs the ``bench`` extra (``pip install -e '.[bench]'``): skipped without it."""
    pytest.importorskip("agents.extensions.memory.sqlalchemy_session")
    pytest.importorskip("langgraph.checkpoint.postgres.aio")
    peers = PeersOptions(workloads=("W1", "W2"), analyze=False)
    data = await smoke("peers", nats_url, pg_admin, tmp_path / "peers.json", peers=peers)
    assert set(data["baseline"]) == {"agents", "langgraph"}
    for system in (data["metrics"]["chronicle"], *data["baseline"].values()):
        assert set(system) == {"W1", "W2"}
        _workload_shape(system["W1"], 20)
        _workload_shape(system["W2"], 20)
    assert "W1 appends/s: chronicle/agents" in data["ratio"]
    assert "W2 appends/s: chronicle/langgraph" in data["ratio"]
    assert any(t["name"].startswith("W1 appends/s, Chronicle / Agents SDK") for t in data["targets"])


def test_bench_cli_wiring(monkeypatch: pytest.MonkeyPatch) -> None:
    """``chronicle bench`` parses its options and hands them to ``run_bench`` (nothing runs)."""
    import bench.cli
    from services.ops import cli

    captured: list[argparse.Namespace] = []

    def fake(settings: object, args: argparse.Namespace) -> int:
        captured.append(args)
        return 0

    monkeypatch.setattr(bench.cli, "run_bench", fake)
    assert cli.main(["bench", "ingest", "--smoke", "--messages", "10", "--sessions", "2", "--out", "x.json"]) == 0
    (args,) = captured
    assert (args.which, args.smoke, args.messages, args.sessions, args.out) == ("ingest", True, 10, 2, "x.json")


def test_bench_peers_cli_wiring(monkeypatch: pytest.MonkeyPatch) -> None:
    """``chronicle bench peers`` hands its sizes to the benchmark (nothing runs)."""
    import bench.cli
    from services.ops import cli

    captured: list[BenchOptions] = []

    async def fake(settings: object, names: list[str], options: BenchOptions) -> dict[str, object]:
        captured.append(options)
        return {}

    monkeypatch.setattr(bench.cli, "run_benchmarks", fake)
    argv = ["bench", "peers", "--repeats", "1", "--scale", "0.1", "--w3-appends", "500", "--concurrency", "4"]
    assert cli.main([*argv, "--systems", "chronicle,Agents", "--workloads", "w1,w3", "--no-analyze"]) == 0
    (options,) = captured
    assert options.repeats == 1
    assert options.peers == PeersOptions(
        concurrency=4, w3_appends=500, scale=0.1, systems=("chronicle", "agents"), workloads=("W1", "W3"), analyze=False
    )
