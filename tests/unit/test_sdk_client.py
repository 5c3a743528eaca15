"""The SDK's HTTP behaviour against a scripted transport: bodies, min_seq, typed errors, retries."""

from __future__ import annotations

import asyncio
import json
import math
import time
import tracemalloc
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from chronicle_sdk import (
    OMITTED,
    AppendResult,
    ChronicleClient,
    ChronicleError,
    Conflict,
    IdempotencyKeyReused,
    InvalidId,
    InvalidRequest,
    MessageConflict,
    MethodNotAllowed,
    NotFound,
    ParentCycle,
    PayloadTooLarge,
    ProjectionTimeout,
    RateLimited,
    ReadOnlyBlock,
    ReadOnlyKey,
    SearchTimeout,
    ServerError,
    Session,
    SessionExists,
    SessionManager,
    SessionNotFound,
    TransientError,
    Unauthorized,
    Unavailable,
    UnknownParent,
    Via,
    format_session_search,
)
from chronicle_sdk.client import REMEMBERED_SESSIONS, RETRY_BUDGET_S, _chain_stored
from chronicle_sdk.errors import MAX_RETRY_AFTER_S, SeqNotReached, UnknownCursor, error_from_problem
from chronicle_sdk.tools import MAX_QUERY_CHARS, ToolDefinition, Tools
from chronicle_sdk.types import NatsPublishing, SearchResult
from events.subjects import SubjectLayout

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
        kw.setdefault("retry_budget_s", 0.0)  # with no pauses, a budget of time would spin: count retries
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
        (problem(409, "parent_cycle", "the message would be its own ancestor"), ParentCycle, "parent_cycle"),
        (problem(422, "idempotency_key_reused"), IdempotencyKeyReused, "idempotency_key_reused"),
        (problem(422, "unknown_cursor", "cursor: no list gives it"), UnknownCursor, "unknown_cursor"),
        (
            problem(422, "seq_not_reached", "as_of_seq: 9 is past the log's last sequence"),
            SeqNotReached,
            "seq_not_reached",
        ),
        (problem(409, "readonly_block", 'Block "soul" is readonly'), ReadOnlyBlock, "readonly_block"),
        (problem(409, "something_new"), Conflict, "something_new"),
        (problem(401, "unauthorized"), Unauthorized, "unauthorized"),
        (problem(403, "read_only_key", "this API key only reads"), ReadOnlyKey, "read_only_key"),
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


async def test_a_search_timeout_is_raised_at_once_not_retried() -> None:
    """The same query would most likely time out again, each try holding a connection as long."""
    rec = Recorder(lambda r: problem(503, "search_timeout", "the search ran past CHRONICLE_SEARCH_TIMEOUT_S (3 s)"))
    async with rec.client() as c:
        with pytest.raises(SearchTimeout) as info:
            await Session.create(c, "s").search("a* b* c*")
    assert not isinstance(info.value, TransientError)
    assert (info.value.status, info.value.code) == (503, "search_timeout")
    assert len(rec.requests) == 1


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
        with pytest.raises(Unavailable, match="may have reached the server and been applied"):
            await s.execute_tool("set_context", {"label": "memory", "content": "x"})
        assert len(rec.requests) == 1
        with pytest.raises(Unavailable):
            await s.refresh_system_prompt()
        assert len(rec.requests) == 2


async def test_a_request_that_never_left_does_not_say_it_may_have_been_applied() -> None:
    def refused(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused", request=request)

    async with Recorder(refused).client(retries=0) as c:
        with pytest.raises(Unavailable) as caught:
            await Session.create(c, "s").execute_tool("set_context", {"label": "memory", "content": "x"})
    assert "refused" in caught.value.detail
    assert "may have" not in caught.value.detail


def timing_out_once(answer: Handler) -> Handler:
    """A handler whose first request times out after it may have reached the server."""
    calls = {"n": 0}

    def handler(request: httpx.Request) -> httpx.Response:
        calls["n"] += 1
        if calls["n"] == 1:
            raise httpx.ReadTimeout("slow", request=request)
        return answer(request)

    return handler


async def test_add_usage_is_retried_after_a_timeout_with_the_same_idempotency_key() -> None:
    added = {"id": "s1", "input_tokens": 10, "output_tokens": 2, "cost": 0.5, "seq": 8}
    rec = Recorder(timing_out_once(lambda r: httpx.Response(200, json=added)))
    async with rec.client() as c:
        await SessionManager(c).add_usage("s1", 10, 2, 0.5)
        assert c.last_seq("s1") == 8
    assert [r.url.path for r in rec.requests] == ["/v1/sessions/s1/usage"] * 2
    keys = [r.headers.get("idempotency-key") for r in rec.requests]
    assert keys[0] is not None
    assert keys[0] == keys[1]
    assert rec.bodies() == [{"input_tokens": 10, "output_tokens": 2, "cost": 0.5}] * 2


async def test_each_add_usage_call_has_its_own_idempotency_key() -> None:
    added = {"id": "s1", "input_tokens": 1, "output_tokens": 0, "cost": 0.0, "seq": 8}
    rec = Recorder(lambda r: httpx.Response(200, json=added))
    async with rec.client() as c:
        await SessionManager(c).add_usage("s1", 1)
        await SessionManager(c).add_usage("s1", 1)
    first, second = (r.headers.get("idempotency-key") for r in rec.requests)
    assert first != second


async def test_end_is_retried_after_a_timeout() -> None:
    ended = {"id": "s1", "end_reason": "done", "seq": 9}
    rec = Recorder(timing_out_once(lambda r: httpx.Response(200, json=ended)))
    async with rec.client() as c:
        await SessionManager(c).end("s1", "done")
        assert c.last_seq("s1") == 9
    assert [r.url.path for r in rec.requests] == ["/v1/sessions/s1:end"] * 2
    assert rec.bodies() == [{"reason": "done"}] * 2


def rate_limited(retry_after: float) -> httpx.Response:
    """The server's 429: a problem with ``retry_after`` and the header's whole seconds."""
    body = {
        "type": "about:blank",
        "title": "Too many requests for this tenant",
        "status": 429,
        "code": "rate_limited",
        "detail": "tenant over its limit",
        "retry_after": retry_after,
    }
    headers = {"content-type": "application/problem+json", "retry-after": str(max(1, math.ceil(retry_after)))}
    return httpx.Response(429, json=body, headers=headers)


def counting_sleeps(client: ChronicleClient, monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """The client's pauses between attempts, recorded instead of slept."""
    slept: list[float] = []

    async def sleep(seconds: float) -> None:
        slept.append(seconds)

    monkeypatch.setattr(client, "_sleep", sleep)
    return slept


async def test_a_rate_limited_append_waits_retry_after_then_succeeds(monkeypatch: pytest.MonkeyPatch) -> None:
    answers = [rate_limited(1.5)]
    rec = Recorder(lambda r: answers.pop(0) if answers else appended(r))
    async with rec.client() as c:
        slept = counting_sleeps(c, monkeypatch)
        result = await Session.create(c, "s").append_message(msg("a"))
    assert (result.id, result.seq) == ("a", 7)
    assert len(rec.requests) == 2
    assert len(slept) == 1
    assert slept[0] >= 1.5


async def test_a_rate_limited_post_that_is_not_idempotent_is_retried(monkeypatch: pytest.MonkeyPatch) -> None:
    """A 429 wrote nothing, so even a POST that may not be repeated is sent again."""
    answers = [rate_limited(0.25)]
    rec = Recorder(lambda r: answers.pop(0) if answers else httpx.Response(200, json={"ok": True}))
    async with rec.client() as c:
        slept = counting_sleeps(c, monkeypatch)
        out = await c.request("POST", "/v1/sessions/s/system-prompt:refresh", idempotent=False)
    assert out == {"ok": True}
    assert len(rec.requests) == 2
    assert slept[0] >= 0.25


async def test_a_request_timeout_is_retried_even_for_a_post_that_is_not_idempotent(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A 408 (the body did not reach the server whole in time) did nothing: the request is sent again."""
    answers = [problem(408, "request_timeout")]
    rec = Recorder(lambda r: answers.pop(0) if answers else httpx.Response(200, json={"ok": True}))
    async with rec.client() as c:
        counting_sleeps(c, monkeypatch)
        out = await c.request("POST", "/v1/sessions/s/system-prompt:refresh", idempotent=False)
    assert out == {"ok": True}
    assert len(rec.requests) == 2


async def test_rate_limited_on_every_attempt_raises_after_the_retries(monkeypatch: pytest.MonkeyPatch) -> None:
    rec = Recorder(lambda r: rate_limited(2.0))
    async with rec.client(retries=3) as c:
        slept = counting_sleeps(c, monkeypatch)
        with pytest.raises(RateLimited) as caught:
            await Session.create(c, "s").append_message(msg("a"))
    assert len(rec.requests) == 4
    assert len(slept) == 3
    assert all(s >= 2.0 for s in slept)
    assert (caught.value.code, caught.value.status, caught.value.retry_after) == ("rate_limited", 429, 2.0)
    assert caught.value.detail == "tenant over its limit"


async def test_a_bare_429_is_rate_limited_with_the_headers_seconds(monkeypatch: pytest.MonkeyPatch) -> None:
    """A proxy's 429 without a problem body: typed all the same, waiting what ``Retry-After`` says."""
    answers = [httpx.Response(429, text="slow down", headers={"retry-after": "3"})]
    rec = Recorder(lambda r: answers.pop(0) if answers else appended(r))
    async with rec.client() as c:
        slept = counting_sleeps(c, monkeypatch)
        await Session.create(c, "s").append_message(msg("a"))
    assert len(rec.requests) == 2
    assert slept[0] >= 3.0
    bare = error_from_problem(429, "slow down", retry_after="3")
    assert (type(bare), bare.code, bare.status, bare.detail) == (RateLimited, "rate_limited", 429, "slow down")
    assert isinstance(bare, RateLimited)
    assert bare.retry_after == 3.0
    unknown = error_from_problem(429, "")
    assert isinstance(unknown, RateLimited)
    assert unknown.retry_after is None
    dated = error_from_problem(429, "", retry_after="Wed, 21 Oct 2026 07:28:00 GMT")  # an HTTP-date is not read
    assert isinstance(dated, RateLimited)
    assert dated.retry_after is None


async def test_a_retry_after_over_the_cap_raises_without_sleeping(monkeypatch: pytest.MonkeyPatch) -> None:
    rec = Recorder(lambda r: rate_limited(MAX_RETRY_AFTER_S + 1))
    async with rec.client() as c:
        slept = counting_sleeps(c, monkeypatch)
        with pytest.raises(RateLimited) as caught:
            await Session.create(c, "s").append_message(msg("a"))
    assert caught.value.retry_after == MAX_RETRY_AFTER_S + 1
    assert len(rec.requests) == 1
    assert slept == []


async def test_get_message_unknown_is_none() -> None:
    rec = Recorder(lambda r: problem(404, "message_not_found"))
    async with rec.client() as c:
        assert await Session.create(c, "s").get_message("x") is None


async def test_get_message_original_asks_for_the_original_with_the_read_your_writes_wait() -> None:
    rec = Recorder(lambda r: httpx.Response(200, json={"id": "x", "role": "user", "parts": []}))
    async with rec.client() as c:
        s = Session.create(c, "s")
        c.note_seq("s", 7)
        assert await s.get_message("x", original=True) == {"id": "x", "role": "user", "parts": []}
        await s.get_message("x")
    assert [dict(r.url.params) for r in rec.requests] == [{"original": "true", "min_seq": "7"}, {"min_seq": "7"}]


@pytest.mark.parametrize("bad", ["", "a/b", " s", "s\x00"])
async def test_session_ids_no_url_can_name_are_invalid_id_before_any_request(bad: str) -> None:
    rec = Recorder(lambda r: httpx.Response(200, json={}))
    async with rec.client() as c:
        with pytest.raises(InvalidId) as caught:
            await SessionManager(c).get(bad)
        assert caught.value.status == 422
        with pytest.raises(InvalidId):
            await Session.create(c, bad).get_message("m1")
        with pytest.raises(InvalidId):
            await SessionManager(c).rename(bad, "x")
    assert rec.requests == []


LONE = "cut emoji \ud83d"
"""Text with a lone surrogate (a model's output cut inside a surrogate pair): not encodable as UTF-8."""


async def test_text_with_a_lone_surrogate_is_invalid_request_before_any_request() -> None:
    rec = Recorder(lambda r: httpx.Response(200, json={"seq": 1}))
    async with rec.client() as c:
        s = Session.create(c, "s1")
        calls = [
            s.append_message({**msg("m1"), "parts": [{"type": "text", "text": LONE}]}),
            s.append_all([msg("m1"), {**msg("m2"), "parts": [{"type": "text", "text": LONE}]}]),
            s.search(LONE),
            SessionManager(c).search(LONE),
            s.get_history(LONE),
            SessionManager(c).rename("s1", LONE),
            SessionManager(c).end("s1", LONE),
            s.replace_context_block("memory", LONE),
        ]
        for call in calls:
            with pytest.raises(InvalidRequest, match="lone surrogates") as caught:
                await call
            assert (caught.value.code, caught.value.status) == ("invalid_request", 422)
        with pytest.raises(InvalidId, match="lone surrogates"):  # an id in the path: no URL can name it
            await s.get_message(LONE)
    assert rec.requests == []


async def test_a_lone_surrogate_is_invalid_request_over_nats_and_jetstream_before_sending() -> None:
    nc = FakeNats(Reply(201, {"id": "m1", "parent_id": None, "seq": 3, "created": True}))
    c = commanding(nc)
    bad = {**msg("m1"), "parts": [{"type": "text", "text": LONE}]}
    with pytest.raises(InvalidRequest, match="lone surrogates"):
        await c.append("s1", bad)
    with pytest.raises(InvalidRequest, match="message 'm1' must not contain lone surrogates"):
        await c.append_chain("s1", [bad], via="jetstream")
    assert nc.subjects == []


async def test_a_message_that_is_not_an_object_is_invalid_request_before_any_request() -> None:
    rec = Recorder(lambda r: httpx.Response(200, json={"seq": 1}))
    async with rec.client() as c:
        s = Session.create(c, "s1")
        with pytest.raises(InvalidRequest, match=r"message 0: a message is an object .*, not str"):
            await s.append_message("hello")  # type: ignore[arg-type]
        with pytest.raises(InvalidRequest, match=r"message 1: a message is an object .*, not list"):
            await s.append_all([msg("m1"), ["m2"]])  # type: ignore[list-item]
        with pytest.raises(InvalidRequest, match=r"a message is an object .*, not NoneType"):
            await s.update_message(None)  # type: ignore[arg-type]
        with pytest.raises(InvalidRequest, match=r"message.id: an update names its message by a string id, not None"):
            await s.update_message({"role": "user", "parts": []})
    assert rec.requests == []


async def test_a_body_json_cannot_hold_is_invalid_request_before_any_request() -> None:
    rec = Recorder(lambda r: httpx.Response(200, json={"seq": 1}))
    async with rec.client() as c:
        with pytest.raises(InvalidRequest, match="the request body is not JSON: Object of type set"):
            await SessionManager(c).create("n", metadata={"tags": {"a", "b"}})
        with pytest.raises(InvalidRequest, match="message 'm2' is not JSON: Object of type set"):
            await Session.create(c, "s1").append_all([msg("m1"), {**msg("m2"), "data": {1}}])
    assert rec.requests == []


def created(request: httpx.Request) -> httpx.Response:
    """``POST /v1/sessions`` answered as the server does; a read of the session answers its entry."""
    if request.method == "POST":
        body = json.loads(request.content)
        return httpx.Response(201, json={**body, "parent_session_id": None, "seq": 3})
    sid = request.url.path.rsplit("/", 1)[-1]
    return httpx.Response(200, json={"id": sid, "name": "n", "metadata": {}})


@pytest.mark.parametrize("bad", ["", "a/b", " s"], ids=["empty", "slash", "space"])
async def test_an_explicit_session_id_the_server_would_refuse_is_invalid_id_before_any_request(bad: str) -> None:
    """``id=""`` is an id, not "no id": it is refused (the server answers ``invalid_id`` too),
    never made into a new UUID session; over HTTP and as NATS commands alike."""
    rec = Recorder(created)
    nc = FakeNats(Reply(201, {"id": "x", "seq": 3}))
    async with rec.client() as c:
        for client in (c, commanding(nc)):
            manager = SessionManager(client)
            with pytest.raises(InvalidId) as caught:
                await manager.create("n", id=bad)
            assert caught.value.status == 422
            with pytest.raises(InvalidId):
                await manager.compact_and_split("s1", "summary", id=bad)
            with pytest.raises(InvalidId):
                await manager.fork("s1", "m1", id=bad)
    assert rec.requests == []
    assert nc.subjects == []


def stored_session(stored: dict[str, Any]) -> Handler:
    """A server where ``stored`` is the session at the id: a create times out after the server
    stored it, its retry is ``409 session_exists``, and a read answers ``stored``."""

    def answer(request: httpx.Request) -> httpx.Response:
        if request.method == "POST":
            return problem(409, "session_exists", "session 's1' already exists")
        return httpx.Response(200, json={"id": "s1", "seq": 3, **stored})

    return timing_out_once(answer)


async def test_a_create_retried_after_its_first_attempt_was_stored_answers_the_stored_session() -> None:
    entry = {"name": "Chat", "metadata": {"owner": "ada", "model": "gpt"}, "parent_session_id": "p1"}
    rec = Recorder(stored_session(entry))
    async with rec.client() as c:
        info = await SessionManager(c).create(
            "Chat", id="s1", parent_session_id="p1", metadata={"owner": "ada"}, model="gpt"
        )
    assert (info.id, info.name, info.metadata, info.parent_session_id) == ("s1", "Chat", entry["metadata"], "p1")
    assert [r.method for r in rec.requests] == ["POST", "POST", "GET"]  # the retry, then the read


@pytest.mark.parametrize(
    "other",
    [
        {"name": "Someone else's", "metadata": {"owner": "ada", "model": "gpt"}, "parent_session_id": "p1"},
        {"name": "Chat", "metadata": {"owner": "bob", "model": "gpt"}, "parent_session_id": "p1"},
        {"name": "Chat", "metadata": {"owner": "ada", "model": "gpt"}, "parent_session_id": None},
    ],
    ids=["name", "metadata", "parent"],
)
async def test_an_id_taken_by_another_session_is_session_exists(other: dict[str, Any]) -> None:
    async with Recorder(stored_session(other)).client() as c:
        with pytest.raises(SessionExists):
            await SessionManager(c).create(
                "Chat", id="s1", parent_session_id="p1", metadata={"owner": "ada"}, model="gpt"
            )


async def test_a_fork_deleted_before_it_is_read_back_is_session_not_found() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        if request.method == "POST":
            return httpx.Response(201, json={"id": "f1", "parent_session_id": "s1", "messages": 1, "seq": 5})
        return problem(404, "session_not_found", "session 'f1' was deleted")

    async with Recorder(handler).client() as c:
        with pytest.raises(SessionNotFound, match="deleted right after it was forked"):
            await SessionManager(c).fork("s1", "m1")


def forked(request: httpx.Request) -> httpx.Response:
    """``POST …/fork`` answered as the server does; a read of the fork answers its entry."""
    if request.method == "POST":
        body = json.loads(request.content)
        return httpx.Response(201, json={"id": body["id"], "parent_session_id": "s1", "messages": 2, "seq": 7})
    fid = request.url.path.rsplit("/", 1)[-1]
    return httpx.Response(200, json={"id": fid, "name": "n", "parent_session_id": "s1"})


@pytest.mark.parametrize("given", [None, "f1"], ids=["new-id", "given-id"])
async def test_a_fork_is_retried_after_a_timeout_with_the_same_id(given: str | None) -> None:
    """The id is chosen here when none is given, so that the retry names the same fork: the
    server completes it (the copies a lost attempt did not publish) and answers as the first."""
    rec = Recorder(timing_out_once(forked))
    async with rec.client() as c:
        info = await SessionManager(c).fork("s1", "m1", "n", id=given)
        assert c.last_seq(info.id) == 7
    first, retry = rec.bodies()
    assert first == retry == {"at_message_id": "m1", "name": "n", "id": info.id}
    assert info.id == given if given is not None else len(info.id) == 36
    assert [r.method for r in rec.requests] == ["POST", "POST", "GET"]


async def test_a_fork_whose_id_is_another_session_is_session_exists_and_not_retried() -> None:
    rec = Recorder(lambda r: problem(409, "session_exists", "session 'f1' already exists"))
    async with rec.client() as c:
        with pytest.raises(SessionExists):
            await SessionManager(c).fork("s1", "m1", id="f1")
    assert len(rec.requests) == 1


async def test_an_upsert_that_meets_another_writers_append_updates_it() -> None:
    """The id was free when checked; another writer appended it (another body) before the append."""

    def handler(request: httpx.Request) -> httpx.Response:
        if request.method == "GET":
            return problem(404, "message_not_found")
        if request.method == "POST":
            return problem(409, "message_conflict", "a message with this id and a different body exists")
        return httpx.Response(200, json={"id": "m1", "seq": 9})

    rec = Recorder(handler)
    async with rec.client() as c:
        assert await SessionManager(c).upsert("s1", msg("m1")) == "m1"
    assert [r.method for r in rec.requests] == ["GET", "POST", "PUT"]
    assert json.loads(rec.requests[-1].content) == {"message": msg("m1")}


async def test_an_upsert_of_a_message_deleted_since_the_check_appends_it() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        if request.method == "GET":
            return httpx.Response(200, json=msg("m1"))
        if request.method == "PUT":
            return problem(404, "message_not_found", "message 'm1' is not in this session")
        return appended(request)

    rec = Recorder(handler)
    async with rec.client() as c:
        assert await SessionManager(c).upsert("s1", msg("m1")) == "m1"
    assert [r.method for r in rec.requests] == ["GET", "PUT", "POST"]


async def test_no_session_id_is_a_new_uuid() -> None:
    rec = Recorder(created)
    async with rec.client() as c:
        info = await SessionManager(c).create("n")
    (body,) = rec.bodies()
    assert info.id == body["id"]
    assert len(body["id"]) == 36, body


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
        unknown = await tools.execute("n\x00" + "o" * 4_998, {})  # as the server shows it: short, printable
        assert unknown == f'Error: tool "n\\u0000{"o" * 62}… (5000 characters)" is not available in this session'
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


NATS_INFO = {
    "tenant": "tenant-x",
    "stream": "CHRONICLE",
    "subject_prefix": "chronicle.ev",
    "partitions": 4,
    "inbox_prefix": "_INBOX_T.tenant-x",
    "publish": [f"chronicle.ev.tenant-x.p{p:03d}.*" for p in range(4)],
    "payload_limit_bytes": 1024,
    "max_message_bytes": 4096,
    "max_event_bytes": 1024 * 1024,
}


def batch_answer(request: httpx.Request) -> httpx.Response:
    body = json.loads(request.content)
    parent, out = body.get("parent_id"), []
    for i, m in enumerate(body["messages"]):
        out.append({"id": m["id"], "parent_id": parent, "seq": 100 + i, "created": True})
        parent = m["id"]
    return httpx.Response(201, json={"messages": out, "seq": out[-1]["seq"]})


async def test_the_tenant_and_layout_are_what_the_server_says() -> None:
    rec = Recorder(lambda r: httpx.Response(200, json=NATS_INFO))
    async with rec.client(nats_url="nats://127.0.0.1:1") as c:
        assert (c.tenant, c.layout) == (None, None)
        info = await c.nats_publishing()
        assert await c.nats_publishing() is info  # asked once
        assert c.tenant == "tenant-x"
        assert c.layout == SubjectLayout(stream="CHRONICLE", prefix="chronicle.ev", partitions=4)
        assert (info.inbox_prefix, info.payload_limit_bytes, len(info.publish)) == ("_INBOX_T.tenant-x", 1024, 4)
    assert [r.url.path for r in rec.requests] == ["/v1/nats"]


async def test_claim_checked_chains_go_through_the_api_without_nats() -> None:
    """A chain holding a body over the payload limit (only the server writes the claim-check
    store) goes whole over HTTP; NATS (here: nothing listening) is never dialled."""

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/nats":
            return httpx.Response(200, json=NATS_INFO)
        return batch_answer(request)

    big = {"id": "big", "role": "user", "parts": [{"type": "text", "text": "x" * 2000}]}
    rec = Recorder(handler)
    async with rec.client(nats_url="nats://127.0.0.1:1", append_via="jetstream") as c:
        s = Session.create(c, "s1")
        results = await s.append_all([msg("a"), {**big, "id": "big2"}, msg("b")], "big")
        assert [(r.id, r.parent_id) for r in results] == [("a", "big"), ("big2", "a"), ("b", "big2")]
        with pytest.raises(PayloadTooLarge):  # over max_message_bytes: refused here
            await s.append_all([{**big, "parts": [{"type": "text", "text": "x" * 5000}]}])
    assert [(r.method, r.url.path) for r in rec.requests] == [
        ("GET", "/v1/nats"),
        ("POST", "/v1/sessions/s1/messages:batch"),
    ]
    assert rec.bodies()[0]["parent_id"] == "big"


async def test_http_chains_are_batches_of_at_most_1000() -> None:
    rec = Recorder(batch_answer)
    async with rec.client() as c:
        results = await c.append_chain("s1", [msg(f"m{i}") for i in range(1500)], None)
        with pytest.raises(InvalidRequest, match="distinct"):
            await c.append_chain("s1", [msg("a"), msg("a")])
    assert [len(b["messages"]) for b in rec.bodies()] == [1000, 500]
    assert [b["parent_id"] for b in rec.bodies()] == [None, "m999"]
    assert [r.parent_id for r in results[999:1001]] == ["m998", "m999"]


async def test_a_chain_names_itself_with_one_idempotency_key_in_every_request() -> None:
    rec = Recorder(batch_answer)
    async with rec.client() as c:
        await c.append_chain("s1", [msg(f"m{i}") for i in range(1500)], None)
        await c.append_chain("s1", [msg("n1")], None)
    keys = [r.headers.get("idempotency-key") for r in rec.requests]
    assert len(keys) == 3
    assert None not in keys
    assert keys[1] == keys[0]  # both requests of the first call
    assert keys[2] != keys[0]  # another call


async def test_http_chains_are_cut_by_size_too(monkeypatch: pytest.MonkeyPatch) -> None:
    from chronicle_sdk import client as sdk_client

    monkeypatch.setattr(sdk_client, "_BATCH_BYTES", 500)  # the API bounds a request body (413 past it)
    rec = Recorder(batch_answer)
    async with rec.client() as c:
        chain = [{**msg(f"m{i}"), "parts": [{"type": "text", "text": "x" * 150}]} for i in range(5)]
        await c.append_chain("s1", chain, None)
    assert [len(b["messages"]) for b in rec.bodies()] == [2, 2, 1]
    assert [b["parent_id"] for b in rec.bodies()] == [None, "m1", "m3"]
    assert all(len(json.dumps(b["messages"])) <= 500 for b in rec.bodies())


def test_publish_failures_map_to_sdk_errors() -> None:
    from chronicle_sdk.client import _Direct, _NatsErrors
    from events.admission import Refused

    c = ChronicleClient("http://x", "k", nats_url="nats://127.0.0.1:1")
    errors = _NatsErrors()
    direct = _Direct(nc=None, publisher=None, errors=errors, who="NKey user U…")  # type: ignore[arg-type]
    too_large = c._publish_error(direct, Refused("too_large", "2000000 bytes"))
    assert (type(too_large), too_large.status, too_large.problem["reason"]) == (PayloadTooLarge, 413, "too_large")
    invalid = c._publish_error(direct, Refused("invalid", "a NUL"))
    assert (type(invalid), invalid.status, invalid.detail) == (InvalidRequest, 422, "a NUL")
    assert type(c._publish_error(direct, TimeoutError())) is Unavailable
    errors.denied = "nats: permissions violation for publish to 'x'"
    denied = c._publish_error(direct, TimeoutError())
    assert (type(denied), denied.code) == (Unauthorized, "nats_unauthorized")
    assert "NKey user U…" in denied.detail


class FakeNats:
    """A NATS connection whose requests answer from a script (each item: a reply or an error)."""

    max_payload = 1024 * 1024
    is_closed = False
    is_connected = True

    def __init__(self, *script: Any) -> None:
        self.script = list(script)
        self.subjects: list[str] = []
        self.payloads: list[Any] = []

    async def request(self, subject: str, data: bytes, timeout: float) -> Any:
        self.subjects.append(subject)
        self.payloads.append(json.loads(data))
        item = self.script.pop(0) if len(self.script) > 1 else self.script[0]
        if isinstance(item, BaseException):
            raise item
        return item


class Reply:
    def __init__(self, status: int, body: dict[str, Any]) -> None:
        self.headers = {"Chronicle-Status": str(status)}
        self.data = json.dumps(body).encode()


def commanding(nc: FakeNats, errors: Any = None) -> ChronicleClient:
    from chronicle_sdk.client import _Direct, _NatsErrors

    c = ChronicleClient(
        "http://x", "k", nats_url="nats://127.0.0.1:1", via="nats", backoff_s=0.0, retries=2, retry_budget_s=0.0
    )
    c._publishing = NatsPublishing.from_json({**NATS_INFO, "command_prefix": "c.cmd"})
    c._direct = _Direct(nc=nc, publisher=None, errors=errors or _NatsErrors(), who="NKey user U…")  # type: ignore[arg-type]
    return c


def test_a_client_used_from_a_later_event_loop_connects_to_nats_again_there() -> None:
    """``asyncio.run`` per call: the NATS connection of a loop that has closed is not used (its
    tasks are gone with the loop); each loop gets its own, opened once."""
    from chronicle_sdk.client import _Direct, _NatsErrors

    opened: list[FakeNats] = []

    async def open_nats(_info: NatsPublishing) -> _Direct:
        opened.append(FakeNats(Reply(201, {"id": "m1", "parent_id": None, "seq": 3, "created": True})))
        return _Direct(nc=opened[-1], publisher=None, errors=_NatsErrors(), who="NKey user U…")  # type: ignore[arg-type]

    c = commanding(FakeNats())
    c._direct = None
    c._open_nats = open_nats  # type: ignore[method-assign,assignment]

    async def two_appends() -> None:
        await c.append("s1", msg("m1"))
        await c.append("s1", msg("m1"))

    asyncio.run(two_appends())
    asyncio.run(two_appends())
    assert [len(nc.subjects) for nc in opened] == [2, 2]
    asyncio.run(c.aclose())  # from a third loop: the second's connection is left to it, not drained here
    assert c._direct is None


async def test_a_write_goes_as_its_command_and_a_problem_is_the_typed_error() -> None:
    appended = {"id": "m1", "parent_id": None, "seq": 3, "created": True}
    nc = FakeNats(Reply(201, appended))
    result = await commanding(nc).append("s1", msg("m1"))
    assert (result.id, result.seq, nc.subjects) == ("m1", 3, ["c.cmd.tenant-x.append"])
    refused = FakeNats(Reply(422, {"status": 422, "code": "unknown_parent", "detail": "no parent p"}))
    with pytest.raises(UnknownParent, match="no parent p"):
        await commanding(refused).append("s1", msg("m1"), "p")
    assert len(refused.subjects) == 1  # a refusal is not retried


@pytest.mark.parametrize("bad", ["a/b", "/", "m/..", ".", ".."])
async def test_new_message_ids_no_url_can_name_are_invalid_id_before_any_request(bad: str) -> None:
    rec = Recorder(appended)
    nc = FakeNats(Reply(201, {"id": bad, "parent_id": None, "seq": 3, "created": True}))
    async with rec.client() as c:
        paths: list[tuple[ChronicleClient, Via]] = [(c, "http"), (commanding(nc), "nats")]
        for client, via in paths:
            with pytest.raises(InvalidId, match=r"must not contain '/'|must not be '\.\.?'") as caught:
                await client.append("s1", msg(bad))
            assert caught.value.status == 422
            with pytest.raises(InvalidId):  # nothing of a chain is sent, the good messages before it neither
                await client.append_chain("s1", [msg("m1"), msg(bad)], via=via)
            with pytest.raises(InvalidId):
                await SessionManager(client).append_all("s1", [msg("m1"), msg(bad)])
            configured = Session.create(client, "s2").with_context("memory", description="facts", max_tokens=100)
            with pytest.raises(InvalidId):  # not even the session's config is written first
                await configured.append_message(msg(bad))
            with pytest.raises(InvalidId):
                await configured.append_all([msg("m1"), msg(bad)])
    assert rec.requests == []
    assert nc.subjects == []


async def test_a_parent_id_with_a_slash_names_a_stored_message_and_is_sent() -> None:
    rec = Recorder(appended)
    async with rec.client() as c:
        await c.append("s1", msg("m2"), "old/m1")
    assert rec.bodies() == [{"message": msg("m2"), "parent_id": "old/m1"}]


async def test_a_command_without_a_command_service_is_retried_then_unavailable() -> None:
    import nats.errors

    nc = FakeNats(nats.errors.NoRespondersError())
    with pytest.raises(Unavailable, match="chronicle commands"):
        await commanding(nc).request("POST", "/v1/sessions/s1/messages:clear")
    assert len(nc.subjects) == 3  # nobody received it: retried (retries=2)


@pytest.mark.parametrize(
    "error", ["ConnectionClosedError", "NoServersError", "ConnectionReconnectingError", "OutboundBufferLimitError"]
)
async def test_a_command_nats_py_did_not_send_is_retried_then_unavailable(error: str) -> None:
    """(Even when repeating it is not safe: it never left the client.)"""
    import nats.errors

    nc = FakeNats(getattr(nats.errors, error)())
    with pytest.raises(Unavailable, match=r"prompt\.refresh: NATS at nats"):
        await commanding(nc).request("POST", "/v1/sessions/s1/system-prompt:refresh", idempotent=False)
    assert len(nc.subjects) == 3  # retries=2


async def test_a_command_is_not_sent_while_the_connection_reconnects() -> None:
    nc = FakeNats(Reply(200, {}))
    nc.is_connected = False
    with pytest.raises(Unavailable, match="reconnecting"):
        await commanding(nc).request("POST", "/v1/sessions/s1/messages:clear")
    assert nc.subjects == []


async def test_a_timed_out_command_is_retried_only_when_repeating_it_is_safe() -> None:
    import nats.errors

    unsafe = FakeNats(nats.errors.TimeoutError())
    with pytest.raises(Unavailable, match=r"no reply .* may have reached the server and been applied"):
        await commanding(unsafe).request("POST", "/v1/sessions/s1/system-prompt:refresh", idempotent=False)
    assert len(unsafe.subjects) == 1
    written = {"label": "notes", "content": "x", "tokens": 1, "max_tokens": None, "seq": 9}
    safe = FakeNats(nats.errors.TimeoutError(), Reply(200, written))
    assert await commanding(safe).request("PUT", "/v1/sessions/s1/context/notes", body={"content": "x"}) == written
    assert safe.subjects == ["c.cmd.tenant-x.context.write"] * 2


async def test_a_denied_command_is_unauthorized() -> None:
    import nats.errors

    from chronicle_sdk.client import _NatsErrors

    errors = _NatsErrors()
    errors.denied = "nats: permissions violation for publish to 'c.cmd.tenant-x.clear'"
    with pytest.raises(Unauthorized) as caught:
        await commanding(FakeNats(nats.errors.TimeoutError()), errors).request("POST", "/v1/sessions/s1/messages:clear")
    assert caught.value.code == "nats_unauthorized"


async def test_reads_stay_on_http_when_writes_go_over_nats() -> None:
    rec = Recorder(lambda r: httpx.Response(200, json={"leaf_id": None, "messages": []}))
    async with rec.client(nats_url="nats://127.0.0.1:1", via="nats") as c:
        assert await c.request("GET", "/v1/sessions/s1/history") == {"leaf_id": None, "messages": []}
    assert [r.url.path for r in rec.requests] == ["/v1/sessions/s1/history"]


async def test_a_reply_outside_the_contract_is_an_error_not_a_result() -> None:
    nc = FakeNats(Reply(200, {"cleared": True, "seq": 9}))
    with pytest.raises(ChronicleError, match="does not match") as caught:
        await commanding(nc).request("PUT", "/v1/sessions/s1/context/notes", body={"content": "x"})
    assert caught.value.code == "invalid_reply"


async def test_a_rate_limited_command_waits_retry_after_then_succeeds(monkeypatch: pytest.MonkeyPatch) -> None:
    limited = {"status": 429, "code": "rate_limited", "detail": "tenant over its limit", "retry_after": 0.5}
    nc = FakeNats(Reply(429, limited), Reply(200, {"prompt": "p", "tokens": 1, "version": 2, "seq": 9}))
    c = commanding(nc)
    slept = counting_sleeps(c, monkeypatch)
    out = await c.request("POST", "/v1/sessions/s1/system-prompt:refresh", idempotent=False)
    assert out["seq"] == 9
    assert nc.subjects == ["c.cmd.tenant-x.prompt.refresh"] * 2
    assert len(slept) == 1
    assert slept[0] >= 0.5


async def test_a_command_rate_limited_on_every_attempt_raises(monkeypatch: pytest.MonkeyPatch) -> None:
    limited = {"status": 429, "code": "rate_limited", "detail": "tenant over its limit", "retry_after": 0.5}
    nc = FakeNats(Reply(429, limited))
    c = commanding(nc)  # retries=2
    slept = counting_sleeps(c, monkeypatch)
    with pytest.raises(RateLimited) as caught:
        await c.request("POST", "/v1/sessions/s1/messages:clear")
    assert (caught.value.code, caught.value.retry_after) == ("rate_limited", 0.5)
    assert len(nc.subjects) == 3
    assert len(slept) == 2


async def test_add_usage_as_a_command_is_retried_after_a_timeout_with_the_same_key() -> None:
    import nats.errors

    added = {"id": "s1", "input_tokens": 10, "output_tokens": 2, "cost": 0.5, "seq": 8}
    nc = FakeNats(nats.errors.TimeoutError(), Reply(200, added))
    await SessionManager(commanding(nc)).add_usage("s1", 10, 2, 0.5)
    assert nc.subjects == ["c.cmd.tenant-x.session.usage"] * 2
    first, retry = nc.payloads
    assert first == retry
    assert first["idempotency_key"]
    assert (first["session_id"], first["input_tokens"], first["output_tokens"], first["cost"]) == ("s1", 10, 2, 0.5)


async def test_end_as_a_command_is_retried_after_a_timeout() -> None:
    import nats.errors

    nc = FakeNats(nats.errors.TimeoutError(), Reply(200, {"id": "s1", "end_reason": "done", "seq": 9}))
    await SessionManager(commanding(nc)).end("s1", "done")
    assert nc.subjects == ["c.cmd.tenant-x.session.end"] * 2
    assert nc.payloads == [{"session_id": "s1", "reason": "done"}] * 2


# -- tools: what is the arguments' fault is an ``Error: …`` result, anything else raises ----------

NESTED = '{"label": "memory", "content": "x", "deep": ' + "[" * 64 + "]" * 64 + "}"
"""Arguments nested 65 levels deep (the object is level 1), one more than the server takes."""
BAD_CHARS = "Error: tool arguments must not contain NUL characters or lone surrogates"


def with_tools(answer: Handler) -> Recorder:
    """A server whose sessions offer set_context, search_context and load_context; tool calls
    (and anything else) get ``answer``."""

    def handler(request: httpx.Request) -> httpx.Response:
        if request.method == "GET" and request.url.path.endswith("/tools"):
            names = ["set_context", "search_context", "load_context"]
            fns = [{"type": "function", "function": {"name": n, "description": "d", "parameters": {}}} for n in names]
            return httpx.Response(200, json={"format": "openai", "tools": fns})
        return answer(request)

    return Recorder(handler)


def posts(rec: Recorder) -> list[httpx.Request]:
    return [r for r in rec.requests if r.method == "POST"]


@pytest.mark.parametrize(
    ("name", "arguments", "expected"),
    [
        ("set_context", '{"label":"memory","content":"\\ud800"}', BAD_CHARS),
        ("set_context", {"label": "memory", "content": "\ud800"}, BAD_CHARS),
        ("set_context", {"label": "memory", "content": ("\udfff",)}, BAD_CHARS),
        ("set_context", '{"label":"memory","content":"a\\u0000b"}', BAD_CHARS),
        ("set_context", {"label": "memory\x00", "content": "a"}, BAD_CHARS),
        ("search_context", {"label": "knowledge", "query": "\u0000"}, BAD_CHARS),
        ("set_context", NESTED, "Error: tool arguments are nested deeper than 64 levels"),
        (
            "set_context",
            '{"a": ' + "[" * 100_000 + "]" * 100_000 + "}",
            "Error: tool arguments are nested deeper than 64 levels",
        ),
        (
            "set_context",
            '{"label": "memory", "content": NaN}',
            "Error: tool arguments are not valid JSON: numbers must be finite",
        ),
        (
            "set_context",
            {"label": "memory", "content": {1, 2}},
            "Error: tool arguments are not valid JSON: Object of type set is not JSON serializable",
        ),
    ],
)
async def test_arguments_the_server_would_refuse_are_error_results_and_send_nothing(
    name: str, arguments: Any, expected: str
) -> None:
    rec = with_tools(lambda r: httpx.Response(200, json={"result": "ran", "seq": 1}))
    async with rec.client() as c:
        s = Session.create(c, "s")
        tools = await s.tools()
        assert await tools.execute(name, arguments, tool_call_id="call-1") == expected
        assert await tools.execute(name, arguments) == expected
        assert await s.execute_tool(name, arguments) == expected
    assert posts(rec) == []


async def test_arguments_one_level_within_the_limit_are_sent() -> None:
    rec = Recorder(lambda r: httpx.Response(200, json={"result": "ran", "seq": 1}))
    within = '{"label": "memory", "content": "x", "deep": ' + "[" * 63 + "]" * 63 + "}"
    async with rec.client() as c:
        assert await Session.create(c, "s").execute_tool("set_context", within) == "ran"
    assert len(rec.bodies()) == 1


async def test_a_bad_tool_call_id_is_an_error_result() -> None:
    rec = with_tools(lambda r: httpx.Response(200, json={"result": "ran", "seq": 1}))
    async with rec.client() as c:
        tools = await Session.create(c, "s").tools()
        result = await tools.execute("load_context", {"label": "skills", "key": "k"}, tool_call_id="c\ud800")
    assert result == "Error: the tool call id must not contain NUL characters or lone surrogates"
    assert posts(rec) == []


@pytest.mark.parametrize(
    ("status", "code", "detail"),
    [
        (422, "invalid_request", "the body is nested deeper than 64 levels"),
        (422, "malformed_json", "the body is not UTF-8"),
        (413, "payload_too_large", "the request body is larger than 1024 bytes"),
    ],
)
async def test_server_refusals_of_the_arguments_are_error_results(status: int, code: str, detail: str) -> None:
    rec = with_tools(lambda r: problem(status, code, detail))
    async with rec.client() as c:
        s = Session.create(c, "s")
        assert await s.execute_tool("set_context", {"label": "memory", "content": "x"}) == f"Error: {detail}"
        assert await (await s.tools()).execute("set_context", {"label": "memory", "content": "x"}) == f"Error: {detail}"
    assert len(posts(rec)) == 2


@pytest.mark.parametrize(
    ("status", "code", "raised"),
    [
        (503, "unavailable", Unavailable),
        (401, "unauthorized", Unauthorized),
        (404, "not_found", NotFound),
        (422, "invalid_id", InvalidId),
        (405, "method_not_allowed", MethodNotAllowed),
        (500, "internal_error", ServerError),
    ],
)
async def test_failures_that_are_not_the_arguments_fault_raise(
    status: int, code: str, raised: type[ChronicleError]
) -> None:
    rec = with_tools(lambda r: problem(status, code, "no"))
    async with rec.client() as c:
        tools = await Session.create(c, "s").tools()
        with pytest.raises(raised):
            await tools.execute("set_context", {"label": "memory", "content": "x"})


async def test_a_session_never_written_has_no_tools_and_a_deleted_one_raises() -> None:
    """The server answers a tool call on a session never written ``404 session_not_found``: the
    SDK reads such a session as empty, so it is the reference's ``not available`` result; a
    deleted session's (``"deleted": true``) raises, as its other calls do."""

    def gone(deleted: bool) -> httpx.Response:
        r = problem(404, "session_not_found", "no")
        body = {**json.loads(r.content), **({"deleted": True} if deleted else {})}
        return httpx.Response(404, json=body, headers={"content-type": "application/problem+json"})

    async with with_tools(lambda r: gone(False)).client() as c:
        tools = await Session.create(c, "s").tools()
        res = await tools.execute("set_context", {"label": "memory", "content": "x"})
        assert res == 'Error: tool "set_context" is not available in this session'
    async with with_tools(lambda r: gone(True)).client() as c:
        tools = await Session.create(c, "s").tools()
        with pytest.raises(SessionNotFound) as raised:
            await tools.execute("set_context", {"label": "memory", "content": "x"})
        assert raised.value.deleted


async def test_an_unreachable_server_raises_from_execute() -> None:
    def refused(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused", request=request)

    async with Recorder(refused).client(retries=1) as c:
        with pytest.raises(Unavailable):
            await Session.create(c, "s").execute_tool("set_context", {"label": "memory", "content": "x"})
        with pytest.raises(Unavailable):
            await SessionManager(c).tools().execute("session_search", {"query": "deploy"})


async def test_session_search_treats_arguments_as_the_session_tools_do() -> None:
    answers = [problem(422, "invalid_request", "q: too short"), httpx.Response(200, json={"results": []})]
    rec = Recorder(lambda r: answers.pop(0))
    async with rec.client() as c:
        tools = SessionManager(c).tools()
        assert await tools.execute("session_search", {"query": "\u0000"}) == BAD_CHARS
        assert await tools.execute("session_search", '{"query": "\\ud800"}') == BAD_CHARS
        assert await tools.execute("session_search", {"query": 3}) == "Error: argument 'query' must be a string"
        # longer than the API takes: nothing found, as search_context answers, and nothing sent
        assert await tools.execute("session_search", {"query": "x" * (MAX_QUERY_CHARS + 1)}) == "No results found."
        assert rec.requests == []
        assert await tools.execute("session_search", {"query": "q"}) == "Error: q: too short"
        assert await tools.execute("session_search", {"query": "x" * MAX_QUERY_CHARS}) == "No results found."
    assert [len(p["q"]) for p in rec.params("/v1/search")] == [1, MAX_QUERY_CHARS]


class Election:
    """A stream-leader election as the client sees it: ``503 unavailable`` (NoStreamResponseError)
    until ``lasts_s`` of the client's pauses have passed, then the answer. Time is the pauses the
    client asked for (recorded, not slept)."""

    def __init__(self, lasts_s: float) -> None:
        self.lasts_s = lasts_s
        self.slept: list[float] = []

    def answer(self, request: httpx.Request) -> httpx.Response:
        if sum(self.slept) < self.lasts_s:
            return problem(503, "unavailable", "NoStreamResponseError")
        return httpx.Response(200, json={"messages": []})

    def client(self, rec: Recorder, monkeypatch: pytest.MonkeyPatch, **kw: Any) -> ChronicleClient:
        c = ChronicleClient("http://chronicle.test", "key", transport=httpx.MockTransport(rec), **kw)

        async def sleep(seconds: float) -> None:
            self.slept.append(seconds)

        monkeypatch.setattr(c, "_sleep", sleep)
        return c


async def test_by_default_a_safe_call_rides_out_a_stream_leader_election(monkeypatch: pytest.MonkeyPatch) -> None:
    election = Election(lasts_s=6.0)  # what a NATS stream-leader election takes
    rec = Recorder(election.answer)
    async with election.client(rec, monkeypatch) as c:
        assert await Session.create(c, "s").get_history() == []
    assert sum(election.slept) >= 6.0
    assert len(rec.requests) == len(election.slept) + 1
    assert all(p <= 2.0 * 1.5 for p in election.slept)  # capped backoff, jittered
    assert election.slept[0] <= 0.1 * 1.5  # it starts short


async def test_by_default_retrying_ends_when_the_time_budget_is_spent(monkeypatch: pytest.MonkeyPatch) -> None:
    election = Election(lasts_s=float("inf"))
    rec = Recorder(election.answer)
    async with election.client(rec, monkeypatch) as c:
        with pytest.raises(Unavailable) as caught:
            await Session.create(c, "s").get_history()
    assert caught.value.detail == "NoStreamResponseError"
    assert sum(election.slept) == pytest.approx(RETRY_BUDGET_S)  # the last pause is cut to the budget
    assert len(rec.requests) == len(election.slept) + 1
    assert 8 <= len(rec.requests) <= 40  # backed off, not hammering


async def test_the_budget_and_the_retries_are_settable(monkeypatch: pytest.MonkeyPatch) -> None:
    short = Election(lasts_s=float("inf"))
    rec = Recorder(short.answer)
    async with short.client(rec, monkeypatch, retries=0, retry_budget_s=1.0) as c:
        with pytest.raises(Unavailable):
            await Session.create(c, "s").get_history()
    assert sum(short.slept) == pytest.approx(1.0)

    counted = Election(lasts_s=float("inf"))
    rec = Recorder(counted.answer)
    async with counted.client(rec, monkeypatch, retries=2, retry_budget_s=0) as c:
        with pytest.raises(Unavailable):
            await Session.create(c, "s").get_history()
    assert (len(rec.requests), len(counted.slept)) == (3, 2)

    slow = Election(lasts_s=float("inf"))  # the first retries are made however long they took
    rec = Recorder(slow.answer)
    async with slow.client(rec, monkeypatch, retries=3, backoff_s=10.0, max_backoff_s=10.0) as c:
        with pytest.raises(Unavailable):
            await Session.create(c, "s").get_history()
    assert len(slow.slept) == 3
    assert sum(slow.slept) >= RETRY_BUDGET_S

    off = Election(lasts_s=float("inf"))
    rec = Recorder(off.answer)
    async with off.client(rec, monkeypatch, retries=0, retry_budget_s=0) as c:
        with pytest.raises(Unavailable):
            await Session.create(c, "s").get_history()
    assert (len(rec.requests), off.slept) == (1, [])


async def test_a_post_that_may_have_run_is_not_retried_within_the_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    election = Election(lasts_s=float("inf"))
    rec = Recorder(election.answer)
    async with election.client(rec, monkeypatch) as c:
        with pytest.raises(Unavailable):
            await c.request("POST", "/v1/sessions/s/system-prompt:refresh", idempotent=False)
    assert (len(rec.requests), election.slept) == (1, [])


async def test_a_retry_after_past_the_budget_left_raises_once_the_retries_are_made(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    rec = Recorder(lambda r: rate_limited(RETRY_BUDGET_S * 0.6))
    election = Election(0)
    async with election.client(rec, monkeypatch, retries=1) as c:
        with pytest.raises(RateLimited):
            await Session.create(c, "s").get_history()
    assert election.slept == [RETRY_BUDGET_S * 0.6]  # the second would end past the budget
    assert len(rec.requests) == 2


async def test_a_command_over_nats_rides_out_an_election_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    import nats.errors

    from chronicle_sdk.client import _Direct, _NatsErrors

    slept: list[float] = []
    unavailable = Reply(503, {"status": 503, "code": "unavailable", "detail": "NoStreamResponseError"})
    appended = Reply(201, {"id": "m1", "parent_id": None, "seq": 3, "created": True})

    class Electing(FakeNats):
        """No command service answers at first, then 503s, until 6 s of pauses have passed."""

        async def request(self, subject: str, data: bytes, timeout: float) -> Any:
            self.script = [
                nats.errors.NoRespondersError() if not slept else unavailable if sum(slept) < 6.0 else appended
            ]
            return await super().request(subject, data, timeout)

    nc = Electing(appended)
    c = ChronicleClient("http://x", "k", nats_url="nats://127.0.0.1:1", via="nats")
    c._publishing = NatsPublishing.from_json({**NATS_INFO, "command_prefix": "c.cmd"})
    c._direct = _Direct(nc=nc, publisher=None, errors=_NatsErrors(), who="NKey user U…")  # type: ignore[arg-type]

    async def sleep(seconds: float) -> None:
        slept.append(seconds)

    monkeypatch.setattr(c, "_sleep", sleep)
    assert (await c.append("s1", msg("m1"))).seq == 3
    assert len(nc.subjects) == len(slept) + 1
    assert 6.0 <= sum(slept) <= RETRY_BUDGET_S


async def test_a_read_the_projection_keeps_behind_raises_after_retries_plus_one_read_waits(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """What the client's docstring says a call may wait (docs/sdk.md): each attempt answered
    ``503 projection_timeout`` after the server's read wait (5 s by default), ``retries`` + 1
    attempts (25 s, past the 15 s budget), plus the pauses (at most 2.25 s)."""
    read_wait_s = 5.0
    start = time.monotonic()  # a call's first attempt is timed from it (the real clock)
    clock = [start]
    monkeypatch.setattr(time, "monotonic", lambda: clock[0])

    def behind(_request: httpx.Request) -> httpx.Response:
        clock[0] += read_wait_s  # the server waited for the projection, then gave up
        return problem(503, "projection_timeout")

    rec = Recorder(behind)
    c = ChronicleClient("http://chronicle.test", "key", transport=httpx.MockTransport(rec))
    slept: list[float] = []

    async def sleep(seconds: float) -> None:
        slept.append(seconds)
        clock[0] += seconds

    monkeypatch.setattr(c, "_sleep", sleep)
    async with c:
        with pytest.raises(ProjectionTimeout):
            await Session.create(c, "s").get_history()
    assert len(rec.requests) == 4 + 1  # retries + 1
    assert sum(slept) <= 0.15 + 0.3 + 0.6 + 1.2
    assert clock[0] - start <= (4 + 1) * read_wait_s + 2.25


async def test_a_chain_request_does_not_end_with_a_summary_when_the_next_can_start_with_it() -> None:
    """History sent back holds a compaction summary: the server replays it and the chain goes on
    after the last message it covers, which the next request's ``parent_id`` could not name."""
    rec = Recorder(batch_answer)
    chain = [msg(f"m{i}") for i in range(999)] + [msg("compaction_6f1c1b4e-0000-4000-8000-000000000000"), msg("new")]
    async with rec.client() as c:
        await c.append_chain("s1", chain, None)
    assert [len(b["messages"]) for b in rec.bodies()] == [999, 2]
    assert [b["parent_id"] for b in rec.bodies()] == [None, "m998"]
    assert rec.bodies()[1]["messages"][0]["id"].startswith("compaction_")


def _overlay_json(seq: int) -> dict[str, Any]:
    return {
        "id": f"o{seq}",
        "message_id": f"compaction_o{seq}",
        "from_message_id": "a",
        "to_message_id": "b",
        "leaf_id": "b",
        "tokens_before": 10,
        "tokens_after": 1,
        "summarizer": "test",
        "model": None,
        "summary": f"summary {seq}",
        "created_at": "2026-12-07T10:00:00+00:00",
        "seq": seq,
    }


def _failure_json(seq: int) -> dict[str, Any]:
    return {
        "seq": seq,
        "leaf_id": "b",
        "summarizer": "test",
        "error": "HTTP 503",
        "attempt": 1,
        "created_at": "2026-12-07T10:00:00+00:00",
    }


async def test_a_sessions_compactions_and_failures_are_read_page_after_page() -> None:
    """The server answers them a page at a time (a page may end early at its text budget): the
    SDK follows ``next_cursor`` until it is null, each item once, in order."""
    pages = {None: ([1, 2], 2), "2": ([3, 4], 4), "4": ([5], None)}

    def handler(request: httpx.Request) -> httpx.Response:
        seqs, nxt = pages[request.url.params.get("cursor")]
        if request.url.path.endswith("/compactions"):
            return httpx.Response(200, json={"compactions": [_overlay_json(q) for q in seqs], "next_cursor": nxt})
        return httpx.Response(200, json={"failures": [_failure_json(q) for q in seqs], "next_cursor": nxt})

    rec = Recorder(handler)
    async with rec.client() as c:
        s = Session.create(c, "s1")
        assert [o.seq for o in await s.get_compactions()] == [1, 2, 3, 4, 5]
        assert [f.seq for f in await s.get_compaction_failures()] == [1, 2, 3, 4, 5]
        assert [o.seq for o in await SessionManager(c).get_compactions("s1")] == [1, 2, 3, 4, 5]
    assert [p.get("cursor") for p in rec.params("/compactions")] == [None, "2", "4"] * 2
    assert [p.get("cursor") for p in rec.params("/compaction-failures")] == [None, "2", "4"]


@pytest.mark.parametrize("failed_index", [7, -2000], ids=["past-the-chain", "negative"])
async def test_a_failed_index_outside_the_chain_keeps_the_servers_error(failed_index: int) -> None:
    """The chain's error message names the message it failed at; a server's ``failed_index``
    that names no message of the chain (here 1000 + 7 of 1002, or before the first) must not
    replace the error with an ``IndexError``."""

    def handler(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        if body["parent_id"] is None:
            return batch_answer(request)
        answer = problem(409, "message_conflict", "the id is stored with another body")
        refused = {**json.loads(answer.content), "failed_index": failed_index, "written": []}
        return httpx.Response(409, json=refused, headers={"content-type": "application/problem+json"})

    rec = Recorder(handler)
    async with rec.client() as c:
        with pytest.raises(MessageConflict) as caught:
            await c.append_chain("s1", [msg(f"m{i}") for i in range(1002)], None)
    err = caught.value
    assert str(err).startswith("the id is stored with another body")
    assert "1000 of the chain's 1002 messages are stored" in str(err)
    assert "go on from" not in str(err)  # no message of the chain to go on from
    assert len(err.written) == 1000


def test_a_pipelined_chains_message_names_the_messages_published_with_the_one_that_failed() -> None:
    """Via JetStream the messages after ``failed_index`` were published with it: one is named
    alone, several as a range; a chain that failed at its last message names none."""
    chain = [{"id": f"m{i}"} for i in range(4)]
    err = Unavailable("down")
    err.written, err.failed_index = [AppendResult("m0", None, 5, True), AppendResult("m1", "m0", 6, True)], 2
    assert "; message 3 was published with it and may be stored too" in _chain_stored(err, chain, pipelined=True)
    err.failed_index, err.written = 1, err.written[:1]
    assert "; messages 2-3 were published with it" in _chain_stored(err, chain, pipelined=True)
    assert "published with it" not in _chain_stored(err, chain[:2], pipelined=True)
    assert "published with it" not in _chain_stored(err, chain, pipelined=False)


async def test_a_client_remembers_a_bounded_number_of_sessions_and_still_waits_for_each_write() -> None:
    """A long-lived client (an agent service's, one conversation after another) kept the last write
    ``seq`` of every session it ever wrote to: its memory grew by an entry per session without
    bound, and every tenant-wide read took the highest of all of them. It now remembers the
    sessions it wrote to last; a read of one it forgot waits for the highest ``seq`` it forgot (at
    least that session's own write), a tenant-wide read for the highest it saw."""

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/search":
            return httpx.Response(200, json={"results": []})
        return httpx.Response(200, json={"leaf_id": None, "messages": []})

    rec = Recorder(handler)
    sessions = 10 * REMEMBERED_SESSIONS
    async with rec.client() as c:
        tracemalloc.start()
        try:
            before = tracemalloc.get_traced_memory()[0]
            for i in range(sessions):
                c.note_seq(f"conversation-{i:08d}-{'x' * 24}", i + 1)
            held = tracemalloc.get_traced_memory()[0] - before
        finally:
            tracemalloc.stop()
        assert held < 400 * REMEMBERED_SESSIONS  # ~200 bytes a session remembered; every one: ~20 MB
        forgotten = sessions - REMEMBERED_SESSIONS  # the highest seq of a forgotten session
        await Session.create(c, f"conversation-{0:08d}-{'x' * 24}").get_history()  # forgotten: seq 1
        await Session.create(c, f"conversation-{forgotten - 1:08d}-{'x' * 24}").get_history()  # forgotten
        await Session.create(c, f"conversation-{sessions - 1:08d}-{'x' * 24}").get_history()  # remembered
        await SessionManager(c).search("x")
        assert c.last_seq() == sessions
    assert rec.params("/history") == [
        {"min_seq": str(forgotten)},
        {"min_seq": str(forgotten)},
        {"min_seq": str(sessions)},
    ]
    assert rec.params("/v1/search") == [{"q": "x", "limit": "20", "min_seq": str(sessions)}]
