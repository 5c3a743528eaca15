"""Operations endpoints: liveness, readiness with projection lag, Prometheus metrics, OpenAPI."""

from __future__ import annotations

import re

import httpx
import pytest

from tests.e2e.helpers import append, msg, new_sid


async def test_healthz(anon: httpx.AsyncClient) -> None:
    r = await anon.get("/healthz")
    assert r.status_code == 200, r.text
    assert r.json() == {"status": "ok"}


@pytest.mark.parametrize("path", ["/healthz", "/readyz", "/audit/"])
async def test_head_answers_like_get_without_a_body(anon: httpx.AsyncClient, path: str) -> None:
    """(Probes send HEAD; it was 405.)"""
    got = await anon.get(path)
    head = await anon.head(path)
    assert (head.status_code, got.status_code) == (200, 200), head.headers
    assert head.content == b""
    assert head.headers["content-type"] == got.headers["content-type"]
    assert int(head.headers["content-length"]) > 0


async def test_head_on_a_route_without_get_is_405_as_get_is(client: httpx.AsyncClient) -> None:
    head = await client.head("/v1/sessions/s1/messages:clear")
    assert (head.status_code, head.content) == (405, b"")
    assert (await client.get("/v1/sessions/s1/messages:clear")).status_code == 405


async def test_readyz_reports_backends_and_lag(client: httpx.AsyncClient, anon: httpx.AsyncClient) -> None:
    out = await append(client, new_sid(), msg("m1", "make sure the projector has something to apply"))
    await client.get("/v1/sessions", params={"min_seq": out["seq"], "limit": 1})
    r = await anon.get("/readyz")
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["ready"] is True
    assert body["nats"] is True
    assert body["postgres"] is True
    lag = body["lag"]
    assert isinstance(lag, dict)
    assert lag, "no projector checkpoint reported"
    assert all(isinstance(v, int) and v >= 0 for v in lag.values())


async def test_metrics(client: httpx.AsyncClient, anon: httpx.AsyncClient) -> None:
    out = await append(client, new_sid(), msg("m1", "counted"))
    await client.get("/v1/sessions", params={"min_seq": out["seq"], "limit": 1})
    r = await anon.get("/metrics")
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("text/plain")
    text = r.text
    assert "chronicle_events_published_total" in text
    m = re.search(r'^chronicle_events_published_total\{type="message.appended"\} (\S+)$', text, re.MULTILINE)
    assert m, text
    assert float(m.group(1)) >= 1
    assert re.search(r"^chronicle_projection_lag\{projector=", text, re.MULTILINE), text
    assert re.search(r"^chronicle_events_applied\{projector=", text, re.MULTILINE), text
    last = re.search(r"^chronicle_stream_last_seq (\S+)$", text, re.MULTILINE)
    assert last
    assert float(last.group(1)) >= out["seq"]


async def published(anon: httpx.AsyncClient) -> dict[str, float]:
    """``chronicle_events_published_total`` of the API process, by event type."""
    r = await anon.get("/metrics")
    assert r.status_code == 200, r.text
    found = re.findall(r'^chronicle_events_published_total\{type="([^"]+)"\} (\S+)$', r.text, re.MULTILINE)
    return {kind: float(n) for kind, n in found}


def added(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    return {k: n - before.get(k, 0.0) for k, n in after.items() if n != before.get(k, 0.0)}


async def test_published_counts_each_event_stored_once_whatever_wrote_it(
    client: httpx.AsyncClient, anon: httpx.AsyncClient
) -> None:
    """The count is the publisher's: an event the log stored for this process, once. A replayed
    append (same ``Idempotency-Key``) and a second erase store nothing and count nothing; a
    tool's block write and the first prompt read count as every other write (they counted
    nothing)."""
    sid = new_sid("counted")
    before = await published(anon)
    body = {"message": msg("m1", "counted once")}
    for _ in range(3):
        r = await client.post(f"/v1/sessions/{sid}/messages", json=body, headers={"Idempotency-Key": f"k-{sid}"})
        assert r.status_code in (200, 201), r.text
    config = {"blocks": [{"label": "memory", "kind": "writable", "description": "facts", "max_tokens": 100}]}
    r = await client.put(f"/v1/sessions/{sid}/config", json=config)
    assert r.status_code == 200, r.text
    r = await client.post(f"/v1/sessions/{sid}/tools/set_context", json={"label": "memory", "content": "blue"})
    assert r.status_code == 200, r.text
    assert r.json()["result"].startswith("Written"), r.json()
    r = await client.get(f"/v1/sessions/{sid}/system-prompt", params={"min_seq": r.json()["seq"]})
    assert r.status_code == 200, r.text
    assert added(before, await published(anon)) == {
        "message.appended": 1,
        "session.configured": 1,
        "context.written": 1,
        "prompt.rendered": 1,
    }
    before = await published(anon)
    for _ in range(2):
        r = await client.post(f"/v1/sessions/{sid}:erase")
        assert r.status_code == 200, r.text
    assert added(before, await published(anon)) == {"session.erased": 1}


async def test_openapi_lists_the_v1_routes(anon: httpx.AsyncClient) -> None:
    r = await anon.get("/openapi.json")
    assert r.status_code == 200, r.text
    paths = r.json()["paths"]
    for p in [
        "/v1/sessions",
        "/v1/sessions/{sid}",
        "/v1/sessions/{sid}/messages",
        "/v1/sessions/{sid}/messages/{mid}",
        "/v1/sessions/{sid}/messages/{mid}/children",
        "/v1/sessions/{sid}/history",
        "/v1/sessions/{sid}/leaf",
        "/v1/sessions/{sid}/search",
        "/v1/search",
        "/v1/sessions/{sid}/events",
    ]:
        assert p in paths, p
