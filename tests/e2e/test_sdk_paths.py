"""Both append paths (HTTP API and direct JetStream publish) give identical histories for one script."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from chronicle_sdk import (
    AppendResult,
    ChronicleClient,
    InvalidId,
    InvalidRequest,
    Session,
    SessionManager,
    Unauthorized,
    Via,
)
from events.credentials import nkey_public_key, tenant_nkey_seed
from services.settings import Settings
from tests.conftest import operator_nats
from tests.e2e.sdk_support import VIAS, client_for, ids, sid, text
from tests.integration.helpers import logged_message


class CountingTransport(httpx.AsyncHTTPTransport):
    """Records ``(method, path)`` of every request the SDK sends."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[str, str]] = []

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        self.calls.append((request.method, request.url.path))
        return await super().handle_async_request(request)


BIG = "x" * (300 * 1024)  # over the 256 KiB payload limit: claim check


def tool_message(mid: str) -> dict[str, Any]:
    return {
        "id": mid,
        "role": "assistant",
        "parts": [
            {"type": "step-start"},
            {
                "type": "tool-set_context",
                "toolCallId": "call_1",
                "state": "output-available",
                "input": {"label": "memory", "content": "caf\u00e9 \u2603"},
                "output": "Written to memory. Usage: 3 tokens",
            },
            {"type": "text", "text": "Done \U0001f600"},
        ],
        "metadata": {"nested": {"list": [1, 2.5, None, True]}},
    }


async def run_script(s: Session, manager: SessionManager, via: Via) -> list[tuple[str, str | None, bool]]:
    results: list[AppendResult] = []
    results.append(await s.append_message(text("m1", "hello"), via=via))
    results.append(await s.append_message(text("m2", "hi there", "assistant"), via=via))
    results.append(await s.append_message(text("m3", "other branch", "assistant"), "m1", via=via))
    results.append(await s.append_message(text("m4", "follow-up"), via=via))
    results.append(await s.append_message(text("m1", "hello"), via=via))  # idempotent repeat
    results.append(await s.append_message(text("r1", "a new root"), None, via=via))
    results += await s.append_all([text("c1", "chain 1"), text("c2", "chain 2"), text("c3", "chain 3")], "m2", via=via)
    last = await manager.append_all(s.id, [text("d1", "root chain"), text("d2", "root chain 2")], via=via)
    assert last == "d2"
    results.append(await s.append_message(tool_message("t1"), "d2", via=via))
    results.append(await s.append_message(text("big", BIG), via=via))
    return [(r.id, r.parent_id, r.created) for r in results]


async def snapshot(s: Session) -> dict[str, Any]:
    """Everything a reader can see of the tree: each message's path and children, plus the log's facts."""
    logged = [e["event"] for e in await s.get_events() if e["event"]["type"] in ("message.appended", "session.created")]
    events = [
        {**e, **logged_message(e).model_dump(mode="json")} if e["type"] == "message.appended" else e for e in logged
    ]
    all_ids = [e["message_id"] for e in events if e["type"] == "message.appended"]
    return {
        "latest": await s.get_history(),
        "paths": {mid: await s.get_history(mid) for mid in all_ids},
        "children": {mid: [m["id"] for m in await s.get_branches(mid)] for mid in all_ids},
        "events": [
            (e["type"], e.get("message_id"), e.get("parent_id"), e.get("role"), e.get("body_sha256")) for e in events
        ],
        "big_is_referenced": any(e.get("message_id") == "big" and e.get("message_ref") for e in events),
        "leaf": await s.get_latest_leaf(),
        "length": await s.get_path_length(),
    }


async def test_http_nats_and_jetstream_give_identical_histories(api_url: str, api_settings: Settings) -> None:
    snapshots: dict[str, dict[str, Any]] = {}
    answers: dict[str, list[tuple[str, str | None, bool]]] = {}
    posts: dict[str, int] = {}
    batches: dict[str, int] = {}
    for via in ("http", "nats", "jetstream"):
        transport = CountingTransport()
        async with client_for(api_url, api_settings, transport=transport) as c:
            s = Session.create(c, sid(f"paths-{via}"))
            answers[via] = await run_script(s, SessionManager(c), via)
            snapshots[via] = await snapshot(s)
        posts[via] = sum(1 for m, p in transport.calls if m == "POST" and p.endswith("/messages"))
        batches[via] = sum(1 for m, p in transport.calls if m == "POST" and p.endswith("/messages:batch"))
    assert answers["http"] == answers["nats"] == answers["jetstream"]
    assert answers["http"][4] == ("m1", None, False)
    assert snapshots["http"] == snapshots["nats"] == snapshots["jetstream"]
    assert snapshots["http"]["big_is_referenced"]
    assert snapshots["http"]["latest"][-1]["parts"][0]["text"] == BIG
    assert [m["id"] for m in snapshots["http"]["paths"]["c3"]] == ["m1", "m2", "c1", "c2", "c3"]
    assert [m["id"] for m in snapshots["http"]["paths"]["d2"]] == ["d1", "d2"]
    assert snapshots["http"]["paths"]["t1"][-1] == tool_message("t1")
    # over NATS nothing went over HTTP: single appends are commands the server decides (the claim-
    # checked body too: the server writes the object store), chains are commands ("nats") or
    # published straight to the stream ("jetstream"); HTTP chains are one messages:batch each
    assert posts == {"http": 8, "nats": 0, "jetstream": 0}
    assert batches == {"http": 2, "nats": 0, "jetstream": 0}


async def test_direct_append_needs_nats_settings(api_url: str) -> None:
    from tests.conftest import KEYS

    async with ChronicleClient(api_url, KEYS["tenant-a"]) as c:
        s = Session.create(c, sid())
        with pytest.raises(ValueError, match="nats_url"):
            await s.append_message(text("m1", "x"), via="jetstream")


async def test_the_direct_path_writes_as_the_keys_tenant(api_url: str, api_settings: Settings) -> None:
    """tenant-b's key publishes on tenant-b's subjects, even for a session id tenant-a also has."""
    shared = sid("tenants")
    async with client_for(api_url, api_settings, tenant="tenant-a") as a:
        sa = Session.create(a, shared)
        await sa.append_message(text("a1", "tenant a's own"))
        history_a = await sa.get_history()
        events_a = await sa.get_events()
    async with client_for(api_url, api_settings, tenant="tenant-b", via="jetstream") as b:
        assert b.tenant is None  # only the server says which tenant a key is
        sb = Session.create(b, shared)
        first = await sb.append_message(text("b1", "tenant b's own"))
        chain = await sb.append_all([text("b2", "second"), text("b3", "third")], "b1")
        assert b.tenant == "tenant-b"
        assert (await b.nats_publishing()).tenant == "tenant-b"
        assert ids(await sb.get_history()) == ["b1", "b2", "b3"]
    nc = await operator_nats(api_settings.nats_url)
    try:
        js, layout = nc.jetstream(), api_settings.layout()
        newest_b = await js.get_last_msg(layout.stream, layout.session_subject("tenant-b", shared))
        assert newest_b.seq == chain[-1].seq > first.seq
        assert json.loads(newest_b.data or b"")["tenant"] == "tenant-b"
        newest_a = await js.get_last_msg(layout.stream, layout.session_subject("tenant-a", shared))
        assert newest_a.seq == events_a[-1]["seq"]
    finally:
        await nc.close()
    async with client_for(api_url, api_settings, tenant="tenant-a") as a:
        sa = Session.create(a, shared)
        assert await sa.get_history() == history_a
        assert await sa.get_events() == events_a


async def test_a_chain_with_a_claim_checked_body_goes_through_the_api(api_url: str, api_settings: Settings) -> None:
    transport = CountingTransport()
    async with client_for(api_url, api_settings, via="jetstream", transport=transport) as c:
        s = Session.create(c, sid("bigchain"))
        await s.append_message(text("m1", "small"))  # published directly
        chain = [text("c1", "before"), text("c2", BIG), text("c3", "after")]
        results = await s.append_all(chain, "m1")
        assert [(r.id, r.parent_id, r.created) for r in results] == [
            ("c1", "m1", True),
            ("c2", "c1", True),
            ("c3", "c2", True),
        ]
        history = await s.get_history()
        assert ids(history) == ["m1", "c1", "c2", "c3"]
        assert history[2]["parts"][0]["text"] == BIG
        appended = [
            logged_message(e["event"]) for e in await s.get_events() if e["event"]["type"] == "message.appended"
        ]
        assert [e.message_id for e in appended] == ["m1", "c1", "c2", "c3"]
        assert appended[2].message_ref
        assert appended[2].message is None
        again = await s.append_all(chain, "m1")  # a re-run appends nothing twice
        assert [(r.id, r.created) for r in again] == [("c1", False), ("c2", False), ("c3", False)]
        assert len([e for e in await s.get_events() if e["event"]["type"] == "message.appended"]) == 4
    posts = [p for m, p in transport.calls if m == "POST"]
    assert posts == [f"/v1/sessions/{s.id}/messages:batch"] * 2


async def test_the_contract_refuses_the_same_on_both_paths(api_url: str, api_settings: Settings) -> None:
    bad = {"id": "m1", "role": "user", "parts": [{"type": "text", "text": "a\u0000b"}]}
    async with client_for(api_url, api_settings) as c:
        for via in VIAS:
            s = Session.create(c, sid(f"nul-{via}"))
            with pytest.raises(InvalidRequest) as err:
                await s.append_message(bad, via=via)
            assert (type(err.value), err.value.status, err.value.code) == (InvalidRequest, 422, "invalid_request")
            assert await s.get_events() == []


async def test_a_wrong_api_key_is_a_clear_error_on_the_direct_path(api_url: str, api_settings: Settings) -> None:
    async with ChronicleClient(api_url, "not-a-key", nats_url=api_settings.nats_url, retries=0) as c:
        with pytest.raises(Unauthorized, match="API key") as err:
            await c.append(sid(), text("m1", "x"), via="jetstream")
        assert err.value.status == 401
        assert c.tenant is None


async def test_nats_refusing_the_credentials_is_a_clear_error(api_url: str, api_settings: Settings) -> None:
    """An API that knows the key but a NATS server that does not (not configured, rotated): the
    error names the NATS server and the credentials, and comes at once (no reconnect loop)."""
    async with client_for(api_url, api_settings) as real:
        publishing = await real.request("GET", "/v1/nats")

    def answer(request: httpx.Request) -> httpx.Response:
        assert request.url.path == "/v1/nats"
        return httpx.Response(200, json=publishing)

    unknown = "key-unknown-to-nats"
    public = nkey_public_key(tenant_nkey_seed(unknown))
    transport = httpx.MockTransport(answer)
    async with ChronicleClient(api_url, unknown, nats_url=api_settings.nats_url, transport=transport) as c:
        started = time.monotonic()
        with pytest.raises(Unauthorized) as err:
            await c.append(sid(), text("m1", "x"), via="jetstream")
        assert time.monotonic() - started < 5
    assert err.value.code == "nats_unauthorized"
    assert api_settings.nats_url in err.value.detail
    assert public in err.value.detail
    assert "Authorization Violation" in err.value.detail


async def test_a_creds_file_is_used_instead_of_the_derived_key(
    api_url: str, api_settings: Settings, tmp_path: Path
) -> None:
    """``nats_credentials``: the user of a .creds file (here one this server does not trust, as it
    has no JWT accounts); refused, the error names the file."""
    creds = tmp_path / "bad.creds"
    creds.write_text(
        "-----BEGIN NATS USER JWT-----\neyJ0eXAiOiJKV1QiLCJhbGciOiJlZDI1NTE5LW5rZXkifQ.e30.c2ln\n"
        "------END NATS USER JWT------\n\n"
        f"-----BEGIN USER NKEY SEED-----\n{tenant_nkey_seed('key-unknown-to-nats')}\n"
        "------END USER NKEY SEED------\n"
    )
    async with client_for(api_url, api_settings, nats_credentials=str(creds)) as c:
        with pytest.raises(Unauthorized) as err:
            await c.append(sid(), text("m1", "x"), via="jetstream")
    assert err.value.code == "nats_unauthorized"
    assert str(creds) in err.value.detail
    async with client_for(api_url, api_settings, nats_credentials=str(tmp_path / "missing.creds")) as c:
        with pytest.raises(ValueError, match=r"missing\.creds"):
            await c.append(sid(), text("m1", "x"), via="jetstream")


@pytest.mark.parametrize("via", VIAS)
@pytest.mark.parametrize(("unnamed", "why"), [(".", "names no message"), ("..", "names no message"), ("a/b", "'/'")])
async def test_a_message_id_no_url_can_name_is_refused_on_every_path_and_nothing_is_written(
    api_url: str, api_settings: Settings, via: Via, unnamed: str, why: str
) -> None:
    transport = CountingTransport()
    async with client_for(api_url, api_settings, via=via, transport=transport) as c:
        s = Session.create(c, sid("unnamed"))
        await s.append_message(text("m1", "kept"))
        sent = len(transport.calls)
        with pytest.raises(InvalidId, match=why):
            await s.append_message(text(unnamed, "unreachable"), via=via)
        with pytest.raises(InvalidId, match=why):  # a chain: straight to JetStream with via
            await c.append_chain(s.id, [text("m2", "before it"), text(unnamed, "unreachable")], "m1", via=via)
        assert len(transport.calls) == sent  # refused before any HTTP request (the unit tests count commands)
        assert [m["id"] for m in await s.get_history()] == ["m1"]


async def test_a_jetstream_chain_answers_created_only_for_messages_new_to_the_session(
    api_url: str, api_settings: Settings
) -> None:
    """As over HTTP: a replay (the same chain again, or a stored id under another parent) answers
    ``created=False``; only the messages the chain adds answer True."""
    answers: dict[str, list[list[tuple[str, bool]]]] = {}
    for via in ("http", "jetstream"):
        async with client_for(api_url, api_settings, via=via) as c:
            s = Session.create(c, sid(f"created-{via}"))
            calls = [
                await s.append_all([text("a", "one"), text("b", "two")]),
                await s.append_all([text("a", "one"), text("b", "two"), text("c", "three")]),  # a and b again
                await s.append_all([text("a", "one")], "c"),  # a stored id under another parent
            ]
            answers[via] = [[(r.id, r.created) for r in call] for call in calls]
            assert ids(await s.get_history()) == ["a", "b", "c"]
    assert (
        answers["jetstream"]
        == answers["http"]
        == [
            [("a", True), ("b", True)],
            [("a", False), ("b", False), ("c", True)],
            [("a", False)],
        ]
    )


async def test_a_jetstream_chain_reads_which_ids_are_stored_once_whatever_its_conflicts(
    api_url: str, api_settings: Settings
) -> None:
    """Into a session that has events, the chain asks once for all its ids (``messages:exists``),
    never one read a message, and not again when another writer's append makes its first
    publish conflict."""

    class Interposing(CountingTransport):
        async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
            if request.url.path.endswith("/messages:exists") and not any(p.endswith(":exists") for _, p in self.calls):
                await other.append(s.id, text("z", "another writer's"))  # the session moves on: a conflict
            return await super().handle_async_request(request)

    transport = Interposing()
    async with (
        client_for(api_url, api_settings, via="jetstream", transport=transport) as c,
        client_for(api_url, api_settings) as other,
    ):
        s = Session.create(c, sid("exists-once"))
        await s.append_all([text("a", "one"), text("b", "two")])
        transport.calls.clear()
        chain = [text("c", "three"), text("a", "one"), text("b", "two"), text("d", "four")]  # new events all
        results = await s.append_all(chain, "b")
        assert [(r.id, r.created) for r in results] == [("c", True), ("a", False), ("b", False), ("d", True)]
        tails = [(m, p.rsplit("/", 1)[-1]) for m, p in transport.calls]
        assert tails.count(("POST", "messages:exists")) == 1
        assert tails.count(("GET", "last-seq")) == 2  # two attempts: the first conflicted
        reads = [p.rsplit("/messages/", 1)[-1] for _, p in transport.calls if "/messages/" in p]
        assert reads == ["b", "b"]  # of one message: only the parent's, an attempt each
        assert ids(await s.get_history("c")) == ["a", "b", "c"]
        assert ids(await s.get_history("z")) == ["a", "b", "z"]
