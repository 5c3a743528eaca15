"""Over HTTP and the SDK's direct path: an event id another tenant took first, publishing straight
to JetStream on its own subjects with its own credentials (JetStream deduplicates across the whole
stream), is never answered as the write's own: ``409 idempotency_key_conflict`` for a keyed
append, :class:`~chronicle_sdk.EventIdTaken` for a direct publish, and nothing of it written."""

from __future__ import annotations

from typing import Any

import httpx
import nats.js.errors
import pytest

from chronicle_sdk import EventIdTaken, Session
from chronicle_sdk.client import direct_append_id
from events.ids import derived_id
from events.messages import body_hash
from services.settings import Settings
from tests.conftest import KEYS, tenant_nats
from tests.e2e.helpers import assert_problem, events, new_sid
from tests.e2e.sdk_support import client_for, ids, text
from tests.integration.helpers import logged_message, take_event_id


async def test_an_append_key_whose_id_another_tenant_took_is_409_and_nothing_is_written(
    client: httpx.AsyncClient, api_settings: Settings
) -> None:
    sid = new_sid()
    assert (await client.post("/v1/sessions", json={"id": sid})).status_code == 201
    message = text("m1", "hello")
    await take_event_id(
        api_settings, "tenant-b", derived_id("append", "tenant-a", sid, "m1", body_hash(message), "req-1")
    )
    r = await client.post(
        f"/v1/sessions/{sid}/messages", json={"message": message}, headers={"Idempotency-Key": "req-1"}
    )
    problem = assert_problem(r, 409, "idempotency_key_conflict")
    assert "req-1" in problem["detail"]
    assert [e["event"]["type"] for e in await events(client, sid)] == ["session.created"]
    r = await client.post(
        f"/v1/sessions/{sid}/messages", json={"message": message}, headers={"Idempotency-Key": "req-2"}
    )
    assert r.status_code == 201, r.text


@pytest.mark.parametrize("taken_index", [0, 1], ids=["first of the chain", "second of the chain"])
async def test_a_direct_publish_whose_id_another_tenant_took_is_event_id_taken(
    api_url: str, api_settings: Settings, taken_index: int
) -> None:
    """The first event is published conditionally, the rest pipelined: either way the taken id is
    :class:`EventIdTaken`, and what the chain stored is what came before it."""
    chain: list[dict[str, Any]] = [text("m1", "first"), text("m2", "second")]
    parents = [None, "m1"]
    sid = new_sid("sdk")
    # the id is known here, as it is to no other tenant (keyed by tenant-b's API key)
    mine = direct_append_id(
        KEYS["tenant-b"], "tenant-b", sid, chain[taken_index]["id"], parents[taken_index], chain[taken_index]
    )
    seq = await take_event_id(api_settings, "tenant-a", mine)
    async with client_for(api_url, api_settings, tenant="tenant-b", via="jetstream") as b:
        s = Session.create(b, sid)
        with pytest.raises(EventIdTaken) as err:
            await s.append_all(chain)
        assert (err.value.code, err.value.status) == ("event_id_taken", 0)
        assert str(seq) in err.value.detail
        assert ids(await s.get_history()) == ["m1", "m2"][:taken_index]
        appended = [e["event"] for e in await s.get_events() if e["event"]["type"] == "message.appended"]
        stored = [logged_message(e).message_id for e in appended]
        assert stored == ["m1", "m2"][:taken_index]


async def test_the_newest_event_id_any_publisher_learns_confirms_no_guess_of_a_direct_appends_body(
    api_url: str, api_settings: Settings
) -> None:
    """A publish with a wrong ``Nats-Expected-Last-Msg-Id`` is refused naming the stream's newest
    event id, whoever's it is. (A direct append's id was derived from its body's plain hash: a
    tenant probing right after another's append confirmed a guess of its body.) It is keyed by
    the appending client's API key: the probe sees an id no guess of the body derives."""
    sid = new_sid("guess")
    secret = text("m1", "my PIN is 4821")
    async with client_for(api_url, api_settings, tenant="tenant-b", via="jetstream") as b:
        await Session.create(b, sid).append_all([secret])
    nc = await tenant_nats(api_settings.nats_url, "tenant-a")
    try:
        own = api_settings.layout().session_subject("tenant-a", new_sid("probe"))
        with pytest.raises(nats.js.errors.APIError) as refused:
            await nc.jetstream().publish(own, b"{}", headers={"Nats-Expected-Last-Msg-Id": "a guess"})
    finally:
        await nc.close()
    newest = str(refused.value.description).rsplit(" ", 1)[-1]
    assert newest == direct_append_id(KEYS["tenant-b"], "tenant-b", sid, "m1", None, secret)  # the probe saw it
    for guess in ("my PIN is 4821", "my PIN is 4822"):
        assert newest != derived_id("sdk:append", "tenant-b", sid, "m1", None, body_hash(text("m1", guess)))
