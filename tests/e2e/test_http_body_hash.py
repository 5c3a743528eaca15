"""A message event published straight to JetStream by its tenant, whose ``body_sha256`` is not its
inline body's hash (and that is no over-cap message, with ``original_ref``), is refused by the
contract as ``invalid`` and quarantined: before, it was admitted, the read model stored the wrong
hash, and appending the same message again over HTTP answered ``409 message_conflict`` instead of
replaying. Real NATS, Postgres, HTTP."""

from __future__ import annotations

import json
import uuid
from typing import Any

import httpx

from events.catalog import MessageAppended, MessageBodyEvent, MessageUpdated
from events.messages import body_hash
from services.settings import Settings
from tests.conftest import tenant_nats
from tests.e2e.helpers import append, history, history_ids, msg, new_sid

WRONG = body_hash(msg("m2", "some other text"))


async def publish_raw(settings: Settings, event: MessageBodyEvent, data: bytes | None = None) -> int:
    """``data`` (``event``'s own bytes by default) as they are, by its tenant with its own NATS
    credentials, on its own subject (no Publisher: it would refuse a wrong hash)."""
    nc = await tenant_nats(settings.nats_url, event.tenant)
    try:
        subject = settings.layout().session_subject(event.tenant, event.session)
        ack = await nc.jetstream().publish(subject, data or event.to_json(), stream=settings.stream)
    finally:
        await nc.close()
    return int(ack.seq)


async def quarantined(client: httpx.AsyncClient, sid: str) -> list[dict[str, Any]]:
    r = await client.get("/v1/quarantine", params={"session_id": sid})
    assert r.status_code == 200, r.text
    items: list[dict[str, Any]] = r.json()["quarantined"]
    return items


async def refused_detail(client: httpx.AsyncClient, sid: str, seq: int) -> str:
    """The detail of the session's one quarantined event, which must be ``seq``, refused as ``invalid``."""
    [q] = await quarantined(client, sid)
    assert (q["seq"], q["reason"]) == (seq, "invalid")
    return str(q["detail"])


async def session_with_m1(client: httpx.AsyncClient) -> str:
    sid = new_sid()
    await append(client, sid, msg("m1", "hello"))
    return sid


def appended_with(sid: str, body: dict[str, Any], digest: str, parent: str | None) -> MessageAppended:
    return MessageAppended(
        id=uuid.uuid4().hex,
        tenant="tenant-a",
        session=sid,
        message_id=str(body["id"]),
        parent_id=parent,
        role=str(body["role"]),
        body_sha256=digest,
        message=body,
    )


async def test_an_append_whose_hash_is_not_its_bodys_is_quarantined_and_the_true_body_then_appends(
    client: httpx.AsyncClient, api_settings: Settings
) -> None:
    sid = await session_with_m1(client)
    body = msg("m2", "the real text")
    seq = await publish_raw(api_settings, appended_with(sid, body, WRONG, "m1"))
    assert await history_ids(client, sid, min_seq=seq) == ["m1"]
    assert f"body_sha256 {WRONG!r} is not the SHA-256 of the inline message" in await refused_detail(client, sid, seq)
    # the id is free: the true body appends, and again it replays (no 409 message_conflict)
    first = await append(client, sid, body, "m1")
    assert first["created"] is True
    again = await append(client, sid, body, "m1", expect=200)
    assert (again["created"], again["seq"]) == (False, first["seq"])
    assert await history_ids(client, sid, min_seq=first["seq"]) == ["m1", "m2"]


async def test_an_update_whose_hash_is_not_its_bodys_is_quarantined_and_changes_nothing(
    client: httpx.AsyncClient, api_settings: Settings
) -> None:
    sid = await session_with_m1(client)
    changed = msg("m1", "changed")
    event = MessageUpdated(
        id=uuid.uuid4().hex,
        tenant="tenant-a",
        session=sid,
        message_id="m1",
        role="user",
        body_sha256=WRONG,
        message=changed,
    )
    seq = await publish_raw(api_settings, event)
    h = await history(client, sid, min_seq=seq)
    assert [m["parts"][0]["text"] for m in h["messages"]] == ["hello"]
    assert f"body_sha256 {WRONG!r}" in await refused_detail(client, sid, seq)


async def test_an_append_with_its_bodys_own_hash_written_out_is_admitted_and_replays(
    client: httpx.AsyncClient, api_settings: Settings
) -> None:
    """The check refuses only a wrong hash: one written out although it is the body's is stored,
    and the same message appended over HTTP replays it."""
    sid = await session_with_m1(client)
    body = msg("m2", "the real text")
    event = appended_with(sid, body, body_hash(body), "m1")
    written_out = {**json.loads(event.to_json()), "body_sha256": body_hash(body), "message_id": "m2", "role": "user"}
    seq = await publish_raw(api_settings, event, json.dumps(written_out).encode())
    assert await history_ids(client, sid, min_seq=seq) == ["m1", "m2"]
    assert await quarantined(client, sid) == []
    again = await append(client, sid, body, "m1", expect=200)
    assert (again["created"], again["seq"]) == (False, seq)
