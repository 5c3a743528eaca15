"""JetStream deduplicates by ``Nats-Msg-Id`` across the whole stream, not per tenant: a tenant
publishing straight to its own subjects (with its own NATS credentials, as here) can take the id
another tenant's later write derives. Such a "duplicate" is never taken for the write's own event
(events/publisher.py): an erasure still happens, a keyed write is ``idempotency_key_conflict``
with nothing written, a server-chosen id is replaced by a fresh one."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
import os
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import pytest
from nats.js.errors import NotFoundError

from events import log as eventlog
from events.blobs import BlobRef, sha256_hex
from events.catalog import CompactionRecorded, MessageAppended, SessionErased, SessionRenamed
from events.context import CompactionConfig, SessionConfig
from events.envelope import Event
from events.ids import TENANT_SCOPE, derived_id
from events.messages import body_hash
from events.objectstore import JetStreamBlobStore
from events.publisher import HDR_MSG_ID, ForeignDuplicate, Published
from events.sealing import kid_in, unseal_fields
from projections import context_queries, queries
from services.audit.readers import event_line, read_event, session_events
from services.bootstrap import Container
from services.compaction.queue import KIND
from services.errors import IdempotencyKeyConflict
from services.settings import Settings
from services.writes.commands import fork
from tests.conftest import running_stack, tenant_nats, tenant_nats_settings
from tests.integration.helpers import assert_rebuild_equals_live, take_event_id, text_message

ATTACKER, VICTIM = "tenant-a", "tenant-b"


@pytest.fixture(scope="module")
def settings(tmp_path_factory: pytest.TempPathFactory, pg_admin: str, s3_endpoint: str) -> Iterator[Settings]:
    with tenant_nats_settings(tmp_path_factory.mktemp("dupes-nats"), pg_admin, s3_endpoint) as s:
        yield s


@pytest.fixture(scope="module")
async def stack(settings: Settings) -> AsyncIterator[Container]:
    async with running_stack(settings) as c:
        yield c


async def events_lines(c: Container, tenant: str, session: str) -> AsyncIterator[bytes]:
    """The session's lines of ``GET …/events`` (services/audit/readers.py)."""
    async for one in session_events(c, tenant, session):
        yield event_line(one, c.layout, c.keys)


async def stored(c: Container, seq: int) -> tuple[str, str, dict[str, object]]:
    """Subject, ``Nats-Msg-Id`` and event of the message at ``seq``, its sealed fields opened with
    its session's key (as ``chronicle replay`` shows it), so the same whether the stack seals or not."""
    msg = await c.js.get_msg(c.layout.stream, seq)
    subject, data = str(msg.subject), msg.data or b""
    event = json.loads(data)
    if (kid := kid_in(data)) is not None:
        await c.keys.load([(*c.layout.parse(subject), kid)])
        event = unseal_fields(event, c.keys)
    return subject, (msg.headers or {}).get(HDR_MSG_ID, ""), event


def body(mid: str, text: str) -> dict[str, object]:
    return {"id": mid, "role": "user", "parts": [{"type": "text", "text": text}]}


async def test_a_duplicate_of_another_subjects_message_is_a_foreign_duplicate_not_a_success(
    stack: Container, settings: Settings, new_id: Callable[[str], str]
) -> None:
    c, sid = stack, new_id("pub")
    stolen = str(uuid.uuid4())
    seq = await take_event_id(settings, ATTACKER, stolen)
    event = SessionRenamed(id=stolen, tenant=VICTIM, session=sid, name="victim's")
    with pytest.raises(ForeignDuplicate) as err:
        await c.publisher.publish(event)
    assert (err.value.seq, err.value.subject) == (seq, c.layout.session_subject(VICTIM, sid))
    with pytest.raises(ForeignDuplicate):
        await c.publisher.publish_many([event])
    assert await c.publisher.last_subject_seq(VICTIM, sid) == 0  # nothing stored for the victim

    fresh = await c.publisher.publish(event, fresh_id_on_foreign=True)
    [many] = await c.publisher.publish_many([event], fresh_id_on_foreign=True)
    for published in (fresh, many):
        subject, msg_id, data = await stored(c, published.seq)
        assert not published.duplicate
        assert (subject, data["tenant"], data["name"]) == (c.layout.session_subject(VICTIM, sid), VICTIM, "victim's")
        assert msg_id == data["id"] != stolen
    assert fresh.seq != many.seq


async def test_a_duplicate_of_its_own_subjects_message_is_still_a_duplicate(
    stack: Container, new_id: Callable[[str], str]
) -> None:
    """A retried publish (its ack lost) is answered with the first one's sequence, as before."""
    c, sid = stack, new_id("own")
    event = SessionRenamed(tenant=VICTIM, session=sid, name="once")
    first = await c.publisher.publish(event)
    again = await c.publisher.publish(event)
    [many] = await c.publisher.publish_many([event])
    assert (again.seq, again.duplicate, many.seq, many.duplicate) == (first.seq, True, first.seq, True)
    assert await c.publisher.last_subject_seq(VICTIM, sid) == first.seq


async def test_an_erasure_whose_id_another_tenant_took_still_erases_the_session(
    stack: Container, settings: Settings, new_id: Callable[[str], str]
) -> None:
    c, sid = stack, new_id("erase")
    await c.commands.create_session(VICTIM, sid, "", None, {})
    appended = await c.commands.append(VICTIM, sid, body("m1", "the victim's secret"))
    await c.waiter.wait_all(appended.seq)
    async with c.pool.connection() as conn:
        assert await queries.get_session(conn, VICTIM, sid) is not None
        assert await queries.existing_ids(conn, VICTIM, sid, ["m1"]) == {"m1"}
    await take_event_id(settings, ATTACKER, derived_id("erase", VICTIM, sid))

    gone = await c.eraser.erase_session(VICTIM, sid)
    subject, msg_id, data = await stored(c, gone.seq)
    assert (subject, data["type"]) == (c.layout.session_subject(VICTIM, sid), "session.erased")
    assert msg_id != derived_id("erase", VICTIM, sid)
    # run again: the derived id is still taken (as it is by nobody past JetStream's duplicate
    # window), and the erasure's event is found where it was noted: nothing more is published
    again = await c.eraser.erase_session(VICTIM, sid)
    assert (again.seq, again.newly_erased) == (gone.seq, False)
    assert await eventlog.last_seq(c.js, c.layout, c.layout.session_subject(VICTIM, sid)) == gone.seq
    await c.waiter.wait_all(again.seq)
    async with c.pool.connection() as conn:
        assert await queries.get_session(conn, VICTIM, sid) is None
        assert await queries.existing_ids(conn, VICTIM, sid, ["m1"]) == set()
        assert await queries.is_erased(conn, VICTIM, sid)


async def test_a_rerun_publishes_nothing_and_an_erasure_stopped_before_its_event_is_finished(
    stack: Container, new_id: Callable[[str], str], monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The erasure recorded, its event not published (it stopped there): running it again
    publishes the event; each rerun after that publishes nothing (past JetStream's duplicate window
    the derived id would not dedup: each appended one more ``session.erased`` and logged the
    erasure's WARNING again) and answers the event's sequence."""
    c, sid = stack, new_id("rerun")
    appended = await c.commands.append(VICTIM, sid, body("m1", "words"))
    assert await c.keys.erase(VICTIM, [sid]) == [sid]  # what the erasure does first; then it stopped
    published: list[str] = []
    publish = c.publisher.publish

    async def counted(event: Event, **kwargs: Any) -> Published:
        published.append(event.type)
        return await publish(event, **kwargs)

    monkeypatch.setattr(c.publisher, "publish", counted)
    done = await c.eraser.erase_session(VICTIM, sid)
    assert published == ["session.erased"]
    assert done.seq > appended.seq
    assert await eventlog.last_seq(c.js, c.layout, c.layout.session_subject(VICTIM, sid)) == done.seq
    caplog.clear()
    for _ in range(2):
        again = await c.eraser.erase_session(VICTIM, sid)
        assert (again.seq, again.newly_erased) == (done.seq, False)
    assert published == ["session.erased"]
    assert await eventlog.last_seq(c.js, c.layout, c.layout.session_subject(VICTIM, sid)) == done.seq
    assert not [r for r in caplog.records if r.name == "chronicle.erasure" and r.levelno >= logging.WARNING]


async def test_an_erasure_whose_id_the_sessions_own_tenant_took_still_erases_the_session(
    stack: Container, settings: Settings, new_id: Callable[[str], str]
) -> None:
    """The same subject, another event under the erasure's id: not an erasure, so one is published."""
    c, sid = stack, new_id("own-erase")
    await c.commands.create_session(VICTIM, sid, "", None, {})
    nc = await tenant_nats(settings.nats_url, VICTIM)
    try:
        renamed = SessionRenamed(id=derived_id("erase", VICTIM, sid), tenant=VICTIM, session=sid, name="kept?")
        subject = c.layout.session_subject(VICTIM, sid)
        held = await nc.jetstream().publish(subject, renamed.to_json(), headers={HDR_MSG_ID: renamed.id})
    finally:
        await nc.close()
    gone = await c.eraser.erase_session(VICTIM, sid)
    assert gone.seq > held.seq
    _, msg_id, data = await stored(c, gone.seq)
    assert (data["type"], msg_id == renamed.id) == ("session.erased", False)
    await c.waiter.wait_all(gone.seq)
    async with c.pool.connection() as conn:
        assert await queries.get_session(conn, VICTIM, sid) is None


async def test_a_usage_key_whose_id_another_tenant_took_is_a_conflict_and_nothing_is_added(
    stack: Container, settings: Settings, new_id: Callable[[str], str]
) -> None:
    c, sid = stack, new_id("usage")
    await c.commands.create_session(VICTIM, sid, "", None, {})
    await take_event_id(settings, ATTACKER, derived_id("usage", VICTIM, sid, "call-1"))
    before = await c.publisher.last_subject_seq(VICTIM, sid)
    with pytest.raises(IdempotencyKeyConflict, match="another key"):
        await c.commands.add_usage(VICTIM, sid, 5, 1, 0.5, "call-1")
    assert await c.publisher.last_subject_seq(VICTIM, sid) == before
    other = await c.commands.add_usage(VICTIM, sid, 5, 1, 0.5, "call-2")  # another key writes
    await c.waiter.wait_all(other.seq)
    async with c.pool.connection() as conn:
        row = await queries.get_session(conn, VICTIM, sid)
    assert row is not None
    assert (row.input_tokens, row.output_tokens) == (5, 1)


async def test_an_append_key_whose_id_another_tenant_took_is_a_conflict_and_nothing_is_appended(
    stack: Container, settings: Settings, new_id: Callable[[str], str]
) -> None:
    c, sid = stack, new_id("append")
    await c.commands.create_session(VICTIM, sid, "", None, {})
    message = body("m1", "hello")
    await take_event_id(settings, ATTACKER, derived_id("append", VICTIM, sid, "m1", body_hash(message), "req-1"))
    before = await c.publisher.last_subject_seq(VICTIM, sid)
    with pytest.raises(IdempotencyKeyConflict, match="another key"):
        await c.commands.append(VICTIM, sid, message, request_key="req-1")
    assert await c.publisher.last_subject_seq(VICTIM, sid) == before
    await c.waiter.wait_all(before)
    async with c.pool.connection() as conn:
        assert await queries.existing_ids(conn, VICTIM, sid, ["m1"]) == set()
    appended = await c.commands.append(VICTIM, sid, message, request_key="req-2")
    assert (appended.id, appended.created, appended.seq > before) == ("m1", True, True)


async def test_a_skill_whose_id_another_tenant_took_is_indexed_under_a_fresh_id(
    stack: Container, settings: Settings, new_id: Callable[[str], str]
) -> None:
    """A server-chosen derived id (here a skill's) is replaced by a fresh one: the write happens."""
    c, bucket, key = stack, new_id("bucket"), "skills/howto.md"
    stolen = derived_id("skill", VICTIM, bucket, key, "etag-1", "how to")
    await take_event_id(settings, ATTACKER, stolen)
    seq = await c.context.record_skill(VICTIM, bucket, key, "how to", "etag-1", 12)
    subject, msg_id, data = await stored(c, seq)
    # its key is read from the index (sealed under CHRONICLE_TEST_ENCRYPTION=1)
    assert (subject, data["type"]) == (c.layout.session_subject(VICTIM, TENANT_SCOPE), "skill.indexed")
    assert msg_id == data["id"] != stolen
    async with c.pool.connection() as conn:
        assert await context_queries.indexed_skills(conn, VICTIM, bucket) == {key: "etag-1"}


async def reflect(c: Container, settings: Settings, own: str, reply: str) -> None:
    """The attacker publishes an event of its own session ``own`` (with its own NATS credentials),
    naming ``reply`` as the reply subject: JetStream, not the attacker, publishes the ack there."""
    event = SessionRenamed(tenant=ATTACKER, session=own, name="mine")
    nc = await tenant_nats(settings.nats_url, ATTACKER)
    try:
        await nc.publish(c.layout.session_subject(ATTACKER, own), event.to_json(), reply=reply)
        await nc.flush()
    finally:
        await nc.close()


async def test_a_fork_copy_whose_id_another_tenant_took_is_copied_once_and_a_retry_publishes_nothing(
    stack: Container, settings: Settings, new_id: Callable[[str], str]
) -> None:
    """A fork's copy is published under a fresh id when its derived one is taken; a retry of the
    fork finds that copy by the message it copies, and publishes it no second time."""
    c, sid, fork_id = stack, new_id("fork-src"), new_id("fork")
    await c.commands.append(VICTIM, sid, body("m1", "the victim's words"))
    taken = derived_id("fork-message", VICTIM, fork_id, "m1")
    await take_event_id(settings, ATTACKER, taken)

    forked = await fork(c.commands, c.eraser, VICTIM, sid, "m1", fork_id, None)
    subject = c.layout.session_subject(VICTIM, fork_id)
    copies = [e async for e in eventlog.read(c.js, c.layout, subject)][1:]
    assert [json.loads(e.data)["type"] for e in copies] == ["message.appended"]
    assert (copies[0].headers or {}).get(HDR_MSG_ID) != taken  # a fresh id
    assert copies[0].seq == forked.seq
    assert await fork(c.commands, c.eraser, VICTIM, sid, "m1", fork_id, None) == forked
    assert await eventlog.last_seq(c.js, c.layout, subject) == forked.seq


async def test_a_publish_ack_reflected_onto_another_tenants_subject_is_quarantined_as_reflected(
    stack: Container, settings: Settings, new_id: Callable[[str], str]
) -> None:
    """JetStream acks to the reply subject the publisher names, so a tenant can have the ack of its
    own event stored under another tenant's subject (only per-tenant NATS accounts prevent it). The
    quarantine says so, naming the sequence whose subject shows who published it."""
    c, sid = stack, new_id("reflected")
    created = await c.commands.create_session(VICTIM, sid, "", None, {})
    victim_subject = c.layout.session_subject(VICTIM, sid)
    own = new_id("own")
    await reflect(c, settings, own, victim_subject)
    for _ in range(500):  # the positive signal: the ack is stored under the victim's subject
        reflected = await eventlog.last_seq(c.js, c.layout, victim_subject)
        if reflected != created.seq:
            break
        await asyncio.sleep(0.02)
    subject, _, ack = await stored(c, reflected)
    assert (subject, set(ack)) == (victim_subject, {"stream", "seq"})
    published_at = int(str(ack["seq"]))
    assert (await stored(c, published_at))[0] == c.layout.session_subject(ATTACKER, own)
    await c.waiter.wait_all(reflected)
    async with c.pool.connection() as conn:
        cur = await conn.execute("SELECT reason, detail FROM quarantine WHERE seq = %s", (reflected,))
        row = await cur.fetchone()
        assert row is not None
        assert row[0] == "reflected_ack"
        assert f"sequence {published_at} of this stream" in row[1]
        assert await queries.get_session(conn, VICTIM, sid) is not None


async def test_a_publish_ack_reflected_onto_an_objects_info_halts_no_projection(
    stack: Container, settings: Settings, new_id: Callable[[str], str]
) -> None:
    """(An ack stored on the object store's info subject of a name the tenant then referenced as
    its body's claim check made nats-py fail on every read of it: the projector retried for ever,
    every tenant's projections halted.) The tenant's own event is quarantined ``body_unavailable``;
    the other tenant's writes are applied."""
    c, bucket = stack, settings.blob_bucket
    await JetStreamBlobStore(c.js, bucket).put(b"made: the bucket exists")
    key = sha256_hex(os.urandom(64))
    info_subject = f"$O.{bucket}.M.{base64.urlsafe_b64encode(key.encode()).decode()}"
    own = new_id("own")
    nc = await tenant_nats(settings.nats_url, ATTACKER)
    try:
        renamed = SessionRenamed(tenant=ATTACKER, session=own, name="mine")
        await nc.publish(c.layout.session_subject(ATTACKER, own), renamed.to_json(), reply=info_subject)
        await nc.flush()
        for _ in range(500):  # the positive signal: the ack is stored as the object's info
            with contextlib.suppress(NotFoundError):
                if set(json.loads((await c.js.get_last_msg(f"OBJ_{bucket}", info_subject)).data or b"")) == {
                    "stream",
                    "seq",
                }:
                    break
            await asyncio.sleep(0.02)
        else:
            raise AssertionError("the ack was not stored")
        ref = BlobRef(store="jetstream-object", key=key, sha256=key, size=64)
        claimed = MessageAppended(
            tenant=ATTACKER,
            session=own,
            message_id="m1",
            parent_id=None,
            role="user",
            body_sha256="0" * 64,
            message_ref=ref,
        )
        held = await nc.jetstream().publish(c.layout.session_subject(ATTACKER, own), claimed.to_json())
    finally:
        await nc.close()
    sid = new_id("victim")
    later = await c.commands.append(VICTIM, sid, text_message("m1", "after"), None)
    await c.waiter.wait_all(later.seq)
    async with c.pool.connection() as conn:
        cur = await conn.execute("SELECT reason FROM quarantine WHERE seq = %s", (held.seq,))
        assert await cur.fetchone() == ("body_unavailable",)
        assert await queries.existing_ids(conn, VICTIM, sid, ["m1"]) == {"m1"}


async def test_a_publish_ack_reflected_onto_another_tenants_work_subject_does_not_lose_its_compaction(
    stack: Container, settings: Settings, new_id: Callable[[str], str]
) -> None:
    """The same reflection onto the compaction work queue: the work stream keeps one message per
    session subject, so the ack replaces the victim session's pending request (and the projector
    does not ask again for a decision it published). The compactor reads the session's request
    back from its committed state, and the session is compacted all the same."""
    c, sid = stack, new_id("compacted")
    policy = CompactionConfig(compact_after=300, protect_head=1, tail_token_budget=50, min_tail_messages=2)
    await c.context.configure(VICTIM, sid, SessionConfig(compaction=policy))
    for i in range(12):
        await c.commands.append(VICTIM, sid, text_message(f"m{i}", f"turn {i} " + "lorem ipsum " * 20))
    work = c.layout.work_subject(KIND, VICTIM, sid)

    async def waiting() -> dict[str, Any]:
        for _ in range(1500):
            with contextlib.suppress(NotFoundError):
                return dict(json.loads((await c.js.get_last_msg(c.layout.work_stream, work)).data or b"{}"))
            await asyncio.sleep(0.02)
        raise AssertionError(f"nothing arrived on {work}")

    assert (await waiting())["type"] == "compaction.requested"  # the projector asked; no compactor runs yet
    await reflect(c, settings, new_id("own"), work)
    for _ in range(500):  # the positive signal: the ack replaced the request
        if set(await waiting()) == {"stream", "seq"}:
            break
        await asyncio.sleep(0.02)
    assert set(await waiting()) == {"stream", "seq"}
    stop = asyncio.Event()
    compactor = asyncio.create_task(c.compactor().run(stop))
    try:
        deadline = time.monotonic() + 30
        while not (recorded := await _recorded(c, VICTIM, sid)):
            assert time.monotonic() < deadline, "the victim's compaction was lost"
            await asyncio.sleep(0.05)
        (overlay,) = recorded
        assert (overlay.tenant, overlay.session) == (VICTIM, sid)
    finally:
        stop.set()
        await asyncio.wait_for(compactor, timeout=15)


async def _recorded(c: Container, tenant: str, session: str) -> list[CompactionRecorded]:
    """The ``compaction.recorded`` events in the session's log, their sealed fields opened."""
    found = []
    async for stored in session_events(c, tenant, session):
        if json.loads(stored.data).get("type") == CompactionRecorded.TYPE:
            event = read_event(stored, c.layout, c.keys)
            assert isinstance(event, CompactionRecorded), event
            found.append(event)
    return found


async def test_a_session_erased_its_tenant_publishes_itself_is_quarantined_and_the_session_kept(
    stack: Container, settings: Settings, new_id: Callable[[str], str]
) -> None:
    """Chronicle's erasure destroys the key and records the erasure before it publishes
    ``session.erased``; one published straight by the tenant erased nothing, so it drops nothing.
    A real erasure afterwards still erases, and a rebuild decides as the live projector did."""
    c, sid = stack, new_id("forged-erasure")
    await c.commands.create_session(VICTIM, sid, "", None, {})
    await c.commands.append(VICTIM, sid, text_message("m1", "before"), None)
    # under the id the real erasure derives: its publish finds a "duplicate" that erased nothing
    forged = SessionErased(id=derived_id("erase", VICTIM, sid), tenant=VICTIM, session=sid)
    nc = await tenant_nats(settings.nats_url, VICTIM)
    try:
        subject = c.layout.session_subject(VICTIM, sid)
        held = await nc.jetstream().publish(subject, forged.to_json(), headers={HDR_MSG_ID: forged.id})
    finally:
        await nc.close()
    later = await c.commands.append(VICTIM, sid, text_message("m2", "after"), None)  # still writable
    await c.waiter.wait_all(later.seq)
    async with c.pool.connection() as conn:
        cur = await conn.execute("SELECT reason FROM quarantine WHERE seq = %s", (held.seq,))
        assert await cur.fetchone() == ("unrecorded_erasure",)
        assert await queries.get_session(conn, VICTIM, sid) is not None
        assert await queries.existing_ids(conn, VICTIM, sid, ["m1", "m2"]) == {"m1", "m2"}
        assert not await queries.is_erased(conn, VICTIM, sid)
    lines = [json.loads(line) async for line in events_lines(c, VICTIM, sid)]
    assert [line["refused"]["reason"] for line in lines if line["seq"] == held.seq] == ["unrecorded_erasure"]
    assert [line.get("erased") for line in lines] == [None] * len(lines)  # the events API still reads them
    await assert_rebuild_equals_live(c, settings.database_url, new_id("rebuild-forged"), schema="shadow_forged")

    gone = await c.eraser.erase_session(VICTIM, sid)
    assert gone.seq > later.seq  # published anew, not the forged event taken for it
    await c.waiter.wait_all(gone.seq)
    async with c.pool.connection() as conn:
        assert await queries.get_session(conn, VICTIM, sid) is None
        assert await queries.existing_ids(conn, VICTIM, sid, ["m1", "m2"]) == set()
        assert await queries.is_erased(conn, VICTIM, sid)
        cur = await conn.execute("SELECT count(*) FROM quarantine WHERE seq = %s", (held.seq,))
        assert await cur.fetchone() == (0,)  # the erasure deletes the session's quarantined bytes too
    again = await c.eraser.erase_session(VICTIM, sid)  # a rerun takes the held erasure: its own
    assert again.seq in {held.seq, gone.seq}
    await c.waiter.wait_all(again.seq)
    await assert_rebuild_equals_live(c, settings.database_url, new_id("rebuild-erased"), schema="shadow_erased")
