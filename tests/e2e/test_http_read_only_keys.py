"""A read-only API key (an auditor's, `chronicle keygen --read-only`) over real HTTP against the
e2e stack: every read of its tenant answers, every write is 403 read_only_key with nothing
published, the data key and the NATS publishing route are refused, and it has no NATS identity."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from chronicle_sdk import ChronicleClient, ReadOnlyKey, Session
from events.credentials import nkey_public_key, tenant_nkey_seed
from services.ops.natsconf import NatsAccess
from services.settings import Settings
from tests.conftest import KEYS, READ_ONLY_KEY
from tests.e2e.helpers import append, assert_problem, chain, events, history_ids, msg, new_sid, stream_last_seq
from tests.support import nats_handshake


@pytest.fixture
async def reader(api_url: str) -> AsyncIterator[httpx.AsyncClient]:
    """tenant-a's read-only key."""
    headers = {"Authorization": f"Bearer {READ_ONLY_KEY}"}
    async with httpx.AsyncClient(base_url=api_url, headers=headers, timeout=30) as c:
        yield c


async def last_seq(client: httpx.AsyncClient, sid: str) -> int:
    r = await client.get(f"/v1/sessions/{sid}/last-seq")
    assert r.status_code == 200, r.text
    seq: int = r.json()["seq"]
    return seq


def writes(sid: str) -> list[tuple[str, str, Any]]:
    """One request of every write route family (method, path, a body a full key would send)."""
    base = f"/v1/sessions/{sid}"
    return [
        ("POST", "/v1/sessions", {"id": new_sid("ro-new")}),
        ("POST", f"{base}/messages", {"message": msg("ro-m", "written by a reader")}),
        ("POST", f"{base}/messages:batch", {"messages": [msg("ro-b", "batch")]}),
        ("PUT", f"{base}/messages/m1", {"message": msg("m1", "changed")}),
        ("DELETE", f"{base}/messages", None),
        ("POST", f"{base}/messages:delete", {"ids": ["m1"]}),
        ("POST", f"{base}/messages:clear", {}),
        ("PATCH", base, {"name": "renamed by a reader"}),
        ("PUT", f"{base}/config", {"blocks": []}),
        ("PUT", f"{base}/context/notes", {"text": "written by a reader"}),
        ("POST", f"{base}/tools/load_context", {"arguments": {}}),
        ("POST", f"{base}/tools/unload_context", {"label": "skills", "key": "k"}),
        ("POST", f"{base}/tools/set_context", {"label": "notes", "content": "written by a reader"}),
        ("POST", f"{base}/tools/session_search/", {"query": "text"}),  # not the tool's own route
        ("POST", f"{base}/system-prompt:refresh", {}),
        ("POST", f"{base}/compact", {}),
        ("POST", f"{base}:erase", {}),
        ("POST", f"{base}/usage", {"input_tokens": 1, "output_tokens": 1}),
        ("POST", f"{base}:end", {}),
        ("POST", f"{base}/fork", {"at_message_id": "m1", "id": new_sid("ro-fork")}),
        ("DELETE", base, None),
    ]


async def test_a_read_only_key_reads_history_events_and_the_audit_reads(
    client: httpx.AsyncClient, reader: httpx.AsyncClient
) -> None:
    sid = new_sid("ro-read")
    seq = await chain(client, sid, ["m1", "m2"])
    assert await history_ids(reader, sid, min_seq=seq) == ["m1", "m2"]
    assert [e["event"]["type"] for e in await events(reader, sid)] == ["message.appended"] * 2
    for path in (
        f"/v1/sessions/{sid}",
        f"/v1/sessions/{sid}/tree",
        f"/v1/sessions/{sid}/prompts",
        f"/v1/sessions/{sid}/compactions",
        f"/v1/sessions/{sid}/compaction-failures",
        f"/v1/sessions/{sid}/messages/m1",
        f"/v1/sessions/{sid}/context",
        f"/v1/sessions/{sid}/tools",
        f"/v1/sessions/{sid}/system-prompt?as_of_seq={seq}",
        f"/v1/sessions/{sid}/search?q=text",
        "/v1/sessions",
        "/v1/search?q=text",
        "/v1/quarantine",
        "/v1/erasures",
    ):
        r = await reader.get(path)
        assert r.status_code == 200, (path, r.text)
    assert (await reader.head(f"/v1/sessions/{sid}/history")).status_code == 200
    exists = await reader.post(f"/v1/sessions/{sid}/messages:exists", json={"ids": ["m2", "m9"]})
    assert exists.status_code == 200, exists.text  # a read, though a POST
    assert exists.json() == {"existing": ["m2"]}
    async with reader.stream("GET", f"/v1/sessions/{sid}/events", params={"follow": "true"}) as followed:
        assert followed.status_code == 200
        first = await anext(line async for line in followed.aiter_lines() if line.strip())
        assert json.loads(first)["event"]["type"] == "message.appended"


async def test_every_write_of_a_read_only_key_is_403_and_publishes_nothing(
    client: httpx.AsyncClient, reader: httpx.AsyncClient
) -> None:
    sid = new_sid("ro-write")
    seq = await chain(client, sid, ["m1", "m2"])
    stream_before = await stream_last_seq(client)
    for method, path, body in writes(sid):
        r = await reader.request(method, path, json=body)
        detail = assert_problem(r, 403, "read_only_key")["detail"]
        assert method in detail, detail
    assert await last_seq(reader, sid) == seq  # nothing published to the session
    assert await stream_last_seq(client) == stream_before  # nor anywhere (the new session, the fork)
    assert await history_ids(reader, sid, min_seq=seq) == ["m1", "m2"]


async def test_a_read_only_key_runs_the_search_tools_as_a_full_key_does(
    client: httpx.AsyncClient, reader: httpx.AsyncClient
) -> None:
    sid = new_sid("ro-tools")
    word = f"w{sid.replace('-', '')}"  # a word of this test's only: the session search is tenant-wide
    await append(client, sid, msg("m1", f"the {word} of the day"))
    knowledge = {"label": "knowledge", "kind": "searchable", "description": "facts"}
    config = {"blocks": [knowledge], "searchable_history": "past"}
    assert (await client.put(f"/v1/sessions/{sid}/config", json=config)).status_code == 200
    indexed = await client.post(
        f"/v1/sessions/{sid}/tools/set_context", json={"label": "knowledge", "content": "the deploy is on friday"}
    )
    assert indexed.status_code == 200, indexed.text
    seq = indexed.json()["seq"]
    await history_ids(reader, sid, min_seq=seq)  # the index has caught up
    for name, arguments in (
        ("session_search", {"query": word}),
        ("search_context", {"label": "knowledge", "query": "friday deploy"}),
    ):
        as_reader = await reader.post(f"/v1/sessions/{sid}/tools/{name}", json=arguments)
        assert as_reader.status_code == 200, (name, as_reader.text)
        as_writer = await client.post(f"/v1/sessions/{sid}/tools/{name}", json=arguments)
        assert as_reader.json() == as_writer.json()
        assert ("the deploy is on friday" if name == "search_context" else word) in as_reader.json()["result"]
    assert await last_seq(reader, sid) == seq  # the searches published nothing


async def test_a_read_only_key_gets_no_data_key_no_nats_route_and_freezes_no_prompt(
    client: httpx.AsyncClient, reader: httpx.AsyncClient
) -> None:
    sid = new_sid("ro-key")
    seq = await chain(client, sid, ["m1"])
    assert_problem(await reader.get(f"/v1/sessions/{sid}/data-key"), 403, "read_only_key")
    assert_problem(await reader.get(f"/v1/sessions/{sid}/data-key/"), 403, "read_only_key")
    assert_problem(await reader.get("/v1/nats"), 403, "read_only_key")
    assert (await reader.get("/v1/sessions/data-key")).status_code == 404  # a session named so is a plain read
    # the first read of the system prompt freezes it (publishes): not for a reader
    first = await reader.get(f"/v1/sessions/{sid}/system-prompt", params={"min_seq": seq})
    assert_problem(first, 403, "read_only_key")
    assert_problem(await reader.get(f"/v1/sessions/{new_sid('ro-none')}/system-prompt"), 404, "session_not_found")
    assert await last_seq(reader, sid) == seq
    frozen = await client.get(f"/v1/sessions/{sid}/system-prompt")
    assert frozen.status_code == 200, frozen.text
    again = await reader.get(f"/v1/sessions/{sid}/system-prompt", params={"min_seq": frozen.json()["seq"]})
    assert again.status_code == 200, again.text
    assert again.json() == frozen.json()


async def test_a_full_key_still_writes_beside_a_read_only_key(client: httpx.AsyncClient) -> None:
    sid = new_sid("ro-full")
    await append(client, sid, msg("m1", "a full key writes"))
    r = await client.post(f"/v1/sessions/{sid}/usage", json={"input_tokens": 1, "output_tokens": 2})
    assert r.status_code in (200, 201), r.text
    r = await client.get("/v1/nats")
    assert r.status_code == 200, r.text


async def test_a_read_only_key_has_no_nats_identity(api_settings: Settings) -> None:
    users = [u["nkey"] for u in NatsAccess.of(api_settings).users()]
    assert nkey_public_key(tenant_nkey_seed(READ_ONLY_KEY)) not in users
    assert nkey_public_key(tenant_nkey_seed(KEYS["tenant-a"])) in users
    url = api_settings.nats_servers()[0]
    assert await nats_handshake(url, tenant_nkey_seed(READ_ONLY_KEY)) == "-ERR 'Authorization Violation'"
    assert await nats_handshake(url, tenant_nkey_seed(KEYS["tenant-a"])) == "PONG"


async def test_the_sdk_reads_with_a_read_only_key_and_raises_read_only_key_on_a_write(
    api_url: str, client: httpx.AsyncClient
) -> None:
    sid = new_sid("ro-sdk")
    seq = await chain(client, sid, ["m1"])
    assert await history_ids(client, sid, min_seq=seq) == ["m1"]  # projected: a fresh client reads it
    async with ChronicleClient(api_url, READ_ONLY_KEY, retries=0) as sdk:
        session = Session.create(sdk, sid)
        assert [m["id"] for m in await session.get_history()] == ["m1"]
        with pytest.raises(ReadOnlyKey) as info:
            await session.append_message({"id": "m2", "role": "user", "content": "by a reader"})
        assert (info.value.status, info.value.code) == (403, "read_only_key")
    assert await last_seq(client, sid) == seq


async def test_whoami_names_the_tenant_to_a_read_only_key_too(
    reader: httpx.AsyncClient, client: httpx.AsyncClient, anon: httpx.AsyncClient
) -> None:
    """How a client (the auditor's view) learns whom it is signed in as: ``GET /v1/nats`` says
    the tenant too, but refuses read-only keys."""
    r = await reader.get("/v1/whoami")
    assert (r.status_code, r.json()) == (200, {"tenant": "tenant-a", "read_only": True}), r.text
    assert_problem(await reader.get("/v1/nats"), 403, "read_only_key")
    r = await client.get("/v1/whoami")
    assert (r.status_code, r.json()) == (200, {"tenant": "tenant-a", "read_only": False}), r.text
    assert_problem(await anon.get("/v1/whoami"), 401, "unauthorized")
