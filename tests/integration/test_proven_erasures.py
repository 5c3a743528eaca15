"""An erasure the database lost is made again from the log: Chronicle's ``session.erased`` carries a
proof (an HMAC under a key derived from the key-encryption key) that a tenant publishing the event
itself cannot make. A database restored from a backup older than an erasure holds the session's
data key and no record of it: the projector that reads the proven event records the erasure again
and destroys the restored key, so the erased content stays unreadable. Without a proof (a tenant's
own event, an event made before proofs) nothing changes: ``unrecorded_erasure``."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable

import psycopg
import pytest

from events import log as eventlog
from events.blobs import BlobRef
from events.catalog import SessionErased
from events.omitted import OMITTED
from events.registry import decode
from projections.rebuild import QuarantineRow, checksums, quarantine_rows
from services.audit import readers as audit
from services.bootstrap import Container, open_container, prepare_database
from services.errors import ErasedSession
from services.settings import Settings
from tests.conftest import make_settings, running_stack
from tests.integration.helpers import text_message
from tests.support import scratch_database

T = "tenant-a"


async def _append(c: Container, session: str, mid: str, text: str) -> int:
    r = await c.commands.append(T, session, text_message(mid, text), OMITTED)
    await c.waiter.wait_session(T, session, r.seq)
    return r.seq


async def _rows(db: str, sql: str, *params: object) -> list[tuple[object, ...]]:
    async with await psycopg.AsyncConnection.connect(db) as conn:
        cur = await conn.execute(sql, params)
        return list(await cur.fetchall())


async def _erased_event(c: Container, seq: int) -> SessionErased:
    event = decode((await c.js.get_msg(c.layout.stream, seq, direct=True)).data or b"")
    assert isinstance(event, SessionErased)
    return event


async def test_a_backup_older_than_an_erasure_is_erased_again_by_the_projector(
    nats_url: str, fresh_db: str, backup: Callable[[str], str], new_id: Callable[[str], str]
) -> None:
    settings = make_settings(nats_url, fresh_db, encryption=True)
    kept, gone = new_id("kept"), new_id("gone")
    async with running_stack(settings) as c:
        for sid in (kept, gone):
            for i in range(3):
                await _append(c, sid, f"m{i}", f"{sid} secret {i}")
    old = backup(fresh_db)  # taken before the erasure: it holds the session's data key
    async with running_stack(settings) as c:
        erasure = await c.eraser.erase_session(T, gone, requested_by="operator (test)", reason="GDPR-77")
        event = await _erased_event(c, erasure.seq)
        assert event.proof is not None
        assert event.proof.startswith(f"{c.keys.kek_id}:")
        last = await _append(c, kept, "m3", "after the erasure")

    restored = settings.model_copy(update={"database_url": old})
    assert await _rows(old, "SELECT count(*) FROM data_keys WHERE session_id = %s", gone) == [(1,)]
    async with running_stack(restored) as c:
        await c.waiter.wait_all(last)
        with pytest.raises(ErasedSession):  # the API learns it as of any other process's erasure
            await c.commands.append(T, gone, text_message("m9", "comes back?"), OMITTED)
        assert (await audit.verify(c)).ok
    assert await _rows(old, "SELECT count(*) FROM data_keys WHERE session_id = %s", gone) == [(0,)]
    assert await _rows(old, "SELECT requested_by, reason, seq FROM erasures WHERE session_id = %s", gone) == [
        ("operator (test)", "GDPR-77", erasure.seq)
    ]
    assert await _rows(old, "SELECT count(*) FROM messages WHERE session_id = %s", gone) == [(0,)]
    assert await _rows(old, "SELECT count(*) FROM sessions WHERE id = %s", gone) == [(0,)]
    assert await _rows(old, "SELECT count(*) FROM messages WHERE session_id = %s", kept) == [(4,)]
    assert await _rows(old, "SELECT count(*) FROM quarantine") == [(0,)]


async def test_a_database_rebuilt_without_a_backup_makes_the_erasures_again(
    nats_url: str, fresh_db: str, pg_admin: str, new_id: Callable[[str], str]
) -> None:
    """A lost database rebuilt from the log alone (``chronicle rebuild``) records the proven
    erasures as the live projector does: in plain mode the erased session's content would
    otherwise come back, its id taking writes again."""
    settings = make_settings(nats_url, fresh_db, encryption=False)
    kept, gone = new_id("kept"), new_id("gone")
    async with running_stack(settings) as c:
        await _append(c, kept, "m0", "plain and kept")
        await _append(c, gone, "m0", "plain secret")
        erasure = await c.eraser.erase_session(T, gone, reason="GDPR-78")
    with scratch_database(pg_admin) as new:
        lost = settings.model_copy(update={"database_url": new})
        await prepare_database(lost)
        async with open_container(lost, log_check=False) as c:
            report = await audit.rebuild_and_swap(c)
            assert report.first
            assert report.swapped_at_seq == erasure.seq
            assert (await audit.verify(c)).ok
            with pytest.raises(ErasedSession):
                await c.commands.append(T, gone, text_message("m1", "comes back?"), OMITTED)
        assert await _rows(new, "SELECT reason, seq FROM erasures WHERE session_id = %s", gone) == [
            ("GDPR-78", erasure.seq)
        ]
        assert await _rows(new, "SELECT count(*) FROM messages WHERE session_id = %s", gone) == [(0,)]
        assert await _rows(new, "SELECT count(*) FROM sessions WHERE id = %s", gone) == [(0,)]
        assert await _rows(new, "SELECT count(*) FROM messages WHERE session_id = %s", kept) == [(1,)]
        assert await _rows(new, "SELECT count(*) FROM quarantine") == [(0,)]


async def _unproven(settings: Settings, session: str, proof: str | None) -> list[tuple[str, str]]:
    """Publish a ``session.erased`` for ``session`` with ``proof`` (as a tenant publishing to the
    stream itself could) and return the quarantine's (subject, reason) once it is applied."""
    async with running_stack(settings) as c:
        await _append(c, session, "m0", "mine")
        forged = SessionErased(tenant=T, session=session, reason="forged", proof=proof)
        published = await c.publisher.publish(forged)
        await c.waiter.wait_all(published.seq)
        async with c.pool.connection() as conn:
            rows = await quarantine_rows(conn, "public")
        return [(subject, reason) for _, subject, reason, *_ in rows]


@pytest.mark.parametrize(
    "proof",
    [None, "kek-guess:AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA", "copy"],
    ids=["none", "guessed", "copied-from-another-erasure"],
)
async def test_an_erasure_without_chronicles_proof_stays_unrecorded_and_erases_nothing(
    nats_url: str, fresh_db: str, new_id: Callable[[str], str], proof: str | None
) -> None:
    settings = make_settings(nats_url, fresh_db, encryption=True)
    mine = new_id("mine")
    if proof == "copy":  # a real proof of another session's erasure does not erase this one
        other = new_id("other")
        async with running_stack(settings) as c:
            await _append(c, other, "m0", "theirs")
            proof = (await _erased_event(c, (await c.eraser.erase_session(T, other)).seq)).proof
    quarantined = await _unproven(settings, mine, proof)
    assert (settings.layout().session_subject(T, mine), "unrecorded_erasure") in quarantined
    assert await _rows(fresh_db, "SELECT count(*) FROM erasures WHERE session_id = %s", mine) == [(0,)]
    assert await _rows(fresh_db, "SELECT count(*) FROM data_keys WHERE session_id = %s", mine) == [(1,)]
    assert await _rows(fresh_db, "SELECT count(*) FROM messages WHERE session_id = %s", mine) == [(1,)]


async def _object_of(c: Container, session: str) -> bytes:
    """The stored bytes of the session's one claim-checked body (sealed with its data key)."""
    refs = [
        json.loads(e.data).get("message_ref")
        async for e in eventlog.read(c.js, c.layout, c.layout.session_subject(T, session))
    ]
    [ref] = [BlobRef.model_validate(r) for r in refs if r is not None]
    return await c.blobs.get(ref)


async def _read_model(db: str) -> tuple[dict[str, tuple[int, str]], list[QuarantineRow]]:
    async with await psycopg.AsyncConnection.connect(db) as conn:
        return await checksums(conn, "public"), await quarantine_rows(conn, "public")


async def test_a_claim_checked_body_of_a_session_whose_erasure_is_learned_later_is_a_tombstone(
    nats_url: str,
    fresh_db: str,
    backup: Callable[[str], str],
    new_id: Callable[[str], str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A sealed, claim-checked body of a session whose proven ``session.erased`` comes later in the
    same batch (a database restored from a backup older than the erasure, its object store too:
    the data key and the object are back, the erasure is not recorded): the projector, catching
    up, and ``chronicle rebuild`` of the whole log both learn the erasure and take the session's
    earlier events as tombstones; neither fails on the body whose key the erasure destroyed (the
    projector failed its batch and retried, the rebuild stopped), and both equal the live read
    model. A rebuild of read models that hold some of the log stops where their projector is
    (before the erasure): the projector then applies the erasure, once."""
    caplog.set_level(logging.WARNING, logger="chronicle.projector")
    settings = make_settings(nats_url, fresh_db, encryption=True, payload_limit_bytes=1024)
    kept, gone = new_id("kept"), new_id("gone")
    async with running_stack(settings) as c:
        for sid in (kept, gone):
            await _append(c, sid, "m0", f"{sid} small")  # each session's data key is made
    async with running_stack(settings, projector=False) as c:  # published, not projected yet
        for sid in (kept, gone):
            await c.commands.append(T, sid, text_message("big", f"{sid} large secret " * 200), OMITTED)
        sealed_object = await _object_of(c, gone)
    older = backup(fresh_db)  # the data keys; the large messages not yet applied
    async with running_stack(settings) as c:
        await _append(c, kept, "m1", "before the erasure")
    newer = backup(fresh_db)  # the data keys; everything but the erasure applied
    bare = backup(newer)  # the same, its read models to be dropped
    async with running_stack(settings) as c:
        erasure = await c.eraser.erase_session(T, gone, reason="GDPR-79")
        assert erasure.objects_deleted == 1
        await c.waiter.wait_all(erasure.seq)
        await c.blobs.put(sealed_object)  # the object store restored from the backup too
    live = await _read_model(fresh_db)
    assert (live[0]["sessions"][0], live[0]["messages"][0], live[1]) == (1, 3, [])

    # the projector catches up from the older backup: one batch holds the body and the erasure
    async with running_stack(settings.model_copy(update={"database_url": older})) as c:
        await c.waiter.wait_all(erasure.seq)
        report = await audit.verify(c)
        assert report.ok, report.differences
    assert [r.getMessage() for r in caplog.records if " failed (" in r.getMessage()] == []
    assert await _read_model(older) == live

    # ``chronicle rebuild`` on the newer backup's copy with no read models (no checkpoint): the
    # whole log, read from sequence 1
    async with await psycopg.AsyncConnection.connect(bare, autocommit=True) as conn:
        await conn.execute("DELETE FROM checkpoints")
    rebuilt = settings.model_copy(update={"database_url": bare})
    async with open_container(rebuilt) as c:
        assert (await audit.rebuild_and_swap(c)).first
    assert await _read_model(bare) == live
    assert await _rows(bare, "SELECT count(*) FROM data_keys WHERE session_id = %s", gone) == [(0,)]
    assert await _rows(bare, "SELECT reason, seq FROM erasures WHERE session_id = %s", gone) == [
        ("GDPR-79", erasure.seq)
    ]
    async with running_stack(rebuilt) as c:
        await c.waiter.wait_all(erasure.seq)
        report = await audit.verify(c)
        assert report.ok, report.differences
    assert await _read_model(bare) == live

    # ``chronicle rebuild`` on the newer backup: up to its projector's checkpoint, before the
    # erasure (the read models as the backup holds them); the projector applies the erasure after it
    rebuilt = settings.model_copy(update={"database_url": newer})
    restored = await _read_model(newer)
    async with open_container(rebuilt) as c:
        await audit.rebuild_and_swap(c)
    assert await _read_model(newer) == restored
    async with running_stack(rebuilt) as c:
        await c.waiter.wait_all(erasure.seq)
        report = await audit.verify(c)
        assert report.ok, report.differences
    assert await _read_model(newer) == live
    assert await _rows(newer, "SELECT count(*) FROM data_keys WHERE session_id = %s", gone) == [(0,)]
    assert await _rows(newer, "SELECT reason, seq FROM erasures WHERE session_id = %s", gone) == [
        ("GDPR-79", erasure.seq)
    ]
