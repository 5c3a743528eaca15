"""A key store holds the keys of its most recently used sessions only (``key_cache_sessions``):
with a capacity far below the sessions it serves, the projector still applies every sealed
event, a reader asks again for what was evicted, a batch keeps all its keys until it is used
(even when a concurrent load evicts while it waits), the readers that wait between events
(events pages, replay, a compaction weighing what came meanwhile) ask again for a key evicted
meanwhile, an erased session stays refused however long ago its entry went, memory stays within
the capacity, and a rebuild still holds every key (encryption on: a database of its own)."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any, cast

import psycopg
import pytest

from events import log as eventlog
from events.blobs import MemoryBlobStore
from events.bodies import unpack_body
from events.catalog import CompactionRecorded, MessageUpdated
from events.messages import body_hash
from events.publisher import Published
from events.sealing import DataKey, KeyDestroyed, KeyUnavailable, kid_in, unseal_fields
from projections import queries
from projections.keystore import PgKeyStore
from projections.rebuild import checksums, rebuild_into
from services.api import log as log_routes
from services.audit import readers as audit
from services.bootstrap import Container, open_container
from tests.conftest import make_settings
from tests.integration.helpers import appended, sealed_claim_check, text_message

T = "tenant-a"
CAPACITY = 2  # far below the sessions of a projector's batch, or of these tests


@dataclass
class Tiny:
    c: Container
    built: PgKeyStore  # the store the composition root built from the settings
    db: str


@pytest.fixture(scope="module")
async def tiny(nats_url: str, pg_admin: str) -> AsyncIterator[Tiny]:
    """A stack whose key store (the publisher's, the projector's) holds two sessions at most."""
    from tests.support import scratch_database

    with scratch_database(pg_admin) as db:
        async with open_container(make_settings(nats_url, db, encryption=True, key_cache_sessions=1000)) as c:
            built = c.keys
            c.publisher.keys = PgKeyStore(c.pool, c.settings.key_wrapper(), seal=True, cache_sessions=CAPACITY)
            stop = asyncio.Event()
            task = asyncio.create_task(c.projector().run(stop))
            try:
                yield Tiny(c, built, db)
            finally:
                stop.set()
                await asyncio.wait_for(task, timeout=15)


def store(c: Container, capacity: int | None, **kw: Any) -> PgKeyStore:
    """A key store of its own (another process's), of ``capacity`` sessions."""
    return PgKeyStore(c.pool, c.settings.key_wrapper(), cache_sessions=capacity, **kw)


async def keyed(c: Container, sessions: list[str]) -> dict[str, DataKey]:
    """Each session's data key, made now (by a writer of its own)."""
    writer = store(c, None, seal=True)
    out: dict[str, DataKey] = {}
    for sid in sessions:
        key = await writer.for_writing(T, sid)
        assert key is not None
        out[sid] = key
    return out


async def stored_of(c: Container, sid: str) -> list[bytes]:
    return [e.data async for e in eventlog.read(c.js, c.layout, c.layout.session_subject(T, sid))]


async def quarantined(c: Container) -> int:
    async with c.pool.connection() as conn:
        cur = await conn.execute("SELECT count(*) FROM quarantine")
        row = await cur.fetchone()
    return int(row[0]) if row else 0


async def published(c: Container, sessions: list[str]) -> int:
    """Two sealed messages in each session, the sessions interleaved (a batch spans them all);
    the last sequence."""
    last = 0
    for i in range(2):
        for sid in sessions:
            parent = None if i == 0 else f"m{i - 1}"
            last = (await c.publisher.publish(appended(T, sid, f"m{i}", parent, f"words {i} of {sid}"))).seq
    return last


def test_the_composition_root_builds_the_store_with_the_setting(tiny: Tiny) -> None:
    assert tiny.built.cache_sessions == 1000


async def test_a_projector_holding_fewer_sessions_than_a_batch_applies_every_sealed_event(
    tiny: Tiny, new_id: Callable[[str], str]
) -> None:
    c = tiny.c
    before = await quarantined(c)
    sessions = [new_id("batch") for _ in range(12)]
    last = await published(c, sessions)
    await c.waiter.wait_all(last)
    async with c.pool.connection() as conn:
        for sid in sessions:
            rows = await queries.history(conn, T, sid, "m1")
            assert [r.id for r in rows] == ["m0", "m1"]
            assert f"words 1 of {sid}" in rows[1].content
    assert await quarantined(c) == before
    assert b"words" not in b"".join(await stored_of(c, sessions[0]))  # sealed in the log


async def test_a_reader_asks_again_for_the_keys_it_evicted(tiny: Tiny, new_id: Callable[[str], str]) -> None:
    c = tiny.c
    sessions = [new_id("reread") for _ in range(6)]
    await published(c, sessions)
    reader = store(c, 3)
    for round_ in range(2):
        for sid in sessions:
            data = (await stored_of(c, sid))[1]
            kid = kid_in(data)
            assert kid is not None
            if round_ == 1 and sid == sessions[0]:
                with pytest.raises(KeyUnavailable):  # evicted by the sessions read after it
                    reader.key(T, sid, kid)
            await reader.load([(T, sid, kid)])
            assert unseal_fields(json.loads(data), reader)["message"]["parts"][0]["text"] == f"words 1 of {sid}"
            assert reader.held_sessions <= 3


async def test_memory_stays_within_the_capacity_however_many_sessions(tiny: Tiny, new_id: Callable[[str], str]) -> None:
    c = tiny.c
    sessions = [new_id("many") for _ in range(20)]
    keys = await keyed(c, sessions)
    reader, writer = store(c, 3), store(c, 3, seal=True)
    for sid in sessions:
        await reader.load([(T, sid, keys[sid].kid)])
        await reader.refresh([(T, sid)])
        assert await writer.for_writing(T, sid) == keys[sid]
        assert max(reader.held_sessions, writer.held_sessions) <= 3
    assert (reader.held_sessions, writer.held_sessions) == (3, 3)


async def test_a_load_holds_its_whole_batch_past_the_capacity_until_the_next_load(
    tiny: Tiny, new_id: Callable[[str], str]
) -> None:
    c = tiny.c
    sessions = [new_id("whole") for _ in range(8)]
    keys = await keyed(c, sessions)
    reader = store(c, 1)
    await reader.load([(T, sid, keys[sid].kid) for sid in sessions])
    assert reader.held_sessions == 8
    for sid in sessions:
        assert reader.key(T, sid, keys[sid].kid) == keys[sid]
    await reader.load([(T, new_id("next"), None)])
    assert reader.held_sessions == 1


async def evict_all_but(c: Container, new_id: Callable[[str], str]) -> None:
    """Load sessions enough to evict every other from the stack's store (another request, say)."""
    await c.keys.load([(T, new_id("evicting"), None) for _ in range(CAPACITY)])


async def sealed_session(c: Container, sid: str, n: int) -> list[tuple[int, str | None]]:
    """``n`` sealed messages in ``sid`` (m0 first, each the child of the one before it); their
    sequences and key ids."""
    out: list[tuple[int, str | None]] = []
    for i in range(n):
        seq = (await c.publisher.publish(appended(T, sid, f"m{i}", f"m{i - 1}" if i else None, f"line {i}"))).seq
        out.append((seq, None))
    kids = [kid_in(d) for d in await stored_of(c, sid)]
    return [(seq, kid) for (seq, _), kid in zip(out, kids, strict=True)]


async def overlay_over_m1(c: Container, sid: str, expected: int, new_id: Callable[[str], str]) -> Published | None:
    """A compaction of m0..m1 (leaf m2) decided at ``expected``, published unless what came
    since changes it (an update of m1 does: None)."""
    overlay = CompactionRecorded(
        tenant=T,
        session=sid,
        overlay_id=new_id("overlay"),
        from_message_id="m0",
        to_message_id="m1",
        leaf_id="m2",
        tokens_before=100,
        tokens_after=10,
        summarizer="offline",
        model=None,
        summary="a summary",
    )
    return await c.compaction._publish_unless_changed(overlay, expected, {"m0", "m1"})


async def test_an_events_page_asks_again_for_a_key_evicted_while_it_is_read(
    tiny: Tiny, new_id: Callable[[str], str]
) -> None:
    c, sid = tiny.c, new_id("page")
    [(_, kid), _] = await sealed_session(c, sid, 2)
    assert kid is not None
    await c.keys.refresh([(T, sid)])  # as the route asks before its answer begins
    # the page's lines as they are made (the answer sends them in chunks of several)
    lines = log_routes._page(c, T, sid, 1, None, log_routes.MAX_EVENTS_PAGE)
    first = json.loads(await anext(lines))
    await evict_all_but(c, new_id)
    with pytest.raises(KeyUnavailable):
        c.keys.key(T, sid, kid)
    second = json.loads(await anext(lines))
    assert [line["event"]["message"]["parts"][0]["text"] for line in (first, second)] == ["line 0", "line 1"]


async def test_a_sealed_claim_checked_body_opens_though_its_key_was_evicted_after_screening(
    tiny: Tiny, new_id: Callable[[str], str]
) -> None:
    """The projector screens a batch (its keys loaded), then plans it, opening claim-checked
    bodies, while other batches load their keys: a body whose key was evicted meanwhile is asked
    for again, not taken for a body that can never be had (quarantined for good, a rebuild
    holding every key would apply it)."""
    c, sid = tiny.c, new_id("claim")
    key = (await keyed(c, [sid]))[sid]
    body = text_message("big", "words kept in object storage")
    blobs = MemoryBlobStore()
    event = await sealed_claim_check(blobs, key, T, sid, "big", body)
    reader = store(c, 1)
    await reader.load([(T, sid, key.kid)])  # screened
    await reader.load([(T, new_id("other-batch"), None)])  # evicts it
    with pytest.raises(KeyUnavailable):
        reader.key(T, sid, key.kid)
    assert await unpack_body(event, blobs, reader) == body


async def test_a_replay_asks_again_for_a_key_evicted_while_it_is_read(tiny: Tiny, new_id: Callable[[str], str]) -> None:
    c, sid = tiny.c, new_id("replay")
    [(_, kid), _] = await sealed_session(c, sid, 2)
    assert kid is not None
    async with contextlib.aclosing(audit.session_events(c, T, sid)) as read:
        first = audit.read_event(await anext(read), c.layout, c.keys)
        await evict_all_but(c, new_id)
        with pytest.raises(KeyUnavailable):
            c.keys.key(T, sid, kid)
        second = audit.read_event(await anext(read), c.layout, c.keys)
    assert [getattr(e, "message_id", None) for e in (first, second)] == ["m0", "m1"]


async def test_a_compaction_sees_an_update_in_its_range_though_its_key_was_evicted_while_it_read(
    tiny: Tiny, new_id: Callable[[str], str], monkeypatch: pytest.MonkeyPatch
) -> None:
    c, sid = tiny.c, new_id("weigh")
    [*_, (expected, _)] = await sealed_session(c, sid, 3)
    await c.publisher.publish(appended(T, sid, "m3", "m2", "came meanwhile"))  # harmless
    body = text_message("m1", "edited meanwhile")
    await c.publisher.publish(
        MessageUpdated(tenant=T, session=sid, message_id="m1", role="user", body_sha256=body_hash(body), message=body)
    )
    read = eventlog.read

    async def read_by_a_busy_process(*args: Any, **kw: Any) -> AsyncIterator[eventlog.StoredEvent]:
        async for stored in read(*args, **kw):
            yield stored
            await evict_all_but(c, new_id)  # while the compaction waits for the next event

    monkeypatch.setattr(eventlog, "read", read_by_a_busy_process)
    published = await overlay_over_m1(c, sid, expected, new_id)
    assert published is None  # the update of m1 was read, not refused for want of its key


class GatedPool:
    """The key store's pool, holding the first connection taken once :attr:`armed` at its end
    (its queries done, their answers not yet kept) until :attr:`gate` opens."""

    def __init__(self, pool: Any) -> None:
        self._pool = pool
        self.armed = False
        self.waiting = asyncio.Event()
        self.gate = asyncio.Event()

    @contextlib.asynccontextmanager
    async def connection(self) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
        hold, self.armed = self.armed, False
        async with self._pool.connection() as conn:
            yield conn
        if hold:
            self.waiting.set()
            await self.gate.wait()


async def test_a_batch_evicted_by_a_concurrent_load_while_it_waits_is_held_again(
    tiny: Tiny, new_id: Callable[[str], str]
) -> None:
    c = tiny.c
    a, b, x, y = (new_id(p) for p in ("a", "b", "x", "y"))
    keys = await keyed(c, [a, b, x, y])
    gated = GatedPool(c.pool)
    reader = PgKeyStore(cast(Any, gated), c.settings.key_wrapper(), cache_sessions=2)
    await reader.load([(T, a, None)])
    gated.armed = True
    first = asyncio.create_task(reader.load([(T, a, None), (T, b, None)]))  # asks about b only: a is held
    await gated.waiting.wait()
    await reader.load([(T, x, None), (T, y, None)])  # meanwhile: a is evicted
    with pytest.raises(KeyUnavailable):
        reader.key(T, a, keys[a].kid)
    gated.gate.set()
    await first
    assert reader.key(T, a, keys[a].kid) == keys[a]  # held again, with b, when its load returned
    assert reader.key(T, b, keys[b].kid) == keys[b]


async def test_an_erased_session_stays_refused_after_its_entry_would_have_been_evicted(
    tiny: Tiny, new_id: Callable[[str], str]
) -> None:
    c = tiny.c
    gone, others = new_id("gone"), [new_id("other") for _ in range(5)]
    keys = await keyed(c, [gone, *others])
    kid = keys[gone].kid
    reader, unaware = store(c, 1, seal=True), store(c, 1)
    writer = store(c, 1, seal=True, write_ttl_s=3600.0)  # polls at its first write only
    await reader.load([(T, gone, kid)])
    await unaware.load([(T, gone, kid)])
    assert await writer.for_writing(T, gone) == keys[gone]
    assert await store(c, None, seal=True).erase(T, [gone]) == [gone]  # by another process

    await reader.refresh([(T, gone)])  # a request's reader asks afresh
    writer.forget(T, gone)  # a command's decision read the erasure
    for sid in others:  # the erased session's entry would be long evicted
        await reader.load([(T, sid, keys[sid].kid)])
        await unaware.load([(T, sid, keys[sid].kid)])
        assert await writer.for_writing(T, sid) == keys[sid]
    for s in (reader, unaware, writer):
        assert s.held_sessions == 1

    await reader.load([(T, gone, kid)])
    await unaware.load([(T, gone, kid)])  # evicted before it knew: asked again, the erasure found
    for s in (reader, unaware):
        with pytest.raises(KeyDestroyed):
            s.key(T, gone, kid)
        assert s.erased(T, gone)
    for s in (reader, writer):
        with pytest.raises(KeyDestroyed):
            await s.for_writing(T, gone)
    assert not any(s.held_sessions > 1 for s in (reader, unaware, writer))


async def test_a_rebuild_with_a_store_smaller_than_the_log_holds_every_key(
    tiny: Tiny, new_id: Callable[[str], str]
) -> None:
    c = tiny.c
    sessions = [new_id("rebuild") for _ in range(5)]
    await published(c, sessions)
    await c.waiter.wait_all(await eventlog.last_seq(c.js, c.layout))
    async with await psycopg.AsyncConnection.connect(tiny.db) as conn:
        live = await checksums(conn, "public")
    keys = store(c, CAPACITY)
    await rebuild_into(c.js, c.layout, tiny.db, "shadow", c.projections(), c.settings.projector_name, keys=keys)
    async with await psycopg.AsyncConnection.connect(tiny.db) as conn:
        assert await checksums(conn, "shadow") == live
        await conn.execute('SET search_path TO "shadow"')
        rows = await queries.history(conn, T, sessions[-1], "m1")
    assert f"words 1 of {sessions[-1]}" in rows[1].content
    assert keys.cache_sessions is None
    assert keys.held_sessions > CAPACITY


async def test_a_compaction_sees_an_update_sealed_under_a_key_made_after_it_asked(
    tiny: Tiny, new_id: Callable[[str], str]
) -> None:
    """(Readers asked again only about evicted sessions: a session held as keyless, written
    before encryption was turned on, never learned of the key made for it since, and a
    compaction weighing what came meanwhile skipped the sealed update in its range.) An event
    sealed under a key the store does not hold has that key asked for."""
    c, sid = tiny.c, new_id("late-key")
    sealing, plain = c.publisher.keys, store(c, CAPACITY)
    c.publisher.keys = plain  # this process does not seal (yet)
    try:
        for i in range(3):
            expected = (await c.publisher.publish(appended(T, sid, f"m{i}", f"m{i - 1}" if i else None, "w"))).seq
        await plain.load([(T, sid, None)])  # asked about: no key
        body = text_message("m1", "edited meanwhile, sealed")
        update = MessageUpdated(
            tenant=T, session=sid, message_id="m1", role="user", body_sha256=body_hash(body), message=body
        )
        c.publisher.keys = store(c, None, seal=True)  # another process, sealing: the session's key is made
        await c.publisher.publish(update)
        assert kid_in((await stored_of(c, sid))[-1]) is not None
        c.publisher.keys = plain
        assert await overlay_over_m1(c, sid, expected, new_id) is None  # the sealed update was read
    finally:
        c.publisher.keys = sealing
