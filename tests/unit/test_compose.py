"""compose.yaml and the Dockerfile, checked without Docker: services, images, health checks, order, env.

The environment the Chronicle containers get must be understood by ``services.settings.Settings``:
a misspelt ``CHRONICLE_*`` key is otherwise ignored silently (``extra="ignore"``) and the process
falls back to its 127.0.0.1 defaults inside the container.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

from events.credentials import nkey_public_key, tenant_nkey_seed
from projections.keystore import new_kek_line
from services.ops import cli
from services.ops.natsconf import NatsAccess, server_config
from services.settings import Settings, api_key_entry, hash_key, new_operator_seed

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "compose.yaml"
DOCKERFILE = ROOT / "Dockerfile"

PREFIX = "CHRONICLE_"
INFRA = ("nats", "postgres", "minio")
CHRONICLE = ("migrate", "api", "projector", "compactor", "commands")
NATS_CONFIG = "nats-config"  # the one-shot service that writes nats-server's configuration
# variables compose refuses to start without (``${VAR:?…}``), and a value for each in these tests
REQUIRED = {"CHRONICLE_NATS_NKEY_SEED": new_operator_seed(), "CHRONICLE_KEK": new_kek_line()}
# CHRONICLE_* keys of compose.yaml that are not Settings fields yet (none now: the S3 settings
# landed with the skills store). Remove each entry when its field lands; the test below insists on that.
PENDING_SETTINGS: frozenset[str] = frozenset()

# ${VAR}, ${VAR:-default}, ${VAR-default}, ${VAR:?error}, ${VAR?error}; `$$` is a literal dollar
_INTERPOLATION = re.compile(r"\$\{(?P<name>[A-Za-z_][A-Za-z0-9_]*)(?:(?P<op>:?[-?])(?P<arg>[^}]*))?\}")


def resolve(value: str, given: dict[str, str] | None = None) -> str:
    """What compose makes of ``value`` when no variable is set but ``given``'s (a ``.env``):
    ``${VAR:-default}`` becomes ``default``, or VAR's value where ``given`` sets it (not empty)."""

    def default(m: re.Match[str]) -> str:
        if (given or {}).get(m["name"]):
            return (given or {})[m["name"]]
        if m["op"] == ":?" and m["name"] in REQUIRED:
            return REQUIRED[m["name"]]
        if m["op"] not in (":-", "-"):
            raise AssertionError(f"{m[0]!r} has no default, so the stack does not start without a .env")
        return m["arg"]

    resolved = _INTERPOLATION.sub(default, value.replace("$$", "\0"))
    assert "$" not in resolved, f"unresolved interpolation in {value!r}"
    return resolved.replace("\0", "$")


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    data = yaml.safe_load(COMPOSE.read_text())
    assert isinstance(data, dict)
    return data


@pytest.fixture(scope="module")
def services(compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    svcs = compose["services"]
    assert isinstance(svcs, dict)
    return svcs


def env_of(service: dict[str, Any], given: dict[str, str] | None = None) -> dict[str, str]:
    env = service.get("environment", {})
    if isinstance(env, list):  # the `- KEY=value` form
        env = dict(item.split("=", 1) for item in env)
    assert isinstance(env, dict)
    for key, value in env.items():
        assert isinstance(value, str), f"{key}: quote it, compose values are strings ({value!r})"
    return {key: resolve(value, given) for key, value in env.items()}


def settings_from(env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> Settings:
    """Settings exactly as the container builds them: from its environment and nothing else."""
    for key in list(os.environ):
        if key.upper().startswith(PREFIX):
            monkeypatch.delenv(key)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    return Settings(_env_file=None)


def container_ports(service: dict[str, Any]) -> set[int]:
    """Container side of each ``[host_ip:][host:]container`` mapping."""
    return {int(str(p).rsplit(":", 1)[-1].split("/")[0]) for p in service.get("ports", [])}


def image_tag(service: dict[str, Any]) -> tuple[str, str]:
    name, _, tag = str(service["image"]).rpartition(":")
    return name, tag


# -- shape ----------------------------------------------------------------------------------------


def test_service_set(compose: dict[str, Any], services: dict[str, dict[str, Any]]) -> None:
    assert set(services) == {*INFRA, *CHRONICLE, NATS_CONFIG}
    assert "version" not in compose, "the top-level `version:` key is obsolete"


def test_infra_images(services: dict[str, dict[str, Any]]) -> None:
    name, tag = image_tag(services["nats"])
    assert name == "nats"
    m = re.fullmatch(r"(\d+)\.(\d+)(?:\.(\d+))?(?:-alpine[0-9.]*)?", tag)
    assert m, f"pin a numeric nats tag, not {tag!r}"
    major, minor = int(m[1]), int(m[2])
    assert major == 2, "nats 2.x"
    assert minor >= 11, f"nats >= 2.11 is required, got {tag}"
    # the alpine variant has busybox wget, which the health check uses (scratch images have no shell)
    assert "alpine" in tag

    name, tag = image_tag(services["postgres"])
    assert name == "pgvector/pgvector"
    assert re.fullmatch(r"pg1[6-9](?:-.*)?", tag), tag

    name, tag = image_tag(services["minio"])
    assert name == "minio/minio"
    assert re.fullmatch(r"RELEASE\.\d{4}-\d{2}-\d{2}T\d{2}-\d{2}-\d{2}Z", tag), f"pin a MinIO release, not {tag!r}"


def volume_at(service: dict[str, Any], path: str) -> str:
    """The volume mounted at ``path`` (the longest mount point that holds it)."""
    mounts = {str(v).split(":")[1]: str(v).split(":")[0] for v in service.get("volumes", [])}
    point = max((m for m in mounts if path == m or path.startswith(m.rstrip("/") + "/")), key=len, default=None)
    assert point is not None, f"{path} is on no volume"
    return mounts[point]


def test_nats_runs_the_generated_configuration(
    services: dict[str, dict[str, Any]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """nats reads the file nats-config writes (a shared volume), JetStream's store is on its own
    volume, and the configuration holds users only (never open), for the settings the services use."""
    command = services["nats"]["command"]
    assert isinstance(command, list)
    conf = command[command.index("-c") + 1]
    assert command[command.index("-m") + 1] == "8222"
    writer = services[NATS_CONFIG]
    args = writer["command"]
    assert args[0] == "nats-config"
    assert args[args.index("--out") + 1] == conf
    assert volume_at(writer, conf) == volume_at(services["nats"], conf)
    assert any(str(v).endswith(":ro") for v in services["nats"]["volumes"] if volume_at(services["nats"], conf) in v)
    assert services["nats"]["depends_on"] == {NATS_CONFIG: {"condition": "service_completed_successfully"}}
    assert writer["restart"] == "no"

    # what `chronicle nats-config` writes in that container: its environment, its arguments
    settings = settings_from(env_of(writer), monkeypatch)
    out = tmp_path / "nats.conf"
    out_at = args.index("--out") + 1
    assert cli.main([*args[:out_at], str(out), *args[out_at + 1 :]]) == 0
    config = json.loads(out.read_text())
    assert config == server_config(NatsAccess.of(settings), host="0.0.0.0", port=4222, store_dir="/data")
    assert volume_at(services["nats"], config["jetstream"]["store_dir"]) == "nats-data", "JetStream on its volume"
    users = config["authorization"]["users"]
    assert users[0]["nkey"] == nkey_public_key(REQUIRED["CHRONICLE_NATS_NKEY_SEED"])
    assert "no_auth_user" not in config


def test_nats_config_writes_the_sync_interval_a_dot_env_sets(
    services: dict[str, dict[str, Any]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``CHRONICLE_NATS_SYNC_INTERVAL=always`` in ``.env``: the nats server fsyncs each write before
    it is acknowledged (unset, the test above: nats-server's default, every 2 minutes)."""
    writer = services[NATS_CONFIG]
    settings_from(env_of(writer, {"CHRONICLE_NATS_SYNC_INTERVAL": "always"}), monkeypatch)
    args = writer["command"]
    out = tmp_path / "nats.conf"
    out_at = args.index("--out") + 1
    assert cli.main([*args[:out_at], str(out), *args[out_at + 1 :]]) == 0
    assert json.loads(out.read_text())["jetstream"] == {"store_dir": "/data", "sync_interval": "always"}


def test_minio_serves_s3_and_console(services: dict[str, dict[str, Any]]) -> None:
    minio = services["minio"]
    command = minio["command"]
    assert command[:2] == ["server", "/data"]
    assert command[command.index("--console-address") + 1] == ":9001"
    env = env_of(minio)
    assert len(env["MINIO_ROOT_USER"]) >= 3
    assert len(env["MINIO_ROOT_PASSWORD"]) >= 8, "MinIO refuses to start with a shorter root password"


def test_infra_health_checks(services: dict[str, dict[str, Any]]) -> None:
    for name in INFRA:
        check = services[name].get("healthcheck")
        assert check, f"{name} has no healthcheck"
        test = check["test"]
        assert isinstance(test, list)
        assert test[0] in ("CMD", "CMD-SHELL")
        assert not check.get("disable", False)
    assert "healthz" in " ".join(services["nats"]["healthcheck"]["test"])
    pg = services["postgres"]["healthcheck"]["test"]
    assert "pg_isready" in pg
    assert pg[pg.index("-d") + 1] == "chronicle"
    assert "ready" in services["minio"]["healthcheck"]["test"] or "/minio/health/live" in " ".join(
        services["minio"]["healthcheck"]["test"]
    )


def test_chronicle_services_are_built_here(services: dict[str, dict[str, Any]]) -> None:
    for name in (*CHRONICLE, NATS_CONFIG):
        svc = services[name]
        assert svc.get("build") in (".", {"context": "."}), name
        assert svc["command"][0] == name, name
    assert services["migrate"]["restart"] == "no"


def test_start_order(services: dict[str, dict[str, Any]]) -> None:
    assert services["migrate"]["depends_on"] == {"postgres": {"condition": "service_healthy"}}
    expected = {
        "nats": {"condition": "service_healthy"},
        "postgres": {"condition": "service_healthy"},
        "minio": {"condition": "service_healthy"},
        "migrate": {"condition": "service_completed_successfully"},
    }
    for name in ("api", "projector", "compactor", "commands"):
        assert services[name]["depends_on"] == expected, name
    # every service_healthy condition points at a service that has a health check
    for name, svc in services.items():
        for dep, cond in svc.get("depends_on", {}).items():
            if cond["condition"] == "service_healthy":
                assert "healthcheck" in services[dep], f"{name} waits on {dep}, which has no healthcheck"


def test_ports(services: dict[str, dict[str, Any]]) -> None:
    assert container_ports(services["nats"]) >= {4222}
    assert container_ports(services["minio"]) == {9000, 9001}
    assert "8080:8080" in services["api"]["ports"]
    assert not services["projector"].get("ports")
    assert not services["compactor"].get("ports")
    assert not services["commands"].get("ports")
    assert not services["migrate"].get("ports")


def test_api_health_check_uses_python(services: dict[str, dict[str, Any]]) -> None:
    test = services["api"]["healthcheck"]["test"]
    assert test[:3] == ["CMD", "python", "-c"], "the slim image has no curl"
    compile(test[3], "<healthcheck>", "exec")
    assert ":8080/healthz" in test[3]


def test_named_volumes_are_declared(compose: dict[str, Any], services: dict[str, dict[str, Any]]) -> None:
    declared = set(compose.get("volumes") or {})
    used: set[str] = set()
    for svc in services.values():
        for volume in svc.get("volumes", []):
            source = str(volume).split(":")[0]
            if not source.startswith((".", "/", "~")):
                used.add(source)
    assert used == declared
    for name in INFRA:
        assert services[name].get("volumes"), f"{name} keeps its data on a volume"


# -- environment against the settings model -------------------------------------------------------


def test_every_chronicle_key_is_a_setting(services: dict[str, dict[str, Any]]) -> None:
    fields = set(Settings.model_fields)
    stale = {key for key in PENDING_SETTINGS if key.removeprefix(PREFIX).lower() in fields}
    assert not stale, f"now real settings, drop them from PENDING_SETTINGS: {sorted(stale)}"
    for name, svc in services.items():
        for key in env_of(svc):
            if not key.startswith(PREFIX) or key in PENDING_SETTINGS:
                continue
            assert key.removeprefix(PREFIX).lower() in fields, f"{name}: {key} is not a Settings field"


def test_chronicle_services_share_one_environment(services: dict[str, dict[str, Any]]) -> None:
    api = env_of(services["api"])
    for name in (*CHRONICLE, NATS_CONFIG):
        assert env_of(services[name]) == api, f"{name} must use the shared x-chronicle-env"
    for name in INFRA:
        assert not any(k.startswith(PREFIX) for k in env_of(services[name])), name


def test_environment_validates_against_settings(
    services: dict[str, dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    env = env_of(services["api"])
    s = settings_from(env, monkeypatch)

    nats = urlsplit(s.nats_url)
    assert (nats.scheme, nats.hostname, nats.port) == ("nats", "nats", 4222)
    assert 4222 in container_ports(services["nats"])

    db = urlsplit(s.database_url)
    assert db.scheme in ("postgresql", "postgres")
    assert (db.hostname, db.port) == ("postgres", 5432)
    pg = env_of(services["postgres"])
    assert db.username == pg["POSTGRES_USER"]
    assert db.password == pg["POSTGRES_PASSWORD"]
    assert db.path.lstrip("/") == pg["POSTGRES_DB"] == "chronicle"

    assert s.api_host == "0.0.0.0"
    assert s.api_port == 8080
    assert f":{s.api_port}/healthz" in services["api"]["healthcheck"]["test"][3]
    assert s.api_port in container_ports(services["api"])
    # the placeholder is well-formed, so the API starts (and answers 401 until a real key is set)
    assert s.api_keys
    assert s.grants_by_key_hash()
    # the migrate service migrates; api and projector must not race it
    assert s.auto_migrate is False

    # the S3 credentials are MinIO's root credentials, and the endpoint is the minio service
    minio = env_of(services["minio"])
    assert env["CHRONICLE_S3_ENDPOINT"] == "minio:9000"
    assert env["CHRONICLE_S3_ACCESS_KEY"] == minio["MINIO_ROOT_USER"]
    assert env["CHRONICLE_S3_SECRET_KEY"] == minio["MINIO_ROOT_PASSWORD"]
    assert env["CHRONICLE_S3_SECURE"] in ("false", "true")
    assert s.claim_check_store == "s3"  # large bodies in MinIO, as the design has them


def test_a_keys_file_set_in_dot_env_reaches_nats_config_and_the_api(
    services: dict[str, dict[str, Any]], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """``CHRONICLE_API_KEYS_FILE`` in ``.env`` is passed to nats-config (its tenants' NATS users)
    and to the API (their keys), as the other settings are; unset it is empty, which the settings
    take as no file (not the working directory's path)."""
    for name in (NATS_CONFIG, "api"):
        assert "CHRONICLE_API_KEYS_FILE" in services[name]["environment"], name
        assert env_of(services[name])["CHRONICLE_API_KEYS_FILE"] == ""
    assert settings_from(env_of(services["api"]), monkeypatch).api_keys_file is None
    keys = tmp_path / "api-keys"  # where the header's mount puts it, in a container
    keys.write_text(f"# acme\n{api_key_entry('acme', 'chr_from_the_file')}\n")
    for name in (NATS_CONFIG, "api"):
        env = env_of(services[name], {"CHRONICLE_API_KEYS_FILE": str(keys)})
        s = settings_from(env, monkeypatch)
        assert s.api_keys_file == str(keys)
        assert hash_key("chr_from_the_file") in s.grants_by_key_hash()
        assert s.tenant_nkeys()["acme"] == [nkey_public_key(tenant_nkey_seed("chr_from_the_file"))]


def test_the_header_says_how_to_give_the_containers_a_keys_file() -> None:
    header = COMPOSE.read_text().split("\nx-chronicle-env", 1)[0]
    assert "CHRONICLE_API_KEYS_FILE" in header
    assert "compose.override.yaml" in header  # the mount, of the file's directory, for nats-config and api
    assert "docker compose kill -s HUP api" in header  # the API's reload


def test_interpolation_resolves_to_defaults() -> None:
    assert resolve("${X:-a:b}") == "a:b"
    assert resolve("${X-[1]}/y") == "[1]/y"
    assert resolve("cost $$5") == "cost $5"
    with pytest.raises(AssertionError):
        resolve("${X}")
    with pytest.raises(AssertionError):
        resolve("${X:?set X}")
    assert resolve("${CHRONICLE_NATS_NKEY_SEED:?make one}") == REQUIRED["CHRONICLE_NATS_NKEY_SEED"]


# -- Dockerfile -----------------------------------------------------------------------------------


def test_the_build_context_holds_what_the_dockerfile_copies() -> None:
    """.dockerignore is an allowlist: a COPY of a path it leaves out fails the image build."""
    allowed = {
        line[1:].strip("/") for line in (ROOT / ".dockerignore").read_text().splitlines() if line.startswith("!")
    }
    copied = [
        source
        for line in DOCKERFILE.read_text().splitlines()
        if line.startswith("COPY ") and "--from=" not in line
        for source in line.split()[1:-1]
    ]
    assert copied
    assert [source for source in copied if source.rstrip("/") not in allowed] == []


def test_dockerfile() -> None:
    text = DOCKERFILE.read_text()
    lines = [line.strip() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    froms = [line for line in lines if line.upper().startswith("FROM ")]
    assert froms
    assert all(line.split()[1] == "python:3.11-slim" for line in froms)
    assert 'ENTRYPOINT ["chronicle"]' in lines
    assert 'CMD ["api"]' in lines
    assert "EXPOSE 8080" in lines
    assert re.search(r"\bCHRONICLE_API_HOST=0\.0\.0\.0\b", text)
    assert re.search(r"pip install \./sdk \.(\s|$)", text), "install the SDK's distribution and the project, no extras"
    assert "[dev]" not in text
    users = [line.split()[1] for line in lines if line.upper().startswith("USER ")]
    assert users
    assert users[-1].split(":")[0] not in ("root", "0"), "run as a non-root user"


def test_postgres_holds_every_connection_the_long_running_services_may_open(
    services: dict[str, dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """(A stock max_connections of 100 under four processes of 20 pooled + 6 more each: "too many
    clients" under load.) The same sum ``chronicle up`` makes, over compose's services."""
    from services.ops.connections import HEADROOM, extra_connections, pool_decision

    command = services["postgres"]["command"]
    most = next(int(arg.split("=", 1)[1]) for arg in command if arg.startswith("max_connections="))
    running = [name for name in CHRONICLE if name != "migrate"]
    each = [settings_from(env_of(services[name]), monkeypatch) for name in running]
    s = each[0]
    decided = pool_decision(
        allowed=most - 3 - HEADROOM,  # the image's superuser_reserved_connections
        extras=[
            extra_connections(s.compactor_concurrency, compacts=name != "projector", compactor=name == "compactor")
            for name in running
        ],
        pool_max=s.db_pool_max,
        pool_max_set=True,  # compose runs the pools as configured: none is capped
        max_connections=most,
    )
    assert decided.pool_max == s.db_pool_max, decided.message
