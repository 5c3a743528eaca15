"""Sealed events through the live projector: keys made after a session was first seen, a seal
whose key id is not where the contract writes it, an unsealed log next to a sealed one, and the
same message sealed twice recognised as the same (encryption on: a database of its own)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable

import pytest

from events import log as eventlog
from events.omitted import OMITTED
from events.publisher import Publisher
from projections import queries
from projections.keystore import PgKeyStore
from services.bootstrap import Container
from tests.conftest import make_settings, running_stack
from tests.integration.helpers import appended, text_message


@pytest.fixture(scope="module")
async def sealing(nats_url: str, pg_admin: str) -> AsyncIterator[Container]:
    from tests.support import scratch_database

    with scratch_database(pg_admin) as db:
        async with running_stack(make_settings(nats_url, db, encryption=True)) as c:
            yield c


async def stored_of(c: Container, tenant: str, sid: str) -> list[bytes]:
    return [e.data async for e in eventlog.read(c.js, c.layout, c.layout.session_subject(tenant, sid))]


def other_writer(c: Container) -> Publisher:
    """A sealing publisher with a key store of its own (another process's): what it makes, the
    projector's store learns only from the database."""
    return Publisher(c.js, c.layout, keys=PgKeyStore(c.pool, c.settings.key_wrapper(), seal=True))


async def quarantined(c: Container) -> int:
    async with c.pool.connection() as conn:
        cur = await conn.execute("SELECT count(*) FROM quarantine")
        row = await cur.fetchone()
    return int(row[0]) if row else 0


async def test_a_session_seen_unsealed_then_sealed_is_applied_whole(
    sealing: Container, new_id: Callable[[str], str]
) -> None:
    c, sid = sealing, new_id("mixed")
    plain = Publisher(c.js, c.layout)  # a writer from before encryption: no keys
    first = await plain.publish(appended("tenant-a", sid, "m1", None, "plain words"))
    await c.waiter.wait_session("tenant-a", sid, first.seq)  # the projector has seen the session, keyless
    second = await other_writer(c).publish(appended("tenant-a", sid, "m2", "m1", "sealed words"))
    await c.waiter.wait_session("tenant-a", sid, second.seq)
    data = await stored_of(c, "tenant-a", sid)
    assert b"plain words" in data[0]
    assert b"sealed words" not in data[1]
    assert b'"sealed"' in data[1]
    async with c.pool.connection() as conn:
        rows = await queries.history(conn, "tenant-a", sid, "m2")
    assert [r.id for r in rows] == ["m1", "m2"]
    assert "sealed words" in rows[1].content


async def test_a_seal_with_its_key_id_elsewhere_still_opens(sealing: Container, new_id: Callable[[str], str]) -> None:
    c, sid = sealing, new_id("order")
    before = await quarantined(c)
    seq = (await Publisher(c.js, c.layout).publish(appended("tenant-a", sid, "m1", None, "first"))).seq
    await c.waiter.wait_session("tenant-a", sid, seq)  # seen keyless: the next key is found only by asking
    event = appended("tenant-a", sid, "m2", "m1", "reordered seal")
    _, data = await other_writer(c).encode_sealed(event)
    raw = json.loads(data)
    raw["sealed"] = {"nonce": raw["sealed"]["nonce"], "ct": raw["sealed"]["ct"], "kid": raw["sealed"]["kid"]}
    ack = await c.js.publish(
        c.layout.session_subject("tenant-a", sid), json.dumps(raw).encode(), stream=c.layout.stream
    )
    await c.waiter.wait_session("tenant-a", sid, ack.seq)
    async with c.pool.connection() as conn:
        row = await queries.get_message(conn, "tenant-a", sid, "m2")
    assert row is not None
    assert "reordered seal" in row.content
    assert await quarantined(c) == before


async def test_the_same_message_again_is_recognised_though_sealed_anew(
    sealing: Container, new_id: Callable[[str], str]
) -> None:
    c, sid = sealing, new_id("again")
    body = text_message("m1", "said twice")
    first = await c.commands.append("tenant-a", sid, body, OMITTED)
    await c.waiter.wait_session("tenant-a", sid, first.seq)
    again = await c.commands.append("tenant-a", sid, body, OMITTED)
    assert (again.created, again.seq) == (False, first.seq)
    assert len(await stored_of(c, "tenant-a", sid)) == 1


@pytest.mark.parametrize("seal", [True, False])
async def test_a_writer_learns_of_an_erasure_by_another_process_at_its_next_poll(
    sealing: Container, new_id: Callable[[str], str], seal: bool
) -> None:
    from events.sealing import KeyDestroyed

    c, sid = sealing, new_id("poll")
    writer = PgKeyStore(c.pool, c.settings.key_wrapper(), seal=seal, write_ttl_s=0.0)  # polls every write
    eraser = PgKeyStore(c.pool, c.settings.key_wrapper(), seal=True)
    first = await writer.for_writing("tenant-a", sid)
    assert (first is not None) == seal
    assert await eraser.erase("tenant-a", [sid]) == [sid]
    with pytest.raises(KeyDestroyed):
        await writer.for_writing("tenant-a", sid)
    assert await writer.for_writing("tenant-a", new_id("other")) is not None or not seal


async def test_sealing_without_a_key_encryption_key_refuses_to_start(nats_url: str, db_url: str) -> None:
    from services.bootstrap import open_container

    with pytest.raises(ValueError, match="key-encryption key"):
        async with open_container(make_settings(nats_url, db_url, encryption=True, kek=None)):
            pass
