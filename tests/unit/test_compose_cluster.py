"""compose.cluster.yaml over compose.yaml, checked without Docker: three NATS nodes routed to each other
with a route password, each with its own store, Chronicle's processes on all three at R3."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from services.ops import cli
from services.ops.natsconf import ROUTE_USER, NatsAccess, server_config
from services.settings import Settings
from tests.unit.test_compose import COMPOSE, REQUIRED, ROOT, env_of, resolve, settings_from, volume_at

OVERRIDE = ROOT / "compose.cluster.yaml"
NODES = ("nats", "nats-2", "nats-3")
ROUTE_PASSWORD = "route-secret-for-the-test"
UNIONED = ("ports", "volumes")  # sequences compose merges instead of replacing


def merge(base: Any, override: Any, key: str = "") -> Any:
    """What ``docker compose -f base -f override`` makes of two values: mappings merge key by key,
    ports and volumes are unioned, anything else is replaced."""
    if isinstance(base, dict) and isinstance(override, dict):
        return {
            k: merge(base[k], override[k], k) if k in base and k in override else override.get(k, base.get(k))
            for k in {**base, **override}
        }
    if key in UNIONED and isinstance(base, list) and isinstance(override, list):
        return base + [v for v in override if v not in base]
    return override


@pytest.fixture(scope="module")
def merged() -> dict[str, Any]:
    data = merge(yaml.safe_load(COMPOSE.read_text()), yaml.safe_load(OVERRIDE.read_text()))
    assert isinstance(data, dict)
    return data


@pytest.fixture(scope="module")
def services(merged: dict[str, Any]) -> dict[str, dict[str, Any]]:
    svcs = merged["services"]
    assert isinstance(svcs, dict)
    return svcs


@pytest.fixture
def required(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(REQUIRED, "CHRONICLE_NATS_ROUTE_PASSWORD", ROUTE_PASSWORD)


def test_merge_rules() -> None:
    assert merge({"a": {"x": 1, "y": [1]}}, {"a": {"y": [2]}}) == {"a": {"x": 1, "y": [2]}}
    assert merge({"ports": ["1:1"]}, {"ports": ["2:2", "1:1"]}) == {"ports": ["1:1", "2:2"]}


def test_three_nodes_each_on_its_own_store(merged: dict[str, Any], services: dict[str, dict[str, Any]]) -> None:
    stores = {name: volume_at(services[name], "/data") for name in NODES}
    assert len(set(stores.values())) == 3, stores
    assert set(stores.values()) <= set(merged["volumes"])
    for name in NODES:
        node = services[name]
        assert node["image"] == services["nats"]["image"]
        assert node["command"] == ["-c", f"/conf/{name}.conf", "-m", "8222"]
        assert volume_at(node, "/conf") == "nats-conf"
        assert node["depends_on"] == {"nats-config": {"condition": "service_completed_successfully"}}
        assert "healthz" in " ".join(node["healthcheck"]["test"])
        published = [str(p) for p in node.get("ports", [])]
        assert all(p.startswith("127.0.0.1:") for p in published), "loopback only"
        assert not any(p.endswith(":6222") for p in published), "the route port stays inside the network"


def test_chronicle_waits_for_every_node(services: dict[str, dict[str, Any]]) -> None:
    for name in ("api", "projector", "compactor", "commands"):
        deps = services[name]["depends_on"]
        assert {n: deps[n] for n in NODES} == {n: {"condition": "service_healthy"} for n in NODES}, name


def test_settings_name_every_node_and_three_replicas(
    services: dict[str, dict[str, Any]], monkeypatch: pytest.MonkeyPatch, required: None
) -> None:
    api = env_of(services["api"])
    for name in ("migrate", "projector", "compactor", "commands", "nats-config"):
        assert env_of(services[name]) == api, f"{name} must have the cluster environment too"
    s = settings_from(api, monkeypatch)
    assert s.nats_servers() == [f"nats://{n}:4222" for n in NODES]
    assert s.stream_replicas == 3
    assert s.nats_route_password is not None
    assert s.nats_route_password.get_secret_value() == ROUTE_PASSWORD


def test_the_route_password_is_required() -> None:
    text = OVERRIDE.read_text()
    assert "${CHRONICLE_NATS_ROUTE_PASSWORD:?" in text
    with pytest.raises(AssertionError):
        resolve("${CHRONICLE_NATS_ROUTE_PASSWORD:?set it}")  # no default: compose refuses to start


def test_nats_config_writes_each_node_with_routes_to_the_others(
    services: dict[str, dict[str, Any]], monkeypatch: pytest.MonkeyPatch, tmp_path: Path, required: None
) -> None:
    writer = services["nats-config"]
    args = [str(a) for a in writer["command"]]
    settings: Settings = settings_from(env_of(writer), monkeypatch)
    out_at = args.index("--out") + 1
    assert args[out_at] == "/conf"
    assert cli.main([*args[:out_at], str(tmp_path), *args[out_at + 1 :]]) == 0
    written = sorted(p.name for p in tmp_path.iterdir())
    assert written == sorted(f"{n}.conf" for n in NODES)
    for name in NODES:
        config = json.loads((tmp_path / f"{name}.conf").read_text())
        assert (tmp_path / f"{name}.conf").stat().st_mode & 0o077 == 0, "the route password is in it"
        cluster = config.pop("cluster")
        assert config.pop("server_name") == name
        assert (config.pop("ping_interval"), config.pop("ping_max")) == ("5s", 2)  # a stopped client is dropped
        assert (cluster.pop("ping_interval"), cluster.pop("ping_max")) == ("2s", 2)  # a hung node's routes close
        assert config == server_config(NatsAccess.of(settings), host="0.0.0.0", port=4222, store_dir="/data")
        assert (cluster["host"], cluster["port"], cluster["name"]) == ("0.0.0.0", 6222, "chronicle")
        assert cluster["authorization"] == {"user": ROUTE_USER, "password": ROUTE_PASSWORD}
        assert cluster["routes"] == [
            f"nats-route://{ROUTE_USER}:{ROUTE_PASSWORD}@{peer}:6222" for peer in NODES if peer != name
        ]


def test_a_cluster_config_without_the_route_password_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("CHRONICLE_NATS_NKEY_SEED", REQUIRED["CHRONICLE_NATS_NKEY_SEED"])
    monkeypatch.delenv("CHRONICLE_NATS_ROUTE_PASSWORD", raising=False)
    assert cli.main(["nats-config", "--out", str(tmp_path), "--cluster-nodes", "a,b,c"]) == 2
    assert "CHRONICLE_NATS_ROUTE_PASSWORD" in capsys.readouterr().err
    assert not list(tmp_path.iterdir())
