"""The hot paths (services/api/hot.py) answer exactly as the routes do: the same requests, good
and bad, through the API with them and without them, give the same status, type and body; and
what they do not take whole reaches the routes."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
import pytest

from services.api.app import build_app
from services.api.metrics import REGISTRY
from services.bootstrap import Container
from tests.conftest import KEYS

Request = tuple[str, str, dict[str, str], bytes | None]
AUTH = {"Authorization": f"Bearer {KEYS['tenant-a']}"}
JSON_TYPE = {"content-type": "application/json"}


def client_of(stack: Container, *, hot: bool) -> httpx.AsyncClient:
    app = build_app(stack.settings.model_copy(update={"api_hot_paths": hot}), stack)
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://chronicle", headers=AUTH)


@pytest.fixture
async def both(stack: Container) -> AsyncIterator[tuple[httpx.AsyncClient, httpx.AsyncClient]]:
    async with client_of(stack, hot=True) as hot, client_of(stack, hot=False) as routes:
        yield hot, routes


def message(mid: str, text: str = "We deploy on Friday") -> dict[str, Any]:
    return {"id": mid, "role": "user", "parts": [{"type": "text", "text": text}]}


def body(value: Any) -> bytes:
    return json.dumps(value).encode()


async def send(client: httpx.AsyncClient, request: Request) -> httpx.Response:
    method, url, headers, content = request
    return await client.request(method, url, headers=headers, content=content)


def bad_requests(sid: str) -> list[Request]:
    """Requests the routes refuse or answer specially (an unknown leaf, a repeated parameter);
    none of them changes anything."""
    append = f"/v1/sessions/{sid}/messages"
    history = f"/v1/sessions/{sid}/history"
    return [
        ("POST", append, JSON_TYPE, b'{"message": '),  # not JSON
        ("POST", append, JSON_TYPE, b""),  # no body
        ("POST", append, {"content-type": "text/plain"}, body({"message": message("t1")})),
        ("POST", append, JSON_TYPE, b'{"message": {"id": "n1", "role": "user", "parts": [], "x": NaN}}'),
        ("POST", append, JSON_TYPE, body({})),  # no message
        ("POST", append, JSON_TYPE, body({"message": message("e1"), "extra": 1})),
        ("POST", append, JSON_TYPE, body({"message": "not an object"})),
        ("POST", append, JSON_TYPE, body([message("l1")])),
        ("POST", append, JSON_TYPE, body({"message": {"role": "user", "parts": []}})),  # no id
        ("POST", append, JSON_TYPE, body({"message": message("bad id\n")})),
        ("POST", append, JSON_TYPE, body({"message": message("p1"), "parent_id": "no-such-parent"})),
        ("POST", append, JSON_TYPE, body({"message": message("z1", "nul \u0000 inside")})),
        ("POST", append, {**JSON_TYPE, "Idempotency-Key": "has space"}, body({"message": message("k1")})),
        ("POST", append, {**JSON_TYPE, "Idempotency-Key": "x" * 129}, body({"message": message("k2")})),
        ("POST", "/v1/sessions/bad%00id/messages", JSON_TYPE, body({"message": message("s1")})),
        ("POST", "/v1/sessions/" + "s" * 300 + "/messages", JSON_TYPE, body({"message": message("s2")})),
        ("POST", append, {**JSON_TYPE, "Authorization": "Bearer wrong"}, body({"message": message("w1")})),
        ("GET", history + "?min_seq=abc", {}, None),
        ("GET", history + "?min_seq=-1", {}, None),
        ("GET", history + f"?min_seq={2**63}", {}, None),
        ("GET", history + "?leaf_id=", {}, None),
        ("GET", history + "?leaf_id=bad%0Aid", {}, None),
        ("GET", history + "?leaf_id=a&leaf_id=b", {}, None),
        ("GET", history + "?limit=0", {}, None),
        ("GET", "/v1/sessions/no-such-session/history", {}, None),
        ("GET", "/v1/sessions/no-such-session/history?leaf_id=m1&min_seq=1", {}, None),
        ("GET", "/v1/sessions/bad%00id/history", {}, None),
        ("GET", history, {"Authorization": "Bearer wrong"}, None),
    ]


async def test_bad_and_odd_requests_answer_alike_with_and_without_the_hot_paths(
    both: tuple[httpx.AsyncClient, httpx.AsyncClient], new_id: Callable[[str], str]
) -> None:
    hot, routes = both
    sid = new_id("s")
    first = await hot.post(f"/v1/sessions/{sid}/messages", json={"message": message("m1")})
    assert first.status_code == 201, first.text
    for request in bad_requests(sid):
        a, b = await send(hot, request), await send(routes, request)
        assert (a.status_code, a.headers.get("content-type"), a.content) == (
            b.status_code,
            b.headers.get("content-type"),
            b.content,
        ), request
    history = await hot.get(f"/v1/sessions/{sid}/history")
    assert [m["id"] for m in history.json()["messages"]] == ["m1"]  # nothing else was written


async def test_appends_and_history_answer_alike_with_and_without_the_hot_paths(
    both: tuple[httpx.AsyncClient, httpx.AsyncClient], new_id: Callable[[str], str]
) -> None:
    answers: list[list[tuple[int, str | None, dict[str, Any]]]] = []
    sids: list[str] = []
    for client in both:
        sid = new_id("s")
        sids.append(sid)
        url = f"/v1/sessions/{sid}/messages"
        keyed = {"Idempotency-Key": "retry-1", "content-type": "application/json; charset=utf-8"}
        steps = [
            await client.post(url, json={"message": message("m1")}),
            await client.post(url, json={"message": message("m2")}),
            await client.post(url, json={"message": message("m2")}),  # the same again: 200
            await client.post(url, json={"message": message("m3"), "parent_id": "m1"}),  # a branch
            await client.post(url, json={"message": message("r1"), "parent_id": None}),  # a new root
            await client.post(url, content=body({"message": message("m4")}), headers=keyed),
            await client.post(url, content=body({"message": message("m4")}), headers=keyed),
        ]
        answers.append([(r.status_code, r.headers.get("content-type"), _no_seq(r.json())) for r in steps])
    assert answers[0] == answers[1]
    assert [status for status, _, _ in answers[0]] == [201, 201, 200, 201, 201, 201, 201]
    reads: list[list[bytes]] = [[], []]
    for sid in sids:
        last = (await both[1].get(f"/v1/sessions/{sid}/leaf")).json()
        for client, out in zip(both, reads, strict=True):
            for query in ("", "?leaf_id=m3", "?leaf_id=m2&min_seq=1", "?min_seq=1"):
                r = await client.get(f"/v1/sessions/{sid}/history{query}")
                assert r.status_code == 200, r.text
                out.append(r.content.replace(sid.encode(), b"SID"))
        assert last["leaf_id"] == "m4"
    assert reads[0] == reads[1]
    assert json.loads(reads[0][1])["messages"][-1]["id"] == "m3"


def _no_seq(answer: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in answer.items() if k != "seq"}


def hot_count(route: str, outcome: str) -> float:
    value = REGISTRY.get_sample_value("chronicle_api_hot_path_requests_total", {"route": route, "outcome": outcome})
    return value or 0.0


async def test_the_hot_paths_serve_plain_requests_and_hand_on_the_rest(
    stack: Container, new_id: Callable[[str], str]
) -> None:
    """A plain append and a plain history read are served by the hot paths; a body that does not
    parse and a parameter they do not take are handed on (the metric counts which)."""
    sid = new_id("s")
    before = {(r, o): hot_count(r, o) for r in ("append", "history") for o in ("served", "handed_on")}
    async with client_of(stack, hot=True) as client:
        appended = await client.post(f"/v1/sessions/{sid}/messages", json={"message": message("m1")})
        assert appended.status_code == 201, appended.text
        read = await client.get(f"/v1/sessions/{sid}/history?min_seq={appended.json()['seq']}")
        assert read.status_code == 200
        assert [m["id"] for m in read.json()["messages"]] == ["m1"]
        refused = await client.post(f"/v1/sessions/{sid}/messages", content=b"{", headers=JSON_TYPE)
        assert refused.status_code == 400
        raw = await client.get(f"/v1/sessions/{sid}/history?compacted=false")
        assert raw.status_code == 200
    after = {key: hot_count(*key) - value for key, value in before.items()}
    assert after == {
        ("append", "served"): 1,
        ("append", "handed_on"): 1,
        ("history", "served"): 1,
        ("history", "handed_on"): 1,
    }
    async with client_of(stack, hot=False) as client:
        await client.get(f"/v1/sessions/{sid}/history")
    assert hot_count("history", "served") - before[("history", "served")] == 1  # off: not looked at
