"""A message nested deeper than the HTTP API takes (64 levels), published straight to JetStream
by its tenant, is refused by the contract as ``invalid`` (quarantined with the reason), as HTTP
refuses it: before, it was admitted and stored, and compacting or forking its session then
answered ``500`` (the readers' ``json.loads`` raised RecursionError). Real NATS, Postgres, HTTP."""

from __future__ import annotations

import json
import re
import uuid
from datetime import UTC, datetime
from typing import Any

import httpx

from events.admission import MAX_DEPTH
from events.catalog import MessageAppended
from events.messages import body_hash
from services.settings import Settings
from tests.conftest import tenant_nats
from tests.e2e.helpers import append, assert_problem, history_ids, msg, new_sid

JSON = {"Content-Type": "application/json"}


def nested(depth: int, mid: str = "m2") -> dict[str, Any]:
    """A message with ``depth`` nested arrays in a part, its deepest ``depth`` + 2 levels below the
    message's own (in a request, as in an event, the message is at level 2). The arrays stand as
    a mark until :func:`dumps` writes them (json.dumps would recurse as deep)."""
    return {
        "id": mid,
        "role": "user",
        "parts": [{"type": "text", "text": "deep"}, {"type": "data-x", "data": f"@@{depth}@@"}],
    }


def dumps(value: dict[str, Any]) -> bytes:
    """``value`` as JSON, with the arrays of a :func:`nested` message written out."""
    return re.sub(r'"@@(\d+)@@"', lambda m: "[" * int(m[1]) + '"bottom"' + "]" * int(m[1]), json.dumps(value)).encode()


async def publish_as_tenant(settings: Settings, tenant: str, sid: str, parent: str, body: dict[str, Any]) -> int:
    """``tenant``'s own append of ``body``, with its own NATS credentials, on its own subject."""
    shallow = {"id": body["id"], "role": "user", "parts": []}
    event = MessageAppended(
        id=uuid.uuid4().hex,
        tenant=tenant,
        session=sid,
        message_id=body["id"],
        parent_id=parent,
        role="user",
        body_sha256=body_hash(shallow),
        message=shallow,
        occurred_at=datetime.now(UTC),
    )
    raw = {k: v for k, v in json.loads(event.to_json()).items() if k not in ("body_sha256", "message_id", "role")}
    raw["message"] = body
    nc = await tenant_nats(settings.nats_url, tenant)
    try:
        ack = await nc.jetstream().publish(settings.layout().session_subject(tenant, sid), dumps(raw))
    finally:
        await nc.close()
    return int(ack.seq)


async def test_a_message_nested_deeper_than_http_takes_is_quarantined_and_compact_and_fork_answer(
    client: httpx.AsyncClient, api_settings: Settings
) -> None:
    sid = new_sid()
    await append(client, sid, msg("m1", "hello"))
    # HTTP refuses the same message in a request
    r = await client.post(f"/v1/sessions/{sid}/messages", content=dumps({"message": nested(960)}), headers=JSON)
    assert_problem(r, 422, "invalid_request")
    seq = await publish_as_tenant(api_settings, "tenant-a", sid, "m1", nested(960))
    assert await history_ids(client, sid, min_seq=seq) == ["m1"]
    r = await client.get("/v1/quarantine", params={"session_id": sid})
    assert r.status_code == 200, r.text
    [q] = r.json()["quarantined"]
    assert (q["seq"], q["reason"]) == (seq, "invalid")
    assert f"nested deeper than {MAX_DEPTH} levels" in q["detail"]
    # the readers never meet it
    r = await client.post(f"/v1/sessions/{sid}/compact", json={})
    assert r.status_code == 200, r.text
    r = await client.post(f"/v1/sessions/{sid}/fork", json={"at_message_id": "m1"})
    assert r.status_code == 201, r.text
    r = await client.post(f"/v1/sessions/{sid}/fork", json={"at_message_id": "m2"})
    assert_problem(r, 404, "message_not_found")


async def test_a_message_as_deep_as_http_takes_is_stored_published_either_way(
    client: httpx.AsyncClient, api_settings: Settings
) -> None:
    """The limit is the same on both paths: the deepest message a request may hold (its request is
    then exactly 64 deep) is admitted from a direct publish too, and forks."""
    deepest = nested(MAX_DEPTH - 4)  # request {"message": {"parts": [{"data": [[…]]}]}}: 4 levels above
    over = nested(MAX_DEPTH - 3)
    sid = new_sid()
    await append(client, sid, msg("m1", "hello"))
    r = await client.post(f"/v1/sessions/{sid}/messages", content=dumps({"message": over}), headers=JSON)
    assert_problem(r, 422, "invalid_request")
    r = await client.post(f"/v1/sessions/{sid}/messages", content=dumps({"message": deepest}), headers=JSON)
    assert r.status_code == 201, r.text
    direct = new_sid()
    await append(client, direct, msg("m1", "hello"))
    seq = await publish_as_tenant(api_settings, "tenant-a", direct, "m1", deepest)
    assert await history_ids(client, direct, min_seq=seq) == ["m1", "m2"]
    r = await client.post(f"/v1/sessions/{direct}/fork", json={"at_message_id": "m2"})
    assert r.status_code == 201, r.text
    seq = await publish_as_tenant(api_settings, "tenant-a", direct, "m2", nested(MAX_DEPTH - 3, "m3"))
    assert await history_ids(client, direct, min_seq=seq) == ["m1", "m2"]
