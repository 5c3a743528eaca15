"""The form of a request, checked before its content: a body declared as something else than JSON
is ``415 unsupported_media_type`` (no Content-Type at all is taken as JSON; more than one is
refused), a body over the
bound is ``413`` before it is read, a path that is not UTF-8 once percent-decoded is ``422
invalid_id`` and a query that is not ``422 invalid_request`` (never folded into U+FFFD), the
session ids ``.`` and ``..`` are refused, a 405 names what is allowed, and ``path-length`` of an
unknown leaf says ``leaf_id: null`` as the other path reads do. Against the API as a real
process."""

from __future__ import annotations

import asyncio
import gzip
import json
from typing import Any
from urllib.parse import quote, urlsplit

import httpx
import pytest

from tests.conftest import KEYS
from tests.e2e.helpers import append, assert_problem, chain, events, msg, new_sid, stream_last_seq

JSON = {"Content-Type": "application/json"}


def _json_routes(sid: str) -> list[tuple[str, str, dict[str, Any]]]:
    """(method, path, a valid body) of every route that takes a JSON body."""
    return [
        ("POST", "/v1/sessions", {"id": f"{sid}-new"}),
        ("PATCH", f"/v1/sessions/{sid}", {"name": "renamed"}),
        ("POST", f"/v1/sessions/{sid}/messages", {"message": msg("m9", "nine")}),
        ("POST", f"/v1/sessions/{sid}/messages:batch", {"messages": [msg("m9", "nine")]}),
        ("PUT", f"/v1/sessions/{sid}/messages/m1", {"message": msg("m1", "changed")}),
        ("POST", f"/v1/sessions/{sid}/fork", {"at_message_id": "m1", "id": f"{sid}-fork"}),
        ("POST", f"/v1/sessions/{sid}/messages:delete", {"ids": ["m1"]}),
        ("PUT", f"/v1/sessions/{sid}/config", {"blocks": [{"label": "mem", "kind": "memory"}]}),
        ("POST", f"/v1/sessions/{sid}/usage", {"input_tokens": 1}),
        ("POST", f"/v1/sessions/{sid}/compact", {"leaf_id": "m1"}),
        ("POST", f"/v1/sessions/{sid}:end", {"reason": "compaction"}),
        ("PUT", f"/v1/sessions/{sid}/context/mem", {"content": "x"}),
        ("POST", f"/v1/sessions/{sid}/tools/set_context", {"label": "mem", "content": "x"}),
    ]


@pytest.mark.parametrize(
    "content_type",
    ["application/x-www-form-urlencoded", "text/plain", "text/json", "application/jsonx", "multipart/form-data"],
)
async def test_a_body_not_sent_as_json_is_415_and_changes_nothing(client: httpx.AsyncClient, content_type: str) -> None:
    sid = new_sid()
    await chain(client, sid, ["m1", "m2"])
    before, last = await events(client, sid), await stream_last_seq(client)
    for method, path, body in _json_routes(sid):
        r = await client.request(method, path, content=json.dumps(body), headers={"Content-Type": content_type})
        problem = assert_problem(r, 415, "unsupported_media_type")
        assert "application/json" in problem["detail"], problem
        assert content_type in problem["detail"], problem
    assert await events(client, sid) == before
    assert await stream_last_seq(client) == last
    assert_problem(await client.get(f"/v1/sessions/{sid}-new"), 404, "session_not_found")


@pytest.mark.parametrize(
    "content_types",
    [("text/plain", "application/json"), ("application/json", "text/plain"), ("application/json",) * 2],
)
async def test_a_body_with_more_than_one_content_type_is_415_on_every_route_and_changes_nothing(
    client: httpx.AsyncClient, content_types: tuple[str, ...]
) -> None:
    """A proxy may judge the first header and the API the last (the hot append path read the last,
    the other routes the first): each route refuses the request alike, whichever is JSON."""
    sid = new_sid()
    await chain(client, sid, ["m1", "m2"])
    before, last = await events(client, sid), await stream_last_seq(client)
    headers = [("Content-Type", t) for t in content_types]
    for method, path, body in _json_routes(sid):
        r = await client.request(method, path, content=json.dumps(body), headers=headers)
        problem = assert_problem(r, 415, "unsupported_media_type")
        assert "more than one Content-Type" in problem["detail"], (path, problem)
    assert await events(client, sid) == before
    assert await stream_last_seq(client) == last


@pytest.mark.parametrize(
    "encoding", ["gzip", "br", "deflate", "GZIP", "identity, gzip", "x-unknown"], ids=lambda e: e.replace(" ", "")
)
async def test_a_coded_body_is_415_naming_the_coding_and_changes_nothing(
    client: httpx.AsyncClient, encoding: str
) -> None:
    """A body sent with a content coding was read as text: ``400 malformed_json``, "not UTF-8".
    Every route refuses it unread, the coding named (the hot append path too)."""
    sid = new_sid()
    await chain(client, sid, ["m1", "m2"])
    before, last = await events(client, sid), await stream_last_seq(client)
    for method, path, body in _json_routes(sid):
        coded = gzip.compress(json.dumps(body).encode())
        r = await client.request(method, path, content=coded, headers={**JSON, "Content-Encoding": encoding})
        problem = assert_problem(r, 415, "unsupported_content_encoding")
        assert encoding.split(", ")[-1].lower() in problem["detail"], problem
        assert r.headers["accept-encoding"] == "identity"
    assert await events(client, sid) == before
    assert await stream_last_seq(client) == last
    assert_problem(await client.get(f"/v1/sessions/{sid}-new"), 404, "session_not_found")


async def test_a_coded_body_without_a_key_is_401_and_identity_is_no_coding(
    client: httpx.AsyncClient, anon: httpx.AsyncClient
) -> None:
    coded = {**JSON, "Content-Encoding": "gzip"}
    assert_problem(await anon.post("/v1/sessions", content=gzip.compress(b"{}"), headers=coded), 401, "unauthorized")
    sid = new_sid()
    r = await client.post("/v1/sessions", json={"id": sid}, headers={"Content-Encoding": "identity"})
    assert r.status_code == 201, r.text


@pytest.mark.parametrize(
    "content_type",
    [None, "application/json", "application/json; charset=utf-8", "Application/JSON", "application/merge-patch+json"],
)
async def test_a_json_body_is_taken_with_any_json_type_or_none(
    client: httpx.AsyncClient, content_type: str | None
) -> None:
    sid = new_sid()
    headers = {} if content_type is None else {"Content-Type": content_type}
    r = await client.post("/v1/sessions", content=json.dumps({"id": sid}), headers=headers)
    assert r.status_code == 201, r.text
    r = await client.post(
        f"/v1/sessions/{sid}/messages", content=json.dumps({"message": msg("m1", "one")}), headers=headers
    )
    assert r.status_code == 201, r.text
    history = await client.get(f"/v1/sessions/{sid}/history", params={"min_seq": r.json()["seq"]})
    assert [m["id"] for m in history.json()["messages"]] == ["m1"]


async def test_a_route_without_a_body_ignores_the_content_type(client: httpx.AsyncClient) -> None:
    sid = new_sid()
    seq = await chain(client, sid, ["m1"])
    r = await client.get(f"/v1/sessions/{sid}/history", params={"min_seq": seq}, headers={"Content-Type": "text/plain"})
    assert r.status_code == 200, r.text


async def _raw(url: str, request: bytes) -> tuple[int, dict[str, str], dict[str, Any]]:
    status, headers, body = await _raw_bytes(url, request)
    return status, headers, json.loads(body)


async def _raw_bytes(url: str, request: bytes) -> tuple[int, dict[str, str], bytes]:
    parts = urlsplit(url)
    reader, writer = await asyncio.open_connection(parts.hostname, parts.port)
    try:
        writer.write(request)
        await writer.drain()
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
        status_line, *lines = head.decode("latin-1").split("\r\n")[:-2]
        headers = {k.lower(): v.strip() for k, v in (line.split(":", 1) for line in lines)}
        body = await asyncio.wait_for(reader.readexactly(int(headers["content-length"])), 10)
        return int(status_line.split()[1]), headers, body
    finally:
        writer.close()


@pytest.mark.parametrize(
    "framing",
    [
        b"Content-Length: -1\r\n\r\n",
        b"Content-Length: abc\r\n\r\n",
        b"Content-Length: 10, 10\r\n\r\n0123456789",
        b"Content-Length: 1\r\nContent-Length: 2\r\n\r\nab",
        b"Content-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
        b"Transfer-Encoding: chunked\r\n\r\nzz\r\nabc\r\n0\r\n\r\n",
    ],
)
async def test_broken_framing_is_the_http_servers_plain_text_400_and_writes_nothing(
    client: httpx.AsyncClient, api_url: str, framing: bytes
) -> None:
    """What docs/http-api.md (Errors) says of a request the HTTP server cannot frame: its own
    plain-text 400, before Chronicle sees it (no problem+json), and the connection closed."""
    last = await stream_last_seq(client)
    head = f"POST /v1/sessions HTTP/1.1\r\nHost: chronicle\r\nAuthorization: Bearer {KEYS['tenant-a']}\r\n"
    status, headers, body = await _raw_bytes(api_url, head.encode() + b"Content-Type: application/json\r\n" + framing)
    assert (status, headers["content-type"], body) == (
        400,
        "text/plain; charset=utf-8",
        b"Invalid HTTP request received.",
    )
    assert headers["connection"] == "close"
    assert await stream_last_seq(client) == last


async def test_a_head_over_the_default_bound_is_431_from_the_api_process(
    client: httpx.AsyncClient, api_url: str
) -> None:
    """``chronicle api`` serves with the head bounds (tests/integration/test_http_head_bounds.py
    has the rest): 64 KiB of request line and headers, default settings."""
    last = await stream_last_seq(client)
    request = (
        f"POST /v1/sessions HTTP/1.1\r\nHost: chronicle\r\nAuthorization: Bearer {KEYS['tenant-a']}\r\n"
        f"X-Pad: {'p' * 64 * 1024}\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{{}}"
    ).encode()
    status, headers, body = await _raw(api_url, request)
    assert (status, body["code"]) == (431, "header_too_large"), body
    assert headers["connection"] == "close"
    assert await stream_last_seq(client) == last


@pytest.mark.parametrize("path", ["/v1/sessions", "/v1/sessions/{sid}/messages"])
async def test_a_declared_length_over_the_default_bound_is_413_at_once(
    client: httpx.AsyncClient, api_url: str, path: str
) -> None:
    sid = new_sid()
    request = (
        f"POST {path.format(sid=sid)} HTTP/1.1\r\nHost: chronicle\r\nAuthorization: Bearer {KEYS['tenant-a']}\r\n"
        "Content-Type: application/json\r\nContent-Length: 10000000000\r\n\r\n"
    ).encode()
    status, headers, body = await _raw(api_url, request)  # no body sent: the answer does not wait for it
    assert (status, body["code"]) == (413, "payload_too_large"), body
    assert headers["connection"] == "close"
    assert_problem(await client.get(f"/v1/sessions/{sid}"), 404, "session_not_found")


async def test_a_declared_length_over_the_bound_without_a_key_is_401(api_url: str) -> None:
    request = b"POST /v1/sessions HTTP/1.1\r\nHost: chronicle\r\nContent-Length: 10000000000\r\n\r\n"
    status, _, body = await _raw(api_url, request)
    assert (status, body["code"]) == (401, "unauthorized"), body


@pytest.mark.parametrize(
    "bad",
    ["%FF", "%FE", "%C0%AF", "%E0%80%AF", "%ED%A0%80", "a%80b", "%F4%90%80%80"],
    ids=["ff", "fe", "overlong-2", "overlong-3", "surrogate", "lone-continuation", "beyond-unicode"],
)
async def test_a_path_that_is_not_utf8_is_422_and_creates_nothing(client: httpx.AsyncClient, bad: str) -> None:
    tag = new_sid()
    last = await stream_last_seq(client)
    requests: list[tuple[str, str, dict[str, Any] | None]] = [
        ("POST", f"/v1/sessions/{tag}{bad}/messages", {"message": msg("m1", "one")}),
        ("GET", f"/v1/sessions/{tag}{bad}/history", None),
        ("PUT", f"/v1/sessions/{tag}{bad}/config", {"blocks": []}),
        ("GET", f"/v1/nope{bad}", None),
    ]
    for method, path, body in requests:
        r = await client.request(method, path, json=body)
        problem = assert_problem(r, 422, "invalid_id")
        assert "UTF-8" in problem["detail"], problem
    assert await stream_last_seq(client) == last
    replaced = quote(f"{tag}\ufffd", safe="")  # what the bad bytes used to become
    assert_problem(await client.get(f"/v1/sessions/{replaced}"), 404, "session_not_found")


@pytest.mark.parametrize("bad", ["%FF", "%FE", "%C0%AF", "%ED%A0%80"])
async def test_a_query_that_is_not_utf8_is_422_and_deletes_nothing(client: httpx.AsyncClient, bad: str) -> None:
    sid = new_sid()
    out = await append(client, sid, msg("\ufffd", "named by the replacement character"))
    last = await stream_last_seq(client)
    r = await client.delete(f"/v1/sessions/{sid}/messages?ids={bad}")  # once, this deleted the message "\ufffd"
    problem = assert_problem(r, 422, "invalid_request")
    assert "UTF-8" in problem["detail"], problem
    r = await client.get(f"/v1/sessions/{sid}/history?leaf_id={bad}")
    assert_problem(r, 422, "invalid_request")
    assert await stream_last_seq(client) == last
    history = await client.get(f"/v1/sessions/{sid}/history", params={"min_seq": out["seq"]})
    assert [m["id"] for m in history.json()["messages"]] == ["\ufffd"]


async def test_a_real_replacement_character_in_an_id_still_works(client: httpx.AsyncClient) -> None:
    sid = f"{new_sid()}\ufffd"
    path = f"/v1/sessions/{quote(sid, safe='')}"
    assert "%EF%BF%BD" in path
    out = await append(client, sid, msg("m\ufffd", "one"))
    history = await client.get(f"{path}/history", params={"min_seq": out["seq"]})
    assert [m["id"] for m in history.json()["messages"]] == ["m\ufffd"]
    assert (await client.get(path)).json()["id"] == sid


@pytest.mark.parametrize("dots", [".", ".."])
async def test_dot_session_ids_are_refused(client: httpx.AsyncClient, dots: str) -> None:
    sid = new_sid()
    await chain(client, sid, ["m1"])
    last = await stream_last_seq(client)
    assert_problem(await client.post("/v1/sessions", json={"id": dots}), 422, "invalid_id")
    r = await client.post(f"/v1/sessions/{sid}/fork", json={"at_message_id": "m1", "id": dots})
    assert_problem(r, 422, "invalid_id")
    r = await client.post("/v1/sessions", json={"id": f"{sid}-child", "parent_session_id": dots})
    assert_problem(r, 422, "invalid_id")
    encoded = dots.replace(".", "%2E")  # reaches the server as the dot segment itself
    r = await client.post(f"/v1/sessions/{encoded}/messages", json={"message": msg("m1", "one")})
    assert_problem(r, 422, "invalid_id")
    assert await stream_last_seq(client) == last


async def test_ids_made_of_more_than_a_dot_segment_are_fine(client: httpx.AsyncClient) -> None:
    tag = new_sid()
    for sid in (f".{tag}", f"{tag}.", f"..{tag}", f"...{tag}"):
        assert (await client.post("/v1/sessions", json={"id": sid})).status_code == 201
    r = await client.post("/v1/sessions", json={"id": "..."})  # made by an earlier run of this test, or now
    assert r.status_code in (201, 409), r.text


async def test_path_length_of_an_unknown_leaf_is_null_as_history_says(client: httpx.AsyncClient) -> None:
    sid = new_sid()
    seq = await chain(client, sid, ["m1", "m2"])
    reads = {
        path: (await client.get(f"/v1/sessions/{sid}/{path}", params={"leaf_id": "nope", "min_seq": seq})).json()
        for path in ("history", "history/stats", "path-length")
    }
    assert [reads[p]["leaf_id"] for p in reads] == [None, None, None], reads
    assert reads["path-length"] == {"leaf_id": None, "length": 0}
    known = await client.get(f"/v1/sessions/{sid}/path-length", params={"leaf_id": "m2"})
    assert known.json() == {"leaf_id": "m2", "length": 2}
    latest = await client.get(f"/v1/sessions/{sid}/path-length")
    assert latest.json() == {"leaf_id": "m2", "length": 2}


async def test_405_names_every_method_the_path_takes(client: httpx.AsyncClient, anon: httpx.AsyncClient) -> None:
    doc = (await anon.get("/openapi.json")).json()
    sid = new_sid()
    for template, method in [
        ("/v1/sessions", "PUT"),
        ("/v1/sessions/{sid}", "POST"),
        ("/v1/sessions/{sid}/messages", "PUT"),
        ("/v1/sessions/{sid}/config", "POST"),
        ("/v1/sessions/{sid}/messages/{mid}", "POST"),
    ]:
        r = await client.request(method, template.format(sid=sid, mid="m1"))
        assert_problem(r, 405, "method_not_allowed")
        allowed = set(r.headers["allow"].split(", "))
        assert allowed == {m.upper() for m in doc["paths"][template]}, (template, allowed)
        for other in allowed:  # each one it names is taken (answered, not 405)
            assert (await client.request(other, template.format(sid=sid, mid="m1"))).status_code != 405


async def test_405_inside_the_auditor_views_files_names_what_they_take(anon: httpx.AsyncClient) -> None:
    r = await anon.post("/audit/static/app.js")
    assert r.status_code == 405, r.text
    assert r.headers["allow"], "an empty Allow says no method is allowed"
    assert "GET" in r.headers["allow"].split(", ")
