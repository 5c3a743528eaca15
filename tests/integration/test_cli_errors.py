"""The CLI's failures are one line that says what is wrong and what to set, with a non-zero exit,
never a traceback; and the tools that only read the log never create the stream (pointed at a
NATS server that is not the stack's, they made ``CHRONICLE`` and its work queue there)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import psycopg
import pytest
from minio import Minio
from nats.js.errors import NotFoundError
from pydantic import SecretStr

from events.credentials import nkey_public_key, tenant_nkey_seed
from events.omitted import OMITTED
from events.subjects import SubjectLayout
from projections.migrate import migration_files
from services.bootstrap import open_container
from services.ops.cli import LOG_MISMATCH_EXIT, SETTINGS_EXIT, UNREACHABLE_EXIT
from services.ops.localstack import free_port
from services.ops.natsconf import NatsAccess
from services.settings import STACK_RECORD, LocalStack, Settings, api_key_entry
from tests.conftest import (
    KEYS,
    OPERATOR_SEED,
    TEST_KEK,
    make_settings,
    operator_nats,
    running_stack,
    tenant_nats_settings,
)
from tests.integration.helpers import text_message
from tests.support import chronicle_cli, nats_server, scratch_database

READERS = [
    ["replay", "--session", "demo"],
    ["history", "--session", "demo"],
    ["history", "--session", "demo", "--as-of-seq", "5"],
    ["verify"],
    ["rebuild"],
    ["archive", "--check"],
    ["archive"],
    ["log", "show"],
    ["log", "rebind", "--yes"],
    ["erase", "--tenant", "tenant-a", "--session", "demo"],
    ["erase", "--tenant", "tenant-a", "--yes"],
    ["keys", "rewrap"],
]
"""Every command that opens the stack without writing to the log (``quarantine`` reads Postgres
alone; ``skills`` writes, and does not create the stream either; the services do; ``up`` starts
its own server)."""


def one_line(done: subprocess.CompletedProcess[str]) -> str:
    """The command's error: exactly one line on stderr, nothing that looks like a traceback."""
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert "Traceback" not in done.stderr
    return lines[0]


@pytest.fixture
def elsewhere(nats_url: str, pg_admin: str) -> Iterator[Settings]:
    """Settings that name a stream this NATS server does not have (the server is not the stack's)."""
    with scratch_database(pg_admin) as db:
        yield make_settings(nats_url, db)


async def streams_of(settings: Settings) -> list[str]:
    """Which of the settings' streams (the log, the work queue) exist on the server."""
    layout = settings.layout()
    nc = await operator_nats(settings.nats_url)
    found = []
    try:
        for name in (layout.stream, layout.work_stream):
            try:
                await nc.jetstream().stream_info(name)
                found.append(name)
            except NotFoundError:
                pass
    finally:
        await nc.close()
    return found


@pytest.mark.parametrize("argv", READERS, ids=" ".join)
async def test_a_tool_that_reads_the_log_never_creates_the_stream(elsewhere: Settings, argv: list[str]) -> None:
    done = chronicle_cli(elsewhere, *argv)
    assert done.returncode == UNREACHABLE_EXIT, done.stderr
    line = one_line(done)
    assert line == (
        f"chronicle {argv[0]}: no stream {elsewhere.stream} on {elsewhere.nats_url}: is CHRONICLE_NATS_URL the "
        "stack's? (`make up` listens on 4250; see README)"
    )
    assert await streams_of(elsewhere) == []


async def test_quarantine_listing_reads_postgres_alone_and_creates_no_stream(elsewhere: Settings) -> None:
    assert chronicle_cli(elsewhere, "migrate").returncode == 0
    done = chronicle_cli(elsewhere, "quarantine", "list")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().endswith("0 quarantined in all")
    assert await streams_of(elsewhere) == []


async def test_quarantine_listing_of_a_tenant_counts_what_it_selects(elsewhere: Settings) -> None:
    """(`--tenant nope` listed nothing over a footer of "2 quarantined in all", every tenant's.)"""
    assert chronicle_cli(elsewhere, "migrate").returncode == 0
    layout = elsewhere.layout()
    with psycopg.connect(elsewhere.database_url, autocommit=True) as conn:
        for seq in (1, 2):
            conn.execute(
                "INSERT INTO quarantine (seq, subject, reason, detail, raw, size, consumer) "
                "VALUES (%s, %s, 'undecodable', 'junk', '\\x00', 1, 'test')",
                (seq, layout.session_subject("tenant-a", f"s{seq}")),
            )
    done = chronicle_cli(elsewhere, "quarantine", "list", "--tenant", "nope")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines() == ["0 quarantined for tenant 'nope'; 2 in all"]
    done = chronicle_cli(elsewhere, "quarantine", "list", "--tenant", "tenant-a", "--limit", "1")
    assert done.returncode == 0, done.stderr
    listed = done.stdout.strip().splitlines()
    assert len(listed) == 2
    assert "tenant-a/s2" in listed[0]
    assert listed[1] == "2 quarantined for tenant 'tenant-a' (undecodable 2); 2 in all"
    done = chronicle_cli(elsewhere, "quarantine", "list")
    assert done.stdout.strip().splitlines()[-1] == "2 quarantined in all (undecodable 2)"


@pytest.mark.parametrize("limit", ["-5", "0", "many"])
async def test_quarantine_listing_refuses_a_limit_below_one(elsewhere: Settings, limit: str) -> None:
    done = chronicle_cli(elsewhere, "quarantine", "list", "--limit", limit)
    assert done.returncode == SETTINGS_EXIT
    assert "Traceback" not in done.stderr
    [line] = done.stderr.splitlines()  # one line, no usage before it
    assert line.startswith("chronicle quarantine list: argument --limit: ")
    assert done.stdout == ""


WRITERS = [
    ["skills", "put", "README.md", "--bucket", "skills-nosuch", "--key", "skills/x", "--tenant", "default"],
    ["skills", "sync", "--bucket", "skills-nosuch"],
]
"""The tools that write to the log: they never create the stream either (``skills`` made
``CHRONICLE`` and its work queue on whichever server CHRONICLE_NATS_URL named)."""


@pytest.mark.parametrize("argv", WRITERS, ids=" ".join)
async def test_a_tool_that_writes_to_the_log_never_creates_the_stream(elsewhere: Settings, argv: list[str]) -> None:
    """A database that has never seen a log, a server without the stream: as a reader is answered."""
    done = chronicle_cli(elsewhere, *argv)
    assert done.returncode == UNREACHABLE_EXIT, done.stderr
    assert one_line(done).startswith(f"chronicle {argv[0]}: no stream {elsewhere.stream} on {elsewhere.nats_url}: ")
    assert await streams_of(elsewhere) == []


async def test_the_services_still_create_the_stream(elsewhere: Settings) -> None:
    """(They set the stack up: what ``chronicle up`` and compose.yaml start opens the stack so.)"""
    async with open_container(elsewhere):
        pass
    assert await streams_of(elsewhere) == [elsewhere.layout().stream, elsewhere.layout().work_stream]


@pytest.fixture
async def foreign(nats_url: str, pg_admin: str, tmp_path: Path) -> AsyncIterator[tuple[Settings, Settings]]:
    """The settings of a stack whose database has been used (bound to its log, on the run's
    server), and the same settings pointed at another nats-server that never held that log (one
    that happens to run at the default CHRONICLE_NATS_URL)."""
    with scratch_database(pg_admin) as db:
        stack = make_settings(nats_url, db)
        async with open_container(stack) as c:
            await c.commands.append("tenant-a", "s1", text_message("m1", "kept"), OMITTED)
        access = NatsAccess((nkey_public_key(OPERATOR_SEED),), SubjectLayout())
        with nats_server(tmp_path, access) as other:
            yield stack, stack.model_copy(update={"nats_url": other})


def absent_line(argv: list[str], settings: Settings) -> str:
    """What a command says pointed at a NATS server without its database's log."""
    return (
        f"chronicle {argv[0]}: the NATS server at {settings.nats_url} does not hold the log this database's read "
        f"models were built from (no stream {settings.stream!r} here; the read models in database "
    )


@pytest.mark.parametrize(
    "argv", [*WRITERS, ["replay", "--session", "s1", "--tenant", "tenant-a"], ["verify"], ["log", "show"]], ids=" ".join
)
async def test_a_tool_pointed_at_a_server_without_the_databases_log_refuses_and_creates_nothing(
    foreign: tuple[Settings, Settings], argv: list[str]
) -> None:
    """(``skills put`` made the streams there, then refused: another log, `chronicle rebuild` or
    `chronicle log rebind --yes`, the wrong fix.) The database says which log it was built from."""
    stack, elsewhere = foreign
    done = chronicle_cli(elsewhere, *argv)
    assert done.returncode == SETTINGS_EXIT, done.stderr
    line = one_line(done)
    assert line.startswith(absent_line(argv, elsewhere)), line
    assert f"were made from stream {stack.stream!r} created " in line
    assert line.endswith(
        ": set CHRONICLE_NATS_URL (and CHRONICLE_NATS_NKEY_SEED) to the stack's (`make up` listens on 4250; a "
        "command run with `chronicle up`'s CHRONICLE_DATA_DIR finds them there; see README)"
    )
    assert "rebuild" not in line
    assert "rebind" not in line
    assert await streams_of(elsewhere) == []


async def test_skills_put_on_the_stacks_server_records_the_skill(
    foreign: tuple[Settings, Settings], s3_endpoint: str, tmp_path: Path
) -> None:
    stack = foreign[0].model_copy(update={"s3_endpoint": s3_endpoint})
    bucket = f"sk-{uuid.uuid4().hex[:12]}"
    s3 = Minio(s3_endpoint, "testing", "testing", secure=False, region="us-east-1")
    s3.make_bucket(bucket)
    doc = tmp_path / "x.md"
    doc.write_text("# X\nhow to x", encoding="utf-8")
    async with running_stack(stack) as c:  # its projector: `skills put` waits until the index has it
        argv = ["skills", "put", str(doc), "--bucket", bucket, "--key", "skills/x"]
        done = await asyncio.to_thread(chronicle_cli, stack, *argv)
        assert done.returncode == 0, done.stderr
        async with c.pool.connection() as conn:
            cur = await conn.execute("SELECT tenant, key FROM skills_index WHERE bucket = %s", (bucket,))
            assert await cur.fetchall() == [("default", "skills/x")]
    said = f"stored {bucket}/tenants/default/skills/x ({len(doc.read_bytes())} bytes); recorded at sequence "
    assert done.stdout.startswith(said), done.stdout
    assert s3.stat_object(bucket, "tenants/default/skills/x").size == len(doc.read_bytes())
    nc = await operator_nats(stack.nats_url)
    try:
        assert (await nc.jetstream().stream_info(stack.stream)).state.last_seq == int(done.stdout[len(said) :])
    finally:
        await nc.close()


async def test_skills_put_of_a_file_that_is_not_utf8_is_one_line_and_stores_nothing(
    foreign: tuple[Settings, Settings], s3_endpoint: str, tmp_path: Path
) -> None:
    stack = foreign[0].model_copy(update={"s3_endpoint": s3_endpoint})
    bucket = f"sk-{uuid.uuid4().hex[:12]}"
    s3 = Minio(s3_endpoint, "testing", "testing", secure=False, region="us-east-1")
    s3.make_bucket(bucket)
    doc = tmp_path / "bin.md"
    doc.write_bytes(b"\xff\xfe\x00binary")
    async with running_stack(stack):
        argv = ["skills", "put", str(doc), "--bucket", bucket, "--key", "skills/bin"]
        done = await asyncio.to_thread(chronicle_cli, stack, *argv)
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip() == f"chronicle skills put: {doc} is not UTF-8 text (byte 0)"
    assert list(s3.list_objects(bucket, recursive=True)) == []


@pytest.mark.parametrize("case", ["missing", "directory", "originals", "claim-check", "archive", "sync-archive"])
async def test_skills_put_or_sync_refused_is_one_line_and_stores_nothing(
    foreign: tuple[Settings, Settings], s3_endpoint: str, tmp_path: Path, case: str
) -> None:
    """A file that is not there or a directory (tracebacks), one of Chronicle's own buckets (it
    was written into: a session config's skills block refuses them)."""
    stack = foreign[0].model_copy(update={"s3_endpoint": s3_endpoint})
    own = {
        "originals": stack.originals_bucket,
        "claim-check": stack.claim_check_bucket,
        "archive": stack.archive_bucket,
        "sync-archive": stack.archive_bucket,
    }
    bucket = own.get(case, f"sk-{uuid.uuid4().hex[:12]}")
    s3 = Minio(s3_endpoint, "testing", "testing", secure=False, region="us-east-1")
    doc = tmp_path / ("nosuch.md" if case == "missing" else "x.md")
    if case == "directory":
        doc.mkdir()
    elif case != "missing":
        doc.write_text("# X\nhow to x", encoding="utf-8")
    key = f"skills/{uuid.uuid4().hex[:8]}"
    command = ["sync"] if case == "sync-archive" else ["put", str(doc), "--key", key]
    done = await asyncio.to_thread(chronicle_cli, stack, "skills", *command, "--bucket", bucket)
    assert done.returncode == 2, (done.stdout, done.stderr)
    said = {
        "missing": f"{doc}: No such file or directory",
        "directory": f"{doc}: Is a directory",
    }.get(case, f"bucket {bucket!r} is reserved for Chronicle's own data")
    assert one_line(done) == f"chronicle skills {command[0]}: {said}"
    assert done.stdout == ""
    if s3.bucket_exists(bucket):
        assert [o.object_name for o in s3.list_objects(bucket, recursive=True) if key in str(o.object_name)] == []


async def test_skills_sync_of_a_bucket_that_does_not_exist_is_one_line(
    foreign: tuple[Settings, Settings], s3_endpoint: str
) -> None:
    """(It said "indexed 0, removed 0, unchanged 0" and exited 0.)"""
    stack = foreign[0].model_copy(update={"s3_endpoint": s3_endpoint})
    bucket = f"nonexist-{uuid.uuid4().hex[:8]}"
    done = await asyncio.to_thread(chronicle_cli, stack, "skills", "sync", "--bucket", bucket)
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert one_line(done) == f"chronicle skills sync: bucket {bucket!r} does not exist: nothing to index"
    assert done.stdout == ""
    assert not Minio(s3_endpoint, "testing", "testing", secure=False, region="us-east-1").bucket_exists(bucket)


async def test_skills_put_into_a_bucket_that_does_not_exist_is_one_line_and_makes_none(
    foreign: tuple[Settings, Settings], s3_endpoint: str, tmp_path: Path
) -> None:
    """(It made the bucket, where ``sync`` and a session config's skills block refuse a missing one.)"""
    stack = foreign[0].model_copy(update={"s3_endpoint": s3_endpoint})
    bucket = f"nonexist-{uuid.uuid4().hex[:8]}"
    doc = tmp_path / "x.md"
    doc.write_text("# X\nhow to x", encoding="utf-8")
    argv = ["skills", "put", str(doc), "--bucket", bucket, "--key", "skills/x"]
    done = await asyncio.to_thread(chronicle_cli, stack, *argv)
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert one_line(done) == (
        f"chronicle skills put: bucket {bucket!r} does not exist: create it first, or pass --create-bucket"
    )
    assert done.stdout == ""
    assert not Minio(s3_endpoint, "testing", "testing", secure=False, region="us-east-1").bucket_exists(bucket)


@pytest.mark.parametrize("case", ["missing", "not-utf8", "unsafe-key"])
async def test_skills_put_with_create_bucket_refused_makes_no_bucket(
    foreign: tuple[Settings, Settings], s3_endpoint: str, tmp_path: Path, case: str
) -> None:
    """``--create-bucket`` makes the bucket only after every other check passed: a put refused
    for its file or its key leaves none behind."""
    stack = foreign[0].model_copy(update={"s3_endpoint": s3_endpoint})
    bucket = f"nonexist-{uuid.uuid4().hex[:8]}"
    doc = tmp_path / ("nosuch.md" if case == "missing" else "x.md")
    if case == "not-utf8":
        doc.write_bytes(b"\xff\xfe\x00binary")
    elif case == "unsafe-key":
        doc.write_text("# X\nhow to x", encoding="utf-8")
    key = "skills/../x" if case == "unsafe-key" else "skills/x"
    argv = ["skills", "put", str(doc), "--bucket", bucket, "--key", key, "--create-bucket"]
    done = await asyncio.to_thread(chronicle_cli, stack, *argv)
    assert done.returncode == 2, (done.stdout, done.stderr)
    said = {
        "missing": f"chronicle skills put: {doc}: No such file or directory",
        "not-utf8": f"chronicle skills put: {doc} is not UTF-8 text (byte 0)",
        "unsafe-key": f"chronicle skills: key {key!r} is not a safe object key: it has an empty, '.' or '..' segment",
    }[case]
    assert one_line(done).startswith(said), done.stderr
    assert done.stdout == ""
    assert not Minio(s3_endpoint, "testing", "testing", secure=False, region="us-east-1").bucket_exists(bucket)


async def test_skills_put_whose_projector_never_applies_it_is_one_line(
    foreign: tuple[Settings, Settings], s3_endpoint: str, tmp_path: Path
) -> None:
    """No projector running: the put is recorded and its wait for the index times out, said in one
    line with a hint (it was a ProjectionTimeout traceback)."""
    stack = foreign[0].model_copy(update={"s3_endpoint": s3_endpoint, "read_wait_timeout_s": 0.5})
    bucket = f"sk-{uuid.uuid4().hex[:12]}"
    Minio(s3_endpoint, "testing", "testing", secure=False, region="us-east-1").make_bucket(bucket)
    doc = tmp_path / "x.md"
    doc.write_text("# X\nhow to x", encoding="utf-8")
    async with running_stack(stack, projector=False):  # the stream exists; nothing applies it
        argv = ["skills", "put", str(doc), "--bucket", bucket, "--key", "skills/x"]
        done = await asyncio.to_thread(chronicle_cli, stack, *argv)
    assert done.returncode == UNREACHABLE_EXIT, done.stderr
    [line] = done.stderr.splitlines()
    assert line.startswith("chronicle skills: the read model has not applied "), line
    assert line.endswith("(projection_timeout) (is a projector running? `chronicle up` runs one)"), line


async def test_an_empty_stream_on_another_server_is_not_answered_with_rebuild_or_rebind(
    foreign: tuple[Settings, Settings], pg_admin: str
) -> None:
    """The streams an earlier release's ``skills put`` made on the wrong server: another log (its
    creation time), but an empty one, so the fix is the server, not the read models."""
    _, elsewhere = foreign
    with scratch_database(pg_admin) as other_db:
        async with open_container(elsewhere.model_copy(update={"database_url": other_db})):
            pass  # (a service of another deployment made them)
    made = await streams_of(elsewhere)
    done = chronicle_cli(elsewhere, *WRITERS[0])
    assert done.returncode == LOG_MISMATCH_EXIT, done.stderr
    line = one_line(done)
    assert line.startswith("chronicle skills: refusing to start: the read models in database "), line
    assert "The stream holds no events, so this NATS server is most likely not the stack's: set " in line
    assert "CHRONICLE_NATS_URL (and CHRONICLE_NATS_NKEY_SEED)" in line
    assert "log rebind" not in line
    assert await streams_of(elsewhere) == made


@pytest.fixture
async def sealed_session(nats_url: str, pg_admin: str) -> AsyncIterator[tuple[Settings, str, int]]:
    """A sealing stack's settings with one session written (its id, its last sequence)."""
    with scratch_database(pg_admin) as db:
        settings = make_settings(nats_url, db, encryption=True, kek=TEST_KEK)
        sid = f"sealed-{uuid.uuid4().hex[:8]}"
        async with open_container(settings) as c:
            seq = (await c.commands.append("tenant-a", sid, text_message("m1", "sealed words"), OMITTED)).seq
        yield settings, sid, seq


@pytest.mark.parametrize("argv", [["replay"], ["history", "--as-of-seq"]], ids=" ".join)
async def test_reading_sealed_events_without_the_kek_says_to_set_it(
    sealed_session: tuple[Settings, str, int], argv: list[str]
) -> None:
    """(A history of now reads the read models, which need no key: it is not refused.)"""
    settings, sid, seq = sealed_session
    without = settings.model_copy(update={"kek": None, "kek_file": None, "encryption": False})
    args = [*argv, str(seq)] if argv[-1] == "--as-of-seq" else argv
    done = chronicle_cli(without, *args, "--tenant", "tenant-a", "--session", sid)
    assert done.returncode == SETTINGS_EXIT, (done.stdout, done.stderr)
    line = one_line(done)
    assert line.startswith(f"chronicle {argv[0]}: ")
    assert "CHRONICLE_KEK_FILE" in line
    assert "sealed" in line


async def test_the_history_of_now_needs_no_kek_on_a_sealing_stack(sealed_session: tuple[Settings, str, int]) -> None:
    """It reads the read models' plaintext (it exited 2: CHRONICLE_ENCRYPTION on, no key set);
    the history as of a sequence opens sealed events, and still says what to set."""
    settings, sid, seq = sealed_session
    async with running_stack(settings) as c:  # its projector applies the session
        await c.waiter.wait_until(lambda: c.waiter.session_applied("tenant-a", sid, seq), "the append")
    without = settings.model_copy(update={"kek": None, "kek_file": None})
    assert without.encryption
    done = chronicle_cli(without, "history", "--tenant", "tenant-a", "--session", sid)
    assert done.returncode == 0, done.stderr
    assert "sealed words" in done.stdout
    done = chronicle_cli(without, "history", "--tenant", "tenant-a", "--session", sid, "--as-of-seq", str(seq))
    assert done.returncode == SETTINGS_EXIT, done.stderr
    assert "no key-encryption key is set (CHRONICLE_KEK or CHRONICLE_KEK_FILE)" in one_line(done)


async def test_a_kek_file_that_is_not_there_is_named(sealed_session: tuple[Settings, str, int]) -> None:
    settings, sid, _ = sealed_session
    missing = settings.model_copy(update={"kek": None, "kek_file": "/nonexistent/kek"})
    done = chronicle_cli(missing, "history", "--tenant", "tenant-a", "--session", sid)
    assert done.returncode == SETTINGS_EXIT, done.stderr
    assert one_line(done) == (
        "chronicle history: CHRONICLE_KEK_FILE '/nonexistent/kek' cannot be read (No such file or directory): set it "
        "to the stack's key-encryption key file (`make up`'s is .chronicle/kek)"
    )


async def test_a_kek_that_is_not_one_is_named(sealed_session: tuple[Settings, str, int]) -> None:
    settings, sid, _ = sealed_session
    done = chronicle_cli(settings.model_copy(update={"kek": SecretStr("garbage")}), "replay", "--session", sid)
    assert done.returncode == SETTINGS_EXIT, done.stderr
    assert one_line(done).startswith("chronicle replay: CHRONICLE_KEK is not a key-encryption key: ")


async def test_a_seed_that_is_not_an_nkey_seed_is_named(elsewhere: Settings) -> None:
    done = chronicle_cli(elsewhere.model_copy(update={"nats_nkey_seed": SecretStr("garbage")}), "verify")
    assert done.returncode == SETTINGS_EXIT, done.stderr
    line = one_line(done)
    assert line.startswith("chronicle verify: CHRONICLE_NATS_NKEY_SEED is not an NKey seed")
    assert "chronicle keygen --operator" in line
    assert await streams_of(elsewhere) == []


async def test_a_nats_server_that_is_not_there_exits_4_in_seconds(elsewhere: Settings) -> None:
    """(It tried forever, logging a ConnectionRefusedError every 0.5 s.)"""
    nowhere = elsewhere.model_copy(update={"nats_url": "nats://127.0.0.1:1"})
    done = chronicle_cli(nowhere, "replay", "--tenant", "a", "--session", "s", "--to-seq", "3", timeout=60)
    assert done.returncode == UNREACHABLE_EXIT, done.stderr
    assert one_line(done).startswith(
        "chronicle replay: NATS at nats://127.0.0.1:1: no server answered in 10 tries each: ConnectionRefusedError"
    )


@pytest.fixture
def tenant_server(tmp_path: Path, pg_admin: str, s3_endpoint: str) -> Iterator[Settings]:
    """Settings for a NATS server that admits the tenants too, with tenant-a's seed for Chronicle's."""
    with tenant_nats_settings(tmp_path, pg_admin, s3_endpoint) as settings:
        assert chronicle_cli(settings, "migrate").returncode == 0
        yield settings.model_copy(update={"nats_nkey_seed": SecretStr(tenant_nkey_seed(KEYS["tenant-a"]))})


async def test_an_identity_denied_the_jetstream_api_exits_4_at_once(tenant_server: Settings) -> None:
    """(A tenant's seed in CHRONICLE_NATS_NKEY_SEED: the tool logged the permissions violation every
    5 s while it waited for JetStream.)"""
    done = chronicle_cli(tenant_server, "replay", "--tenant", "tenant-a", "--session", "s", timeout=60)
    assert done.returncode == UNREACHABLE_EXIT, done.stderr
    line = one_line(done)
    prefix = f"chronicle replay: NATS at {tenant_server.nats_url}: nats: permissions violation for publish to "
    assert line.lower().startswith(prefix.lower() + '"$js.api.stream.info.'), line
    assert "this identity may not use the JetStream API" in line
    assert "needs Chronicle's operator identity: CHRONICLE_NATS_NKEY_SEED" in line


DATABASE_USERS = [["quarantine", "list"], ["migrate"], ["replay", "--session", "demo"], ["verify"]]
"""Commands that open the database (all of them through one error handling in ``cli.main``)."""


@pytest.mark.parametrize("argv", DATABASE_USERS, ids=" ".join)
@pytest.mark.parametrize("where", ["unreachable", "missing"])
async def test_a_database_that_cannot_be_used_is_one_line_naming_the_setting(
    elsewhere: Settings, pg_admin: str, argv: list[str], where: str
) -> None:
    """(It was a psycopg traceback, exit 1.)"""
    server = pg_admin.rsplit("/", 1)[0]
    url = "postgresql://postgres@127.0.0.1:1/x" if where == "unreachable" else f"{server}/nosuch_{uuid.uuid4().hex[:8]}"
    done = chronicle_cli(elsewhere.model_copy(update={"database_url": url}), *argv, timeout=60)
    assert done.returncode == UNREACHABLE_EXIT, done.stderr
    line = one_line(done)
    assert line.startswith(f"chronicle {argv[0]}: the database of CHRONICLE_DATABASE_URL ("), line
    assert ("Connection refused" if where == "unreachable" else "does not exist") in line


STARTS: dict[str, tuple[dict[str, object], int]] = {
    "database-unreachable": ({"database_url": "postgresql://postgres@127.0.0.1:1/x"}, UNREACHABLE_EXIT),
    "database-missing": ({"database_url": "nosuch"}, UNREACHABLE_EXIT),
    "nats-unreachable": ({"nats_url": "nats://127.0.0.1:1"}, UNREACHABLE_EXIT),
    "kek-file-missing": ({"kek": None, "kek_file": "/nope/kek"}, SETTINGS_EXIT),
    "seed-malformed": ({"nats_nkey_seed": SecretStr("SUAXXXX")}, SETTINGS_EXIT),
    "seed-not-admitted": ({"nats_nkey_seed": SecretStr(tenant_nkey_seed("a key no server admits"))}, UNREACHABLE_EXIT),
    "replicas-unclustered": ({"stream_replicas": 3}, SETTINGS_EXIT),
}
"""What keeps a service from starting, and its exit status (README: 2 a setting, 4 NATS or the
database unreachable or refusing)."""

START_LINES = {
    "database-unreachable": "the database of CHRONICLE_DATABASE_URL (127.0.0.1:1/x) cannot be used: ",
    "database-missing": "the database of CHRONICLE_DATABASE_URL (",
    "nats-unreachable": "NATS at nats://127.0.0.1:1: no server answered in 10 tries each: ConnectionRefusedError",
    "kek-file-missing": "CHRONICLE_KEK_FILE '/nope/kek' cannot be read (No such file or directory)",
    "seed-malformed": "CHRONICLE_NATS_NKEY_SEED is not an NKey seed",
    "seed-not-admitted": "NATS at ",
    "replicas-unclustered": "stream ",
}


@pytest.mark.parametrize("process", ["api", "projector"])
@pytest.mark.parametrize("case", list(STARTS))
async def test_a_service_that_cannot_start_says_why_in_one_line(
    elsewhere: Settings, pg_admin: str, process: str, case: str
) -> None:
    """(The API dumped uvicorn's lifespan traceback and exited 3, the status of another log's read
    models; a replica count the servers cannot hold was a traceback, exit 1, in every process.)"""
    update, status = STARTS[case]
    if case == "database-missing":
        update = {"database_url": f"{pg_admin.rsplit('/', 1)[0]}/nosuch_{uuid.uuid4().hex[:8]}"}
    settings = elsewhere.model_copy(update={**update, "api_port": free_port()})
    done = chronicle_cli(settings, process, timeout=90)
    assert done.returncode == status, done.stderr
    line = one_line(done)
    assert line.startswith(f"chronicle {process}: {START_LINES[case]}"), line
    if case == "replicas-unclustered":
        assert "3 replicas need a NATS cluster" in line
        assert "set CHRONICLE_STREAM_REPLICAS=1" in line
    if case == "seed-not-admitted":
        assert "nats: authorization failed: the server does not admit this identity" in line
        assert "CHRONICLE_NATS_NKEY_SEED" in line


@pytest.mark.parametrize("process", ["api", "projector", "compactor"])
async def test_a_database_migrated_by_a_newer_release_is_refused_in_one_line(elsewhere: Settings, process: str) -> None:
    """(During a rolling upgrade a process of the earlier release kept writing under the new schema.)"""
    assert chronicle_cli(elsewhere, "migrate", timeout=90).returncode == 0
    with psycopg.connect(elsewhere.database_url, autocommit=True) as conn:
        conn.execute("INSERT INTO schema_migrations (version, name) VALUES (999, '999_from_the_future.sql')")
    done = chronicle_cli(elsewhere.model_copy(update={"api_port": free_port()}), process, timeout=90)
    assert done.returncode == LOG_MISMATCH_EXIT, done.stderr
    line = one_line(done)
    assert line.startswith(f"chronicle {process}: refusing to start: the database was migrated to version 999 "), line
    assert f"this one knows up to {max(v for v, _, _ in migration_files())}" in line


async def test_migrate_of_a_database_migrated_by_a_newer_release_is_refused_in_one_line(elsewhere: Settings) -> None:
    """(An older release's `chronicle migrate`, run during a downgrade, said "applied: nothing (up
    to date)" and exited 0.)"""
    known = max(v for v, _, _ in migration_files())
    assert chronicle_cli(elsewhere, "migrate", timeout=90).returncode == 0
    with psycopg.connect(elsewhere.database_url, autocommit=True) as conn:
        conn.execute("INSERT INTO schema_migrations (version, name) VALUES (%s, '0xx_future.sql')", (known + 1,))
        before = conn.execute("SELECT version FROM schema_migrations ORDER BY version").fetchall()
    done = chronicle_cli(elsewhere, "migrate", timeout=90)
    assert done.returncode == LOG_MISMATCH_EXIT, done.stderr
    line = one_line(done)
    assert line.startswith(f"chronicle migrate: refusing to start: the database was migrated to version {known + 1} ")
    assert f"this one knows up to {known}" in line
    assert "up to date" not in done.stdout
    with psycopg.connect(elsewhere.database_url, autocommit=True) as conn:
        assert conn.execute("SELECT version FROM schema_migrations ORDER BY version").fetchall() == before


def beside(settings: Settings, data_dir: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """``chronicle <args>`` with ``settings`` but for the NATS address and identity, which it has
    to find in ``data_dir`` (what ``chronicle up`` recorded there), and ``env`` on top."""
    full = settings.as_env(os.environ)
    for name in ("CHRONICLE_NATS_URL", "CHRONICLE_NATS_NKEY_SEED"):
        full.pop(name)
    full |= {"CHRONICLE_DATA_DIR": str(data_dir), **env}
    return subprocess.run(
        [sys.executable, "-m", "services.ops.cli", *args], env=full, capture_output=True, text=True, timeout=120
    )


async def test_a_tool_run_with_the_stacks_data_dir_reaches_its_nats(
    foreign: tuple[Settings, Settings], tmp_path: Path
) -> None:
    """(With CHRONICLE_DATABASE_URL and CHRONICLE_DATA_DIR alone, a tool went to the default
    CHRONICLE_NATS_URL, another server.) An explicit CHRONICLE_NATS_URL still wins."""
    stack, elsewhere = foreign
    data = tmp_path / "stack-data"
    data.mkdir()
    (data / "nats-operator.nk").write_text(OPERATOR_SEED + "\n")
    LocalStack(stack.nats_url, str(data / "nats-operator.nk")).write(data)
    done = beside(stack, data, "log", "show")
    assert done.returncode == 0, done.stderr
    assert f"bound to: stream {stack.stream!r} created " in done.stdout
    assert f"stream:   {stack.stream!r} created " in done.stdout
    # another server: the stack's identity does not go with it
    explicit = beside(stack, data, "log", "show", CHRONICLE_NATS_URL=elsewhere.nats_url)
    assert explicit.returncode == UNREACHABLE_EXIT, explicit.stderr
    assert one_line(explicit).startswith(f"chronicle log: NATS at {elsewhere.nats_url}: nats: authorization failed")
    explicit = beside(
        stack, data, "log", "show", CHRONICLE_NATS_URL=elsewhere.nats_url, CHRONICLE_NATS_NKEY_SEED=OPERATOR_SEED
    )
    assert explicit.returncode == SETTINGS_EXIT, explicit.stderr
    assert one_line(explicit).startswith(absent_line(["log"], elsewhere))


async def test_a_stack_record_that_is_not_one_is_one_line(foreign: tuple[Settings, Settings], tmp_path: Path) -> None:
    (tmp_path / STACK_RECORD).write_text("{")
    done = beside(foreign[0], tmp_path, "log", "show")
    assert done.returncode == SETTINGS_EXIT, done.stderr
    assert one_line(done) == (
        f"chronicle log: {tmp_path / STACK_RECORD} is not `chronicle up`'s record of its stack (JSON with its "
        "nats_url): remove it (the next `chronicle up` writes it again) or set CHRONICLE_NATS_URL"
    )


async def test_a_recorded_stack_that_is_not_running_is_named(elsewhere: Settings, tmp_path: Path) -> None:
    LocalStack("nats://127.0.0.1:1").write(tmp_path)
    done = beside(elsewhere, tmp_path, "log", "show")
    assert done.returncode == UNREACHABLE_EXIT, done.stderr
    line = one_line(done)
    assert line.startswith("chronicle log: NATS at nats://127.0.0.1:1: no server answered in 10 tries each: "), line
    assert line.endswith(
        f" (the address `chronicle up` recorded in {tmp_path / STACK_RECORD}: is that stack running? Set "
        "CHRONICLE_NATS_URL for another)"
    )


@pytest.mark.parametrize("argv", [["archive"], ["archive", "--check"], ["archive", "--restore"]], ids=" ".join)
async def test_object_storage_that_is_not_there_is_one_line_naming_the_endpoint(
    sealed_session: tuple[Settings, str, int], argv: list[str]
) -> None:
    """urllib3's retry warnings and its long message were three lines, the endpoint in none."""
    settings, _, _ = sealed_session
    done = chronicle_cli(settings.model_copy(update={"s3_endpoint": "127.0.0.1:1"}), *argv)
    assert done.returncode == 2, (done.stdout, done.stderr)
    line = one_line(done)
    assert line.startswith("chronicle archive: object storage at CHRONICLE_S3_ENDPOINT (127.0.0.1:1) "), line
    assert len(line) < 250, line


async def test_another_tool_meeting_object_storage_that_is_not_there_exits_4_in_one_line(
    sealed_session: tuple[Settings, str, int],
) -> None:
    settings, _, _ = sealed_session
    gone = settings.model_copy(update={"s3_endpoint": "127.0.0.1:1"})
    done = chronicle_cli(gone, "skills", "sync", "--tenant", "tenant-a", "--bucket", "skills")
    assert done.returncode == UNREACHABLE_EXIT, (done.stdout, done.stderr)
    assert one_line(done) == (
        "chronicle skills: object storage at CHRONICLE_S3_ENDPOINT (127.0.0.1:1) cannot be used: "
        "Failed to establish a new connection: [Errno 111] Connection refused"
    )


@pytest.mark.parametrize("broken", ["bad-line", "absent", "empty"])
def test_a_broken_keys_file_stops_the_commands_that_use_keys_and_not_one_that_uses_none(
    elsewhere: Settings, tmp_path: Path, broken: str
) -> None:
    """``CHRONICLE_API_KEYS_FILE`` is read by what uses the tenant keys (the API, nats-config, up,
    erase) and by nothing else: an operator's typo there stopped every process at its next start,
    and a restarted projector crash-looped on a file it never uses. ``migrate`` starts and does its
    work; the API, nats-config, erase and up, given the same settings, each refuse in one line
    naming the file (and the line), exit 2."""
    keys = tmp_path / "api-keys"
    if broken == "bad-line":
        keys.write_text(f"# tenants\n{api_key_entry('acme', 'chr_ok')}\nacme:chr_live_SECRETPART\n")
    elif broken == "empty":
        keys.write_text("")
    settings = elsewhere.model_copy(update={"api_keys_file": str(keys), "api_port": free_port()})
    migrated = chronicle_cli(settings, "migrate", timeout=90)
    assert migrated.returncode == 0, migrated.stderr
    assert str(keys) not in migrated.stderr
    for argv in key_users(tmp_path):
        refused = chronicle_cli(settings, *argv, timeout=90)
        assert refused.returncode == SETTINGS_EXIT, (argv, refused.stderr)
        line = one_line(refused)
        assert line.startswith(f"chronicle {argv[0]}: setting CHRONICLE_API_KEYS_FILE: {keys}"), line
        assert "SECRETPART" not in refused.stderr
        if broken == "bad-line":
            assert f"{keys} line 3: an entry of tenant 'acme' is not" in line
    assert not (tmp_path / "nats.conf").exists()  # nats-config refused before it wrote anything


def key_users(tmp: Path) -> list[list[str]]:
    """The commands that use the tenant keys, each as it would run (each refuses before it does anything)."""
    return [["api"], ["nats-config", "--out", str(tmp / "nats.conf")], ["erase", "--tenant", "acme"], ["up"]]
