"""`chronicle up` from a clean data directory: ready, serves, stops cleanly, restarts with its data,
and refuses to start on a new event log under read models of the old one."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path

import httpx
import nats
import psycopg
from nats.js.api import StreamInfo

from events.credentials import nkey_public_key, tenant_inbox_prefix, tenant_nkey_seed
from services.ops.cli import UNREACHABLE_EXIT
from services.ops.localstack import ROUTE_PORT_OFFSET, free_port, port_free
from services.settings import KeyGrant, api_key_entry, grants_fingerprint, hash_key
from tests.support import nats_handshake, scratch_database


def _env(data: Path, db_url: str, s3: str, api_port: int, **extra: str) -> dict[str, str]:
    """``up``'s environment: its data dir, database, S3 server (the run's moto: an endpoint that is
    set and does not answer stops it) and API port, nothing else of Chronicle's."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CHRONICLE_")}
    env.update(
        CHRONICLE_DATA_DIR=str(data),
        CHRONICLE_DATABASE_URL=db_url,
        CHRONICLE_API_PORT=str(api_port),
        **({"CHRONICLE_S3_ENDPOINT": s3} if s3 else {}),  # "": not set (`up --s3-port`)
        **extra,
    )
    return env


def _start(
    data: Path, db_url: str, s3: str, api_port: int, nats_port: int, *args: str, **extra: str
) -> tuple[subprocess.Popen[str], list[str]]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "services.ops.cli", "up", "--nats-port", str(nats_port), *args],
        env=_env(data, db_url, s3, api_port, **extra),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    lines: list[str] = []
    deadline = time.monotonic() + 90
    assert proc.stdout is not None
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        lines.append(line)
        if line.startswith("Chronicle is ready"):
            # consume the two lines with the key and the hint
            lines.append(proc.stdout.readline())
            return proc, lines
    proc.kill()
    raise AssertionError("chronicle up did not become ready:\n" + "".join(lines))


def _up_refused(data: Path, db_url: str, s3: str, api_port: int, nats_port: int) -> subprocess.CompletedProcess[str]:
    """``chronicle up`` run to its end (one that refuses to start ends by itself), its output kept."""
    return subprocess.run(
        [sys.executable, "-m", "services.ops.cli", "up", "--nats-port", str(nats_port)],
        env=_env(data, db_url, s3, api_port),
        capture_output=True,
        text=True,
        timeout=120,
    )


def _stop(proc: subprocess.Popen[str]) -> str:
    """Ctrl-C, as a user stops it. Should the stop hang, every process it started is killed (they
    run in their own sessions, so killing ``chronicle up`` alone would leave them serving for the
    rest of the test run) and the test fails with what it printed."""
    proc.send_signal(signal.SIGINT)
    try:
        out, _ = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        for pid in _descendants(proc.pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        proc.kill()
        out, _ = proc.communicate()
        raise AssertionError("chronicle up did not stop within 60 s:\n" + out) from None
    assert proc.returncode == 0, out
    return out


def _descendants(root: int) -> list[int]:
    """Every live process under ``root``, children first."""
    parents: dict[int, int] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            parents[int(stat.parent.name)] = int(stat.read_text().rsplit(")", 1)[1].split()[1])
    found: list[int] = []
    frontier = [root]
    while frontier:
        kids = [pid for pid, ppid in parents.items() if ppid in frontier]
        found.extend(kids)
        frontier = kids
    return found


def test_up_s3_port_starts_its_s3_there_for_every_process_and_records_it(tmp_path: Path, fresh_db: str) -> None:
    """``--s3-port N`` (CHRONICLE_S3_ENDPOINT not set): moto on 127.0.0.1:N, with the bucket
    skills; every process of the stack given that endpoint, and stack.json recording it (and that
    the stack seals) for the commands run beside it: a skill put there is sealed. (Only
    127.0.0.1:9000 could be had: setting the endpoint made it an S3 that must answer.)"""
    api_port, nats_port, s3_port = free_port(), free_port(), free_port()
    proc, lines = _start(tmp_path / "data", fresh_db, "", api_port, nats_port, "--s3-port", str(s3_port))
    try:
        started = f"chronicle up: no S3/MinIO at 127.0.0.1:{s3_port}; starting moto"
        assert any(line.startswith(started) for line in lines)
        assert not port_free("127.0.0.1", s3_port)
        stack = json.loads((tmp_path / "data" / "stack.json").read_text())
        assert stack["s3_endpoint"] == f"http://127.0.0.1:{s3_port}"
        children = [pid for pid in _descendants(proc.pid) if "services.ops.cli" in _cmdline(pid)]
        assert len(children) >= 4  # projector, compactor, commands, api
        for pid in children:
            assert _environ(pid).get("CHRONICLE_S3_ENDPOINT") == f"http://127.0.0.1:{s3_port}", _cmdline(pid)
        beside = {k: v for k, v in os.environ.items() if not k.startswith("CHRONICLE_")}
        beside |= {"CHRONICLE_DATA_DIR": str(tmp_path / "data")}
        assert stack["encryption"] is True
        skill = tmp_path / "tax.md"
        skill.write_text("# tax\n")
        canary = f"canary{uuid.uuid4().hex}"
        put = subprocess.run(
            [
                sys.executable,
                "-m",
                "services.ops.cli",
                "skills",
                "put",
                str(skill),
                "--bucket",
                "skills",
                "--key",
                canary,
                "--description",
                canary,
            ],
            env=beside,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert put.returncode == 0, put.stderr
        # sealed as the stack seals (the put beside it published its skill.indexed in plaintext)
        stored = [
            p for p in (tmp_path / "data" / "nats").rglob("*") if p.is_file() and canary.encode() in p.read_bytes()
        ]
        assert stored == []
    finally:
        _stop(proc)


def _cmdline(pid: int) -> str:
    with contextlib.suppress(OSError):
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    return ""


def _environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(item.decode().split("=", 1) for item in raw if b"=" in item)


def test_up_serves_stops_and_restarts_with_its_data(
    tmp_path: Path, fresh_db: str, pg_admin: str, s3_endpoint: str
) -> None:
    api_port, nats_port = free_port(), free_port()
    proc, lines = _start(tmp_path / "data", fresh_db, s3_endpoint, api_port, nats_port)
    # the run's moto answers there: used as it is, no bucket made on it (only on a moto `up` starts)
    assert f"chronicle up: using S3/MinIO at {s3_endpoint}\n" in lines
    assert not [line for line in lines if "made the bucket" in line]
    key = lines[-1].split(":", 1)[1].strip()
    base = f"http://127.0.0.1:{api_port}"
    headers = {"Authorization": f"Bearer {key}"}
    try:
        # NATS is never open: no anonymous client; the default tenant's key-derived identity and
        # the operator's (kept in the data dir) are admitted
        nats_url = f"nats://127.0.0.1:{nats_port}"
        assert asyncio.run(nats_handshake(nats_url, None)) == "-ERR 'Authorization Violation'"
        assert asyncio.run(nats_handshake(nats_url, tenant_nkey_seed(key))) == "PONG"
        operator = (tmp_path / "data" / "nats-operator.nk").read_text().strip()
        assert asyncio.run(nats_handshake(nats_url, operator)) == "PONG"
        msg = {"id": "m1", "role": "user", "parts": [{"type": "text", "text": "remember me"}]}
        r = httpx.post(f"{base}/v1/sessions/up-demo/messages", json={"message": msg}, headers=headers, timeout=30)
        assert r.status_code == 201, r.text
        h = httpx.get(f"{base}/v1/sessions/up-demo/history", params={"min_seq": r.json()["seq"]}, headers=headers)
        assert [m["id"] for m in h.json()["messages"]] == ["m1"]
        # a tool run beside it with its data dir alone reaches its NATS and its database (recorded
        # in the data dir), as its operator, and opens its sealed events with its key
        assert json.loads((tmp_path / "data" / "stack.json").read_text()) == {
            "nats_url": nats_url,
            "nats_nkey_seed_file": str((tmp_path / "data" / "nats-operator.nk").resolve()),
            "kek_file": str((tmp_path / "data" / "kek").resolve()),
            "database_url": fresh_db,
            "s3_endpoint": f"http://{s3_endpoint}",
            "encryption": True,
            "api_key_file": str((tmp_path / "data" / "api-key").resolve()),
        }
        beside = {k: v for k, v in os.environ.items() if not k.startswith("CHRONICLE_")}
        beside |= {"CHRONICLE_DATA_DIR": str(tmp_path / "data")}
        replay = subprocess.run(
            [sys.executable, "-m", "services.ops.cli", "replay", "--tenant", "default", "--session", "up-demo"],
            env=beside,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert replay.returncode == 0, replay.stderr
        assert "remember me" in replay.stdout
        # a second instance refuses: the ports are taken
        second = subprocess.run(
            [sys.executable, "-m", "services.ops.cli", "up", "--nats-port", str(nats_port)],
            env={**os.environ, "CHRONICLE_API_PORT": str(api_port), "CHRONICLE_DATA_DIR": str(tmp_path / "other")},
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert second.returncode == 1
        assert "already taken" in second.stderr
    finally:
        out = _stop(proc)
    assert "stopping" in out
    proc, lines = _start(tmp_path / "data", fresh_db, s3_endpoint, api_port, nats_port)
    try:
        assert lines[-1].split(":", 1)[1].strip() == key  # the same key, kept in the data dir
        h = httpx.get(f"{base}/v1/sessions/up-demo/history", headers=headers, timeout=30)
        assert [m["id"] for m in h.json()["messages"]] == ["m1"]
    finally:
        _stop(proc)
    # the database lost (a new, empty one), the event log kept: it would be bound and replayed into
    # silently, without the data keys and erasure records the log cannot restore. Refused, with what to do
    with scratch_database(pg_admin) as new_db:
        refused = _up_refused(tmp_path / "data", new_db, s3_endpoint, api_port, nats_port)
    assert refused.returncode == 1, refused.stdout + refused.stderr
    assert "has never held read models of stream" in refused.stderr, refused.stderr
    assert "restore it from a backup" in refused.stderr
    assert "exit status 3) exited during start-up; stopping" in refused.stderr
    # the event log wiped, the database kept: a new stream under the old name, whose first events
    # the read models would take for applied ones. Refused, with what to do
    shutil.rmtree(tmp_path / "data" / "nats")
    refused = _up_refused(tmp_path / "data", fresh_db, s3_endpoint, api_port, nats_port)
    assert refused.returncode == 1, refused.stdout + refused.stderr
    assert "refusing to start: the read models in database" in refused.stderr, refused.stderr
    assert "chronicle rebuild" in refused.stderr
    assert "exit status 3) exited during start-up; stopping" in refused.stderr
    assert "Traceback" not in refused.stderr  # each refusal is its message, not a server's trace


def test_a_second_up_on_the_same_data_dir_is_refused_before_it_changes_anything(
    tmp_path: Path, fresh_db: str, s3_endpoint: str
) -> None:
    """(A second `up` with other ports and the same data dir started a second nats-server on the
    first one's JetStream store, "Stream state outdated … will rebuild", second workers on its
    database, and overwrote its nats.conf and stack.json.) One line naming the data dir and the
    running stack, exit 4, nothing written, nothing started."""
    data = (tmp_path / "data").resolve()
    api_port, nats_port = free_port(), free_port()
    proc, _ = _start(data, fresh_db, s3_endpoint, api_port, nats_port)
    try:
        kept = {name: (data / name).read_bytes() for name in ("nats.conf", "stack.json")}
        other_api, other_nats = free_port(), free_port()
        second = _up_refused(data, fresh_db, s3_endpoint, other_api, other_nats)
        assert second.returncode == UNREACHABLE_EXIT, second.stdout + second.stderr
        assert second.stderr == (
            f"chronicle up: {data} is the data dir of a running `chronicle up` (pid {proc.pid}, API "
            f"http://127.0.0.1:{api_port}, NATS nats://127.0.0.1:{nats_port}): stop it first, or set "
            "CHRONICLE_DATA_DIR to another data dir\n"
        )
        assert second.stdout == ""
        assert {name: (data / name).read_bytes() for name in kept} == kept
        assert port_free("127.0.0.1", other_nats)
        assert port_free("127.0.0.1", other_api)
        assert httpx.get(f"http://127.0.0.1:{api_port}/healthz", timeout=30).status_code == 200
    finally:
        _stop(proc)


def test_up_with_two_partitioned_projectors(tmp_path: Path, fresh_db: str, s3_endpoint: str) -> None:
    """CHRONICLE_PROJECTOR_WORKERS=2: two projector processes, one partition each; session and
    tenant-wide reads with ``min_seq`` see every append."""
    api_port, nats_port = free_port(), free_port()
    proc, lines = _start(
        tmp_path / "data",
        fresh_db,
        s3_endpoint,
        api_port,
        nats_port,
        CHRONICLE_PARTITIONS="2",
        CHRONICLE_PROJECTOR_WORKERS="2",
    )
    key = lines[-1].split(":", 1)[1].strip()
    base = f"http://127.0.0.1:{api_port}"
    headers = {"Authorization": f"Bearer {key}"}
    try:
        with httpx.Client(base_url=base, headers=headers, timeout=30) as client:
            last = 0
            for i in range(8):  # sessions spread over both partitions
                msg = {"id": "m1", "role": "user", "parts": [{"type": "text", "text": f"partition probe {i}"}]}
                r = client.post(f"/v1/sessions/two-{i}/messages", json={"message": msg})
                assert r.status_code == 201, r.text
                last = max(last, r.json()["seq"])
            listed = client.get("/v1/sessions", params={"min_seq": last, "limit": 50})
            assert listed.status_code == 200, listed.text
            assert {s["id"] for s in listed.json()["sessions"]} >= {f"two-{i}" for i in range(8)}
    finally:
        _stop(proc)
    with psycopg.connect(fresh_db) as conn:
        names = {r[0] for r in conn.execute("SELECT name FROM checkpoints WHERE name LIKE 'projector%'")}
    assert names == {"projector.p000", "projector.p001"}  # one checkpoint per partition, no other


def test_up_on_a_three_node_nats_cluster(tmp_path: Path, fresh_db: str, s3_endpoint: str) -> None:
    """--nats-cluster 3: three nats-servers on consecutive ports, none open, the stream at R3 with
    every copy current, two projector workers (each preferring another node) serving reads, and
    --api-processes 2: two API processes on the one port."""
    api_port = free_port()
    nats_port = _free_run(3)
    proc, lines = _start(
        tmp_path / "data",
        fresh_db,
        s3_endpoint,
        api_port,
        nats_port,
        "--nats-cluster",
        "3",
        "--api-processes",
        "2",
        CHRONICLE_PARTITIONS="2",
        CHRONICLE_PROJECTOR_WORKERS="2",
    )
    key = lines[-1].split(":", 1)[1].strip()
    operator = (tmp_path / "data" / "nats-operator.nk").read_text().strip()
    said: list[str] = []  # what `up` printed while the test waited for a node to come back
    try:
        assert any("a cluster of 3 nats-servers" in line for line in lines)
        assert len(_children(proc.pid, "api")) == 2
        urls = [f"nats://127.0.0.1:{nats_port + i}" for i in range(3)]
        for url in urls:
            assert asyncio.run(nats_handshake(url, None)) == "-ERR 'Authorization Violation'"
            assert asyncio.run(nats_handshake(url, operator)) == "PONG"
        with httpx.Client(base_url=f"http://127.0.0.1:{api_port}", headers={"Authorization": f"Bearer {key}"}) as c:
            last = 0
            for i in range(6):
                msg = {"id": "m1", "role": "user", "parts": [{"type": "text", "text": f"cluster probe {i}"}]}
                r = c.post(f"/v1/sessions/c-{i}/messages", json={"message": msg}, timeout=30)
                assert r.status_code == 201, r.text
                last = max(last, r.json()["seq"])
            # a tenant-wide read waits for every partition's projector; right after start, on a
            # loaded machine, that can outlast the read's wait (503, retried as a client would)
            for _ in range(6):
                listed = c.get("/v1/sessions", params={"min_seq": last, "limit": 50}, timeout=30)
                if listed.status_code != 503:
                    break
            assert listed.status_code == 200, listed.text
            assert {s["id"] for s in listed.json()["sessions"]} >= {f"c-{i}" for i in range(6)}
        for _ in range(10):  # new connections, spread by the kernel over both processes: all answered
            fresh = httpx.get(f"http://127.0.0.1:{api_port}/healthz", timeout=30)
            assert fresh.status_code == 200
        info = asyncio.run(_stream_info(urls, operator))
        assert info.config.num_replicas == 3
        assert info.cluster is not None
        assert info.cluster.leader
        assert sorted(p.name or "" for p in info.cluster.replicas or []) == sorted(
            {"n1", "n2", "n3"} - {info.cluster.leader}
        )
        # a node dies: the stack keeps serving on the other two and `up` starts it again
        (n2,) = _nats_node(proc.pid, "nats-n2.conf")
        os.kill(n2, signal.SIGKILL)
        assert proc.stdout is not None
        while not said or said[-1] != "chronicle up: nats-server n2 is back\n":  # the processes log here too
            said.append(proc.stdout.readline())
            assert said[-1], "".join(said)  # `up` ended
        assert any(
            line.startswith("chronicle up: nats-server n2 exited (exit status -9); starting it again") for line in said
        ), said
        assert proc.poll() is None
        (again,) = _nats_node(proc.pid, "nats-n2.conf")
        assert again != n2
        assert asyncio.run(nats_handshake(urls[1], operator)) == "PONG"
        with httpx.Client(base_url=f"http://127.0.0.1:{api_port}", headers={"Authorization": f"Bearer {key}"}) as c:
            msg = {"id": "m2", "role": "user", "parts": [{"type": "text", "text": "after the node came back"}]}
            for _ in range(10):  # a write in the node's re-election window may be 503, as a client retries
                r = c.post("/v1/sessions/c-0/messages", json={"message": msg}, timeout=30)
                if r.status_code != 503:
                    break
                time.sleep(1)
            assert r.status_code == 201, r.text
    finally:
        out = _stop(proc)
    # each projector worker logged the node it reached: the URL order made them pick different ones
    nodes = {
        line.split(" projector ", 1)[1].split()[0]: line.rsplit(" via NATS ", 1)[1].strip()
        for line in [*lines, *said, *out.splitlines()]
        if " consuming " in line and " via NATS " in line
    }
    assert nodes == {"projector.p000": f"127.0.0.1:{nats_port}", "projector.p001": f"127.0.0.1:{nats_port + 1}"}


def _child_processes(parent: int, wanted: Callable[[list[bytes]], bool]) -> list[int]:
    """Live child processes of ``parent`` whose command line (``argv``) is ``wanted``."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            ppid = int(stat.read_text().rsplit(")", 1)[1].split()[1])
            argv = (stat.parent / "cmdline").read_bytes().split(b"\0")
        except (OSError, ValueError, IndexError):
            continue
        if ppid == parent and wanted(argv):
            found.append(int(stat.parent.name))
    return found


def _children(parent: int, command: str) -> list[int]:
    """Live child processes of ``parent`` running ``chronicle <command>``."""
    return _child_processes(parent, lambda argv: command.encode() in argv[-2:])


def _nats_node(parent: int, conf: str) -> list[int]:
    """Live child processes of ``parent`` running nats-server with the configuration ``conf``."""
    return _child_processes(parent, lambda argv: any(a.endswith(conf.encode()) for a in argv))


def _free_run(size: int) -> int:
    """A first port such that it and the next ``size - 1`` (and the routes 1000 above) are free."""
    for _ in range(50):
        first = free_port()
        ports = [first + i for i in range(size)] + [first + ROUTE_PORT_OFFSET + i for i in range(size)]
        if all(port_free("127.0.0.1", p) for p in ports):
            return first
    raise AssertionError("no run of free ports")


async def _stream_info(urls: list[str], operator: str) -> StreamInfo:
    nc = await nats.connect(urls, nkeys_seed_str=operator)
    try:
        return await nc.jetstream().stream_info("CHRONICLE")
    finally:
        await nc.close()


def test_up_with_an_ops_key_becomes_ready(tmp_path: Path, fresh_db: str, s3_endpoint: str) -> None:
    """(With CHRONICLE_OPS_KEY set it asked /readyz without the key, was answered 401 until its
    timeout, and stopped: "the API did not become ready in time".)"""
    api_port, nats_port = free_port(), free_port()
    proc, lines = _start(
        tmp_path / "data", fresh_db, s3_endpoint, api_port, nats_port, CHRONICLE_OPS_KEY="ops-key-of-up"
    )
    base = f"http://127.0.0.1:{api_port}"
    try:
        assert any(line.startswith("Chronicle is ready") for line in lines)
        assert httpx.get(f"{base}/readyz", timeout=30).status_code == 401  # the key is still asked for
        ready = httpx.get(f"{base}/readyz", headers={"Authorization": "Bearer ops-key-of-up"}, timeout=30)
        assert ready.status_code == 200, ready.text
    finally:
        _stop(proc)


def test_up_runs_its_nats_server_with_the_sync_interval_setting(
    tmp_path: Path, fresh_db: str, s3_endpoint: str
) -> None:
    """CHRONICLE_NATS_SYNC_INTERVAL=always: JetStream fsyncs each write before it is acknowledged
    (`up` had no way to set it: its server fsynced every 2 minutes, nats-server's default;
    tests/integration/test_nats_config.py runs a server with the configuration)."""
    api_port, nats_port = free_port(), free_port()
    data = tmp_path / "data"
    proc, _ = _start(data, fresh_db, s3_endpoint, api_port, nats_port, CHRONICLE_NATS_SYNC_INTERVAL="always")
    try:
        conf = data / "nats.conf"
        assert json.loads(conf.read_text())["jetstream"] == {"store_dir": str(data / "nats"), "sync_interval": "always"}
        assert _nats_node(proc.pid, str(conf)), "its nats-server runs with that configuration"
    finally:
        _stop(proc)


def test_up_refuses_a_data_dir_made_with_the_other_log_layout(tmp_path: Path) -> None:
    """A cluster's new, empty log beside a one-server log would start at sequence 1 under read
    models whose checkpoints are further on: refused before anything starts."""
    (tmp_path / "nats").mkdir()
    env = {**os.environ, "CHRONICLE_DATA_DIR": str(tmp_path), "CHRONICLE_API_PORT": str(free_port())}
    done = subprocess.run(
        [sys.executable, "-m", "services.ops.cli", "up", "--nats-cluster", "3", "--nats-port", str(_free_run(3))],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1
    assert "holds the event log of one nats-server" in done.stderr
    assert not list(tmp_path.glob("nats-n*"))


def test_up_refuses_pools_the_server_cannot_hold_naming_what_to_change(
    tmp_path: Path, fresh_db: str, s3_endpoint: str
) -> None:
    """(Each process opened pools of up to CHRONICLE_DB_POOL_MAX with no regard for the server's
    max_connections: under load, requests met "too many clients".) A pool size the operator set
    that the server cannot hold for every process is refused before any process starts, and
    before the database is migrated (earlier it was migrated first: a new release's `up` refused
    this way had moved the database on past the release that still ran, which then refused it)."""
    api_port, nats_port = free_port(), free_port()
    done = subprocess.run(
        [sys.executable, "-m", "services.ops.cli", "up", "--nats-port", str(nats_port)],
        env=_env(tmp_path / "data", fresh_db, s3_endpoint, api_port, CHRONICLE_DB_POOL_MAX="500"),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 1, done.stdout + done.stderr
    assert "4 processes of up to 500 pooled connections each (CHRONICLE_DB_POOL_MAX) and 21 more" in done.stderr
    assert "raise max_connections (at least" in done.stderr
    assert "Chronicle is ready" not in done.stdout
    assert port_free("127.0.0.1", api_port)
    assert port_free("127.0.0.1", nats_port)  # what it had started is stopped
    with psycopg.connect(fresh_db) as conn:
        migrated = conn.execute("SELECT to_regclass('schema_migrations') IS NOT NULL").fetchone()
    assert migrated == (False,)


async def test_up_reloads_the_api_keys_file_on_sighup(tmp_path: Path, fresh_db: str, s3_endpoint: str) -> None:
    """SIGHUP to `chronicle up`: the keys file read again, nats.conf written again and nats-server
    reloaded (a new tenant's NATS user admitted; a removed one refused, its open connection dropped),
    SIGHUP to every API process (a new key answers 200 on each, a removed one 401); a file that
    does not parse changes nothing, in one line, and the stack keeps running."""
    api_port, nats_port = free_port(), free_port()
    keys_file = tmp_path / "api-keys"
    keep = "chr_keep_" + uuid.uuid4().hex  # in every version of the file: the previous keys stay in force
    kept = f"# ops\n{api_key_entry('ops', keep)}\n"
    keys_file.write_text(kept)
    proc, started = _start(
        tmp_path / "data", fresh_db, s3_endpoint, api_port, nats_port, "--api-processes", "2",
        CHRONICLE_API_KEYS_FILE=str(keys_file),
    )  # fmt: skip
    # each API process says which keys it serves, as a fingerprint (equal in both, never a key)
    first = grants_fingerprint({hash_key(keep): KeyGrant("ops")})
    start_line = f"api keys: 1 in force (keys file: {keys_file}), keys fingerprint {first}"
    assert sum(start_line in line for line in started) == 2, "".join(started)
    out = proc.stdout
    assert out is not None
    nats_url, base = f"nats://127.0.0.1:{nats_port}", f"http://127.0.0.1:{api_port}"
    key = "chr_reload_" + uuid.uuid4().hex

    async def statuses(of: str) -> set[int]:  # a new connection each: the kernel spreads them over both processes
        async with httpx.AsyncClient(timeout=30) as http:
            return {
                (await http.get(f"{base}/v1/sessions", headers={"Authorization": f"Bearer {of}"})).status_code
                for _ in range(12)
            }

    async def until(what: str, done: Callable[[], Awaitable[bool]]) -> None:
        deadline = time.monotonic() + 30
        while not await done():
            assert proc.poll() is None, f"chronicle up exited: {proc.returncode}"
            assert time.monotonic() < deadline, f"not within 30 s: {what}"
            await asyncio.sleep(0.1)

    async def said(text: str) -> str:
        """The first line of up's output (and its processes') from now on that holds ``text``."""
        while text not in (line := await asyncio.to_thread(out.readline)):
            assert line, f"chronicle up ended before saying {text!r}"
        return line

    async def said_all(*texts: str) -> list[str]:
        """A line for each of ``texts`` (in any order, from now on), each line once."""
        found: list[str | None] = [None] * len(texts)
        while None in found:
            line = await asyncio.to_thread(out.readline)
            assert line, f"chronicle up ended before saying {[t for t, f in zip(texts, found, strict=True) if not f]}"
            at = next((i for i, t in enumerate(texts) if found[i] is None and t in line), None)
            if at is not None:
                found[at] = line
        return [line for line in found if line is not None]

    try:
        assert await statuses(key) == {401}
        assert await nats_handshake(nats_url, tenant_nkey_seed(key)) == "-ERR 'Authorization Violation'"
        keys_file.write_text(f"{kept}# acme\n{api_key_entry('acme', key)}\n")
        proc.send_signal(signal.SIGHUP)
        second = grants_fingerprint({hash_key(keep): KeyGrant("ops"), hash_key(key): KeyGrant("acme")})
        lines = await said_all(
            "chronicle up: api keys reloaded",
            *[f"api keys reloaded: 2 entries from {keys_file}, keys fingerprint {second}"] * 2,  # each API process
        )
        assert lines[0].strip() == (
            f"chronicle up: api keys reloaded: 2 entries from {keys_file}, keys fingerprint {second} (1 nats-server "
            "configuration(s) written again and reloaded, 2 API process(es) sent SIGHUP)"
        )
        await until("the new key answers 200 on every API process", lambda: _only(statuses(key), 200))
        await until("nats-server admits the new tenant", lambda: _handshake_is(nats_url, key, "PONG"))
        conf = json.loads((tmp_path / "data" / "nats.conf").read_text())
        assert nkey_public_key(tenant_nkey_seed(key)) in [u["nkey"] for u in conf["authorization"]["users"]]
        nc = await nats.connect(
            nats_url,
            nkeys_seed_str=tenant_nkey_seed(key),
            inbox_prefix=tenant_inbox_prefix("acme"),
            allow_reconnect=False,
        )
        try:
            keys_file.write_text(f"{kept}# acme revoked\n")
            proc.send_signal(signal.SIGHUP)
            await said("api keys reloaded: 1 entries")
            await until("the removed key answers 401 on every API process", lambda: _only(statuses(key), 401))
            await until("its open NATS connection dropped", lambda: _is(nc.is_closed))
            assert await nats_handshake(nats_url, tenant_nkey_seed(key)) == "-ERR 'Authorization Violation'"
        finally:
            await nc.close()
        # a file that does not parse: nothing changes, one line, the stack keeps serving
        keys_file.write_text(f"{api_key_entry('acme', key)}\nacme:{key}\n{kept}")
        proc.send_signal(signal.SIGHUP)
        line = await said("api keys not reloaded")
        assert line.strip() == (
            "chronicle up: api keys not reloaded, nothing changed (the previous keys stay in force): "
            f"{keys_file} line 2: an entry of tenant 'acme' is not 'tenant:sha256hex[:nkey|:read-only]': the digest "
            "is not 64 hex digits"
        )
        assert await statuses(key) == {401}
        assert await nats_handshake(nats_url, tenant_nkey_seed(key)) == "-ERR 'Authorization Violation'"
        assert await statuses(keep) == {200}  # the keys in force before the file that does not parse
        assert not (tmp_path / "data" / "api-key").exists()  # keys configured: none made for tenant default
        assert proc.poll() is None
    finally:
        _stop(proc)


async def _only(statuses: Awaitable[set[int]], status: int) -> bool:
    return await statuses == {status}


async def _handshake_is(url: str, key: str, answer: str) -> bool:
    return await nats_handshake(url, tenant_nkey_seed(key)) == answer


async def _is(value: bool) -> bool:
    return value
