"""A session's usage counters and end reason over HTTP (the reference's ``addUsage`` and
``end_reason``): ``POST /v1/sessions/{sid}/usage`` and ``POST /v1/sessions/{sid}:end``."""

from __future__ import annotations

import math
import re
from typing import Any

import httpx
import pytest

from events.catalog import SessionRenamed
from events.ids import derived_id
from services.settings import Settings
from tests.conftest import tenant_nats
from tests.e2e.helpers import assert_problem, events, new_sid


async def created(client: httpx.AsyncClient, **body: Any) -> str:
    sid = new_sid()
    r = await client.post("/v1/sessions", json={"id": sid, **body})
    assert r.status_code == 201, r.text
    return sid


async def session(client: httpx.AsyncClient, sid: str, min_seq: int) -> dict[str, Any]:
    r = await client.get(f"/v1/sessions/{sid}", params={"min_seq": min_seq})
    assert r.status_code == 200, r.text
    out: dict[str, Any] = r.json()
    return out


async def test_a_new_session_has_no_usage_and_no_end_reason(client: httpx.AsyncClient) -> None:
    sid = new_sid()
    r = await client.post("/v1/sessions", json={"id": sid})
    got = await session(client, sid, r.json()["seq"])
    assert (got["input_tokens"], got["output_tokens"], got["estimated_cost"], got["end_reason"]) == (0, 0, 0.0, None)


async def test_usage_adds_up_over_calls(client: httpx.AsyncClient) -> None:
    sid = await created(client)
    r = await client.post(f"/v1/sessions/{sid}/usage", json={"input_tokens": 1200, "output_tokens": 350, "cost": 0.25})
    assert r.status_code == 200, r.text
    first = r.json()
    assert first == {"id": sid, "input_tokens": 1200, "output_tokens": 350, "cost": 0.25, "seq": first["seq"]}
    r = await client.post(f"/v1/sessions/{sid}/usage", json={"input_tokens": 800, "cost": 0.5})
    assert r.status_code == 200, r.text
    got = await session(client, sid, r.json()["seq"])
    assert (got["input_tokens"], got["output_tokens"], got["estimated_cost"]) == (2000, 350, 0.75)
    kinds = [e["event"]["type"] for e in await events(client, sid)]
    assert kinds == ["session.created", "session.usage_added", "session.usage_added"]


async def test_usage_is_listed_with_the_session(client: httpx.AsyncClient) -> None:
    sid = await created(client)
    r = await client.post(f"/v1/sessions/{sid}/usage", json={"output_tokens": 7})
    seq = r.json()["seq"]
    r = await client.get("/v1/sessions", params={"limit": 500, "min_seq": seq})
    [entry] = [s for s in r.json()["sessions"] if s["id"] == sid]
    assert entry["output_tokens"] == 7


async def published_usage(anon: httpx.AsyncClient) -> float:
    """The API's count of the ``session.usage_added`` events it published (its /metrics)."""
    r = await anon.get("/metrics")
    assert r.status_code == 200, r.text
    m = re.search(r'^chronicle_events_published_total\{type="session.usage_added"\} (\S+)$', r.text, re.MULTILINE)
    return float(m.group(1)) if m else 0.0


async def test_a_retry_with_the_same_idempotency_key_adds_once(
    client: httpx.AsyncClient, anon: httpx.AsyncClient
) -> None:
    sid = await created(client)
    body = {"input_tokens": 10, "output_tokens": 1, "cost": 0.01}
    path = f"/v1/sessions/{sid}/usage"
    counted = await published_usage(anon)
    first = await client.post(path, json=body, headers={"Idempotency-Key": "call-1"})
    retry = await client.post(path, json=body, headers={"Idempotency-Key": "call-1"})
    other = await client.post(path, json=body, headers={"Idempotency-Key": "call-2"})
    assert (first.status_code, retry.status_code, other.status_code) == (200, 200, 200)
    assert retry.json() == first.json()
    assert other.json()["seq"] > first.json()["seq"]
    got = await session(client, sid, other.json()["seq"])
    assert (got["input_tokens"], got["output_tokens"], got["estimated_cost"]) == (20, 2, 0.02)
    assert await published_usage(anon) - counted == 2  # the retry wrote nothing, and is not counted


async def test_an_idempotency_key_is_per_session(client: httpx.AsyncClient) -> None:
    one, two = await created(client), await created(client)
    headers = {"Idempotency-Key": "same-key"}
    a = await client.post(f"/v1/sessions/{one}/usage", json={"input_tokens": 1}, headers=headers)
    b = await client.post(f"/v1/sessions/{two}/usage", json={"input_tokens": 2}, headers=headers)
    assert (a.status_code, b.status_code) == (200, 200), b.text
    assert (await session(client, two, b.json()["seq"]))["input_tokens"] == 2


@pytest.mark.parametrize(
    "other",
    [{"input_tokens": 11, "output_tokens": 1, "cost": 0.01}, {"input_tokens": 10, "output_tokens": 1, "cost": 0.02}],
    ids=["tokens", "cost"],
)
async def test_the_same_idempotency_key_with_other_amounts_is_refused_and_nothing_is_written(
    client: httpx.AsyncClient, anon: httpx.AsyncClient, other: dict[str, Any]
) -> None:
    sid = await created(client)
    path = f"/v1/sessions/{sid}/usage"
    headers = {"Idempotency-Key": "call-1"}
    first = await client.post(path, json={"input_tokens": 10, "output_tokens": 1, "cost": 0.01}, headers=headers)
    assert first.status_code == 200, first.text
    counted = await published_usage(anon)
    problem = assert_problem(await client.post(path, json=other, headers=headers), 422, "idempotency_key_reused")
    assert "call-1" in problem["detail"]
    assert [e["event"]["type"] for e in await events(client, sid)] == ["session.created", "session.usage_added"]
    got = await session(client, sid, first.json()["seq"])
    assert (got["input_tokens"], got["output_tokens"], got["estimated_cost"]) == (10, 1, 0.01)
    assert await published_usage(anon) == counted
    again = await client.post(path, json={"input_tokens": 10, "output_tokens": 1, "cost": 0.01}, headers=headers)
    assert again.json() == first.json()  # the first amounts still answer as the first time


async def test_a_negative_zero_cost_is_stored_and_answered_as_zero(client: httpx.AsyncClient) -> None:
    sid = await created(client)
    r = await client.post(
        f"/v1/sessions/{sid}/usage",
        content=b'{"input_tokens": 3, "cost": -0.0}',
        headers={"content-type": "application/json"},
    )
    assert r.status_code == 200, r.text
    assert '"cost":0.0' in r.text.replace(" ", "")
    assert math.copysign(1.0, r.json()["cost"]) == 1.0
    [stored] = [e["event"] for e in await events(client, sid) if e["event"]["type"] == "session.usage_added"]
    assert math.copysign(1.0, stored["cost"]) == 1.0
    got = await session(client, sid, r.json()["seq"])
    assert math.copysign(1.0, got["estimated_cost"]) == 1.0


@pytest.mark.parametrize("body", [{}, {"input_tokens": 0, "output_tokens": 0, "cost": 0}, {"cost": -0.0}], ids=repr)
async def test_nothing_to_add_writes_nothing_and_answers_the_last_seq(client: httpx.AsyncClient, body: Any) -> None:
    sid = new_sid()
    made = await client.post("/v1/sessions", json={"id": sid})
    r = await client.post(f"/v1/sessions/{sid}/usage", json=body)
    assert r.status_code == 200, r.text
    assert r.json() == {"id": sid, "input_tokens": 0, "output_tokens": 0, "cost": 0.0, "seq": made.json()["seq"]}
    assert [e["event"]["type"] for e in await events(client, sid)] == ["session.created"]
    assert_problem(await client.post(f"/v1/sessions/{new_sid()}/usage", json=body), 404, "session_not_found")


async def test_end_records_the_reason_and_the_session_stays_writable(client: httpx.AsyncClient) -> None:
    sid = await created(client)
    r = await client.post(f"/v1/sessions/{sid}:end", json={"reason": "compaction"})
    assert r.status_code == 200, r.text
    assert r.json() == {"id": sid, "end_reason": "compaction", "seq": r.json()["seq"]}
    assert (await session(client, sid, r.json()["seq"]))["end_reason"] == "compaction"
    r = await client.post(f"/v1/sessions/{sid}/usage", json={"input_tokens": 1})
    assert r.status_code == 200, r.text
    r = await client.post(f"/v1/sessions/{sid}:end", json={"reason": "user closed it"})
    got = await session(client, sid, r.json()["seq"])
    assert (got["end_reason"], got["input_tokens"]) == ("user closed it", 1)


@pytest.mark.parametrize("path", ["usage", ":end"])
async def test_an_unknown_or_deleted_session_is_404_and_nothing_is_written(
    client: httpx.AsyncClient, path: str
) -> None:
    body = {"reason": "x"} if path == ":end" else {"input_tokens": 1}
    unknown = new_sid()
    url = f"/v1/sessions/{unknown}{path if path.startswith(':') else '/' + path}"
    assert_problem(await client.post(url, json=body), 404, "session_not_found")
    assert await events(client, unknown) == []

    sid = await created(client)
    r = await client.delete(f"/v1/sessions/{sid}")
    assert r.status_code == 200, r.text
    url = f"/v1/sessions/{sid}{path if path.startswith(':') else '/' + path}"
    assert_problem(await client.post(url, json=body), 404, "session_not_found")
    assert [e["event"]["type"] for e in await events(client, sid)] == ["session.created", "session.deleted"]


@pytest.mark.parametrize(
    "body",
    [
        {"input_tokens": -1},
        {"output_tokens": -5},
        {"cost": -0.01},
        {"input_tokens": 1.5},
        {"input_tokens": "12"},
        {"input_tokens": True},
        {"cost": "0.1"},
        {"input_tokens": 10**12 + 1},
        {"cost": 1e13},
        {"tokens": 3},
        [],
    ],
    ids=repr,
)
async def test_bad_usage_is_422_and_nothing_is_written(client: httpx.AsyncClient, body: Any) -> None:
    sid = await created(client)
    assert_problem(await client.post(f"/v1/sessions/{sid}/usage", json=body), 422, "invalid_request")
    assert [e["event"]["type"] for e in await events(client, sid)] == ["session.created"]


async def test_a_non_finite_cost_is_refused(client: httpx.AsyncClient) -> None:
    sid = await created(client)
    r = await client.post(
        f"/v1/sessions/{sid}/usage", content=b'{"cost": NaN}', headers={"content-type": "application/json"}
    )
    problem = assert_problem(r, 422, "invalid_request")  # the strict JSON reader's refusal
    assert "NaN" in problem["detail"]
    assert [e["event"]["type"] for e in await events(client, sid)] == ["session.created"]


async def test_a_bad_idempotency_key_is_refused(client: httpx.AsyncClient) -> None:
    sid = await created(client)
    r = await client.post(f"/v1/sessions/{sid}/usage", json={"input_tokens": 1}, headers={"Idempotency-Key": "a b"})
    assert_problem(r, 422, "invalid_request")
    assert [e["event"]["type"] for e in await events(client, sid)] == ["session.created"]


@pytest.mark.parametrize("body", [{}, {"reason": ""}, {"reason": "x" * 257}, {"reason": "nul\u0000"}, {"reason": 3}])
async def test_a_bad_end_reason_is_refused_and_nothing_is_written(client: httpx.AsyncClient, body: Any) -> None:
    sid = await created(client)
    assert_problem(await client.post(f"/v1/sessions/{sid}:end", json=body), 422, "invalid_request")
    assert [e["event"]["type"] for e in await events(client, sid)] == ["session.created"]


async def test_an_idempotency_key_whose_id_a_tenant_published_under_is_409_and_nothing_is_written(
    client: httpx.AsyncClient, api_settings: Settings
) -> None:
    """A tenant publishing straight to JetStream put another event under the id the call derives
    (within the duplicate window, JetStream then stores nothing for the call): 409, not a 500."""
    sid = await created(client)
    layout = api_settings.layout()
    nc = await tenant_nats(api_settings.nats_url, "tenant-a")
    try:
        renamed = SessionRenamed(tenant="tenant-a", session=sid, name="taken")
        headers = {"Nats-Msg-Id": derived_id("usage", "tenant-a", sid, "call-1")}
        ack = await nc.jetstream().publish(layout.session_subject("tenant-a", sid), renamed.to_json(), headers=headers)
    finally:
        await nc.close()
    r = await client.post(f"/v1/sessions/{sid}/usage", json={"input_tokens": 5}, headers={"Idempotency-Key": "call-1"})
    problem = assert_problem(r, 409, "idempotency_key_conflict")
    assert "call-1" in problem["detail"]
    assert [e["event"]["type"] for e in await events(client, sid)] == ["session.created", "session.renamed"]
    got = await session(client, sid, ack.seq)
    assert (got["name"], got["input_tokens"]) == ("taken", 0)
