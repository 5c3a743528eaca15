"""Message ids holding a ``/``: a new message may not take one (no URL path segment could name it,
``422 invalid_id``, nothing written), while a message stored with one earlier (published straight to
the log, as an older release did) stays readable, a parent, deletable, and a fork copies it
unchanged. Against the API as a real process."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from events.catalog import MessageAppended
from events.publisher import Publisher
from services.settings import Settings
from tests.conftest import operator_nats
from tests.e2e.helpers import append, assert_problem, chain, events, history_ids, msg, new_sid, stream_last_seq
from tests.integration.helpers import appended, logged_message

SLASHED = ["a/b", "/", "/m", "m/", "a/..", "../a"]

_json = {"Content-Type": "application/json"}
_routed = {"Content-Type": "application/vnd.chronicle+json"}  # through the routes instead of the hot path


@pytest.mark.parametrize("headers", [_json, _routed], ids=["hot-path", "route"])
async def test_a_new_message_id_with_a_slash_is_422_and_nothing_is_written(
    client: httpx.AsyncClient, headers: dict[str, str]
) -> None:
    sid = new_sid("slash")
    await chain(client, sid, ["m1"])
    before, last = await events(client, sid), await stream_last_seq(client)
    for mid in SLASHED:
        body = {"message": msg(mid, "unreachable")}
        r = await client.post(f"/v1/sessions/{sid}/messages", content=json.dumps(body), headers=headers)
        problem = assert_problem(r, 422, "invalid_id")
        assert "message id must not contain '/'" in problem["detail"], problem
        batch = {"messages": [msg("m2", "before it"), msg(mid, "unreachable")], "parent_id": "m1"}
        r = await client.post(f"/v1/sessions/{sid}/messages:batch", content=json.dumps(batch), headers=headers)
        assert_problem(r, 422, "invalid_id")
    fresh = new_sid("slash")  # an append to a session never created creates nothing either
    r = await client.post(f"/v1/sessions/{fresh}/messages", json={"message": msg("a/b", "x")})
    assert_problem(r, 422, "invalid_id")
    assert await events(client, sid) == before
    assert await events(client, fresh) == []
    assert await stream_last_seq(client) == last


async def _publish_as_an_older_release(settings: Settings, sid: str, mid: str, parent: str) -> int:
    """``mid`` appended under ``parent`` straight to the log with the contract's publisher: what
    an earlier release stored, or an agent service publishing directly."""
    nc = await operator_nats(settings.nats_url)
    try:
        event = appended("tenant-a", sid, mid, parent, f"stored long ago as {mid}")
        return (await Publisher(nc.jetstream(), settings.layout()).publish(event)).seq
    finally:
        await nc.close()


async def test_a_stored_id_with_a_slash_stays_readable_a_parent_and_is_copied_by_a_fork(
    client: httpx.AsyncClient, api_settings: Settings
) -> None:
    sid = new_sid("slash")
    await chain(client, sid, ["m1"])
    seq = await _publish_as_an_older_release(api_settings, sid, "old/m2", "m1")
    assert await history_ids(client, sid, min_seq=seq) == ["m1", "old/m2"]
    # a parent by id: the reading rules admit it
    child = await append(client, sid, msg("m3", "after the old one"), "old/m2")
    assert child["parent_id"] == "old/m2"
    assert await history_ids(client, sid, min_seq=child["seq"], leaf_id="old/m2") == ["m1", "old/m2"]
    assert await history_ids(client, sid, min_seq=child["seq"]) == ["m1", "old/m2", "m3"]
    r = await client.get(f"/v1/sessions/{sid}/search", params={"q": "stored long ago", "min_seq": child["seq"]})
    assert [hit["id"] for hit in r.json()["results"]] == ["old/m2"], r.text
    # the same id appended again is a new message's id as far as the request goes: refused
    r = await client.post(f"/v1/sessions/{sid}/messages", json={"message": msg("old/m2", "stored long ago as old/m2")})
    assert_problem(r, 422, "invalid_id")

    fork: dict[str, Any] = (await client.post(f"/v1/sessions/{sid}/fork", json={"at_message_id": "m3"})).json()
    assert fork["messages"] == 3, fork
    assert await history_ids(client, fork["id"], min_seq=fork["seq"]) == ["m1", "old/m2", "m3"]
    logged = [e["event"] for e in await events(client, fork["id"])]
    copies = [logged_message(e) for e in logged if e["type"] == "message.appended"]
    assert all(isinstance(e, MessageAppended) for e in copies)
    assert [(e.message_id, e.parent_id) for e in copies if isinstance(e, MessageAppended)] == [
        ("m1", None),
        ("old/m2", "m1"),
        ("m3", "old/m2"),
    ]
    at_old = (await client.post(f"/v1/sessions/{sid}/fork", json={"at_message_id": "old/m2"})).json()
    assert await history_ids(client, at_old["id"], min_seq=at_old["seq"]) == ["m1", "old/m2"]

    deleted = await client.post(f"/v1/sessions/{sid}/messages:delete", json={"ids": ["old/m2"]})
    assert deleted.status_code == 200, deleted.text
    assert await history_ids(client, sid, min_seq=deleted.json()["seq"], leaf_id="m1") == ["m1"]
