"""``chronicle nats-config`` writes a configuration that a real nats-server runs with: on loopback
by default, as ``chronicle up``'s server listens, elsewhere only when ``--host`` names it; JetStream
fsyncing as ``CHRONICLE_NATS_SYNC_INTERVAL`` says (the server's default, 2 minutes, when unset)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import httpx
import pytest

from events.credentials import nkey_public_key, tenant_nkey_seed
from services.ops import cli
from services.ops.localstack import free_port, nats_server_binary, wait_for_port
from services.settings import api_key_entry, new_operator_seed


@pytest.fixture
def operator(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in (
        "CHRONICLE_NATS_ROUTE_PASSWORD",
        "CHRONICLE_API_KEYS",
        "CHRONICLE_API_KEYS_FILE",
        "CHRONICLE_NATS_SYNC_INTERVAL",
    ):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("CHRONICLE_NATS_NKEY_SEED", new_operator_seed())


def written(tmp_path: Path, *args: str) -> dict[str, object]:
    out = tmp_path / "nats.conf"
    assert cli.main(["nats-config", "--out", str(out), "--store-dir", str(tmp_path / "js"), *args]) == 0
    config: dict[str, object] = json.loads(out.read_text())
    return config


def test_the_config_listens_on_loopback_unless_told_and_a_nats_server_runs_it(tmp_path: Path, operator: None) -> None:
    port = free_port()
    config = written(tmp_path, "--port", str(port))
    assert (config["host"], config["port"]) == ("127.0.0.1", port)
    log = tmp_path / "nats.log"
    proc = subprocess.Popen([nats_server_binary(), "-c", str(tmp_path / "nats.conf"), "-l", str(log)])
    try:
        wait_for_port("127.0.0.1", port, proc, "nats-server")
        assert f"Listening for client connections on 127.0.0.1:{port}" in log.read_text()
    finally:
        proc.terminate()
        proc.wait(timeout=10)


@pytest.mark.parametrize(
    ("given", "written_as", "runs_with"),
    [
        ("always", "always", {"sync_always": True}),
        ("Always", "always", {"sync_always": True}),
        ("10s", "10s", {"sync_interval": 10_000_000_000}),
        ("1m30s", "1m30s", {"sync_interval": 90_000_000_000}),
    ],
)
def test_the_sync_interval_setting_is_jetstream_s_and_a_nats_server_runs_with_it(
    tmp_path: Path,
    operator: None,
    monkeypatch: pytest.MonkeyPatch,
    given: str,
    written_as: str,
    runs_with: dict[str, object],
) -> None:
    monkeypatch.setenv("CHRONICLE_NATS_SYNC_INTERVAL", given)
    port, monitor = free_port(), free_port()
    config = written(tmp_path, "--port", str(port))
    assert config["jetstream"] == {"store_dir": str(tmp_path / "js"), "sync_interval": written_as}
    conf, log = tmp_path / "nats.conf", tmp_path / "nats.log"
    proc = subprocess.Popen([nats_server_binary(), "-c", str(conf), "-l", str(log), "-m", str(monitor)])
    try:
        wait_for_port("127.0.0.1", port, proc, "nats-server")
        wait_for_port("127.0.0.1", monitor, proc, "nats-server monitoring")
        jetstream = httpx.get(f"http://127.0.0.1:{monitor}/varz", timeout=10).json()["jetstream"]["config"]
        assert {key: jetstream[key] for key in runs_with} == runs_with
    finally:
        proc.terminate()
        proc.wait(timeout=10)


@pytest.mark.parametrize("given", [None, ""], ids=["unset", "empty"])  # empty: compose's ${…:-}
def test_without_a_sync_interval_jetstream_keeps_the_server_s_default(
    tmp_path: Path, operator: None, monkeypatch: pytest.MonkeyPatch, given: str | None
) -> None:
    if given is not None:
        monkeypatch.setenv("CHRONICLE_NATS_SYNC_INTERVAL", given)
    assert written(tmp_path)["jetstream"] == {"store_dir": str(tmp_path / "js")}


def test_each_cluster_node_takes_the_sync_interval(
    tmp_path: Path, operator: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CHRONICLE_NATS_ROUTE_PASSWORD", "route-secret")
    monkeypatch.setenv("CHRONICLE_NATS_SYNC_INTERVAL", "always")
    assert cli.main(["nats-config", "--out", str(tmp_path), "--cluster-nodes", "a,b"]) == 0
    nodes = [json.loads((tmp_path / f"{name}.conf").read_text()) for name in "ab"]
    assert [node["jetstream"]["sync_interval"] for node in nodes] == ["always", "always"]


@pytest.mark.parametrize("given", ["soon", "10", "0s", "-5s", "10 s", "always,10s"])
def test_a_bad_sync_interval_is_refused_naming_the_setting_and_what_it_takes(
    tmp_path: Path, operator: None, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], given: str
) -> None:
    monkeypatch.setenv("CHRONICLE_NATS_SYNC_INTERVAL", given)
    out = tmp_path / "nats.conf"
    assert cli.main(["nats-config", "--out", str(out)]) == cli.SETTINGS_EXIT
    assert not out.exists()
    err = capsys.readouterr().err
    assert err.startswith("chronicle nats-config: setting CHRONICLE_NATS_SYNC_INTERVAL: ")
    assert "not a NATS sync interval: `always` (fsync every write before it is acknowledged) or a duration" in err
    assert f"(given: {given!r})" in err


def test_host_binds_where_it_says(tmp_path: Path, operator: None) -> None:
    assert written(tmp_path, "--host", "0.0.0.0")["host"] == "0.0.0.0"
    assert written(tmp_path, "--host", "10.1.2.3")["host"] == "10.1.2.3"


def test_a_cluster_node_listens_on_loopback_for_clients_and_on_its_name_for_routes(
    tmp_path: Path, operator: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CHRONICLE_NATS_ROUTE_PASSWORD", "route-secret")
    assert cli.main(["nats-config", "--out", str(tmp_path), "--cluster-nodes", "a,b"]) == 0
    node = json.loads((tmp_path / "a.conf").read_text())
    assert (node["host"], node["cluster"]["host"]) == ("127.0.0.1", "a")


def test_the_api_keys_file_s_tenants_are_users_with_the_env_s(
    tmp_path: Path, operator: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A tenant whose key is in ``CHRONICLE_API_KEYS_FILE`` gets its NATS user as one of
    ``CHRONICLE_API_KEYS`` does (a read-only key none: it has no NATS identity)."""
    keys = tmp_path / "api-keys"
    keys.write_text(f"# acme\n{api_key_entry('acme', 'chr_file')}\n{api_key_entry('acme', 'chr_ro', read_only=True)}\n")
    monkeypatch.setenv("CHRONICLE_API_KEYS_FILE", str(keys))
    monkeypatch.setenv("CHRONICLE_API_KEYS", json.dumps([api_key_entry("beta", "chr_env")]))
    users = written(tmp_path, "--port", str(free_port()))["authorization"]["users"]  # type: ignore[index]
    nkeys = [user["nkey"] for user in users]
    assert nkeys[1:] == [nkey_public_key(tenant_nkey_seed(key)) for key in ("chr_file", "chr_env")]
    assert users[1]["permissions"]["publish"]["allow"][0].split(".")[2] == "acme"
