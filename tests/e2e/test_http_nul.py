"""NUL characters cannot be stored by Postgres: refused at the edge and by the event contract;
an event holding one that reaches the log anyway is quarantined, never applied."""

from __future__ import annotations

import uuid

import httpx
import psycopg
import pytest

from events.admission import Refused
from events.catalog import MessageAppended
from events.messages import body_hash
from events.publisher import Publisher
from services.settings import Settings
from tests.conftest import operator_nats


def sid() -> str:
    return "nul-" + uuid.uuid4().hex[:8]


async def test_nul_is_refused_everywhere(client: httpx.AsyncClient) -> None:
    s = sid()
    bad = {"id": "m1", "role": "user", "parts": [{"type": "text", "text": "a\u0000b"}]}
    r = await client.post(f"/v1/sessions/{s}/messages", json={"message": bad})
    assert (r.status_code, r.json()["code"]) == (422, "invalid_request")
    r = await client.post("/v1/sessions", json={"id": s, "metadata": {"k": "a\u0000b"}})
    assert (r.status_code, r.json()["code"]) == (422, "invalid_request")
    r = await client.get(f"/v1/sessions/{s}/search", params={"q": "a\u0000b"})
    assert r.status_code == 422
    r = await client.get("/v1/sessions", params={"cursor": str(10**20)})
    assert r.status_code == 422
    ok = await client.post(f"/v1/sessions/{s}/messages", json={"message": {**bad, "parts": []}})
    assert ok.status_code == 201
    events = (await client.get(f"/v1/sessions/{s}/events")).text.strip().splitlines()
    assert len(events) == 1  # only the good append was recorded


async def test_a_nul_event_is_refused_by_the_publisher_and_quarantined_when_published_raw(
    client: httpx.AsyncClient, api_settings: Settings
) -> None:
    s = sid()
    body = {"id": "m1", "role": "us\u0000er", "parts": [{"type": "text", "text": "a\u0000b"}]}
    ev = MessageAppended(
        tenant="tenant-a",
        session=s,
        message_id="m1",
        parent_id=None,
        role=body["role"],
        body_sha256=body_hash(body),
        message=body,
    )
    nc = await operator_nats(api_settings.nats_url)
    try:
        pub = Publisher(nc.jetstream(), api_settings.layout())
        with pytest.raises(Refused) as refused:
            await pub.publish(ev)
        assert refused.value.reason == "invalid"
        # a publisher that bypasses the contract: stored, then quarantined by the projector
        ack = await nc.jetstream().publish(pub.subject_of(ev), ev.to_json(), stream=api_settings.stream)
    finally:
        await nc.close()
    other = sid()
    r = await client.post(f"/v1/sessions/{other}/messages", json={"message": {"id": "x", "role": "user", "parts": []}})
    assert r.status_code == 201  # the projector kept going past the bad event
    h = await client.get(f"/v1/sessions/{other}/history", params={"min_seq": r.json()["seq"]})
    assert [m["id"] for m in h.json()["messages"]] == ["x"]
    assert r.json()["seq"] > ack.seq
    async with await psycopg.AsyncConnection.connect(api_settings.database_url) as conn:
        cur = await conn.execute("SELECT reason FROM quarantine WHERE seq = %s", (ack.seq,))
        assert await cur.fetchone() == ("invalid",)
