"""Issue 12: every bad input gets a 4xx problem+json and publishes nothing; no error drops the
keep-alive connection; per-session reads of unknown sessions are 404; clearing is explicit."""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

import httpx
import pytest

from events.catalog import SessionConfigured
from events.context import ObjectSource, ReadonlyBlock, SessionConfig
from events.publisher import Publisher
from services.settings import Settings
from tests.conftest import operator_nats
from tests.e2e.context_support import new_bucket
from tests.e2e.helpers import append, assert_problem, chain, events, msg, new_sid, stream_last_seq

JSON = {"Content-Type": "application/json"}


async def _session_with_messages(client: httpx.AsyncClient) -> tuple[str, list[dict[str, Any]], int]:
    sid = new_sid()
    await chain(client, sid, ["m1", "m2"])
    return sid, await events(client, sid), await stream_last_seq(client)


async def _unchanged(client: httpx.AsyncClient, sid: str, before: list[dict[str, Any]], last: int) -> None:
    assert await events(client, sid) == before
    assert await stream_last_seq(client) == last


def _bad_bodies(sid: str) -> list[tuple[str, str, bytes]]:
    """(method, path, raw body) of every JSON-taking route, each body holding ``{BAD}``."""
    return [
        ("POST", "/v1/sessions", b'{"id": "%s-new", "metadata": {BAD: 1}}' % sid.encode()),
        ("POST", "/v1/sessions", b'{"id": "%s-new", "metadata": {"k": BAD}}' % sid.encode()),
        ("PATCH", f"/v1/sessions/{sid}", b'{"name": BAD}'),
        ("POST", f"/v1/sessions/{sid}/messages", b'{"message": {"id": "m9", "role": "user", "parts": [], "x": BAD}}'),
        ("POST", f"/v1/sessions/{sid}/messages:batch", b'{"messages": [{"id": "m9", "role": "user", "parts": [BAD]}]}'),
        ("PUT", f"/v1/sessions/{sid}/messages/m1", b'{"message": {"id": "m1", "role": "user", "parts": [], "x": BAD}}'),
        ("POST", f"/v1/sessions/{sid}/fork", b'{"at_message_id": "m1", "name": BAD}'),
        ("POST", f"/v1/sessions/{sid}/messages:delete", b'{"ids": ["m1", BAD]}'),
        ("PUT", f"/v1/sessions/{sid}/config", b'{"blocks": [{"label": "a", "kind": "readonly", "content": BAD}]}'),
        ("PUT", f"/v1/sessions/{sid}/context/mem", b'{"content": BAD}'),
        ("POST", f"/v1/sessions/{sid}/tools/set_context", b'{"label": "mem", "content": BAD}'),
        ("POST", f"/v1/sessions/{sid}/compact", b'{"leaf_id": BAD}'),
    ]


BAD_VALUES = {
    "lone-surrogate": b'"a\\ud800b"',
    "lone-low-surrogate": b'"\\udc00"',
    "nul": b'"a\\u0000b"',
    "nan": b"NaN",
    "infinity": b"Infinity",
    "minus-infinity": b"-Infinity",
    "overflowing-float": b"1e400",
    "integer-past-4300-digits": b"9" * 5000,  # Python refuses to read it: was a 500 on every route
}


@pytest.mark.parametrize("bad", BAD_VALUES.values(), ids=BAD_VALUES.keys())
async def test_bad_json_values_anywhere_are_422_and_publish_nothing(client: httpx.AsyncClient, bad: bytes) -> None:
    sid, before, last = await _session_with_messages(client)
    for method, path, raw in _bad_bodies(sid):
        if not bad.startswith(b'"') and b"{BAD: 1}" in raw:
            continue  # a key must be a string
        r = await client.request(method, path, content=raw.replace(b"BAD", bad), headers=JSON)
        assert_problem(r, 422, "invalid_request")
        assert r.json()["detail"], r.text
    await _unchanged(client, sid, before, last)
    assert_problem(await client.get(f"/v1/sessions/{sid}-new"), 404, "session_not_found")


def _nested(depth: int) -> bytes:
    return b"[" * depth + b"]" * depth


@pytest.mark.parametrize("depth", [65, 254, 3000, 100_000])
async def test_deeply_nested_json_is_422_and_publishes_nothing(client: httpx.AsyncClient, depth: int) -> None:
    sid, before, last = await _session_with_messages(client)
    for method, path, raw in _bad_bodies(sid):
        r = await client.request(method, path, content=raw.replace(b"BAD", _nested(depth)), headers=JSON)
        if b"{BAD: 1}" in raw:
            assert r.status_code == 400, r.text  # a list is not a key: malformed
            continue
        problem = assert_problem(r, 422, "invalid_request")
        assert "nested" in problem["detail"], problem
    await _unchanged(client, sid, before, last)


async def test_json_nested_to_the_limit_is_accepted(client: httpx.AsyncClient) -> None:
    sid = new_sid()
    deep: Any = "x"
    for _ in range(61):  # body, message, extra field, then 61 lists: 64 levels
        deep = [deep]
    r = await client.post(f"/v1/sessions/{sid}/messages", json={"message": {**msg("m1", "ok"), "extra": deep}})
    assert r.status_code == 201, r.text


async def test_nul_in_fork_name_is_422(client: httpx.AsyncClient) -> None:
    sid, before, last = await _session_with_messages(client)
    r = await client.post(f"/v1/sessions/{sid}/fork", json={"at_message_id": "m1", "name": "a\u0000b", "id": sid + "f"})
    assert_problem(r, 422, "invalid_request")
    await _unchanged(client, sid, before, last)
    assert_problem(await client.get(f"/v1/sessions/{sid}f"), 404, "session_not_found")


async def test_a_nul_in_a_query_parameter_is_named_not_shown_as_a_regex(client: httpx.AsyncClient) -> None:
    r = await client.get("/v1/search", params={"q": "x\x00y"})
    assert_problem(r, 422, "invalid_request")
    assert r.json()["detail"] == "query.q: must not contain NUL characters"
    assert [e["msg"] for e in r.json()["errors"]] == ["must not contain NUL characters"]


@pytest.mark.parametrize("bad_sid", ["a/b", "/lead", "trail/", "a\\b/c"])
async def test_session_ids_with_a_slash_are_refused(client: httpx.AsyncClient, bad_sid: str) -> None:
    last = await stream_last_seq(client)
    assert_problem(await client.post("/v1/sessions", json={"id": bad_sid}), 422, "invalid_id")
    r = await client.post(f"/v1/sessions/{quote(bad_sid, safe='')}/messages", json={"message": msg("m1", "x")})
    assert r.status_code in (404, 422), r.text  # never reachable: no route or an invalid id
    sid, before, last = await _session_with_messages(client)
    r = await client.post(f"/v1/sessions/{sid}/fork", json={"at_message_id": "m1", "id": bad_sid})
    assert_problem(r, 422, "invalid_id")
    await _unchanged(client, sid, before, last)


async def test_a_fork_whose_path_the_log_refuses_publishes_nothing(client: httpx.AsyncClient) -> None:
    """A fork re-records the path as new events; a fork name over the limit of the new session
    event... (any refusal) must come before the session is created."""
    sid, before, last = await _session_with_messages(client)
    r = await client.post(f"/v1/sessions/{sid}/fork", json={"at_message_id": "m1", "id": sid + "/x"})
    assert r.status_code == 422
    await _unchanged(client, sid, before, last)


# -- 404 for per-session reads of unknown sessions ---------------------------------------------


async def _get(client: httpx.AsyncClient, path: str, **params: Any) -> httpx.Response:
    path, _, query = path.partition("?")
    extra = dict(item.split("=") for item in query.split("&") if item)
    return await client.get(path, params={**extra, **params})


READS = [
    "/v1/sessions/{sid}/history",
    "/v1/sessions/{sid}/history?max_bytes=1024",
    "/v1/sessions/{sid}/history/stats",
    "/v1/sessions/{sid}/leaf",
    "/v1/sessions/{sid}/path-length",
    "/v1/sessions/{sid}/messages/m1",
    "/v1/sessions/{sid}/messages/m1/children",
    "/v1/sessions/{sid}/search?q=hello",
    "/v1/sessions/{sid}/compactions",
    "/v1/sessions/{sid}/context",
]


@pytest.mark.parametrize("path", READS)
async def test_reads_of_an_unknown_session_are_404(
    client: httpx.AsyncClient, client_b: httpx.AsyncClient, path: str
) -> None:
    other = new_sid()
    seq = (await append(client_b, other, msg("m1", "hello")))["seq"]
    last = await stream_last_seq(client)
    for sid in (new_sid(), other):  # never created, and another tenant's
        assert_problem(await _get(client, path.format(sid=sid)), 404, "session_not_found")
    assert await stream_last_seq(client) == last
    r = await _get(client_b, path.format(sid=other), min_seq=seq)
    assert r.status_code == 200, r.text


async def test_reads_of_a_deleted_session_are_404(client: httpx.AsyncClient) -> None:
    sid = new_sid()
    await chain(client, sid, ["m1"])
    seq = (await client.delete(f"/v1/sessions/{sid}")).json()["seq"]
    for path in READS:
        assert_problem(await _get(client, path.format(sid=sid), min_seq=seq), 404, "session_not_found")


async def test_a_read_with_min_seq_waits_then_decides(client: httpx.AsyncClient) -> None:
    sid = new_sid()
    seq = (await append(client, sid, msg("m1", "x")))["seq"]
    r = await client.get(f"/v1/sessions/{sid}/history", params={"min_seq": seq})
    assert [m["id"] for m in r.json()["messages"]] == ["m1"]


async def test_empty_existing_session_reads_are_200(client: httpx.AsyncClient) -> None:
    sid = new_sid()
    seq = (await client.post("/v1/sessions", json={"id": sid})).json()["seq"]
    for path in READS:
        if "messages/m1" in path and not path.endswith("children"):
            assert_problem(await _get(client, path.format(sid=sid), min_seq=seq), 404, "message_not_found")
            continue
        r = await _get(client, path.format(sid=sid), min_seq=seq)
        assert r.status_code == 200, (path, r.text)


# -- huge min_seq ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "path",
    [
        "/v1/search?q=x",
        "/v1/sessions",
        "/v1/sessions/{sid}/history",
        "/v1/sessions/{sid}/history/stats",
        "/v1/sessions/{sid}/search?q=x",
    ],
)
async def test_a_huge_min_seq_is_clamped_not_a_timeout(client: httpx.AsyncClient, path: str) -> None:
    sid = new_sid()
    await chain(client, sid, ["m1"])
    r = await _get(client, path.format(sid=sid), min_seq=10**18)
    assert r.status_code == 200, r.text


# -- delete and clear -------------------------------------------------------------------------


async def test_delete_without_ids_is_422_and_clears_nothing(client: httpx.AsyncClient) -> None:
    sid, before, last = await _session_with_messages(client)
    problem = assert_problem(await client.delete(f"/v1/sessions/{sid}/messages"), 422, "invalid_request")
    assert ":clear" in problem["detail"]
    await _unchanged(client, sid, before, last)


async def test_clear_is_its_own_operation(client: httpx.AsyncClient) -> None:
    sid, _before, _ = await _session_with_messages(client)
    r = await client.post(f"/v1/sessions/{sid}/messages:clear")
    assert r.status_code == 200, r.text
    out = r.json()
    assert out["cleared"] is True
    h = await client.get(f"/v1/sessions/{sid}/history", params={"min_seq": out["seq"]})
    assert h.json()["messages"] == []
    assert [e["event"]["type"] for e in await events(client, sid)][-1] == "messages.cleared"
    r = await client.post(f"/v1/sessions/{new_sid()}/messages:clear")
    assert r.json() == {"cleared": True, "seq": 0}


async def test_delete_many_ids_in_one_request(client: httpx.AsyncClient) -> None:
    sid = new_sid()
    await chain(client, sid, [f"m{i}" for i in range(5)])
    ids = ",".join([*(f"m{i}" for i in range(0, 5, 2)), *(f"absent{i}" for i in range(500))])
    r = await client.delete(f"/v1/sessions/{sid}/messages", params={"ids": ids})
    assert r.status_code == 200, r.text
    assert r.json()["deleted"] == ["m0", "m2", "m4"]


async def test_too_many_ids_are_422(client: httpx.AsyncClient) -> None:
    sid, before, last = await _session_with_messages(client)
    ids = ",".join(f"m{i}" for i in range(1001))
    assert_problem(await client.delete(f"/v1/sessions/{sid}/messages", params={"ids": ids}), 422, "invalid_request")
    await _unchanged(client, sid, before, last)


async def test_an_id_holding_a_comma_is_deleted_with_a_json_list(client: httpx.AsyncClient) -> None:
    """Found by schemathesis: ``ids`` splits on ',', so a message whose id holds one could never be
    deleted; ``POST …/messages:delete`` takes the ids as a JSON list."""
    sid = new_sid()
    await chain(client, sid, ["a", "b"])
    await append(client, sid, msg("a,b", "x"))
    r = await client.delete(f"/v1/sessions/{sid}/messages", params={"ids": "a,b"})
    assert r.json()["deleted"] == ["a", "b"]  # the query form names two ids
    r = await client.post(f"/v1/sessions/{sid}/messages:delete", json={"ids": ["a,b", "absent"]})
    assert r.status_code == 200, r.text
    assert r.json()["deleted"] == ["a,b"]
    r = await client.get(f"/v1/sessions/{sid}/messages/a%2Cb", params={"min_seq": r.json()["seq"]})
    assert_problem(r, 404, "message_not_found")


async def test_json_delete_refuses_what_the_query_form_refuses(client: httpx.AsyncClient) -> None:
    sid, before, last = await _session_with_messages(client)
    path = f"/v1/sessions/{sid}/messages:delete"
    assert_problem(await client.post(path, json={"ids": []}), 422, "invalid_request")
    assert_problem(await client.post(path, json={}), 422, "invalid_request")
    assert_problem(await client.post(path, json={"ids": [f"m{i}" for i in range(1001)]}), 422, "invalid_request")
    assert_problem(await client.post(path, json={"ids": ["m1", " m2"]}), 422, "invalid_id")
    await _unchanged(client, sid, before, last)


# -- S3 keys -----------------------------------------------------------------------------------

BAD_KEYS = ["../other/x.md", "/abs.md", "a//b.md", "a\\b.md", "a/\u0001.md", ".", "a/./b", "a/../b"]


@pytest.mark.parametrize("key", BAD_KEYS)
async def test_unsafe_object_keys_are_refused_at_config_time(
    client: httpx.AsyncClient, api_settings: Settings, key: str
) -> None:
    bucket = new_bucket(api_settings)
    sid, before, last = await _session_with_messages(client)
    configs = [
        {"blocks": [{"label": "p", "kind": "readonly", "source": {"bucket": bucket, "key": key}}]},
        {"blocks": [{"label": "s", "kind": "skills", "bucket": bucket, "prefix": key + "/"}]},
        {"blocks": [{"label": "s", "kind": "skills", "bucket": bucket, "keys": [key]}]},
    ]
    for config in configs:
        problem = assert_problem(await client.put(f"/v1/sessions/{sid}/config", json=config), 422, "invalid_config")
        assert "key" in problem["detail"] or "prefix" in problem["detail"], problem
    await _unchanged(client, sid, before, last)


async def test_safe_object_keys_are_accepted(client: httpx.AsyncClient, api_settings: Settings) -> None:
    bucket = new_bucket(api_settings)
    sid = new_sid()
    config = {
        "blocks": [
            {"label": "p", "kind": "readonly", "source": {"bucket": bucket, "key": "docs/policy v2.md"}},
            {"label": "s", "kind": "skills", "bucket": bucket, "prefix": "skills/", "keys": ["tax", "a..b"]},
            {"label": "t", "kind": "skills", "bucket": bucket},
        ]
    }
    r = await client.put(f"/v1/sessions/{sid}/config", json=config)
    assert r.status_code == 200, r.text


# -- errors keep the connection ----------------------------------------------------------------


async def test_an_error_answer_keeps_the_connection(client: httpx.AsyncClient) -> None:
    """Every problem answer is complete and the next request on the same connection works."""
    sid = new_sid()
    seq = await chain(client, sid, ["m1"])
    for _ in range(3):
        r = await client.post(f"/v1/sessions/{sid}/messages", content=b"[" * 5000 + b"]" * 5000, headers=JSON)
        assert r.status_code == 422
        r = await client.get(f"/v1/sessions/{sid}/history", params={"min_seq": seq})
        assert r.status_code == 200


async def test_tool_errors_do_not_leak_exception_text(client: httpx.AsyncClient, api_settings: Settings) -> None:
    bucket = new_bucket(api_settings)
    sid = new_sid()
    config = {"blocks": [{"label": "sk", "kind": "skills", "bucket": bucket}]}
    seq = (await client.put(f"/v1/sessions/{sid}/config", json=config)).json()["seq"]
    await client.get(f"/v1/sessions/{sid}/config", params={"min_seq": seq})
    r = await client.post(f"/v1/sessions/{sid}/tools/load_context", json={"label": "sk", "key": "../../x"})
    assert r.status_code == 200, r.text
    assert r.json()["result"] == "Not found: ../../x"


async def test_a_stored_config_with_an_unsafe_key_is_a_clear_409(
    client: httpx.AsyncClient, api_settings: Settings
) -> None:
    """A config stored before keys were checked (here: published straight to the log) makes the
    context and prompt routes answer ``409 unsafe_config`` naming the block, not a 500."""
    bucket = new_bucket(api_settings)
    sid = new_sid()
    config = SessionConfig(blocks=[ReadonlyBlock(label="policy", source=ObjectSource(bucket=bucket, key="../x.md"))])
    nc = await operator_nats(api_settings.nats_url)
    try:
        seq = (
            await Publisher(nc.jetstream(), api_settings.layout()).publish(
                SessionConfigured(tenant="tenant-a", session=sid, config=config)
            )
        ).seq
    finally:
        await nc.close()
    r = await client.get(f"/v1/sessions/{sid}/context", params={"min_seq": seq})
    problem = assert_problem(r, 409, "unsafe_config")
    assert "'policy'" in problem["detail"]
    assert_problem(await client.get(f"/v1/sessions/{sid}/system-prompt"), 409, "unsafe_config")
    last = await stream_last_seq(client)
    # weighed against it, a config too large to render a storable prompt is refused as against none
    big = [{"label": f"p{i}", "kind": "readonly", "content": "x" * 600_000} for i in range(2)]
    r = await client.put(f"/v1/sessions/{sid}/config", json={"blocks": big})
    assert "(it is 0 bytes stored with the config in force)" in assert_problem(r, 413, "payload_too_large")["detail"]
    r = await client.put(f"/v1/sessions/{sid}/config", json={"blocks": [{"label": "policy", "kind": "readonly"}]})
    assert r.status_code == 200, r.text  # a new config repairs it
    assert (await client.get(f"/v1/sessions/{sid}/context", params={"min_seq": r.json()["seq"]})).status_code == 200
    assert await stream_last_seq(client) > last


# -- events over the log's limit ----------------------------------------------------------------


async def test_a_prompt_or_block_over_the_event_limit_is_413_and_publishes_nothing(client: httpx.AsyncClient) -> None:
    sid = new_sid()
    config = {"blocks": [{"label": "a", "kind": "writable"}, {"label": "b", "kind": "writable"}]}
    assert (await client.put(f"/v1/sessions/{sid}/config", json=config)).status_code == 200
    r = await client.put(f"/v1/sessions/{sid}/context/a", json={"content": "x" * 600_000})
    assert r.status_code == 200, r.text[:300]
    before, last = await events(client, sid), await stream_last_seq(client)
    # a write after which the prompt (both blocks) could not be stored is refused: the prompt stays storable
    r = await client.put(f"/v1/sessions/{sid}/context/b", json={"content": "x" * 600_000})
    assert_problem(r, 413, "payload_too_large")
    r = await client.put(f"/v1/sessions/{sid}/context/a", json={"content": "y" * 600_000, "mode": "append"})
    assert_problem(r, 413, "payload_too_large")
    await _unchanged(client, sid, before, last)
    assert (await client.get(f"/v1/sessions/{sid}/system-prompt")).status_code == 200


# -- paging ------------------------------------------------------------------------------------


async def test_events_are_paged(client: httpx.AsyncClient) -> None:
    sid = new_sid()
    await chain(client, sid, [f"m{i}" for i in range(5)])
    every = await events(client, sid)
    pages: list[dict[str, Any]] = []
    params = {"from_seq": 1, "limit": 2}
    while True:
        page = await events(client, sid, **params)
        pages.extend(page)
        if len(page) < params["limit"]:
            break
        params["from_seq"] = page[-1]["seq"] + 1
    assert pages == every
    assert len(every) == 5
    r = await client.get(f"/v1/sessions/{sid}/events", params={"limit": 10_001})
    assert_problem(r, 422, "invalid_request")


@pytest.mark.parametrize("count", [5, 4])
async def test_children_are_paged(client: httpx.AsyncClient, count: int) -> None:
    """Pages of 2; the last one, full (4) or not (5), says it is the last (a full one named a
    next page, which was empty)."""
    sid = new_sid()
    await append(client, sid, msg("root", "r"), None)
    seq = 0
    for i in range(count):
        seq = (await append(client, sid, msg(f"c{i}", "x"), "root"))["seq"]
    got: list[str] = []
    pages = 0
    params: dict[str, Any] = {"limit": 2, "min_seq": seq}
    while True:
        out = (await client.get(f"/v1/sessions/{sid}/messages/root/children", params=params)).json()
        got.extend(m["id"] for m in out["messages"])
        pages += 1
        if out["next_cursor"] is None:
            break
        params["cursor"] = out["next_cursor"]
    assert got == [f"c{i}" for i in range(count)]
    assert pages == (count + 1) // 2
    out = (await client.get(f"/v1/sessions/{sid}/messages/root/children")).json()
    assert [m["id"] for m in out["messages"]] == got
    assert out["next_cursor"] is None
