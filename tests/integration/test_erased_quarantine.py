"""Refused events of an erased session, on real NATS and Postgres: the session a stored message is
filed under is decided by its subject (whatever its bytes say), and an erased session's refused
event is a tombstone, never quarantined: live, in a rebuild and in a verify alike. One quarantined
before the erasure is deleted by it (live) and tombstoned by a rebuild (the key store knows it
erased), so ``verify`` stays identical; one published after it is not stored at all; replay shows
tombstones, never the raw bytes. The session's ids under another partition's token are the
session's too (deleted, tombstoned); a subject that names no session is the tenant scope's, kept
until the tenant is erased (tests/integration/test_tenant_erasure_quarantine.py)."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Callable
from typing import Any, cast

import httpx
import psycopg
import pytest

from events.catalog import SessionErased
from events.subjects import SubjectLayout, partition_of
from projections import quarantine
from projections.keystore import ERASURE_LOCK
from projections.migrate import migrate, migration_files
from projections.quarantine import RAW_KEPT, Quarantined, record, screen
from projections.rebuild import quarantine_rows
from projections.runner import apply_batch
from services.api.app import build_app
from services.audit import readers as audit
from services.audit.strays import strays
from services.bootstrap import Container
from services.settings import Settings
from tests.conftest import KEYS, make_settings, running_stack
from tests.integration.helpers import appended, text_message
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


def wrong_partitions(c: Container, sid: str) -> list[str]:
    """The session's ids under another partition's token than its own: another partition of the
    layout's, and one past the layout's count (a subject no tenant may publish on)."""
    subject = c.layout.session_subject(T, sid)
    token = f".p{partition_of(T, sid, c.layout.partitions):03d}."
    return [
        subject.replace(token, f".p{(int(token[2:5]) + 1) % c.layout.partitions:03d}."),
        subject.replace(token, ".p007."),
    ]


def unrelated_subjects(c: Container) -> list[str]:
    """Subjects whose refusals are decided without the session: one that names no session (the
    tenant scope's), and another session's ids under another partition's token."""
    return [f"{c.layout.prefix}.{T}.nosession", *wrong_partitions(c, "someone-else")]


async def rebuilt_as_live(c: Container, conninfo: str) -> list[Any]:
    """Verify finds no difference, and a rebuild swapped in holds the quarantine rows live held
    (returned)."""
    report = await audit.verify(c)
    assert report.ok, report.differences
    async with await psycopg.AsyncConnection.connect(conninfo) as conn:
        before = await quarantine_rows(conn, "public")
    await audit.rebuild_and_swap(c)
    async with await psycopg.AsyncConnection.connect(conninfo) as conn:
        assert await quarantine_rows(conn, "public") == before
    return before


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
        misplaced = [await publish(c, s, MARKER + b" misplaced") for s in wrong_partitions(c, sid)]
        kept = [await publish(c, s, b"{unrelated refusal") for s in unrelated_subjects(c)]
        await c.waiter.wait_all(kept[-1])
        assert set(await quarantined(fresh_db)) == {bad, *misplaced, *kept}  # quarantined live, raw bytes kept
        assert await stored_anywhere(fresh_db, MARKER)

        await erase_elsewhere(c, sid)
        # the erasure deleted the session's rows only: its ids under any partition token
        assert set(await quarantined(fresh_db)) == set(kept)
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
        for misplaced in wrong_partitions(c, sid):
            await publish(c, misplaced, MARKER + b" misplaced after")
        kept = [await publish(c, s, b"{unrelated refusal") for s in unrelated_subjects(c)]
        await c.waiter.wait_all(kept[-1])  # the checkpoint moved past the tombstone
        assert set(await quarantined(fresh_db)) == set(kept)
    async with running_stack(settings) as c:  # a projector that never saw the session
        await publish(c, wrong_partitions(c, sid)[1], MARKER + b" misplaced after a restart")
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


# -- strays: refused on another subject, their bytes naming the session -------------------------

STRAY = "stray marker"


def stray(
    c: Container, named: str, subject_of: str, mid: str, *, wrong_partition: bool, size: int = 0
) -> tuple[str, bytes]:
    """An event of ``named`` (its text holding :data:`STRAY`, padded to ``size``) published on
    ``subject_of``'s subject, or that session's subject under another partition's token: refused
    ``subject_mismatch``, its bytes naming ``named``."""
    subject = c.layout.session_subject(T, subject_of)
    if wrong_partition:
        part = partition_of(T, subject_of, c.layout.partitions)
        subject = subject.replace(f".p{part:03d}.", f".p{(part + 1) % c.layout.partitions:03d}.")
    text = STRAY + " " + "x" * max(0, size - len(STRAY))
    return subject, appended(T, named, mid, None, text=text).to_json()


async def listed(client: httpx.AsyncClient, sid: str) -> list[int]:
    """``GET /v1/quarantine?session_id=``: the sequences listed with the session."""
    r = await client.get("/v1/quarantine", params={"session_id": sid, "limit": 100})
    assert r.status_code == 200, r.text
    return sorted(q["seq"] for q in r.json()["quarantined"])


@contextlib.asynccontextmanager
async def api(c: Container) -> AsyncIterator[httpx.AsyncClient]:
    """The HTTP API over ``c``, as tenant ``T``."""
    transport = httpx.ASGITransport(app=build_app(c.settings, c))
    headers = {"Authorization": f"Bearer {KEYS[T]}"}
    async with httpx.AsyncClient(transport=transport, base_url="http://api", headers=headers) as client:
        yield client


async def test_a_stray_quarantined_before_the_erasure_is_gone_after_it_and_a_rebuild_equals_live(
    settings: Settings, fresh_db: str, new_id: Callable[[str], str]
) -> None:
    """Strays of the erased session (on its subject under another partition's token, on another
    session's subject, one over the 64 KiB a row keeps) are deleted by its erasure, from the table
    and the API alike; a stray naming a live session of the same tenant is kept; verify and a
    rebuild decide the same as the live projector."""
    sid, live = new_id("doomed"), new_id("live")
    async with running_stack(settings) as c, api(c) as client:
        await c.commands.append(T, sid, text_message("m1", "kept until the erasure"), None)
        await c.commands.append(T, live, text_message("m1", "a live one"), None)
        wrong_part = await publish(c, *stray(c, sid, sid, "s1", wrong_partition=True))
        elsewhere = await publish(c, *stray(c, sid, live, "s2", wrong_partition=False))
        cut = await publish(c, *stray(c, sid, live, "s3", wrong_partition=False, size=RAW_KEPT + 1000))
        kept = await publish(c, *stray(c, live, live, "k1", wrong_partition=True))
        await c.waiter.wait_all(kept)
        assert set(await quarantined(fresh_db)) == {wrong_part, elsewhere, cut, kept}
        assert await listed(client, sid) == [wrong_part]  # listed with the session its subject names
        assert await listed(client, live) == [elsewhere, cut, kept]
        assert await stored_anywhere(fresh_db, STRAY.encode())

        await erase_elsewhere(c, sid)
        assert set(await quarantined(fresh_db)) == {kept}
        assert await listed(client, sid) == []
        assert await listed(client, live) == [kept]
        before = await rebuilt_as_live(c, fresh_db)
        assert [r[0] for r in before] == [kept]
        async with await psycopg.AsyncConnection.connect(fresh_db) as conn:
            cur = await conn.execute(
                "SELECT count(*) FROM quarantine WHERE position(%s::bytea in raw) > 0", (STRAY.encode(),)
            )
            assert await cur.fetchone() == (1,)  # the live session's stray only
        assert (await audit.verify(c)).ok


async def test_a_stray_published_after_the_erasure_leaves_no_row_live_after_a_restart_or_in_a_rebuild(
    settings: Settings, fresh_db: str, new_id: Callable[[str], str]
) -> None:
    sid, live = new_id("doomed"), new_id("live")
    async with running_stack(settings) as c:
        await c.commands.append(T, sid, text_message("m1", "before"), None)
        await c.commands.append(T, live, text_message("m1", "a live one"), None)
        await erase_elsewhere(c, sid)
        await publish(c, *stray(c, sid, sid, "s1", wrong_partition=True))
        await publish(c, *stray(c, sid, live, "s2", wrong_partition=False))
        kept = await publish(c, *stray(c, live, live, "k1", wrong_partition=True))
        await c.waiter.wait_all(kept)  # the checkpoint moved past the tombstones
        assert set(await quarantined(fresh_db)) == {kept}
    async with running_stack(settings) as c, api(c) as client:  # a projector that never saw the session
        last = await publish(c, *stray(c, sid, live, "s3", wrong_partition=False))
        await c.waiter.wait_all(last)
        assert set(await quarantined(fresh_db)) == {kept}
        assert await listed(client, sid) == []
        assert await listed(client, live) == [kept]
        report = await audit.verify(c)
        assert report.ok, report.differences
        await audit.rebuild_and_swap(c)
        assert set(await quarantined(fresh_db)) == {kept}


async def test_a_stray_quarantined_after_the_erasers_delete_is_dropped_when_the_erasure_is_applied(
    settings: Settings, fresh_db: str, new_id: Callable[[str], str]
) -> None:
    """The race the eraser's own delete cannot close, for a stray: the eraser's steps by hand, its
    delete left out; the projector applying ``session.erased`` drops the session's strays (one
    over the 64 KiB its row keeps, named by its whole event when it was recorded) and keeps a live
    session's, so verify stays identical."""
    sid, live = new_id("raced"), new_id("live")
    async with running_stack(settings) as c:
        await c.commands.append(T, sid, text_message("m1", "kept until the erasure"), None)
        await c.commands.append(T, live, text_message("m1", "a live one"), None)
        refused = await publish(c, *stray(c, sid, live, "s1", wrong_partition=False))
        cut = await publish(c, *stray(c, sid, sid, "s2", wrong_partition=True, size=RAW_KEPT + 1000))
        kept = await publish(c, *stray(c, live, live, "k1", wrong_partition=True))
        await c.waiter.wait_all(kept)
        assert set(await quarantined(fresh_db)) == {refused, cut, kept}
        await c.keys.erase(T, [sid])  # step 1: the key destroyed, the erasure recorded
        erased = await c.publisher.publish(SessionErased(tenant=T, session=sid))  # step 2; no step 4
        await c.waiter.wait_all(erased.seq)
        assert set(await quarantined(fresh_db)) == {kept}
        report = await audit.verify(c)
        assert report.ok, report.differences


async def test_the_eraser_itself_deletes_the_sessions_strays_while_no_projector_runs(
    settings: Settings, fresh_db: str, new_id: Callable[[str], str]
) -> None:
    """Step 4 of the erasure, on its own: replay's lookup finds the session's strays (one over the
    64 KiB its row keeps, named by its whole event when it was recorded), and the eraser deletes
    exactly those, before any projector applies ``session.erased``."""
    sid, live = new_id("doomed"), new_id("live")
    async with running_stack(settings) as c:
        await c.commands.append(T, sid, text_message("m1", "kept until the erasure"), None)
        await c.commands.append(T, live, text_message("m1", "a live one"), None)
        gone = [
            await publish(c, *stray(c, sid, sid, "s1", wrong_partition=True)),
            await publish(c, *stray(c, sid, live, "s2", wrong_partition=False, size=RAW_KEPT + 1000)),
        ]
        kept = await publish(c, *stray(c, live, live, "k1", wrong_partition=True))
        await c.waiter.wait_all(kept)
        assert [s.seq for s in await strays(c, T, sid)] == gone
        assert [s.seq for s in await strays(c, T, live)] == [kept]
    async with running_stack(settings, projector=False) as c:
        await c.eraser.erase_session(T, sid)
        assert set(await quarantined(fresh_db)) == {kept}
        assert await strays(c, T, sid) == []


async def waiting_on_advisory_lock(conn: psycopg.AsyncConnection, pid: int | None = None) -> int:
    """Until a backend of this database (``pid``, when given) waits on an advisory lock (pg_locks:
    not granted); its pid."""
    for _ in range(500):
        cur = await conn.execute(
            "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND NOT granted AND (%(pid)s::int IS NULL OR "
            "pid = %(pid)s) AND database = (SELECT oid FROM pg_database WHERE datname = current_database())",
            {"pid": pid},
        )
        if (row := await cur.fetchone()) is not None:
            return int(row[0])
        await asyncio.sleep(0.01)
    raise AssertionError("no backend waited on an advisory lock")


async def test_a_stray_screened_before_the_erasure_is_recorded_is_a_tombstone_when_its_batch_commits(
    settings: Settings, fresh_db: str, new_id: Callable[[str], str]
) -> None:
    """A batch may be screened (prefetch, or another partition's worker) while the erasure runs:
    in its transaction the projector asks again, under the lock the erasure is recorded under, so
    a batch that meets an erasure being recorded waits for it and records no stray of it (a
    rebuild tombstones it), while the refusal of a live session is recorded; the checkpoint moves
    past both."""
    sid, live = new_id("doomed"), new_id("live")
    async with running_stack(settings, projector=False) as c:
        runner = c.projector()
        assert runner.keys is not None
        subject, data = stray(c, sid, live, "s1", wrong_partition=False)
        other_subject, other_data = stray(c, live, live, "k1", wrong_partition=True)
        refused = [
            screen(5, subject, data, c.layout, runner.keys),
            screen(6, other_subject, other_data, c.layout, runner.keys),
        ]
        assert all(isinstance(q, Quarantined) for q in refused)  # screened before the erasure
        name = new_id("checkpoint")
        async with c.pool.connection() as conn:
            async with await psycopg.AsyncConnection.connect(fresh_db) as eraser, eraser.transaction():
                # the eraser's step 1 under way: its lock held, the erasure not yet committed
                await eraser.execute(ERASURE_LOCK, (T,))
                await eraser.execute("INSERT INTO erasures (tenant, session_id) VALUES (%s, %s)", (T, sid))
                batch = asyncio.create_task(commit_refusals(conn, name, cast(list[Quarantined], refused), c.layout))
                await waiting_on_advisory_lock(eraser, conn.info.backend_pid)
            assert await batch == [6]  # recorded after the erasure's commit: the live session's only
        assert set(await quarantined(fresh_db)) == {6}
        async with c.pool.connection() as conn:
            cur = await conn.execute("SELECT seq FROM checkpoints WHERE name = %s", (name,))
            assert await cur.fetchone() == (6,)


async def commit_refusals(
    conn: psycopg.AsyncConnection, name: str, refused: list[Quarantined], layout: SubjectLayout
) -> list[int]:
    """One projector transaction recording ``refused``: the sequences it recorded."""
    recorded: list[Quarantined] = []
    async with conn.transaction():
        await apply_batch(conn, name, [], [], refused=refused, quarantined=recorded, layout=layout)
    return [q.seq for q in recorded]


async def test_an_erasure_recorded_while_a_batch_records_its_stray_waits_and_then_deletes_it(
    settings: Settings, fresh_db: str, new_id: Callable[[str], str]
) -> None:
    """The other order: a batch recording a stray of a live session holds the erasure lock
    (shared) until it commits; the erasure's step 1 waits for that commit, so its step 4 (run
    after) finds the stray and deletes it."""
    sid, live = new_id("doomed"), new_id("live")
    async with running_stack(settings, projector=False) as c:
        runner = c.projector()
        assert runner.keys is not None
        subject, data = stray(c, sid, live, "s1", wrong_partition=False)
        refused = screen(5, subject, data, c.layout, runner.keys)
        assert isinstance(refused, Quarantined)
        async with await psycopg.AsyncConnection.connect(fresh_db) as conn:
            async with conn.transaction():
                recorded: list[Quarantined] = []
                await apply_batch(
                    conn, new_id("checkpoint"), [], [], refused=[refused], quarantined=recorded, layout=c.layout
                )
                assert recorded == [refused]
                step1 = asyncio.create_task(c.keys.erase(T, [sid]))
                async with await psycopg.AsyncConnection.connect(fresh_db) as watcher:
                    await waiting_on_advisory_lock(watcher)  # the erasure's step 1
                assert not step1.done()
            assert await step1 == [sid]  # recorded once the batch committed
        assert set(await quarantined(fresh_db)) == {5}
        await c.eraser.erase_session(T, sid)  # the rest of the erasure: step 4 deletes the stray
        assert await quarantined(fresh_db) == {}


async def test_a_stray_left_by_an_earlier_release_goes_when_the_erasure_is_run_again(
    settings: Settings, fresh_db: str, new_id: Callable[[str], str]
) -> None:
    """README "Upgrading": a stray of a session erased by an earlier release (which deleted only its
    subject's rows) stays in the table, and verify shows it, until the erasure is run again: a rerun
    publishes nothing and deletes it, found by the session migration 031 filled in from its bytes."""
    sid, live = new_id("doomed"), new_id("live")
    async with running_stack(settings) as c:
        await c.commands.append(T, sid, text_message("m1", "kept until the erasure"), None)
        subject, data = stray(c, sid, live, "s1", wrong_partition=False)
        seq = await publish(c, subject, data)
        first = await erase_elsewhere(c, sid)
        assert await quarantined(fresh_db) == {}
        async with c.pool.connection() as conn, conn.transaction():  # as the earlier projector left it
            await record(conn, settings.projector_name, [Quarantined(seq, subject, "subject_mismatch", "x", data)])
            await backfill(conn)
        assert not (await audit.verify(c)).ok
        async with running_stack(settings, projector=False) as other:
            again = await other.eraser.erase_session(T, sid)
        assert (again.seq, again.newly_erased) == (first, False)
        assert await quarantined(fresh_db) == {}
        report = await audit.verify(c)
        assert report.ok, report.differences


async def test_a_batch_that_applies_an_erasure_moves_its_checkpoint_past_the_tombstones_after_it(
    settings: Settings, fresh_db: str, new_id: Callable[[str], str]
) -> None:
    """One batch: a ``session.erased``, then a stray of the session (a tombstone, the batch's last
    sequence): the erasure's delete of strays leaves the checkpoint moving past the tombstone."""
    sid = new_id("doomed")
    erased = SessionErased(tenant=T, session=sid)
    subject = settings.layout().session_subject(T, sid)
    async with running_stack(settings, projector=False) as c:
        await c.keys.erase(T, [sid])
        name = new_id("checkpoint")
        async with c.pool.connection() as conn, conn.transaction():
            await apply_batch(conn, name, [], [(7, erased)], sources={7: (subject, erased.to_json())}, passed=[8])
        async with c.pool.connection() as conn:
            cur = await conn.execute("SELECT seq FROM checkpoints WHERE name = %s", (name,))
            assert await cur.fetchone() == (8,)


async def backfill(conn: psycopg.AsyncConnection) -> None:
    """Migration 031 run again (it is idempotent): what an upgrade does to the rows it finds."""
    [sql] = [text for version, _, text in migration_files() if version == 31]
    await conn.execute(sql.encode())


async def named(conninfo: str) -> dict[int, tuple[str | None, str | None]]:
    """seq -> (named_tenant, named_session) of every quarantined event."""
    async with await psycopg.AsyncConnection.connect(conninfo) as conn:
        cur = await conn.execute("SELECT seq, named_tenant, named_session FROM quarantine ORDER BY seq")
        return {int(s): (t, n) for s, t, n in await cur.fetchall()}


async def test_migration_031_names_the_session_of_whole_json_rows_of_their_subjects_tenant_only(
    settings: Settings, fresh_db: str, new_id: Callable[[str], str]
) -> None:
    """Rows recorded before the column: a whole JSON object naming a session of its subject's
    tenant gets it; a cut row (its whole event only in the log), bytes that are not UTF-8 or not
    JSON, and a body naming another tenant stay NULL, and the migration does not fail on them. The
    projector records the same from the whole event (the cut one too)."""
    sid, live = new_id("doomed"), new_id("live")
    layout = settings.layout()
    other = layout.session_subject("tenant-a", sid)
    whole = stray_bytes(sid, "s1")
    rows = [
        Quarantined(1, layout.session_subject(T, live), "subject_mismatch", "x", whole),
        Quarantined(2, layout.session_subject(T, live), "subject_mismatch", "x", stray_bytes(sid, "s2", RAW_KEPT)),
        Quarantined(3, layout.session_subject(T, live), "not_json", "x", b"\xff\xfe{" + whole),
        Quarantined(4, layout.session_subject(T, live), "not_json", "x", whole[:-1]),
        Quarantined(5, other, "subject_mismatch", "x", whole),  # tenant-a's subject, naming tenant-b's session
        Quarantined(
            6,
            layout.session_subject(T, live),
            "not_json",
            "x",
            b'{"tenant": "' + T.encode() + b'", "session": "a\\u0000b"}',
        ),
    ]
    await migrate(fresh_db)
    async with await psycopg.AsyncConnection.connect(fresh_db) as conn, conn.transaction():
        await record(conn, "earlier", rows)  # as an earlier release recorded them: no session named
        await backfill(conn)
    want: dict[int, tuple[str | None, str | None]] = {i: (None, None) for i in range(1, 7)}
    assert await named(fresh_db) == {**want, 1: (T, sid)}
    async with await psycopg.AsyncConnection.connect(fresh_db) as conn, conn.transaction():
        await conn.execute("DELETE FROM quarantine")
        await record(conn, "now", rows, layout)
    assert await named(fresh_db) == {**want, 1: (T, sid), 2: (T, sid)}


def stray_bytes(sid: str, mid: str, size: int = 0) -> bytes:
    """An event of ``T``'s session ``sid`` (padded to ``size``): a stray wherever else it is stored."""
    return appended(T, sid, mid, None, text="x" * size).to_json()


async def test_a_stray_naming_another_tenants_erased_session_is_quarantined_and_shown_to_its_publisher(
    settings: Settings, fresh_db: str, new_id: Callable[[str], str]
) -> None:
    """Tenant-scoped: tenant ``T`` publishes, on its own subjects, events naming tenant-a's session
    before and after its erasure; they are quarantined as any refusal (names no session of
    ``T``), the erasure deletes none of them, and ``T`` sees them all: whether another tenant's
    session is erased never shows. Verify and a rebuild decide the same."""
    sid, mine = new_id("theirs"), new_id("mine")
    async with running_stack(settings) as c, api(c) as client:
        await c.commands.append("tenant-a", sid, text_message("m1", "tenant-a's"), None)
        await c.commands.append(T, mine, text_message("m1", "mine"), None)
        foreign = appended("tenant-a", sid, "s1", None, text=STRAY).to_json()
        subject = c.layout.session_subject(T, mine)
        before = await publish(c, subject, foreign)
        await c.waiter.wait_all(before)
        async with running_stack(settings, projector=False) as other:
            erased = (await other.eraser.erase_session("tenant-a", sid)).seq
        after = await publish(c, subject, foreign)
        await c.waiter.wait_all(max(erased, after))
        assert set(await quarantined(fresh_db)) == {before, after}
        assert (await named(fresh_db))[after] == (None, None)
        assert await listed(client, mine) == [before, after]
        assert [s.seq for s in await strays(c, "tenant-a", sid)] == []
        report = await audit.verify(c)
        assert report.ok, report.differences
        await audit.rebuild_and_swap(c)
        assert set(await quarantined(fresh_db)) == {before, after}


async def test_the_stray_lookup_and_the_erasures_delete_read_by_index_never_other_tenants_rows(
    fresh_db: str,
) -> None:
    """Lead's review: another tenant's flood of refused events (large, malformed) must not make an
    erasure slow. The lookups and the deletes read by indexes (migrations 031, 032), as
    the plan says without statistics (this Postgres runs with autovacuum off); and the lookup
    never returns another tenant's row naming the session."""
    await migrate(fresh_db)
    async with await psycopg.AsyncConnection.connect(fresh_db) as conn, conn.transaction():
        await conn.execute(  # tenant-a's flood: rows naming tenant-b's session on tenant-a's subjects
            "INSERT INTO quarantine (seq, subject, reason, detail, raw, size, consumer) "
            "SELECT g, 'chronicle.ev.tenant-a.p000.s' || g, 'not_json', 'x', "
            'convert_to(repeat(\'{"tenant": "tenant-b", "session": "s"}\', 50), \'UTF8\'), 70000, \'flood\' '
            "FROM generate_series(1, 20000) g"
        )
        own = ["chronicle.ev.tenant-b.p000.s"]
        low, high = quarantine.tenant_range(SubjectLayout(), T)
        plans = []
        asked: list[tuple[str, Any]] = [
            (quarantine._STRAYS, {"tenant": T, "session": "s", "own": own, "from": 1, "to": None}),
            # a session's rows, its ids under any partition token; the tenant scope's: the tenant's rows
            (quarantine._OWNED_SESSION, {"rlow": "s.", "rhigh": "s/", "low": low, "high": high}),
            (quarantine._OWNED_TENANT, {"low": low, "high": high}),
            ("DELETE FROM quarantine WHERE seq = ANY(%s)", ([1, 2],)),
        ]
        for sql, params in asked:
            cur = await conn.execute(b"EXPLAIN " + sql.encode(), params)
            plans.append("\n".join(str(r[0]) for r in await cur.fetchall()))
        assert "quarantine_named" in plans[0], plans[0]
        assert "quarantine_subject_reversed" in plans[1], plans[1]
        assert "quarantine_subject_pattern" in plans[2], plans[2]
        assert "quarantine_pkey" in plans[3], plans[3]
        assert not any("Seq Scan" in p for p in plans), plans
        assert await quarantine.strays(conn, [(T, "s")], own) == []
        assert await quarantine.owned(conn, SubjectLayout(), T, "s") == []
        assert await quarantine.tenant_sessions(conn, SubjectLayout(), T) == set()
        assert len(await quarantine.owned(conn, SubjectLayout(), "tenant-a", "s1")) == 1


async def test_a_batch_of_refusals_naming_many_sessions_takes_one_lock_per_tenant(
    settings: Settings, new_id: Callable[[str], str]
) -> None:
    """What a batch's refusals name is the publisher's to choose: 300 strays naming 300 sessions take
    one shared advisory lock (their tenant's), not 300 or 600 entries of Postgres' lock table,
    which every connection shares (a tenant filling it failed every transaction of every tenant)."""
    async with running_stack(settings, projector=False) as c:
        runner = c.projector()
        assert runner.keys is not None
        refused = [
            screen(i + 1, *stray(c, new_id("named"), new_id("on"), "s1", wrong_partition=False), c.layout, runner.keys)
            for i in range(300)
        ]
        assert all(isinstance(q, Quarantined) for q in refused)
        async with c.pool.connection() as conn, conn.transaction():
            await apply_batch(
                conn, new_id("checkpoint"), [], [], refused=cast(list[Quarantined], refused), layout=c.layout
            )
            cur = await conn.execute(
                "SELECT count(*) FROM pg_locks WHERE pid = pg_backend_pid() AND locktype = 'advisory'"
            )
            assert await cur.fetchone() == (1,)
        assert len(await quarantined(settings.database_url)) == 300
