"""Every bad input gets a 4xx problem+json with a stable code, and writes nothing."""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import quote

import httpx
import pytest

from tests.e2e.helpers import append, append_body, assert_problem, chain, events, msg, new_sid, stream_last_seq

LONG_ID = "x" * 257
LONG_SID = "s" * 129

BAD_APPEND_BODIES: dict[str, Any] = {
    "parts-not-a-list": {"message": {"id": "m", "role": "user", "parts": "hello"}},
    "parts-is-an-object": {"message": {"id": "m", "role": "user", "parts": {"type": "text", "text": "x"}}},
    "part-not-an-object": {"message": {"id": "m", "role": "user", "parts": ["hello"]}},
    "part-without-type": {"message": {"id": "m", "role": "user", "parts": [{"text": "hello"}]}},
    "role-a-number": {"message": {"id": "m", "role": 7, "parts": []}},
    "role-missing": {"message": {"id": "m", "parts": []}},
    "role-empty": {"message": {"id": "m", "role": "", "parts": []}},
    "id-missing": {"message": {"role": "user", "parts": []}},
    "id-a-number": {"message": {"id": 42, "role": "user", "parts": []}},
    "id-null": {"message": {"id": None, "role": "user", "parts": []}},
    "id-empty": {"message": {"id": "", "role": "user", "parts": []}},
    "id-too-long": {"message": {"id": LONG_ID, "role": "user", "parts": []}},
    "id-control-char": {"message": {"id": "a\u0001b", "role": "user", "parts": []}},
    "id-surrounding-space": {"message": {"id": " m ", "role": "user", "parts": []}},
    "parts-missing": {"message": {"id": "m", "role": "user"}},
    "parts-null": {"message": {"id": "m", "role": "user", "parts": None}},
    "message-missing": {"parent_id": None},
    "message-a-string": {"message": "hello"},
    "message-a-list": {"message": [{"id": "m"}]},
    "body-a-list": [{"message": {"id": "m", "role": "user", "parts": []}}],
    "body-a-string": "hello",
    "unknown-top-level-field": {"message": {"id": "m", "role": "user", "parts": []}, "extra": 1},
    "parent-id-a-number": {"message": {"id": "m", "role": "user", "parts": []}, "parent_id": 5},
    "parent-id-empty": {"message": {"id": "m", "role": "user", "parts": []}, "parent_id": ""},
    "parent-id-too-long": {"message": {"id": "m", "role": "user", "parts": []}, "parent_id": LONG_ID},
    "text-part-text-a-number": {"message": {"id": "m", "role": "user", "parts": [{"type": "text", "text": 123}]}},
    "text-part-text-null": {"message": {"id": "m", "role": "user", "parts": [{"type": "text", "text": None}]}},
    "text-part-without-text": {"message": {"id": "m", "role": "user", "parts": [{"type": "text"}]}},
    "reasoning-part-text-a-list": {
        "message": {"id": "m", "role": "assistant", "parts": [{"type": "reasoning", "text": ["a"]}]}
    },
    "tool-part-call-id-a-number": {
        "message": {"id": "m", "role": "assistant", "parts": [{"type": "tool-x", "toolCallId": 7, "input": {}}]}
    },
    "dynamic-tool-name-an-object": {
        "message": {
            "id": "m",
            "role": "assistant",
            "parts": [{"type": "dynamic-tool", "toolCallId": "c", "toolName": {"n": 1}, "input": {}}],
        }
    },
    "file-part-url-a-number": {
        "message": {"id": "m", "role": "user", "parts": [{"type": "file", "mediaType": "image/png", "url": 1}]}
    },
    "message-id-dot": {"message": {"id": ".", "role": "user", "parts": []}},
    "message-id-dot-dot": {"message": {"id": "..", "role": "user", "parts": []}},
    "message-id-with-a-slash": {"message": {"id": "a/b", "role": "user", "parts": []}},
}


async def assert_nothing_written(client: httpx.AsyncClient, sid: str, last_seq: int) -> None:
    assert await events(client, sid) == []
    assert_problem(await client.get(f"/v1/sessions/{sid}"), 404, "session_not_found")
    assert await stream_last_seq(client) == last_seq


@pytest.mark.parametrize("body", BAD_APPEND_BODIES.values(), ids=BAD_APPEND_BODIES.keys())
async def test_bad_append_bodies(client: httpx.AsyncClient, body: Any) -> None:
    sid = new_sid()
    last = await stream_last_seq(client)
    r = await client.post(f"/v1/sessions/{sid}/messages", json=body)
    assert 400 <= r.status_code < 500, r.text
    problem = assert_problem(r, 422, r.json().get("code", "?"))
    assert problem["code"] in {"invalid_request", "invalid_id"}, problem
    assert problem["detail"]
    if problem["code"] == "invalid_request":  # validation failures name the fields, as every route's
        assert problem["errors"], problem
        assert all(e["loc"][0] == "body" and e["msg"] and e["type"] for e in problem["errors"]), problem
    await assert_nothing_written(client, sid, last)


async def test_bad_input_to_an_existing_session_writes_nothing(client: httpx.AsyncClient) -> None:
    sid = new_sid()
    seq = await chain(client, sid, ["m1", "m2"])
    before = await events(client, sid)
    last = await stream_last_seq(client)
    for body in BAD_APPEND_BODIES.values():
        r = await client.post(f"/v1/sessions/{sid}/messages", json=body)
        assert r.status_code == 422, r.text
        r = await client.put(f"/v1/sessions/{sid}/messages/m1", json=body)
        assert r.status_code == 422, r.text
    r = await client.post(f"/v1/sessions/{sid}/messages", content=b'{"message": ', headers=_json)
    assert_problem(r, 400, "malformed_json")
    assert await events(client, sid) == before
    assert await stream_last_seq(client) == last
    h = await client.get(f"/v1/sessions/{sid}/history", params={"min_seq": seq})
    assert [m["id"] for m in h.json()["messages"]] == ["m1", "m2"]


_json = {"Content-Type": "application/json"}
# the same body through the routes instead of the hot path (services/api/hot.py takes only plain JSON)
_routed = {"Content-Type": "application/vnd.chronicle+json"}


@pytest.mark.parametrize("headers", [_json, _routed], ids=["hot-path", "route"])
async def test_a_message_refused_names_its_fields_in_errors(client: httpx.AsyncClient, headers: dict[str, str]) -> None:
    """A message's shape is checked past the edge's own validation (the same check for every
    transport), and its refusal carries ``errors`` as every other validation failure does: on a
    single append (the hot path's too), in a batch (``loc`` names the message) and on ``PUT``."""
    sid = new_sid()
    last = await stream_last_seq(client)

    async def refused(method: str, path: str, body: Any) -> dict[str, Any]:
        r = await client.request(method, f"/v1/sessions/{sid}/{path}", content=json.dumps(body), headers=headers)
        return assert_problem(r, 422, "invalid_request")

    problem = await refused("POST", "messages", {"message": {"id": "x11", "parts": []}})
    assert problem["detail"] == "message.role: Field required"
    assert problem["errors"] == [{"loc": ["body", "message", "role"], "msg": "Field required", "type": "missing"}]
    batch = {"messages": [msg("b1", "fine"), {"id": "b2", "role": "user", "parts": [{"type": "text", "text": 1}]}]}
    problem = await refused("POST", "messages:batch", batch)
    [error] = problem["errors"]
    assert error["loc"][:3] == ["body", "messages", "1"], problem
    assert problem["detail"].startswith("messages.1."), problem
    problem = await refused("POST", "messages:batch", {"messages": [msg("b1", "a"), msg("b1", "b")]})
    assert [e["loc"] for e in problem["errors"]] == [["body", "messages"]]
    problem = await refused("PUT", "messages/m1", {"message": {"id": "m1", "role": "", "parts": []}})
    assert [e["loc"] for e in problem["errors"]] == [["body", "message", "role"]]
    problem = await refused("PUT", "messages/m1", {"message": msg("m2", "another id")})
    assert problem["errors"] == [
        {"loc": ["body", "message", "id"], "msg": "must equal the id in the path", "type": "value_error"}
    ]
    await assert_nothing_written(client, sid, last)


@pytest.mark.parametrize("headers", [_json, _routed], ids=["hot-path", "route"])
@pytest.mark.parametrize(("case", "part"), [("text", {"type": "text", "text": 123}), ("dots", None)])
async def test_loose_parts_and_dot_ids_are_refused_on_both_append_paths(
    client: httpx.AsyncClient, headers: dict[str, str], case: str, part: dict[str, Any] | None
) -> None:
    sid = new_sid()
    last = await stream_last_seq(client)
    for mid in [".", ".."] if part is None else ["m"]:
        message = {"id": mid, "role": "user", "parts": [part] if part else []}
        r = await client.post(f"/v1/sessions/{sid}/messages", content=json.dumps({"message": message}), headers=headers)
        problem = assert_problem(r, 422, "invalid_request" if part else "invalid_id")
        assert ("text must be a string" if part else f"must not be {mid!r}") in problem["detail"], problem
    await assert_nothing_written(client, sid, last)


async def test_a_batch_with_a_dot_id_writes_none_of_its_messages(client: httpx.AsyncClient) -> None:
    sid = new_sid()
    last = await stream_last_seq(client)
    for bad in (".", ".."):
        r = await client.post(f"/v1/sessions/{sid}/messages:batch", json={"messages": [msg("m1", "a"), msg(bad, "b")]})
        problem = assert_problem(r, 422, "invalid_id")
        assert f"must not be {bad!r}" in problem["detail"], problem
    r = await client.post(
        f"/v1/sessions/{sid}/messages:batch",
        json={"messages": [{"id": "m1", "role": "user", "parts": [{"type": "reasoning", "text": 5}]}]},
    )
    assert_problem(r, 422, "invalid_request")
    await assert_nothing_written(client, sid, last)


async def test_ids_with_dots_and_arbitrary_tool_json_are_still_fine(client: httpx.AsyncClient) -> None:
    sid = new_sid()
    parts = [
        {"type": "text", "text": "", "state": "done", "providerMetadata": {"x": [1, None]}},
        {"type": "reasoning", "reasoning": "AI SDK 4 shape", "details": [{"type": "text", "text": "t"}]},
        {
            "type": "tool-lookup",
            "toolCallId": "c1",
            "state": "output-available",
            "input": 5,
            "output": [1, {"a": None}],
        },
        {"type": "dynamic-tool", "toolCallId": "c2", "toolName": "t", "input": None, "output": "plain"},
        {"type": "data-weather", "data": 3, "title": 4},
        {"type": "step-start"},
        {"type": "custom", "text": 9},
    ]
    for mid in ("...", ".m", "m.", "..m"):
        await append(client, sid, {"id": mid, "role": "assistant", "parts": parts})
    r = await client.put(
        f"/v1/sessions/{sid}/messages/...", json={"message": {"id": "...", "role": "user", "parts": []}}
    )
    assert r.status_code == 200, r.text
    h = await client.get(f"/v1/sessions/{sid}/history", params={"min_seq": r.json()["seq"]})
    assert [m["id"] for m in h.json()["messages"]] == ["...", ".m", "m.", "..m"]
    assert h.json()["messages"][1]["parts"] == parts


DUPLICATE_KEYS = {
    "top level": b'{"message": {"id": "m", "role": "user", "parts": []}, '
    b'"message": {"id": "n", "role": "user", "parts": []}}',
    "in the message": b'{"message": {"id": "m", "role": "user", "role": "assistant", "parts": []}}',
    "in a part": b'{"message": {"id": "m", "role": "user", "parts": [{"type": "text", "text": "a", "text": "b"}]}}',
    "deep in tool output": b'{"message": {"id": "m", "role": "user", "parts": [{"type": "tool-x", "output": '
    b'{"rows": [{"k": 1, "v": 2, "k": 3}]}}]}}',
}


@pytest.mark.parametrize("headers", [_json, _routed], ids=["hot-path", "route"])
@pytest.mark.parametrize("raw", DUPLICATE_KEYS.values(), ids=DUPLICATE_KEYS.keys())
async def test_a_key_twice_in_one_object_is_refused(
    client: httpx.AsyncClient, raw: bytes, headers: dict[str, str]
) -> None:
    sid = new_sid()
    last = await stream_last_seq(client)
    r = await client.post(f"/v1/sessions/{sid}/messages", content=raw, headers=headers)
    problem = assert_problem(r, 422, "invalid_request")
    assert "in one object twice" in problem["detail"], problem
    await assert_nothing_written(client, sid, last)


@pytest.mark.parametrize(
    ("method", "path", "raw"),
    [
        ("POST", "/v1/sessions", b'{"id": "{sid}-x", "id": "{sid}-y"}'),
        (
            "PUT",
            "/v1/sessions/{sid}/messages/m1",
            b'{"message": {"id": "m1", "id": "m1", "role": "user", "parts": []}}',
        ),
        (
            "POST",
            "/v1/sessions/{sid}/messages:batch",
            b'{"messages": [{"id": "m2", "role": "user", "parts": [], "parts": []}]}',
        ),
        ("PUT", "/v1/sessions/{sid}/config", b'{"blocks": [], "blocks": []}'),
        ("PATCH", "/v1/sessions/{sid}", b'{"name": "a", "name": "b"}'),
    ],
)
async def test_a_key_twice_is_refused_by_every_write(
    client: httpx.AsyncClient, method: str, path: str, raw: bytes
) -> None:
    sid = new_sid()
    await append(client, sid, msg("m1", "exists"))
    before = await events(client, sid)
    last = await stream_last_seq(client)
    body = raw.replace(b"{sid}", sid.encode())
    r = await client.request(method, path.format(sid=sid), content=body, headers=_json)
    problem = assert_problem(r, 422, "invalid_request")
    assert "in one object twice" in problem["detail"], problem
    assert await events(client, sid) == before
    assert await stream_last_seq(client) == last


MALFORMED = [b"{", b'{"message": {"id": "m",}}', b"not json at all", b'{"message": {"id": "m"}} trailing', b"\xff\xfe"]


@pytest.mark.parametrize("raw", MALFORMED)
async def test_malformed_json_append(client: httpx.AsyncClient, raw: bytes) -> None:
    sid = new_sid()
    last = await stream_last_seq(client)
    r = await client.post(f"/v1/sessions/{sid}/messages", content=raw, headers=_json)
    assert_problem(r, 400, "malformed_json")
    await assert_nothing_written(client, sid, last)


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("POST", "/v1/sessions"),
        ("PATCH", "/v1/sessions/{sid}"),
        ("PUT", "/v1/sessions/{sid}/messages/m1"),
    ],
)
async def test_malformed_json_other_writes(client: httpx.AsyncClient, method: str, path: str) -> None:
    sid = new_sid()
    await append(client, sid, msg("m1", "exists"))
    before = await events(client, sid)
    last = await stream_last_seq(client)
    r = await client.request(method, path.format(sid=sid), content=b'{"name": ', headers=_json)
    assert_problem(r, 400, "malformed_json")
    assert await events(client, sid) == before
    assert await stream_last_seq(client) == last


@pytest.mark.parametrize(
    "body",
    [
        {"id": 5},
        {"id": ""},
        {"id": LONG_SID},
        {"id": "a\u0001b"},
        {"name": 5},
        {"name": "x" * 513},
        {"metadata": "not an object"},
        {"parent_session_id": ""},
        {"unknown": True},
        ["not", "an", "object"],
    ],
)
async def test_bad_create_session_bodies(client: httpx.AsyncClient, body: Any) -> None:
    last = await stream_last_seq(client)
    r = await client.post("/v1/sessions", json=body)
    assert r.status_code == 422, r.text
    problem = assert_problem(r, 422, r.json()["code"])
    assert problem["code"] in {"invalid_request", "invalid_id"}
    assert await stream_last_seq(client) == last


@pytest.mark.parametrize("body", [{}, {"name": 5}, {"name": None}, {"name": "x" * 513}, {"name": "ok", "x": 1}])
async def test_bad_rename_bodies(client: httpx.AsyncClient, body: Any) -> None:
    sid = new_sid()
    r = await client.post("/v1/sessions", json={"id": sid, "name": "kept"})
    seq = r.json()["seq"]
    r = await client.patch(f"/v1/sessions/{sid}", json=body)
    assert_problem(r, 422, "invalid_request")
    assert len(await events(client, sid)) == 1
    assert (await client.get(f"/v1/sessions/{sid}", params={"min_seq": seq})).json()["name"] == "kept"


INVALID_SIDS = {
    "too-long": LONG_SID,
    "control-char": "bad\u0001id",
    "newline": "bad\nid",
    "del-char": "bad\u007fid",
    "leading-space": " padded",
}


@pytest.mark.parametrize("sid", INVALID_SIDS.values(), ids=INVALID_SIDS.keys())
async def test_invalid_session_ids_in_the_path(client: httpx.AsyncClient, sid: str) -> None:
    p = quote(sid, safe="")
    last = await stream_last_seq(client)
    requests: list[tuple[str, str, Any]] = [
        ("POST", f"/v1/sessions/{p}/messages", append_body(msg("m1", "x"))),
        ("PUT", f"/v1/sessions/{p}/messages/m1", {"message": msg("m1", "x")}),
        ("DELETE", f"/v1/sessions/{p}/messages", None),
        ("DELETE", f"/v1/sessions/{p}/messages?ids=m1", None),
        ("PATCH", f"/v1/sessions/{p}", {"name": "x"}),
        ("POST", f"/v1/sessions/{p}/usage", {"input_tokens": 1}),
        ("POST", f"/v1/sessions/{p}:end", {"reason": "x"}),
        ("DELETE", f"/v1/sessions/{p}", None),
        ("GET", f"/v1/sessions/{p}", None),
        ("GET", f"/v1/sessions/{p}/history", None),
        ("GET", f"/v1/sessions/{p}/history/stats", None),
        ("GET", f"/v1/sessions/{p}/leaf", None),
        ("GET", f"/v1/sessions/{p}/path-length", None),
        ("GET", f"/v1/sessions/{p}/messages/m1", None),
        ("GET", f"/v1/sessions/{p}/messages/m1/children", None),
        ("GET", f"/v1/sessions/{p}/search?q=x", None),
        ("GET", f"/v1/sessions/{p}/events", None),
    ]
    for method, path, body in requests:
        r = await client.request(method, path, json=body)
        assert_problem(r, 422, "invalid_id")
    r = await client.post("/v1/sessions", json={"id": sid})
    assert_problem(r, 422, "invalid_id")
    assert await stream_last_seq(client) == last


async def test_session_id_of_128_chars_is_fine(client: httpx.AsyncClient) -> None:
    sid = new_sid("max").ljust(128, "z")
    assert len(sid) == 128
    out = await append(client, sid, msg("m1", "ok"))
    r = await client.get(f"/v1/sessions/{sid}/history", params={"min_seq": out["seq"]})
    assert [m["id"] for m in r.json()["messages"]] == ["m1"]


async def test_unusual_but_valid_ids_round_trip(client: httpx.AsyncClient) -> None:
    """Dots, wildcards, spaces and non-ASCII cannot break the subject layout and stay separate."""
    base = new_sid()
    sids = [f"{base}.a.b", f"{base}.*", f"{base}.>", f"{base} with space", f"{base}-ünïcødé-日本"]
    seqs: dict[str, int] = {}
    for i, sid in enumerate(sids):
        seqs[sid] = (await append(client, sid, msg(f"id.{i} *>", f"text {i}")))["seq"]
    for i, sid in enumerate(sids):
        p = quote(sid, safe="")
        r = await client.get(f"/v1/sessions/{p}/history", params={"min_seq": seqs[sid]})
        assert [m["id"] for m in r.json()["messages"]] == [f"id.{i} *>"]
        evs = await events(client, p)
        assert [e["event"]["session"] for e in evs] == [sid]
        r = await client.get(f"/v1/sessions/{p}/messages/{quote(f'id.{i} *>', safe='')}")
        assert r.status_code == 200, r.text
    # The whole tenant wildcard-like session did not swallow the others.
    r = await client.get(f"/v1/sessions/{quote(base + '.*', safe='')}/history")
    assert len(r.json()["messages"]) == 1


@pytest.mark.parametrize(
    ("path", "params"),
    [
        ("/v1/sessions/{sid}/history", {"leaf_id": ""}),
        ("/v1/sessions/{sid}/history", {"leaf_id": LONG_ID}),
        ("/v1/sessions/{sid}/history", {"min_seq": -1}),
        ("/v1/sessions/{sid}/history", {"min_seq": "abc"}),
        ("/v1/sessions/{sid}/history", {"max_bytes": -1}),
        ("/v1/sessions/{sid}/history", {"max_bytes": "lots"}),
        ("/v1/sessions/{sid}/history", {"max_bytes": 10, "min_recent": -1}),
        ("/v1/sessions/{sid}/history/stats", {"min_seq": -1}),
        ("/v1/sessions/{sid}/history/stats", {"min_seq": 2**63}),
        ("/v1/sessions/{sid}/history/stats", {"leaf_id": ""}),
        ("/v1/sessions/{sid}/search", {}),
        ("/v1/sessions/{sid}/search", {"q": ""}),
        ("/v1/sessions/{sid}/search", {"q": "x", "limit": 0}),
        ("/v1/sessions/{sid}/search", {"q": "x", "limit": 201}),
        ("/v1/sessions/{sid}/search", {"q": "x", "limit": "many"}),
        ("/v1/search", {}),
        ("/v1/search", {"q": "x" * 1001}),
        ("/v1/sessions", {"limit": 0}),
        ("/v1/sessions", {"cursor": -1}),
        ("/v1/sessions", {"cursor": "abc"}),
        ("/v1/sessions", {"order": "recent", "cursor": "recent.1.a\u0000b"}),
        ("/v1/sessions", {"order": "recent", "cursor": "recent.1"}),
        ("/v1/sessions", {"order": "recent", "cursor": "recent..s"}),
        ("/v1/sessions", {"order": "newest"}),
        ("/v1/sessions", {"order": ""}),
        ("/v1/sessions/{sid}/events", {"from_seq": 0}),
        ("/v1/sessions/{sid}/events", {"to_seq": "x"}),
        ("/v1/sessions/{sid}/messages/{long}", {}),
    ],
)
async def test_bad_query_parameters(client: httpx.AsyncClient, path: str, params: dict[str, Any]) -> None:
    r = await client.get(path.format(sid=new_sid(), long=LONG_ID), params=params)
    assert r.status_code == 422, r.text
    problem = assert_problem(r, 422, r.json()["code"])
    assert problem["code"] in {"invalid_request", "invalid_id"}


@pytest.mark.parametrize(
    ("path", "query", "repeated"),
    [
        ("/v1/sessions", "limit=500&limit=1", "limit"),
        ("/v1/sessions", "order=recent&limit=2&order=created", "order"),
        ("/v1/sessions", "cursor=1&cursor=2", "cursor"),
        ("/v1/erasures", "limit=5&limit=1", "limit"),
        ("/v1/quarantine", "session_id=a&session_id=b", "session_id"),
        ("/v1/sessions/{sid}/history", "leaf_id=m1&leaf_id=m2", "leaf_id"),
        ("/v1/sessions/{sid}/history", "min_seq=1&min_seq=1", "min_seq"),
        ("/v1/sessions/{sid}/search", "q=x&q=y", "q"),
        ("/v1/search", "q=x&limit=1&limit=2", "limit"),
        ("/v1/sessions/{sid}/events", "from_seq=1&to_seq=2&to_seq=3", "to_seq"),
        ("/v1/sessions/{sid}/messages/m1/children", "limit=1&limit=2", "limit"),
    ],
)
async def test_a_scalar_query_parameter_given_twice_is_422_naming_it(
    client: httpx.AsyncClient, path: str, query: str, repeated: str
) -> None:
    """Never the last value silently: a proxy checking the first would have seen another request."""
    sid = new_sid()
    await chain(client, sid, ["m1"])
    problem = assert_problem(await client.get(f"{path.format(sid=sid)}?{query}"), 422, "invalid_request")
    assert problem["errors"] == [
        {"loc": ["query", repeated], "msg": "given more than once; give it once", "type": "repeated"}
    ]
    assert f"query.{repeated}" in problem["detail"], problem


NO_TIME_TRAVEL = ["/history/stats", "/compactions", "/leaf", "/prompts", "/messages/m1", ""]
"""Reads of a session that take no ``as_of_seq``, which another read of it takes (``history``,
``context``, ``system-prompt``)."""
UNKNOWN_QUERY = [
    *(("GET", f"/v1/sessions/{{sid}}{tail}", "as_of_seq=2", "as_of_seq") for tail in NO_TIME_TRAVEL),
    # a misspelt parameter answered its default
    ("GET", "/v1/sessions/{sid}/history", "leaf_id=m1&as_of=1", "as_of"),
    ("GET", "/v1/sessions/{sid}/history", "compact=false", "compact"),
    ("GET", "/v1/sessions", "sort=recent", "sort"),
    ("GET", "/v1/sessions/{sid}/events", "from=2", "from"),
    # writes: nothing is written
    ("POST", "/v1/sessions/{sid}/messages", "parent_id=m1", "parent_id"),
    ("DELETE", "/v1/sessions/{sid}/messages", "ids=m1&all=true", "all"),
    ("POST", "/v1/sessions/{sid}/messages:clear", "min_seq=1", "min_seq"),
]


@pytest.mark.parametrize(
    ("method", "path", "query", "unknown"), UNKNOWN_QUERY, ids=[" ".join(u[:3]) for u in UNKNOWN_QUERY]
)
async def test_a_query_parameter_the_route_does_not_take_is_422_naming_it_and_changes_nothing(
    client: httpx.AsyncClient, method: str, path: str, query: str, unknown: str
) -> None:
    """(It was ignored: ``history/stats?as_of_seq=3`` answered the current state to a client that
    believed it had asked for the past, a misspelt parameter its default.)"""
    sid = new_sid()
    await chain(client, sid, ["m1", "m2"])
    before, last = await events(client, sid), await stream_last_seq(client)
    body = {"message": msg("m3", "three")} if path.endswith("/messages") and method == "POST" else None
    r = await client.request(method, f"{path.format(sid=sid)}?{query}", json=body)
    problem = assert_problem(r, 422, "invalid_request")
    [error] = problem["errors"]
    assert (error["loc"], error["type"]) == (["query", unknown], "extra_forbidden"), problem
    assert error["msg"].startswith("not a parameter of this route (it takes "), error
    assert problem["detail"].startswith(f"query.{unknown}: not a parameter of this route"), problem
    assert await events(client, sid) == before
    assert await stream_last_seq(client) == last


async def test_the_parameters_a_route_takes_and_min_seq_on_every_read_are_taken(client: httpx.AsyncClient) -> None:
    """``min_seq`` on a read that does not declare it is taken (the SDK sends it with every read
    after a write); the parameters a route declares are taken as before."""
    sid = new_sid()
    seq = await chain(client, sid, ["m1", "m2"])
    for path in (
        "/v1/whoami",
        "/v1/erasures",
        "/v1/quarantine",
        "/v1/nats",
        f"/v1/sessions/{sid}/last-seq",
        f"/v1/sessions/{sid}/events",
        f"/v1/sessions/{sid}/history/stats",
    ):
        r = await client.get(path, params={"min_seq": seq})
        assert r.status_code == 200, (path, r.text)
    r = await client.get(
        f"/v1/sessions/{sid}/history", params={"leaf_id": "m1", "compacted": "false", "as_of_seq": seq}
    )
    assert [m["id"] for m in r.json()["messages"]] == ["m1"], r.text
    r = await client.get(f"/v1/sessions/{sid}/history/stats", params={"leaf_id": "m2", "min_seq": seq})
    assert [row["id"] for row in r.json()["rows"]] == ["m1", "m2"], r.text


async def test_a_list_parameter_may_repeat(client: httpx.AsyncClient) -> None:
    sid = new_sid()
    await chain(client, sid, ["m1", "m2", "m3"])
    r = await client.delete(f"/v1/sessions/{sid}/messages?ids=m2&ids=m3")
    assert r.status_code == 200, r.text
    history = await client.get(f"/v1/sessions/{sid}/history", params={"min_seq": r.json()["seq"]})
    assert [m["id"] for m in history.json()["messages"]] == ["m1"]


@pytest.mark.parametrize("path", ["path-length", "history/stats"])
@pytest.mark.parametrize("leaf_id", ["", LONG_ID, "a\u0001b"])
async def test_path_reads_validate_leaf_id(client: httpx.AsyncClient, path: str, leaf_id: str) -> None:
    r = await client.get(f"/v1/sessions/{new_sid()}/{path}", params={"leaf_id": leaf_id})
    assert_problem(r, 422, "invalid_id")


async def test_bad_ids_on_delete_writes_nothing(client: httpx.AsyncClient) -> None:
    sid = new_sid()
    await chain(client, sid, ["m1"])
    before = await events(client, sid)
    assert_problem(await client.delete(f"/v1/sessions/{sid}/messages", params={"ids": ""}), 422, "invalid_request")
    assert_problem(await client.delete(f"/v1/sessions/{sid}/messages", params={"ids": ","}), 422, "invalid_request")
    r = await client.delete(f"/v1/sessions/{sid}/messages", params={"ids": f"m1,{LONG_ID}"})
    assert_problem(r, 422, "invalid_id")
    assert await events(client, sid) == before


async def test_missing_authorization(anon: httpx.AsyncClient) -> None:
    sid = new_sid()
    last = await stream_last_seq(anon)
    for method, path, body in [
        ("POST", f"/v1/sessions/{sid}/messages", append_body(msg("m1", "x"))),
        ("POST", "/v1/sessions", {"id": sid}),
        ("GET", f"/v1/sessions/{sid}/history", None),
        ("GET", "/v1/sessions", None),
        ("GET", "/v1/search?q=x", None),
        ("GET", f"/v1/sessions/{sid}/events", None),
        ("DELETE", f"/v1/sessions/{sid}/messages", None),
    ]:
        r = await anon.request(method, path, json=body)
        assert_problem(r, 401, "unauthorized")
        assert r.headers.get("www-authenticate", "").lower().startswith("bearer")
    assert await stream_last_seq(anon) == last


@pytest.mark.parametrize(
    "header",
    ["Bearer wrong-key", "Bearer", "Basic dXNlcjpwYXNz", "key-a-only", "Token abc", "Bearer a b"],
)
async def test_wrong_api_key(anon: httpx.AsyncClient, client: httpx.AsyncClient, header: str) -> None:
    sid = new_sid()
    last = await stream_last_seq(anon)
    h = {"Authorization": header}
    r = await anon.post(f"/v1/sessions/{sid}/messages", json=append_body(msg("m1", "x")), headers=h)
    assert_problem(r, 401, "unauthorized")
    r = await anon.get(f"/v1/sessions/{sid}/history", headers=h)
    assert_problem(r, 401, "unauthorized")
    assert await stream_last_seq(anon) == last
    assert await events(client, sid) == []


@pytest.mark.parametrize(
    "second",
    ["same", "other-tenant", "wrong"],
    ids=["the-same-key-twice", "another-tenants-key", "a-wrong-key"],
)
async def test_more_than_one_authorization_header_is_401_and_changes_nothing(
    anon: httpx.AsyncClient, client: httpx.AsyncClient, client_b: httpx.AsyncClient, second: str
) -> None:
    """A proxy appending its own credentials, or a confused client: the request is not taken as
    whichever key comes first (nor last), on the hot paths (append, history) as on the routes."""
    sid = new_sid()
    await chain(client, sid, ["m1"])
    before, last = await events(client, sid), await stream_last_seq(client)
    first = client.headers["authorization"]
    then = {"same": first, "other-tenant": client_b.headers["authorization"], "wrong": "Bearer wrong-key"}[second]
    for pair in ([first, then], [then, first]):
        headers = [("Authorization", value) for value in pair]
        for method, path, body in [
            ("POST", f"/v1/sessions/{sid}/messages", append_body(msg("m2", "two"))),  # the hot append
            ("GET", f"/v1/sessions/{sid}/history", None),  # the hot history read
            ("POST", "/v1/sessions", {"id": f"{sid}-new"}),
            ("POST", f"/v1/sessions/{sid}/messages:batch", {"messages": [msg("m3", "three")]}),
            ("GET", f"/v1/sessions/{sid}", None),
            ("GET", "/v1/sessions", None),
            ("DELETE", f"/v1/sessions/{sid}", None),
        ]:
            r = await anon.request(method, path, json=body, headers=headers)
            problem = assert_problem(r, 401, "ambiguous_credentials")
            assert "this request has 2" in problem["detail"], problem
            assert r.headers["www-authenticate"] == "Bearer"
    assert await events(client, sid) == before
    assert await stream_last_seq(client) == last
    assert_problem(await client.get(f"/v1/sessions/{sid}-new"), 404, "session_not_found")
    assert (await client.get(f"/v1/sessions/{sid}")).status_code == 200  # the DELETE did nothing
    assert await events(client_b, sid) == []  # nor was it taken as tenant-b's
    assert_problem(await client_b.get(f"/v1/sessions/{sid}-new"), 404, "session_not_found")


async def test_one_authorization_header_is_still_enough(anon: httpx.AsyncClient, client: httpx.AsyncClient) -> None:
    """The refusal counts headers, not requests with some other header alike."""
    sid = new_sid()
    headers = [("Authorization", client.headers["authorization"]), ("X-Authorization", "Bearer wrong-key")]
    r = await anon.post(f"/v1/sessions/{sid}/messages", json=append_body(msg("m1", "one")), headers=headers)
    assert r.status_code == 201, r.text
    seq = r.json()["seq"]
    assert (await client.get(f"/v1/sessions/{sid}/messages/m1", params={"min_seq": seq})).status_code == 200


async def test_bearer_scheme_is_case_insensitive(anon: httpx.AsyncClient, client: httpx.AsyncClient) -> None:
    token = client.headers["authorization"].split(" ", 1)[1]
    r = await anon.get(f"/v1/sessions/{new_sid()}", headers={"Authorization": f"bearer {token}"})
    assert_problem(r, 404, "session_not_found")  # authenticated: the session is looked up


async def test_unauthenticated_malformed_body_is_401(anon: httpx.AsyncClient) -> None:
    """Authentication comes before parsing: an anonymous caller learns nothing about the body rules."""
    r = await anon.post(f"/v1/sessions/{new_sid()}/messages", content=b"{", headers=_json)
    assert_problem(r, 401, "unauthorized")


async def test_unauthenticated_invalid_body_is_401(anon: httpx.AsyncClient) -> None:
    r = await anon.post(f"/v1/sessions/{new_sid()}/messages", json={"message": {"parts": 1}})
    assert_problem(r, 401, "unauthorized")


async def test_roles_are_free_strings(client: httpx.AsyncClient) -> None:
    sid = new_sid()
    for role in ["narrator", "system", "tool", "Critic 2", "ü-role"]:
        out = await append(client, sid, msg(f"m-{role}", f"spoken by {role}", role=role))
        r = await client.get(
            f"/v1/sessions/{sid}/messages/{quote(f'm-{role}', safe='')}", params={"min_seq": out["seq"]}
        )
        assert r.json()["role"] == role


async def test_unknown_route_and_method_are_problems(client: httpx.AsyncClient) -> None:
    assert_problem(await client.get("/v1/nope"), 404, "not_found")
    assert_problem(await client.put("/v1/sessions"), 405, "method_not_allowed")
