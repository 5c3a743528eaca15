"""NUL characters cannot be stored by Postgres: refused at the edge, harmless in the log."""

from __future__ import annotations

import uuid

import httpx

from events.catalog import MessageAppended
from events.messages import body_hash


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


async def test_a_nul_event_from_another_publisher_does_not_stop_the_projector(
    client: httpx.AsyncClient, api_settings: object
) -> None:
    import nats

    from events.publisher import Publisher

    s = sid()
    body = {"id": "m1", "role": "us\u0000er", "parts": [{"type": "text", "text": "a\u0000b"}]}
    nc = await nats.connect(api_settings.nats_url)  # type: ignore[attr-defined]
    try:
        pub = Publisher(nc.jetstream(), api_settings.layout())  # type: ignore[attr-defined]
        ev = MessageAppended(
            tenant="tenant-a",
            session=s,
            message_id="m1",
            parent_id=None,
            role=body["role"],
            body_sha256=body_hash(body),
            message=body,
        )
        seq = (await pub.publish(ev)).seq
    finally:
        await nc.close()
    h = await client.get(f"/v1/sessions/{s}/history", params={"min_seq": seq})
    assert h.status_code == 200
    assert [m["id"] for m in h.json()["messages"]] == ["m1"]
    r = await client.post(f"/v1/sessions/{sid()}/messages", json={"message": {"id": "x", "role": "user", "parts": []}})
    assert r.status_code == 201  # the projector kept going
