"""Every benchmark runs in smoke mode (tiny sizes) so it cannot rot. No timing assertions."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import pytest

from services.bench import BENCHMARKS, run_one
from services.bench_support import BenchOptions
from tests.conftest import make_settings

COMMON_KEYS = {"benchmark", "params", "environment", "metrics", "baseline", "ratio", "targets", "cpu_s"}


def positive(stats: dict[str, Any], *keys: str) -> None:
    for key in keys:
        assert stats[key] > 0, f"{key} = {stats[key]!r}"


async def smoke(name: str, nats_url: str, pg_admin: str, out: Path) -> dict[str, Any]:
    options = BenchOptions(smoke=True, out=out, nats_url=nats_url, postgres_url=pg_admin, progress=False)
    report = await run_one(make_settings(nats_url, pg_admin), name, options)
    data: dict[str, Any] = json.loads(out.read_text())
    assert data == json.loads(json.dumps(report.as_dict()))
    assert set(data) >= COMMON_KEYS
    assert data["benchmark"] == name
    assert data["params"]["smoke"] is True
    assert data["targets"], "every benchmark states its targets"
    for target in data["targets"]:
        assert {"name", "value", "op", "threshold", "met"} <= set(target)
        assert target["value"] > 0
    assert all(v > 0 for v in data["ratio"].values())
    return data


def test_every_benchmark_is_covered() -> None:
    assert set(BENCHMARKS) == {"ingest", "api", "history", "search", "rebuild", "context", "compaction"}


async def test_ingest_smoke(nats_url: str, pg_admin: str, tmp_path: Path) -> None:
    data = await smoke("ingest", nats_url, pg_admin, tmp_path / "ingest.json")
    m = data["metrics"]
    assert m["stored_rows"] == m["messages"] == data["params"]["messages"]
    positive(m, "msgs_per_s", "publish_per_s", "end_to_end_s")
    assert m["lag_events_p99"] >= m["lag_events_p50"] >= 0
    positive(data["baseline"], "rows_per_s")


async def test_api_smoke(nats_url: str, pg_admin: str, tmp_path: Path) -> None:
    data = await smoke("api", nats_url, pg_admin, tmp_path / "api.json")
    for key in ("append_c1", "append_c1_spread", "append_c16", "ryw_read", "ryw_total"):
        positive(data["metrics"][key], "n", "p50", "p99")
    positive(data["baseline"]["healthz"], "n", "p50", "p99")


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


def test_bench_cli_wiring(monkeypatch: pytest.MonkeyPatch) -> None:
    """``chronicle bench`` parses its options and hands them to ``run_bench`` (nothing runs)."""
    import services.bench
    from services import cli

    captured: list[argparse.Namespace] = []
    monkeypatch.setattr(services.bench, "run_bench", lambda settings, args: captured.append(args) or 0)
    assert cli.main(["bench", "ingest", "--smoke", "--messages", "10", "--sessions", "2", "--out", "x.json"]) == 0
    (args,) = captured
    assert (args.which, args.smoke, args.messages, args.sessions, args.out) == ("ingest", True, 10, 2, "x.json")
