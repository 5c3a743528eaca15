"""Refused events of an erased session, on real NATS and Postgres: the session a stored message is
filed under is decided by its subject (whatever its bytes say), and an erased session's refused
event is a tombstone, never quarantined: live, in a rebuild and in a verify alike. One quarantined
before the erasure is deleted by it (live) and tombstoned by a rebuild (the key store knows it
erased), so ``verify`` stays identical; one published after it is not stored at all; replay shows
tombstones, never the raw bytes. Refusals decided without the session (a subject that names no
session, another partition's token) are quarantined as before, and kept."""

from __future__ import annotations

import json
from collections.abc import Callable

import psycopg
import pytest

from events.catalog import SessionErased
from events.subjects import partition_of
from projections.rebuild import quarantine_rows
from services.audit import readers as audit
from services.bootstrap import Container
from services.settings import Settings
from tests.conftest import make_settings, running_stack
from tests.integration.helpers import text_message
from tests.support import chronicle_cli

T = "tenant-b"
MARKER = b"{bad marker"


@pytest.fixture
def settings(nats_url: str, fresh_db: str) -> Settings:
    """A stream and a database of the test's own, two partitions."""
    return make_settings(nats_url, fresh_db, partitions=2)


async def quarantined(conninfo: str) -> dict[int, str]:
    """seq -> subject of every quarantined event."""
    async with await psycopg.AsyncConnection.connect(conninfo) as conn:
        cur = await conn.execute("SELECT seq, subject FROM quarantine ORDER BY seq")
        return {int(s): str(subject) for s, subject in await cur.fetchall()}


async def stored_anywhere(conninfo: str, marker: bytes) -> bool:
    """Whether any quarantined row (any schema: a verify's shadow is dropped, a rebuild's swapped
    in) holds ``marker`` in its raw bytes."""
    async with await psycopg.AsyncConnection.connect(conninfo) as conn:
        cur = await conn.execute("SELECT count(*) FROM quarantine WHERE position(%s::bytea in raw) > 0", (marker,))
        row = await cur.fetchone()
    return bool(row and row[0])


async def publish(c: Container, subject: str, data: bytes) -> int:
    """``data`` straight to the stream, as a tenant may (no contract in between); its sequence."""
    return (await c.js.publish(subject, data, stream=c.settings.stream)).seq


def unrelated_subjects(c: Container, sid: str) -> list[str]:
    """Subjects whose refusals are decided without the session: one that names no session, and
    the erased session's ids under another partition's token (not its session subject)."""
    subject = c.layout.session_subject(T, sid)
    part = partition_of(T, sid, c.layout.partitions)
    other = subject.replace(f".p{part:03d}.", f".p{(part + 1) % c.layout.partitions:03d}.")
    return [f"{c.layout.prefix}.{T}.nosession", other]


async def erase_elsewhere(c: Container, sid: str) -> int:
    """Erase ``sid`` from another process's stack (the projector learns of it from the log and
    the database only); waits until it is applied; the erasure's sequence."""
    async with running_stack(c.settings, projector=False) as other:
        seq = (await other.eraser.erase_session(T, sid)).seq
    await c.waiter.wait_all(seq)
    return seq


async def test_a_refused_event_quarantined_before_the_erasure_leaves_verify_identical_and_rebuild_equal(
    settings: Settings, fresh_db: str, new_id: Callable[[str], str]
) -> None:
    sid = new_id("doomed")
    async with running_stack(settings) as c:
        await c.commands.append(T, sid, text_message("m1", "kept until the erasure"), None)
        subject = c.layout.session_subject(T, sid)
        bad = await publish(c, subject, MARKER)
        kept = [await publish(c, s, b"{unrelated refusal") for s in unrelated_subjects(c, sid)]
        await c.waiter.wait_all(kept[-1])
        assert set(await quarantined(fresh_db)) == {bad, *kept}  # quarantined live, raw bytes kept
        assert await stored_anywhere(fresh_db, MARKER)

        await erase_elsewhere(c, sid)
        assert set(await quarantined(fresh_db)) == set(kept)  # the erasure deleted the session's row only
        report = await audit.verify(c)
        assert report.ok, report.differences
        assert report.live["quarantine"][0] == len(kept)

        await audit.rebuild_and_swap(c)
        async with await psycopg.AsyncConnection.connect(fresh_db) as conn:
            assert [r[0] for r in await quarantine_rows(conn, "public")] == kept
        assert not await stored_anywhere(fresh_db, MARKER)
        report = await audit.verify(c)
        assert report.ok, report.differences


async def test_a_refused_event_published_after_the_erasure_is_not_stored_live_or_after_a_restart(
    settings: Settings, fresh_db: str, new_id: Callable[[str], str]
) -> None:
    sid = new_id("doomed")
    async with running_stack(settings) as c:
        await c.commands.append(T, sid, text_message("m1", "before"), None)
        await erase_elsewhere(c, sid)
        subject = c.layout.session_subject(T, sid)
        await publish(c, subject, MARKER + b" after")
        kept = [await publish(c, s, b"{unrelated refusal") for s in unrelated_subjects(c, sid)]
        await c.waiter.wait_all(kept[-1])  # the checkpoint moved past the tombstone
        assert set(await quarantined(fresh_db)) == set(kept)
    async with running_stack(settings) as c:  # a projector that never saw the session
        last = await publish(c, subject, MARKER + b" after a restart")
        await c.waiter.wait_all(last)
        assert set(await quarantined(fresh_db)) == set(kept)
        assert not await stored_anywhere(fresh_db, MARKER)
        report = await audit.verify(c)
        assert report.ok, report.differences
        assert not await stored_anywhere(fresh_db, MARKER)


async def test_a_refused_event_met_after_an_erasure_is_recorded_and_before_its_event_is_not_stored(
    settings: Settings, fresh_db: str, new_id: Callable[[str], str]
) -> None:
    """The projector asked about the session before (not erased then); the erasure is recorded by
    another process and stops there (before ``session.erased``): the projector asks again before
    it quarantines, so it stores nothing a rebuild would not."""
    sid = new_id("halfway")
    async with running_stack(settings) as c:
        await c.waiter.wait_all((await c.commands.append(T, sid, text_message("m1", "before"), None)).seq)
        async with running_stack(settings, projector=False) as other:
            assert await other.keys.erase(T, [sid]) == [sid]  # what the erasure does first; then it stopped
        await c.waiter.wait_all(await publish(c, c.layout.session_subject(T, sid), MARKER))
        assert await quarantined(fresh_db) == {}  # as a rebuild, which knows the erasure, decides


def replayed(settings: Settings, sid: str, fmt: str) -> str:
    done = chronicle_cli(settings, "replay", "--tenant", T, "--session", sid, "--format", fmt)
    assert done.returncode == 0, done.stderr
    return done.stdout


async def test_replay_of_an_erased_session_shows_its_refused_events_as_tombstones_without_raw(
    settings: Settings, fresh_db: str, new_id: Callable[[str], str]
) -> None:
    sid, live = new_id("doomed"), new_id("live")
    async with running_stack(settings) as c:
        await c.commands.append(T, sid, text_message("m1", "before"), None)
        bad = await publish(c, c.layout.session_subject(T, sid), MARKER)
        await c.commands.append(T, live, text_message("m1", "a live one"), None)
        shown = await publish(c, c.layout.session_subject(T, live), MARKER + b" of a live session")
        await c.waiter.wait_all(shown)
        await erase_elsewhere(c, sid)
        records = [audit.replay_record(s, c.layout, c.keys) async for s in audit.session_events(c, T, sid)]
        lines = [audit.event_line(s, c.layout, c.keys) async for s in audit.session_events(c, T, sid)]
        kept = [audit.replay_record(s, c.layout, c.keys) async for s in audit.session_events(c, T, live)]
    events = [r["event"]["type"] for r in records if "event" in r]
    assert events == ["session.erased"]  # the erasure itself; every other one a tombstone
    assert [r["seq"] for r in records if "erased" in r] == [r["seq"] for r in records[:-1]]
    assert bad in {r["seq"] for r in records[:-1]}
    assert not any("raw" in r or "refused" in r for r in records)
    assert b"bad marker" not in b"".join(lines)
    for fmt in ("jsonl", "table"):
        out = replayed(settings, sid, fmt)
        assert "bad marker" not in out
        assert str(bad) in out
    refused = [r for r in kept if "refused" in r]  # a live session's refusal still shows its raw bytes
    assert [(r["seq"], r["raw"]) for r in refused] == [(shown, {"text": "{bad marker of a live session"})]
    assert json.loads(replayed(settings, live, "jsonl").splitlines()[-1])["raw"] == refused[0]["raw"]


async def test_a_refusal_quarantined_after_the_erasers_delete_is_dropped_when_the_erasure_is_applied(
    settings: Settings, fresh_db: str, new_id: Callable[[str], str]
) -> None:
    """The race the eraser's own delete cannot close: a refusal screened before the erasure was
    recorded and committed after the eraser deleted the subject's quarantine rows. Here the eraser's
    steps are taken by hand, its delete left out: the projector drops the row when it applies
    ``session.erased``, so verify stays identical."""
    sid = new_id("raced")
    async with running_stack(settings) as c:
        r = await c.commands.append(T, sid, text_message("m1", "kept until the erasure"), None)
        refused = await publish(c, c.layout.session_subject(T, sid), MARKER)
        await c.waiter.wait_all(refused)
        assert refused in await quarantined(fresh_db)
        await c.keys.erase(T, [sid])  # step 1: the key destroyed, the erasure recorded
        erased = await c.publisher.publish(SessionErased(tenant=T, session=sid))  # step 2; no step 4
        await c.waiter.wait_all(erased.seq)
        assert refused not in await quarantined(fresh_db)
        assert not await stored_anywhere(fresh_db, MARKER)
        assert erased.seq > r.seq
        assert (await audit.verify(c)).ok
