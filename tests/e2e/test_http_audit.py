"""The JSON reads behind the auditor's view (the whole tree, prompt versions, compaction failures,
quarantined events, context as of a sequence) and the page itself, over HTTP."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest

from chronicle_sdk import ChronicleClient
from events.catalog import CompactionFailed, SessionCreated, SkillUnloaded
from events.publisher import Publisher
from services.settings import Settings
from tests.conftest import KEYS, operator_nats, tenant_nats
from tests.e2e.helpers import PROBLEM, append, chain, msg, new_sid, stream_last_seq


async def _json(r: httpx.Response, status: int = 200) -> dict[str, Any]:
    assert r.status_code == status, r.text
    out: dict[str, Any] = r.json()
    return out


async def _problem(r: httpx.Response, status: int, code: str) -> None:
    assert (r.status_code, r.headers["content-type"], r.json()["code"]) == (status, PROBLEM, code), r.text


async def _publish_raw(settings: Settings, tenant: str, sid: str, data: bytes) -> int:
    nc = await operator_nats(settings.nats_url)
    try:
        ack = await nc.jetstream().publish(settings.layout().session_subject(tenant, sid), data, stream=settings.stream)
    finally:
        await nc.close()
    return int(ack.seq)


# -- the tree ------------------------------------------------------------------------------


async def test_each_event_line_says_when_the_stream_stored_it(client: httpx.AsyncClient) -> None:
    sid = new_sid()
    await append(client, sid, msg("m1", "hello"))
    await append(client, sid, msg("m2", "sealed or not, each line is JSON"))
    lines = [json.loads(line) for line in (await client.get(f"/v1/sessions/{sid}/events")).text.splitlines()]
    assert [line["event"]["type"] for line in lines] == ["message.appended", "message.appended"]
    stored = [datetime.fromisoformat(line["stored_at"]) for line in lines]
    assert stored == sorted(stored)
    assert abs(stored[-1] - datetime.now(UTC)) < timedelta(minutes=1)
    assert all(list(line)[:2] == ["seq", "stored_at"] for line in lines)


async def test_a_page_says_where_the_sessions_log_ended_when_it_was_read(client: httpx.AsyncClient) -> None:
    """``Chronicle-Last-Seq``: a page of exactly ``limit`` lines whose last is at that sequence is
    the end; one before it is not (an auditor tells a whole read from one that stopped early)."""
    sid = new_sid()
    for i in range(3):
        await append(client, sid, msg(f"m{i}", "x"))
    whole = await client.get(f"/v1/sessions/{sid}/events", params={"limit": 3})
    seqs = [json.loads(line)["seq"] for line in whole.text.splitlines()]
    assert whole.headers["chronicle-last-seq"] == str(seqs[-1])
    first = await client.get(f"/v1/sessions/{sid}/events", params={"limit": 2})
    assert [json.loads(line)["seq"] for line in first.text.splitlines()] == seqs[:2]
    assert first.headers["chronicle-last-seq"] == str(seqs[-1])  # more after this page
    empty = await client.get(f"/v1/sessions/{new_sid()}/events")
    assert (empty.status_code, empty.text, empty.headers["chronicle-last-seq"]) == (200, "", "0")


@pytest.mark.parametrize("follow", ["false", "true"])
async def test_events_to_seq_below_from_seq_is_refused_not_an_empty_page(
    client: httpx.AsyncClient, follow: str
) -> None:
    sid = new_sid()
    await append(client, sid, msg("m1", "x"))
    r = await client.get(f"/v1/sessions/{sid}/events", params={"from_seq": 5, "to_seq": 4, "follow": follow})
    await _problem(r, 422, "invalid_request")
    assert "to_seq (4) is below from_seq (5)" in r.json()["detail"]


def strict_json_only(constant: str) -> Any:
    raise AssertionError(f"{constant} is no JSON")


async def test_an_event_stored_over_several_lines_is_one_line_of_the_page_the_follow_and_the_sdk(
    client: httpx.AsyncClient, api_url: str, api_settings: Settings
) -> None:
    """JSON allows raw newlines (and carriage returns) between tokens, so a tenant publishing
    straight to the stream may lay an event out over lines; spliced into the NDJSON as stored it
    was several lines (one of them a record of the tenant's making): the page, a followed answer
    and the SDK broke, and a lenient reader saw a forged event. Each line break is now a space:
    one line, the same JSON value, every other byte as stored (parsed and written again, a number
    such as ``1e400`` came out ``Infinity``, which no strict JSON reader takes)."""
    sid = new_sid()
    forged = {"seq": 1, "stored_at": "2026-12-01T00:00:00Z", "event": {"type": "message.appended", "session": sid}}
    created = json.loads(SessionCreated(tenant="tenant-a", session=sid, name="n").to_json())
    del created["metadata"]
    big = ', "n": 1e400, "s": "sealed"'  # the word too: only a sealed event is written again
    data = (json.dumps(created)[:-1] + ', "metadata": {"a":\r\n' + json.dumps(forged) + big + "\n}}").encode()
    nc = await tenant_nats(api_settings.nats_url, "tenant-a")
    try:
        subject = api_settings.layout().session_subject("tenant-a", sid)
        seq = int((await nc.jetstream().publish(subject, data, stream=api_settings.stream)).seq)
    finally:
        await nc.close()

    page = (await client.get(f"/v1/sessions/{sid}/events")).text
    followed = (await client.get(f"/v1/sessions/{sid}/events", params={"follow": "true", "to_seq": seq})).text
    for body in (page, followed):
        [line] = [line for line in body.split("\n") if line.strip()]
        record = json.loads(line, parse_constant=strict_json_only)
        assert (record["seq"], record["event"]["type"]) == (seq, "session.created")
        assert record["event"]["metadata"] == {"a": forged, "n": float("inf"), "s": "sealed"}
        assert "\r" not in line
        assert big in line
    async with ChronicleClient(api_url, KEYS["tenant-a"]) as sdk:
        session = sdk.session(sid)
        assert [r["event"]["metadata"]["a"] for r in await session.get_events()] == [forged]
        assert [r["seq"] async for r in session.follow_events(to_seq=seq)] == [seq]


async def test_tree_answers_every_branch_a_page_at_a_time(client: httpx.AsyncClient) -> None:
    sid = new_sid()
    await chain(client, sid, ["a", "b", "c"])
    last = (await append(client, sid, msg("b2", "another answer", "assistant"), "a"))["seq"]
    nodes: list[dict[str, Any]] = []
    cursor = 0
    pages = 0
    while True:
        page = await _json(
            await client.get(f"/v1/sessions/{sid}/tree", params={"limit": 2, "cursor": cursor, "min_seq": last})
        )
        nodes += page["messages"]
        pages += 1
        assert page["leaf_id"] == "b2"
        if page["next_cursor"] is None:
            break
        cursor = page["next_cursor"]
    assert pages == 2  # 2 + 2: the last page is full and says so (it said another page, empty, followed)
    assert [(n["id"], n["parent_id"]) for n in nodes] == [("a", None), ("b", "a"), ("c", "b"), ("b2", "a")]
    assert [n["seq"] for n in nodes] == sorted(n["seq"] for n in nodes)
    assert nodes[3]["message"] == msg("b2", "another answer", "assistant")
    assert {(n["role"], n["capped"], tuple(n["unloaded"])) for n in nodes[:3]} == {("user", False, ())}


async def test_a_tree_of_exactly_one_default_page_says_it_is_the_last(client: httpx.AsyncClient) -> None:
    """1000 messages, the default ``limit``: one page, ``next_cursor`` null (it named a next
    page, which was empty)."""
    sid = new_sid()
    batch = [msg(f"m{i}", "x") for i in range(1000)]
    r = await client.post(f"/v1/sessions/{sid}/messages:batch", json={"messages": batch, "parent_id": None})
    assert r.status_code == 201, r.text
    page = await _json(await client.get(f"/v1/sessions/{sid}/tree", params={"min_seq": r.json()["seq"]}))
    assert len(page["messages"]) == 1000
    assert page["next_cursor"] is None


@pytest.mark.parametrize("route", ["tree", "messages/a/children"])
async def test_a_sequence_cursor_past_the_largest_is_refused_alike_however_long(
    client: httpx.AsyncClient, route: str
) -> None:
    """These cursors are any sequence (the page after it): past 2^63-1 the schema's maximum
    refuses them, 19 digits or 20 alike; the largest is a page (empty)."""
    sid = new_sid()
    seq = await chain(client, sid, ["a", "b"])
    for cursor in (str(2**63), "9" * 20, "9" * 100):
        await _problem(
            await client.get(f"/v1/sessions/{sid}/{route}", params={"cursor": cursor}), 422, "invalid_request"
        )
    page = await _json(await client.get(f"/v1/sessions/{sid}/{route}", params={"cursor": 2**63 - 1, "min_seq": seq}))
    assert (page["messages"], page["next_cursor"]) == ([], None)


async def test_tree_shows_an_unloaded_skill_output_as_its_marker(
    client: httpx.AsyncClient, api_settings: Settings
) -> None:
    sid = new_sid()
    part = {
        "type": "tool-load_context",
        "toolCallId": "c1",
        "input": {"key": "tax"},
        "output": "SECRET RULES",
        "state": "output-available",
    }
    await append(client, sid, {"id": "t1", "role": "assistant", "parts": [part]})
    nc = await operator_nats(api_settings.nats_url)
    try:
        pub = Publisher(nc.jetstream(), api_settings.layout())
        done = await pub.publish(
            SkillUnloaded(tenant="tenant-a", session=sid, label="skills", key="tax", message_id="t1", tool_call_id="c1")
        )
    finally:
        await nc.close()
    node = (await _json(await client.get(f"/v1/sessions/{sid}/tree", params={"min_seq": done.seq})))["messages"][0]
    assert node["unloaded"] == ["tax"]
    assert node["message"]["parts"][0]["output"] == "[skill unloaded: tax]"
    assert "SECRET RULES" in (await client.get(f"/v1/sessions/{sid}/events")).text  # the log keeps the original


@pytest.mark.parametrize("route", ["tree", "prompts", "compaction-failures"])
async def test_session_reads_of_unknown_or_foreign_sessions_are_404(
    route: str, client: httpx.AsyncClient, client_b: httpx.AsyncClient, anon: httpx.AsyncClient
) -> None:
    sid = new_sid()
    await _problem(await client.get(f"/v1/sessions/{sid}/{route}"), 404, "session_not_found")
    seq = (await append(client, sid, msg("m1", "hello")))["seq"]
    await _problem(await client_b.get(f"/v1/sessions/{sid}/{route}"), 404, "session_not_found")
    await _problem(await anon.get(f"/v1/sessions/{sid}/{route}"), 401, "unauthorized")
    await _problem(await client.get(f"/v1/sessions/%20{sid}/{route}"), 422, "invalid_id")
    r = await client.get(f"/v1/sessions/{sid}/{route}", params={"min_seq": seq})
    assert r.status_code == 200, r.text


@pytest.mark.parametrize("params", [{"limit": 0}, {"limit": 1001}, {"cursor": -1}, {"min_seq": "x"}])
async def test_tree_refuses_bad_paging(params: dict[str, Any], client: httpx.AsyncClient) -> None:
    sid = new_sid()
    await append(client, sid, msg("m1", "hello"))
    await _problem(await client.get(f"/v1/sessions/{sid}/tree", params=params), 422, "invalid_request")


# -- prompts, failures, context as of ------------------------------------------------------


async def test_prompts_lists_every_version_with_its_reason(client: httpx.AsyncClient) -> None:
    sid = new_sid()
    seq = (await append(client, sid, msg("m1", "hello")))["seq"]
    assert await _json(await client.get(f"/v1/sessions/{sid}/prompts", params={"min_seq": seq})) == {
        "prompts": [],
        "next_cursor": None,
    }
    config = {"blocks": [{"label": "memory", "kind": "writable", "max_tokens": 100}]}
    await _json(await client.put(f"/v1/sessions/{sid}/config", json=config))
    first = await _json(await client.get(f"/v1/sessions/{sid}/system-prompt"))
    await _json(await client.put(f"/v1/sessions/{sid}/context/memory", json={"content": "Fridays"}))
    second = await _json(await client.post(f"/v1/sessions/{sid}/system-prompt:refresh"))
    found = (await _json(await client.get(f"/v1/sessions/{sid}/prompts", params={"min_seq": second["seq"]})))["prompts"]
    assert [(p["version"], p["reason"], p["seq"], p["text"]) for p in found] == [
        (1, "freeze", first["seq"], first["prompt"]),
        (2, "refresh", second["seq"], second["prompt"]),
    ]
    assert "Fridays" in found[1]["text"]


async def test_compaction_failures_are_listed(client: httpx.AsyncClient, api_settings: Settings) -> None:
    sid = new_sid()
    seq = (await append(client, sid, msg("m1", "hello")))["seq"]
    assert await _json(await client.get(f"/v1/sessions/{sid}/compaction-failures", params={"min_seq": seq})) == {
        "failures": [],
        "next_cursor": None,
    }
    nc = await operator_nats(api_settings.nats_url)
    try:
        pub = Publisher(nc.jetstream(), api_settings.layout())
        failed = CompactionFailed(
            tenant="tenant-a", session=sid, leaf_id="m1", summarizer="openai-compatible", error="HTTP 503", attempt=2
        )
        done = await pub.publish(failed)
    finally:
        await nc.close()
    found = await _json(await client.get(f"/v1/sessions/{sid}/compaction-failures", params={"min_seq": done.seq}))
    assert found["failures"] == [
        {
            "seq": done.seq,
            "leaf_id": "m1",
            "summarizer": "openai-compatible",
            "error": "HTTP 503",
            "attempt": 2,
            "created_at": failed.occurred_at.isoformat(),
        }
    ]


async def test_context_as_of_a_sequence(client: httpx.AsyncClient) -> None:
    sid = new_sid()
    before = (await append(client, sid, msg("m1", "hello")))["seq"]
    config = {
        "blocks": [
            {"label": "memory", "kind": "writable", "max_tokens": 100},
            {"label": "notes", "kind": "searchable", "description": "Notes"},
        ]
    }
    await _json(await client.put(f"/v1/sessions/{sid}/config", json=config))
    one = (await _json(await client.put(f"/v1/sessions/{sid}/context/memory", json={"content": "one"})))["seq"]
    await _json(
        await client.post(f"/v1/sessions/{sid}/tools/set_context", json={"label": "notes", "key": "k", "content": "x"})
    )
    two = (await _json(await client.put(f"/v1/sessions/{sid}/context/memory", json={"content": "two"})))["seq"]

    async def at(seq: int) -> dict[str, Any]:
        return await _json(await client.get(f"/v1/sessions/{sid}/context", params={"as_of_seq": seq}))

    assert await at(before) == {"as_of_seq": before, "blocks": []}
    memory_then = (await at(one))["blocks"][0]
    assert (memory_then["label"], memory_then["content"], memory_then["tokens"]) == ("memory", "one", 1)
    then = (await at(two))["blocks"]
    now = (await _json(await client.get(f"/v1/sessions/{sid}/context", params={"min_seq": two})))["blocks"]
    assert then == now  # the fold agrees with the live read model
    assert now[0]["content"] == "two"
    assert now[1]["content"] == "1 entries indexed."
    assert (await at(one))["blocks"][1]["content"] == ""  # the entry came after
    await _problem(await client.get(f"/v1/sessions/{sid}/context", params={"as_of_seq": -1}), 422, "invalid_request")
    await _problem(
        await client.get(f"/v1/sessions/{new_sid()}/context", params={"as_of_seq": 1}), 404, "session_not_found"
    )


async def test_history_as_of_answers_404_for_a_session_that_does_not_live_as_the_read_of_now(
    client: httpx.AsyncClient,
) -> None:
    unknown = new_sid()
    for params in ({}, {"as_of_seq": 1}):
        await _problem(await client.get(f"/v1/sessions/{unknown}/history", params=params), 404, "session_not_found")
    sid = new_sid()
    r = await client.post(f"/v1/sessions/{sid}/messages", json={"message": msg("m1", "hello")})
    assert r.status_code == 201, r.text
    first = r.json()["seq"]
    before = await client.get(  # before its first event, read after it
        f"/v1/sessions/{sid}/history", params={"as_of_seq": first - 1, "min_seq": first}
    )
    assert before.status_code == 200, before.text
    assert before.json()["messages"] == []


@pytest.mark.parametrize("path", ["history", "context", "system-prompt"])
async def test_as_of_a_sequence_past_the_log_is_422_and_the_last_is_taken(client: httpx.AsyncClient, path: str) -> None:
    """A sequence the log has not reached has no state yet: answered, it would change as the log
    grows (two reads as of one sequence would differ)."""
    sid = new_sid()
    await chain(client, sid, ["m1"])
    last = await stream_last_seq(client)
    r = await client.get(f"/v1/sessions/{sid}/{path}", params={"as_of_seq": last + 1000})
    await _problem(r, 422, "seq_not_reached")
    assert (
        r.json()["detail"]
        == f"as_of_seq: {last + 1000} is past the log's last sequence ({last}): no state as of it yet"
    )
    await _json(await client.get(f"/v1/sessions/{sid}/{path}", params={"as_of_seq": last}))


# -- quarantine ----------------------------------------------------------------------------


async def test_quarantine_shows_a_tenant_only_its_own_events(
    client: httpx.AsyncClient, client_b: httpx.AsyncClient, anon: httpx.AsyncClient, api_settings: Settings
) -> None:
    sa, sb = new_sid(), new_sid()
    await append(client, sa, msg("m1", "hello"))
    await append(client_b, sb, msg("m1", "hello"))
    bad_a = await _publish_raw(api_settings, "tenant-a", sa, b"not json from a")
    bad_b = await _publish_raw(api_settings, "tenant-b", sb, b"not json from b")
    await _json(await client.get(f"/v1/sessions/{sa}/tree", params={"min_seq": bad_a}))  # projected past it
    await _json(await client_b.get(f"/v1/sessions/{sb}/tree", params={"min_seq": bad_b}))

    mine = (await _json(await client.get("/v1/quarantine", params={"session_id": sa})))["quarantined"]
    assert [(q["seq"], q["session_id"], q["reason"]) for q in mine] == [(bad_a, sa, "not_json")]
    assert mine[0]["size"] == len(b"not json from a")
    every = [q["seq"] for q in (await _json(await client.get("/v1/quarantine", params={"limit": 500})))["quarantined"]]
    assert bad_a in every
    assert bad_b not in every
    theirs = [
        q["seq"] for q in (await _json(await client_b.get("/v1/quarantine", params={"limit": 500})))["quarantined"]
    ]
    assert bad_b in theirs
    assert bad_a not in theirs
    assert (await _json(await client_b.get("/v1/quarantine", params={"session_id": sa})))["quarantined"] == []

    await _problem(await anon.get("/v1/quarantine"), 401, "unauthorized")
    await _problem(await client.get("/v1/quarantine", params={"session_id": " x"}), 422, "invalid_id")
    await _problem(await client.get("/v1/quarantine", params={"limit": 0}), 422, "invalid_request")


async def test_quarantine_of_a_session_lists_its_event_refused_on_a_wrong_partition(
    client: httpx.AsyncClient, client_b: httpx.AsyncClient, api_settings: Settings
) -> None:
    """An event naming the session but stored under another partition token is listed with that
    session in the tenant's list, so the session's own list (what the view's tab asks) has it too."""
    sid = new_sid()
    await append(client, sid, msg("m1", "hello"))
    layout = api_settings.layout()
    own = layout.session_subject("tenant-a", sid)
    part = layout.partition_token(own)
    assert part is not None
    wrong = own.replace(f".p{part:03d}.", f".p{(part + 1) % layout.partitions:03d}.")
    nc = await operator_nats(api_settings.nats_url)
    try:
        bad = int((await nc.jetstream().publish(wrong, b"not json, wrong partition", stream=api_settings.stream)).seq)
    finally:
        await nc.close()
    last = await _publish_raw(api_settings, "tenant-a", sid, b"not json, own subject")
    await _json(await client.get(f"/v1/sessions/{sid}/tree", params={"min_seq": last}))

    every = (await _json(await client.get("/v1/quarantine", params={"limit": 500})))["quarantined"]
    assert {(q["seq"], q["session_id"]) for q in every} >= {(bad, sid), (last, sid)}
    mine = (await _json(await client.get("/v1/quarantine", params={"session_id": sid})))["quarantined"]
    assert [q["seq"] for q in mine] == [last, bad]
    suffix = (await _json(await client.get("/v1/quarantine", params={"session_id": sid[1:]})))["quarantined"]
    assert suffix == []  # an id that is the end of this one is another session
    assert (await _json(await client_b.get("/v1/quarantine", params={"session_id": sid})))["quarantined"] == []


async def test_quarantine_is_paged_so_every_refused_event_can_be_read(
    client: httpx.AsyncClient, api_settings: Settings
) -> None:
    sid = new_sid()
    await append(client, sid, msg("m1", "hello"))
    bad = [await _publish_raw(api_settings, "tenant-a", sid, f"not json {i}".encode()) for i in range(5)]
    await _json(await client.get(f"/v1/sessions/{sid}/tree", params={"min_seq": bad[-1]}))

    seen: list[int] = []
    pages = 0
    cursor: int | None = None
    while True:
        params: dict[str, Any] = {"session_id": sid, "limit": 2} | ({"cursor": cursor} if cursor else {})
        body = await _json(await client.get("/v1/quarantine", params=params))
        seen += [q["seq"] for q in body["quarantined"]]
        pages += 1
        cursor = body["next_cursor"]
        if cursor is None:
            break
        assert cursor == seen[-1]
    assert (seen, pages) == (sorted(bad, reverse=True), 3)
    whole = await _json(await client.get("/v1/quarantine", params={"session_id": sid, "limit": 5}))
    assert ([q["seq"] for q in whole["quarantined"]], whole["next_cursor"]) == (seen, None)  # exactly full: last
    await _problem(await client.get("/v1/quarantine", params={"cursor": 0}), 422, "invalid_request")
    await _problem(await client.get("/v1/quarantine", params={"cursor": "x"}), 422, "invalid_request")


# -- the page ------------------------------------------------------------------------------


async def test_the_page_and_its_assets_are_served_from_here_without_a_key(anon: httpx.AsyncClient) -> None:
    r = await anon.get("/audit")
    assert (r.status_code, r.headers["location"]) == (308, "/audit/")
    page = await anon.get("/audit/")
    assert page.status_code == 200
    assert page.headers["content-type"].startswith("text/html")
    csp = page.headers["content-security-policy"]
    assert "default-src 'none'" in csp
    assert "script-src 'self'" in csp
    assert "connect-src 'self'" in csp
    assets = re.findall(r'(?:src|href)="([^"]+)"', page.text)
    assert assets == ["/audit/static/app.css", "/audit/static/app.js"]
    seen: set[str] = set()
    todo = list(assets)
    while todo:  # every asset and every module it imports is served by this server
        path = todo.pop()
        if path in seen:
            continue
        seen.add(path)
        r = await anon.get(path)
        assert r.status_code == 200, path
        assert not re.search(r"https?://", r.text), f"{path} names another server"
        todo += [f"/audit/static/{name}" for name in re.findall(r'from "\./([a-z]+\.js)"', r.text)]
        if path.endswith(".js"):
            assert r.headers["content-type"].split(";")[0] in ("text/javascript", "application/javascript")
    assert {"/audit/static/api.js", "/audit/static/tree.js", "/audit/static/dom.js"} <= seen
    assert (await anon.get("/audit/static/missing.js")).status_code == 404
    assert not [p for p in (await anon.get("/openapi.json")).json()["paths"] if p.startswith("/audit")]
