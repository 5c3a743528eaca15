"""The SDK's HTTP behaviour against a scripted transport: bodies, min_seq, typed errors, retries."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from chronicle_sdk import (
    OMITTED,
    ChronicleClient,
    ChronicleError,
    Conflict,
    MessageConflict,
    NotFound,
    ProjectionTimeout,
    ReadOnlyBlock,
    ServerError,
    Session,
    SessionManager,
    Unauthorized,
    Unavailable,
    UnknownParent,
    format_session_search,
)
from chronicle_sdk.errors import error_from_problem
from chronicle_sdk.tools import ToolDefinition, Tools
from chronicle_sdk.types import SearchResult

Handler = Callable[[httpx.Request], httpx.Response]


class Recorder:
    """A mock transport that records requests and answers from ``handler``."""

    def __init__(self, handler: Handler) -> None:
        self.requests: list[httpx.Request] = []
        self._handler = handler

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        return self._handler(request)

    def client(self, **kw: Any) -> ChronicleClient:
        kw.setdefault("backoff_s", 0.0)
        return ChronicleClient("http://chronicle.test", "key", transport=httpx.MockTransport(self), **kw)

    def bodies(self, method: str = "POST") -> list[Any]:
        return [json.loads(r.content) for r in self.requests if r.method == method and r.content]

    def params(self, path_suffix: str) -> list[dict[str, str]]:
        return [dict(r.url.params) for r in self.requests if r.url.path.endswith(path_suffix)]


def problem(status: int, code: str, detail: str = "") -> httpx.Response:
    body = {"type": f"https://chronicle.dev/problems/{code}", "title": code, "status": status, "code": code}
    if detail:
        body["detail"] = detail
    return httpx.Response(status, json=body, headers={"content-type": "application/problem+json"})


def appended(request: httpx.Request, seq: int = 7) -> httpx.Response:
    body = json.loads(request.content)
    return httpx.Response(201, json={"id": body["message"]["id"], "parent_id": None, "seq": seq, "created": True})


def msg(mid: str) -> dict[str, Any]:
    return {"id": mid, "role": "user", "parts": [{"type": "text", "text": mid}]}


async def test_parent_omitted_null_or_id_in_the_body() -> None:
    rec = Recorder(appended)
    async with rec.client() as c:
        s = Session.create(c, "s1")
        await s.append_message(msg("a"))
        await s.append_message(msg("b"), OMITTED)
        await s.append_message(msg("c"), None)
        await s.append_message(msg("d"), "a")
    assert [("parent_id" in b, b.get("parent_id")) for b in rec.bodies()] == [
        (False, None),
        (False, None),
        (True, None),
        (True, "a"),
    ]
    assert rec.requests[0].headers["authorization"] == "Bearer key"


async def test_reads_wait_for_this_clients_writes() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        if request.method == "POST":
            return appended(request, seq=41 if "/s1/" in request.url.path else 12)
        if request.url.path == "/v1/search":
            return httpx.Response(200, json={"results": []})
        return httpx.Response(200, json={"leaf_id": None, "messages": []})

    rec = Recorder(handler)
    async with rec.client() as c:
        one, two, three = Session.create(c, "s1"), Session.create(c, "s2"), Session.create(c, "s3")
        await three.get_history()
        await one.append_message(msg("a"))
        await two.append_message(msg("b"))
        await one.get_history()
        await two.get_history()
        await three.get_history()
        await SessionManager(c).search("x")
        assert c.last_seq("s1") == 41
        assert c.last_seq() == 41
    assert rec.params("/history") == [{}, {"min_seq": "41"}, {"min_seq": "12"}, {}]
    assert rec.params("/v1/search") == [{"q": "x", "limit": "20", "min_seq": "41"}]


@pytest.mark.parametrize(
    ("response", "cls", "code"),
    [
        (problem(422, "unknown_parent", "parent message 'x' is not in this session"), UnknownParent, "unknown_parent"),
        (problem(409, "message_conflict"), MessageConflict, "message_conflict"),
        (problem(409, "readonly_block", 'Block "soul" is readonly'), ReadOnlyBlock, "readonly_block"),
        (problem(409, "something_new"), Conflict, "something_new"),
        (problem(401, "unauthorized"), Unauthorized, "unauthorized"),
        (httpx.Response(404, text="nope"), NotFound, "not_found"),
        (httpx.Response(500, json={"detail": "boom"}), ServerError, "internal_error"),
    ],
)
def test_problem_codes_map_to_typed_errors(response: httpx.Response, cls: type[ChronicleError], code: str) -> None:
    try:
        body: Any = response.json()
    except ValueError:
        body = response.text
    err = error_from_problem(response.status_code, body)
    assert type(err) is cls
    assert err.code == code
    assert err.status == response.status_code
    if isinstance(body, dict) and "detail" in body:
        assert err.detail == body["detail"]


async def test_conflicts_share_a_base_and_carry_the_servers_message() -> None:
    rec = Recorder(lambda r: problem(409, "readonly_block", 'Block "soul" is readonly'))
    async with rec.client() as c:
        with pytest.raises(Conflict) as info:
            await Session.create(c, "s").replace_context_block("soul", "x")
    assert isinstance(info.value, ReadOnlyBlock)
    assert info.value.detail == 'Block "soul" is readonly'
    assert len(rec.requests) == 1  # not transient: no retry


async def test_transient_reads_are_retried_then_succeed() -> None:
    answers = [problem(503, "projection_timeout"), httpx.Response(502), httpx.Response(200, json={"messages": []})]
    rec = Recorder(lambda r: answers.pop(0))
    async with rec.client() as c:
        assert await Session.create(c, "s").get_history() == []
    assert len(rec.requests) == 3


async def test_retries_are_bounded() -> None:
    rec = Recorder(lambda r: problem(503, "projection_timeout"))
    async with rec.client(retries=2) as c:
        with pytest.raises(ProjectionTimeout):
            await Session.create(c, "s").get_history()
    assert len(rec.requests) == 3


async def test_connection_errors_are_retried() -> None:
    calls = {"n": 0}

    def handler(request: httpx.Request) -> httpx.Response:
        calls["n"] += 1
        if calls["n"] < 3:
            raise httpx.ConnectError("refused", request=request)
        return appended(request)

    rec = Recorder(handler)
    async with rec.client() as c:
        result = await Session.create(c, "s").append_message(msg("a"))
    assert result.seq == 7
    assert calls["n"] == 3


async def test_non_idempotent_posts_are_not_retried_after_they_may_have_run() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/tools/set_context"):
            raise httpx.ReadTimeout("slow", request=request)
        return problem(503, "unavailable")

    rec = Recorder(handler)
    async with rec.client() as c:
        s = Session.create(c, "s")
        with pytest.raises(Unavailable):
            await s.execute_tool("set_context", {"label": "memory", "content": "x"})
        assert len(rec.requests) == 1
        with pytest.raises(Unavailable):
            await s.refresh_system_prompt()
        assert len(rec.requests) == 2


async def test_get_message_unknown_is_none() -> None:
    rec = Recorder(lambda r: problem(404, "message_not_found"))
    async with rec.client() as c:
        assert await Session.create(c, "s").get_message("x") is None


async def test_config_is_sent_once_and_only_when_it_differs() -> None:
    stored: dict[str, Any] = {"config": {"blocks": []}}

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/config"):
            if request.method == "PUT":
                stored["config"] = json.loads(request.content)
                return httpx.Response(200, json={"config": stored["config"], "seq": 3})
            return httpx.Response(200, json=stored)
        return httpx.Response(200, json={"messages": []})

    rec = Recorder(handler)
    async with rec.client() as c:
        s = Session.create(c, "s").with_context("memory", description="Facts", max_tokens=10).compact_after(500)
        await s.get_history()
        await s.get_history()
        await (
            Session.create(c, "s")
            .with_context("memory", description="Facts", max_tokens=10)
            .compact_after(500)
            .get_history()
        )
        await Session.create(c, "s").get_history()  # no builder calls: nothing sent
    puts = [json.loads(r.content) for r in rec.requests if r.method == "PUT"]
    assert puts == [
        {
            "blocks": [{"label": "memory", "description": "Facts", "max_tokens": 10, "kind": "writable"}],
            "compaction": {"compact_after": 500},
        }
    ]
    assert rec.params("/history")[1] == {"min_seq": "3"}


async def test_system_prompt_waits_for_the_clients_own_refresh() -> None:
    prompts = [{"prompt": "old", "tokens": 1, "version": 1, "seq": 5}] * 2 + [
        {"prompt": "new", "tokens": 1, "version": 2, "seq": 9}
    ]

    def handler(request: httpx.Request) -> httpx.Response:
        if request.method == "POST":
            return httpx.Response(200, json={"prompt": "new", "tokens": 1, "version": 2, "seq": 9})
        return httpx.Response(200, json=prompts.pop(0))

    rec = Recorder(handler)
    async with rec.client() as c:
        s = Session.create(c, "s")
        assert await s.refresh_system_prompt() == "new"
        assert await s.freeze_system_prompt() == "new"
    assert len(rec.requests) == 4


async def test_session_search_formatting_and_limit() -> None:
    results = [
        {"id": "a", "session_id": "s1", "role": "user", "content": "deploy to production", "rank": 0.5},
        {"id": "b", "session_id": "s2", "role": "assistant", "content": "deployed", "rank": 0.1},
    ]
    answers = [{"results": results}, {"results": []}]
    rec = Recorder(lambda r: httpx.Response(200, json=answers.pop(0)))
    async with rec.client() as c:
        tools = SessionManager(c).tools()
        assert await tools.execute("session_search", '{"query": "deploy"}') == (
            "[user] deploy to production\n---\n[assistant] deployed"
        )
        assert await tools.execute("session_search", {"query": "zzz"}) == "No results found."
        assert await tools.execute("nope", {}) == 'Error: tool "nope" is not available in this session'
    assert rec.params("/v1/search")[0] == {"q": "deploy", "limit": "10"}
    assert format_session_search([SearchResult("x", "user", "hi")]) == "[user] hi"


async def test_tools_merge_and_formats() -> None:
    calls: list[tuple[str, dict[str, Any]]] = []

    async def run(name: str, args: dict[str, Any]) -> str:
        calls.append((name, args))
        return "ok"

    a = Tools([ToolDefinition("one", "first", {"type": "object"})], {"one": run})
    b = Tools([ToolDefinition("two", "second", {"type": "object"})], {"two": run})
    merged = a + b
    assert merged.names == ["one", "two"]
    assert merged.openai()[1] == {
        "type": "function",
        "function": {"name": "two", "description": "second", "parameters": {"type": "object"}},
    }
    assert merged.anthropic()[0] == {"name": "one", "description": "first", "input_schema": {"type": "object"}}
    assert await merged.execute("two", "") == "ok"
    assert await merged.execute("two", "[1]") == "Error: tool arguments must be a JSON object"
    assert calls == [("two", {})]
    assert not Tools([], {})


def test_jetstream_default_needs_nats_settings() -> None:
    with pytest.raises(ValueError, match="nats_url"):
        ChronicleClient("http://x", "k", append_via="jetstream")
