"""Erasure, proved: a canary written into a session by every path is, after ``:erase``, nowhere
(JetStream's files on disk, any Postgres table, the S3 bucket, a rebuild, the events API, the CLI
replay), while another session's text stays everywhere it was. A stack of its own (API and
projector processes, a nats-server whose store directory the test reads), encryption on."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
from minio import Minio

from bench.support import settings_env
from services.ops.localstack import free_port, wait_for_port
from services.ops.natsconf import NatsAccess
from services.settings import Settings
from tests.conftest import KEYS, make_settings
from tests.e2e.context_support import configure, tool
from tests.e2e.helpers import msg
from tests.support import chronicle_cli, nats_server, scratch_database


@pytest.fixture(scope="module")
def sealed(
    tmp_path_factory: pytest.TempPathFactory, pg_admin: str, s3_endpoint: str
) -> Iterator[tuple[Settings, Path]]:
    """Settings of a sealing stack and its nats-server's store directory."""
    tmp = tmp_path_factory.mktemp("erase-nats")
    with scratch_database(pg_admin) as db:
        port = free_port()
        settings = make_settings(
            f"nats://127.0.0.1:{port}",
            db,
            s3_endpoint=s3_endpoint,
            encryption=True,
            payload_limit_bytes=2048,
            row_cap_bytes=10_000,
            originals_bucket=f"orig-{uuid.uuid4().hex[:8]}",
        )
        with nats_server(tmp, NatsAccess.of(settings), port=port):
            yield settings, tmp / "nats"


cli = chronicle_cli


@pytest.fixture(scope="module")
async def client(sealed: tuple[Settings, Path]) -> AsyncIterator[httpx.AsyncClient]:
    """tenant-a's client of the sealing stack's API. The machine is shared: a port picked free may
    be taken before the API binds it, so the API is asked who it is (our key must be known)."""
    settings, _ = sealed
    assert cli(settings, "migrate").returncode == 0
    procs = [subprocess.Popen([sys.executable, "-m", "services.ops.cli", "projector"], env=settings_env(settings))]
    headers = {"Authorization": f"Bearer {KEYS['tenant-a']}"}
    try:
        for _ in range(3):
            mine = settings.model_copy(update={"api_port": free_port()})
            api = subprocess.Popen([sys.executable, "-m", "services.ops.cli", "api"], env=settings_env(mine))
            procs.append(api)
            wait_for_port("127.0.0.1", mine.api_port, api, "chronicle api", timeout=30)
            c = httpx.AsyncClient(base_url=f"http://127.0.0.1:{mine.api_port}", headers=headers, timeout=30)
            if api.poll() is None and (await c.get("/v1/nats")).status_code == 200:
                break
            await c.aclose()
            api.terminate()
        else:
            pytest.fail("the API never answered as this stack's")
        try:
            yield c
        finally:
            await c.aclose()
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait(timeout=20)


CONFIG: dict[str, Any] = {
    "blocks": [
        {"kind": "writable", "label": "memory", "description": "Facts"},
        {"kind": "searchable", "label": "knowledge", "description": "Docs"},
    ],
    "compaction": {"protect_head": 1, "tail_token_budget": 10, "min_tail_messages": 2},
}


async def ok(r: httpx.Response, status: int = 200) -> dict[str, Any]:
    assert r.status_code == status, r.text
    out: dict[str, Any] = r.json()
    return out


async def write_by_every_path(c: httpx.AsyncClient, sid: str, canary: str) -> int:
    """The canary in: append, update, context write, searchable entry, rendered prompt, summary,
    a claim-checked body, an over-cap original, an end reason. Returns the last sequence."""
    await configure(c, sid, CONFIG)
    await ok(await c.post(f"/v1/sessions/{sid}/messages", json={"message": msg("m0", f"hello {canary}")}), 201)
    await ok(await c.post(f"/v1/sessions/{sid}/messages", json={"message": msg("m1", "first draft")}), 201)
    await ok(await c.put(f"/v1/sessions/{sid}/messages/m1", json={"message": msg("m1", f"edited {canary}")}))
    await ok(await c.put(f"/v1/sessions/{sid}/context/memory", json={"content": f"remember {canary}"}))
    res, _ = await tool(c, sid, "set_context", {"label": "knowledge", "content": f"fact {canary}"})
    assert res.startswith("Indexed"), res
    prompt = await ok(await c.get(f"/v1/sessions/{sid}/system-prompt"))
    assert canary in prompt["prompt"]
    claim = msg("m2", f"{canary} " + "claim-checked words " * 200)  # over the 2 KB payload limit
    await ok(await c.post(f"/v1/sessions/{sid}/messages", json={"message": claim}), 201)
    capped = msg("m3", f"{canary} " + "over the row cap " * 1000)  # over the 10 KB row cap
    await ok(await c.post(f"/v1/sessions/{sid}/messages", json={"message": capped}), 201)
    for i in range(4, 9):
        await ok(
            await c.post(f"/v1/sessions/{sid}/messages", json={"message": msg(f"m{i}", f"turn {i} {canary}")}), 201
        )
    compacted = await ok(await c.post(f"/v1/sessions/{sid}/compact", json={}))
    assert compacted["compacted"] is True, compacted
    assert canary in compacted["overlay"]["summary"]
    ended = await ok(await c.post(f"/v1/sessions/{sid}:end", json={"reason": f"closed over {canary}"}))
    return int(ended["seq"])


def files_holding(root: Path, needle: bytes) -> list[str]:
    return [str(p) for p in root.rglob("*") if p.is_file() and needle in p.read_bytes()]


def tables_holding(db: str, needle: str) -> list[str]:
    """Every table of every schema (read models, quarantine, keys, checkpoints) whose rows' text holds ``needle``."""
    found = []
    with psycopg.connect(db, autocommit=True) as conn:
        tables = conn.execute(
            "SELECT table_schema, table_name FROM information_schema.tables WHERE table_type = 'BASE TABLE' "
            "AND table_schema NOT IN ('pg_catalog', 'information_schema')"
        ).fetchall()
        for schema, table in tables:
            row = conn.execute(
                f'SELECT count(*) FROM "{schema}"."{table}" t WHERE strpos(t::text, %s) > 0', (needle,)
            ).fetchone()
            if row and row[0]:
                found.append(f"{schema}.{table}")
    return found


def s3(settings: Settings) -> Minio:
    return Minio(settings.s3_endpoint, "testing", "testing", secure=False, region="us-east-1")


def objects_holding(settings: Settings, needle: bytes) -> tuple[list[str], int]:
    """The S3 objects (every bucket) whose bytes hold ``needle``, and how many objects were read."""
    store = s3(settings)
    found, read = [], 0
    for bucket in store.list_buckets():
        for obj in store.list_objects(bucket.name, recursive=True):
            assert obj.object_name is not None
            resp = store.get_object(bucket.name, obj.object_name)
            try:
                data = resp.read()
            finally:
                resp.close()
                resp.release_conn()
            read += 1
            if needle in data:
                found.append(f"{bucket.name}/{obj.object_name}")
    return found, read


async def event_lines(c: httpx.AsyncClient, sid: str) -> list[dict[str, Any]]:
    r = await c.get(f"/v1/sessions/{sid}/events")
    assert r.status_code == 200, r.text
    return [json.loads(line) for line in r.text.splitlines()]


async def test_a_canary_written_by_every_path_is_nowhere_after_erasure(
    client: httpx.AsyncClient, sealed: tuple[Settings, Path]
) -> None:
    settings, store = sealed
    canary, keeper = f"canary{uuid.uuid4().hex}", f"keeper{uuid.uuid4().hex}"
    sid, other = f"erase-{uuid.uuid4().hex[:8]}", f"keep-{uuid.uuid4().hex[:8]}"
    await write_by_every_path(client, other, keeper)
    last = await write_by_every_path(client, sid, canary)
    before = await event_lines(client, sid)
    assert any(canary in json.dumps(line) for line in before)  # the tenant reads its own events opened
    assert tables_holding(settings.database_url, canary)  # materialised before: the checks below can fail
    assert not files_holding(store, canary.encode()), "plaintext reached JetStream's files"
    assert files_holding(store, sid.encode())  # the readable envelope is on disk: the search sees the log

    erased = await ok(await client.post(f"/v1/sessions/{sid}:erase"))
    assert erased["erased"] is True
    assert erased["seq"] > last
    assert erased["objects_deleted"] >= 2  # the claim-checked body and the original

    assert not files_holding(store, canary.encode())
    assert tables_holding(settings.database_url, canary) == []
    found, read = objects_holding(settings, canary.encode())
    assert found == []
    assert read > 0
    lines = await event_lines(client, sid)
    assert len(lines) == len(before) + 1
    assert all("erased" in line for line in lines[:-1])
    assert lines[-1]["event"]["type"] == "session.erased"
    assert canary not in json.dumps(lines)
    replay = cli(settings, "replay", "--tenant", "tenant-a", "--session", sid)
    assert replay.returncode == 0, replay.stderr
    assert canary not in replay.stdout
    replayed = [json.loads(line) for line in replay.stdout.splitlines()]
    assert [r["seq"] for r in replayed if "erased" in r] == [line["seq"] for line in before]
    gone = await client.get(f"/v1/sessions/{sid}/history")
    assert (gone.status_code, gone.json()["code"]) == (410, "session_erased"), gone.text

    verify = cli(settings, "verify")
    assert verify.returncode == 0, verify.stdout + verify.stderr
    rebuild = cli(settings, "rebuild")
    assert rebuild.returncode == 0, rebuild.stdout + rebuild.stderr
    assert tables_holding(settings.database_url, canary) == []

    # the other session is untouched: its text is materialised, searchable, readable
    assert tables_holding(settings.database_url, keeper)
    history = await ok(await client.get(f"/v1/sessions/{other}/history"))
    assert keeper in json.dumps(history)
    search = await ok(await client.get("/v1/search", params={"q": keeper}))
    assert search["results"], search
    assert any(keeper in json.dumps(line) for line in await event_lines(client, other))


async def test_an_erased_session_takes_no_writes_and_erasing_again_is_harmless(client: httpx.AsyncClient) -> None:
    sid = f"erase-{uuid.uuid4().hex[:8]}"
    await ok(await client.post(f"/v1/sessions/{sid}/messages", json={"message": msg("m0", "hello")}), 201)
    first = await ok(await client.post(f"/v1/sessions/{sid}:erase"))
    again = await ok(await client.post(f"/v1/sessions/{sid}:erase"))
    assert again["seq"] == first["seq"]  # the same session.erased event: stored once
    r = await client.post(f"/v1/sessions/{sid}/messages", json={"message": msg("m1", "after")})
    assert (r.status_code, r.json()["code"]) == (410, "session_erased"), r.text
    r = await client.post("/v1/sessions", json={"id": sid})
    assert (r.status_code, r.json()["code"]) == (410, "session_erased"), r.text


async def test_a_tenant_is_erased_with_every_session_and_other_tenants_keep_theirs(
    client: httpx.AsyncClient, sealed: tuple[Settings, Path], tmp_path: Path
) -> None:
    settings, _ = sealed
    word = f"tenantword{uuid.uuid4().hex}"
    headers = {"Authorization": f"Bearer {KEYS['tenant-b']}"}
    async with httpx.AsyncClient(base_url=str(client.base_url), headers=headers, timeout=30) as b:
        for i in range(2):
            await ok(await b.post(f"/v1/sessions/b-{i}-{word[-6:]}/messages", json={"message": msg("m0", word)}), 201)
        mine = f"a-{word[-6:]}"
        await ok(await client.post(f"/v1/sessions/{mine}/messages", json={"message": msg("m0", word)}), 201)
        doc = tmp_path / "skill.md"
        doc.write_text(f"# A skill\n{word}\n")
        bucket = f"skills-{uuid.uuid4().hex[:8]}"
        s3(settings).make_bucket(bucket)  # `skills put` makes none
        put = cli(
            settings, "skills", "put", str(doc), "--bucket", bucket, "--key", "skills/one", "--tenant", "tenant-b"
        )
        assert put.returncode == 0, put.stderr
        assert objects_holding(settings, word.encode())[0] == [f"{bucket}/tenants/tenant-b/skills/one"]
        erase = cli(settings, "erase", "--tenant", "tenant-b", "--yes")
        assert erase.returncode == 0, erase.stderr
        erased = [json.loads(line) for line in erase.stdout.splitlines()]
        assert {e["session"] for e in erased} >= {f"b-0-{word[-6:]}", f"b-1-{word[-6:]}", ""}
        # the tenant scope (its empty session id) is named as what it is
        assert "erased tenant-level entries of tenant 'tenant-b'" in erase.stderr
        assert "erased session ''" not in erase.stderr
        listed = await ok(await b.get("/v1/sessions"))
        assert listed["sessions"] == []
    assert objects_holding(settings, word.encode())[0] == []  # its skill document went too
    assert tables_holding(settings.database_url, word) != []  # tenant-a's copy
    history = await ok(await client.get(f"/v1/sessions/{mine}/history"))
    assert word in json.dumps(history)


async def test_the_sdk_direct_path_seals_with_the_key_chronicle_gives_its_tenant(
    client: httpx.AsyncClient, sealed: tuple[Settings, Path]
) -> None:
    """An agent service publishing straight to JetStream writes ciphertext too: its session's key
    comes from Chronicle (its own tenant's only), the projector opens it, erasure shreds it."""
    from chronicle_sdk import ChronicleClient
    from events import log as eventlog
    from tests.conftest import operator_nats

    settings, store = sealed
    canary, sid = f"direct{uuid.uuid4().hex}", f"direct-{uuid.uuid4().hex[:8]}"
    api = str(client.base_url)
    async with ChronicleClient(api, KEYS["tenant-a"], nats_url=settings.nats_url) as sdk:
        # a chain via JetStream is published by the SDK itself (single appends go as commands)
        await sdk.append_chain(sid, [msg("m1", f"direct {canary}"), msg("m2", "more")], None, via="jetstream")
        history = await sdk.session(sid).get_history()
    assert canary in json.dumps(history)
    nc = await operator_nats(settings.nats_url)
    try:
        stored = [
            e
            async for e in eventlog.read(
                nc.jetstream(), settings.layout(), settings.layout().session_subject("tenant-a", sid)
            )
        ]
    finally:
        await nc.close()
    assert stored
    assert all(canary.encode() not in e.data for e in stored)
    assert any(b'"sealed"' in e.data for e in stored)
    other = await client.get(f"/v1/sessions/{sid}/data-key")  # tenant-a's own session: its key
    assert other.status_code == 200
    headers = {"Authorization": f"Bearer {KEYS['tenant-b']}"}
    async with httpx.AsyncClient(base_url=api, headers=headers, timeout=30) as b:
        theirs = await ok(await b.get(f"/v1/sessions/{sid}/data-key"))  # tenant-b's session of that name
    assert theirs["key"] != other.json()["key"]
    await ok(await client.post(f"/v1/sessions/{sid}:erase"))
    assert not files_holding(store, canary.encode())
    assert tables_holding(settings.database_url, canary) == []
    gone = await client.get(f"/v1/sessions/{sid}/data-key")
    assert (gone.status_code, gone.json()["code"]) == (410, "session_erased")


async def tenant_erasures(db: str, tenant: str) -> list[str]:
    async with await psycopg.AsyncConnection.connect(db) as conn:
        cur = await conn.execute("SELECT session_id FROM erasures WHERE tenant = %s", (tenant,))
        return sorted(str(r[0]) for r in await cur.fetchall())


@pytest.mark.usefixtures("client")  # the stack running: its processes make the stream, its projector indexes
async def test_erasing_a_tenant_that_never_existed_burns_no_name(sealed: tuple[Settings, Path], tmp_path: Path) -> None:
    """(It printed an erasure and recorded it: the name was burnt, a later ``skills put`` died
    with a KeyDestroyed traceback.) A tenant with only a skill document is erased as before; an
    erased one's ``skills put`` is one line, and nothing is uploaded. The stack runs (no tool makes
    the stream, and ``skills put`` waits for the projector), whatever ran before."""
    settings, _ = sealed
    tenant = f"nobody-{uuid.uuid4().hex[:8]}"
    for argv in (["--yes"], []):
        done = cli(settings, "erase", "--tenant", tenant, *argv)
        assert done.returncode == 1, (done.stdout, done.stderr)
        assert done.stdout == ""
        assert done.stderr.strip().splitlines()[-1] == (
            f"chronicle erase: no tenant {tenant!r} (no session, data key, skill document or event): nothing erased"
        )
    assert await tenant_erasures(settings.database_url, tenant) == []
    word = f"nobodyword{uuid.uuid4().hex}"
    doc = tmp_path / "skill.md"
    doc.write_text(f"# A skill\n{word}\n")
    bucket = f"skills-{uuid.uuid4().hex[:8]}"
    s3(settings).make_bucket(bucket)  # `skills put` makes none
    put = ["skills", "put", str(doc), "--bucket", bucket, "--key", "skills/one", "--tenant", tenant]
    assert cli(settings, *put).returncode == 0  # the name is still free
    erased = cli(settings, "erase", "--tenant", tenant, "--yes")
    assert erased.returncode == 0, erased.stderr
    assert [json.loads(line)["session"] for line in erased.stdout.splitlines()] == [""]
    assert await tenant_erasures(settings.database_url, tenant) == [""]
    assert objects_holding(settings, word.encode())[0] == []
    again = cli(settings, *put)
    assert again.returncode == 2, (again.stdout, again.stderr)
    assert again.stderr.strip() == (f"chronicle skills put: tenant {tenant!r} is erased: it takes no skill documents")
    assert objects_holding(settings, word.encode())[0] == []  # refused before it was uploaded
    # a document put under its prefix by other means: `skills sync` refuses to index it, one line
    # (it died with a KeyDestroyed traceback)
    data = b"# Another skill\n"
    s3(settings).put_object(bucket, f"tenants/{tenant}/skills/two", io.BytesIO(data), len(data))
    synced = cli(settings, "skills", "sync", "--bucket", bucket, "--tenant", tenant)
    assert synced.returncode == 2, (synced.stdout, synced.stderr)
    assert synced.stderr.strip() == f"chronicle skills sync: tenant {tenant!r} is erased: it takes no skill documents"


def test_chronicle_erase_refuses_an_invalid_id_and_erases_nothing(sealed: tuple[Settings, Path]) -> None:
    settings, _ = sealed
    done = cli(settings, "erase", "--tenant", "tenant a")
    assert done.returncode == 2
    assert "tenant" in done.stderr


async def test_the_sdk_erases_a_session_and_then_hears_session_erased(client: httpx.AsyncClient) -> None:
    from chronicle_sdk import ChronicleClient, ChronicleError, SessionManager

    sid = f"sdk-erase-{uuid.uuid4().hex[:8]}"
    async with ChronicleClient(str(client.base_url), KEYS["tenant-a"]) as sdk:
        session = sdk.session(sid)
        await session.append_message(msg("m1", "to be forgotten"))
        seq = await SessionManager(sdk).erase(sid)
        assert seq > 0
        with pytest.raises(ChronicleError) as info:
            await session.append_message(msg("m2", "after"))
    assert (info.value.status, info.value.code) == (410, "session_erased")


def write_routes(sid: str) -> list[tuple[str, str, Any]]:
    """Every write route of the API, as (method, path, body), on a session holding ``m0`` with the
    ``memory`` block of :data:`CONFIG`."""
    s = f"/v1/sessions/{sid}"
    return [
        ("POST", f"{s}/messages", {"message": msg("w1", "after")}),
        ("POST", f"{s}/messages:batch", {"messages": [msg("w2", "after")]}),
        ("PUT", f"{s}/messages/m0", {"message": msg("m0", "edited after")}),
        ("DELETE", f"{s}/messages?ids=m0", None),
        ("POST", f"{s}/messages:delete", {"ids": ["m0"]}),
        ("POST", f"{s}/messages:clear", None),
        ("PATCH", s, {"name": "renamed"}),
        ("POST", f"{s}/usage", {"input_tokens": 1}),
        ("POST", f"{s}:end", {"reason": "done"}),
        ("POST", f"{s}/fork", {"at_message_id": "m0", "id": f"{sid}-fork"}),
        ("PUT", f"{s}/config", CONFIG),
        ("PUT", f"{s}/context/memory", {"content": "after"}),
        ("POST", f"{s}/tools/set_context", {"label": "memory", "content": "after"}),
        ("POST", f"{s}/system-prompt:refresh", None),
        ("POST", f"{s}/compact", {}),
        ("DELETE", s, None),
    ]


async def written_session(c: httpx.AsyncClient, prefix: str) -> str:
    sid = f"{prefix}-{uuid.uuid4().hex[:8]}"
    await configure(c, sid, CONFIG)
    await ok(await c.post(f"/v1/sessions/{sid}/messages", json={"message": msg("m0", "hello")}), 201)
    return sid


async def test_every_write_and_read_of_an_erased_session_is_410_and_writes_nothing(client: httpx.AsyncClient) -> None:
    sid = await written_session(client, "erased")
    await ok(await client.post(f"/v1/sessions/{sid}:erase"))
    before = await event_lines(client, sid)
    answers = {}
    for method, path, body in [*write_routes(sid), ("POST", "/v1/sessions", {"id": sid})]:
        r = await client.request(method, path, json=body)
        answers[f"{method} {path}"] = (r.status_code, r.json().get("code"))
    assert answers == dict.fromkeys(answers, (410, "session_erased"))
    assert await event_lines(client, sid) == before
    assert (await client.get(f"/v1/sessions/{sid}-fork")).status_code == 404  # no fork was made
    reads = ("", "/history", "/leaf", "/messages/m0", "/messages/m0/children", "/context", "/tools", "/system-prompt")
    for tail in reads:  # its reads say so as its writes do (they answered 404, as a session never written)
        r = await client.get(f"/v1/sessions/{sid}{tail}")
        assert (r.status_code, r.json()["code"], r.json()["detail"]) == (
            410,
            "session_erased",
            f"session {sid!r} was erased",
        )
    r = await client.post(f"/v1/sessions/{sid}/messages:exists", json={"ids": ["m0"]})
    assert (r.status_code, r.json()["code"]) == (410, "session_erased")
    r = await client.post("/v1/sessions", json={"id": f"{sid}-child", "parent_session_id": sid})
    assert (r.status_code, r.json()["code"]) == (410, "session_erased")  # a read of it, as a fork's source
    assert (await client.get(f"/v1/sessions/{sid}/events")).status_code == 200  # the log's tombstones


async def test_every_write_to_a_deleted_session_is_404_and_writes_nothing(client: httpx.AsyncClient) -> None:
    sid = await written_session(client, "deleted")
    await ok(await client.delete(f"/v1/sessions/{sid}"))
    before = await event_lines(client, sid)
    answers = {}
    for method, path, body in write_routes(sid):
        r = await client.request(method, path, json=body)
        answers[f"{method} {path}"] = (r.status_code, r.json().get("code"))
    assert answers == dict.fromkeys(answers, (404, "session_not_found"))
    r = await client.post("/v1/sessions", json={"id": sid})  # its id stays taken
    assert (r.status_code, r.json()["code"]) == (409, "session_exists")
    assert await event_lines(client, sid) == before
    assert (await client.get(f"/v1/sessions/{sid}-fork")).status_code == 404


async def erasure_recorded(db: str, sid: str) -> bool:
    async with await psycopg.AsyncConnection.connect(db) as conn:
        cur = await conn.execute("SELECT 1 FROM erasures WHERE session_id = %s", (sid,))
        return await cur.fetchone() is not None


async def test_erasing_a_session_that_does_not_exist_is_404_and_burns_no_id(
    client: httpx.AsyncClient, sealed: tuple[Settings, Path]
) -> None:
    settings, _ = sealed
    sid = f"nosuch-{uuid.uuid4().hex[:8]}"
    r = await client.post(f"/v1/sessions/{sid}:erase")
    assert (r.status_code, r.json()["code"]) == (404, "session_not_found"), r.text
    assert not await erasure_recorded(settings.database_url, sid)
    assert await event_lines(client, sid) == []
    await ok(await client.post("/v1/sessions", json={"id": sid}), 201)  # the id is still free


async def test_a_session_with_only_a_data_key_can_be_erased(client: httpx.AsyncClient) -> None:
    """An agent service asks for the key before publishing itself: the session exists for erasure."""
    sid = f"keyonly-{uuid.uuid4().hex[:8]}"
    await ok(await client.get(f"/v1/sessions/{sid}/data-key"))
    erased = await ok(await client.post(f"/v1/sessions/{sid}:erase"))
    assert erased["erased"] is True
    gone = await client.get(f"/v1/sessions/{sid}/data-key")
    assert (gone.status_code, gone.json()["code"]) == (410, "session_erased")


async def test_a_deleted_sessions_data_key_is_404(client: httpx.AsyncClient) -> None:
    """Nothing can be written to a deleted session: its key is not handed out (it was 200)."""
    sid = f"deleted-{uuid.uuid4().hex[:8]}"
    await ok(await client.post(f"/v1/sessions/{sid}/messages", json={"message": msg("m1", "hello")}), 201)
    assert (await client.get(f"/v1/sessions/{sid}/data-key")).status_code == 200  # a live one's
    deleted = await client.delete(f"/v1/sessions/{sid}")
    assert deleted.status_code == 200, deleted.text
    after = await client.get(f"/v1/sessions/{sid}", params={"min_seq": deleted.json()["seq"]})
    assert after.status_code == 404, after.text  # the deletion is applied
    gone = await client.get(f"/v1/sessions/{sid}/data-key")
    assert (gone.status_code, gone.json()["code"]) == (404, "session_not_found")


async def test_an_erasure_stopped_after_destroying_the_key_is_finished_by_running_it_again(
    client: httpx.AsyncClient, sealed: tuple[Settings, Path]
) -> None:
    settings, _ = sealed
    sid = f"halfway-{uuid.uuid4().hex[:8]}"
    await ok(await client.get(f"/v1/sessions/{sid}/data-key"))  # a key, no event yet
    # what the erasure does first, before its event; then it stopped
    async with await psycopg.AsyncConnection.connect(settings.database_url) as conn, conn.transaction():
        await conn.execute("DELETE FROM data_keys WHERE tenant = 'tenant-a' AND session_id = %s", (sid,))
        await conn.execute("INSERT INTO erasures (tenant, session_id) VALUES ('tenant-a', %s)", (sid,))
    assert await event_lines(client, sid) == []
    erased = await ok(await client.post(f"/v1/sessions/{sid}:erase"))
    assert erased["erased"] is True
    [tombstone] = await event_lines(client, sid)
    assert tombstone["seq"] == erased["seq"]


@pytest.mark.usefixtures("client")  # the stack running: its processes make the stream (no tool does)
async def test_chronicle_erase_of_a_session_that_does_not_exist_says_so_and_records_nothing(
    sealed: tuple[Settings, Path],
) -> None:
    settings, _ = sealed
    sid = f"nosuch-{uuid.uuid4().hex[:8]}"
    done = cli(settings, "erase", "--tenant", "tenant-a", "--session", sid)
    assert done.returncode == 1, done.stderr
    assert done.stdout == ""
    assert done.stderr.strip().splitlines() == [
        f"chronicle erase: no session {sid!r} of tenant 'tenant-a' (no event in the log, no data key): nothing erased"
    ]
    assert not await erasure_recorded(settings.database_url, sid)


async def test_chronicle_erase_of_a_whole_tenant_needs_yes(
    client: httpx.AsyncClient, sealed: tuple[Settings, Path]
) -> None:
    settings, _ = sealed
    headers = {"Authorization": f"Bearer {KEYS['tenant-b']}"}
    sid = f"kept-{uuid.uuid4().hex[:8]}"
    async with httpx.AsyncClient(base_url=str(client.base_url), headers=headers, timeout=30) as c:
        await ok(await c.post(f"/v1/sessions/{sid}/messages", json={"message": msg("m0", "kept")}), 201)
        done = cli(settings, "erase", "--tenant", "tenant-b")
        assert done.returncode == 1, done.stderr
        assert f"would erase: {sid!r}" in done.stdout.splitlines()
        assert done.stdout.splitlines()[-1].startswith("not erased: erasing tenant 'tenant-b' destroys every session")
        assert "--yes" in done.stdout
        assert not await erasure_recorded(settings.database_url, sid)
        history = await ok(await c.get(f"/v1/sessions/{sid}/history"))
    assert [m["id"] for m in history["messages"]] == ["m0"]
