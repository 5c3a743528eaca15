"""A database that has never held read models, next to a log that already holds events (a lost or
replaced Postgres), is refused by every component with :class:`NeverBound` instead of being bound
and replayed into silently (the data keys and erasure records it lacks are not in the log);
``chronicle rebuild`` builds it on purpose, from the whole log, and binds it. A rebuild swaps the
quarantine with the read models, so a verify right after it compares equal."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator

import psycopg
import pytest

from events.omitted import OMITTED
from projections.logbinding import NeverBound
from projections.rebuild import checksums, quarantine_rows
from services.audit import readers as audit
from services.bootstrap import Container, open_container, prepare_database
from services.ops.cli import LOG_MISMATCH_EXIT
from services.ops.localstack import free_port
from services.settings import Settings
from tests.conftest import make_settings, running_stack
from tests.integration.helpers import chain, text_message
from tests.support import chronicle_cli, scratch_database

T = "tenant-a"
KEPT = ("data_keys", "erasures")
"""What the log cannot restore: the tables a backup must hold."""


@pytest.fixture
def other_db(pg_admin: str) -> Iterator[str]:
    """A second, new database (the replacement of a lost one)."""
    with scratch_database(pg_admin) as url:
        yield url


async def _append(c: Container, session: str, mid: str, text: str) -> int:
    r = await c.commands.append(T, session, text_message(mid, text), OMITTED)
    await c.waiter.wait_session(T, session, r.seq)
    return r.seq


async def _used_log(settings: Settings, new_id: Callable[[str], str]) -> tuple[list[str], str, int]:
    """Two sealed sessions with messages and one erased; returns (kept sessions, erased one, last seq)."""
    kept, erased = [new_id("kept"), new_id("kept")], new_id("gone")
    async with running_stack(settings) as c:
        for sid in (*kept, erased):
            for i in range(3):
                await _append(c, sid, f"m{i}", f"{sid} message {i}")
        seq = (await c.eraser.erase_session(T, erased)).seq
        await c.waiter.wait_all(seq)
        last = (await c.js.stream_info(settings.stream)).state.last_seq
    return kept, erased, last


async def _one(db: str, sql: str, *params: object) -> object:
    async with await psycopg.AsyncConnection.connect(db) as conn:
        cur = await conn.execute(sql, params)
        row = await cur.fetchone()
    return row[0] if row else None


async def _binding(db: str) -> object:
    return await _one(db, "SELECT stream FROM log_binding")


async def _copy(src: str, dst: str, table: str) -> int:
    """``table``'s rows from ``src`` into ``dst`` (the restore of a backup of just that table)."""
    async with (
        await psycopg.AsyncConnection.connect(src) as a,
        await psycopg.AsyncConnection.connect(dst) as b,
        a.cursor().copy(f"COPY {table} TO STDOUT (FORMAT binary)") as out,
        b.cursor().copy(f"COPY {table} FROM STDIN (FORMAT binary)") as into,
    ):
        async for chunk in out:
            await into.write(chunk)
    async with await psycopg.AsyncConnection.connect(dst) as b:
        await b.commit()
    return int(str(await _one(dst, f"SELECT count(*) FROM {table}")))


async def test_every_component_refuses_a_new_database_next_to_a_used_log(
    nats_url: str, fresh_db: str, other_db: str, new_id: Callable[[str], str]
) -> None:
    settings = make_settings(nats_url, fresh_db, encryption=True)
    _, _, last = await _used_log(settings, new_id)
    lost = settings.model_copy(update={"database_url": other_db})
    await prepare_database(lost)  # migrated, as `chronicle up` or a deploy would
    with pytest.raises(NeverBound) as refused:
        async with open_container(lost):
            pass
    text = str(refused.value)
    assert f"has never held read models of stream {settings.stream!r} ({last} events" in text
    assert "restore it from a backup" in text
    assert "data keys and the erasure records" in text
    assert "`chronicle rebuild` (which records the binding)" in text
    async with open_container(lost, log_check=False) as c:
        runner = c.projector()
        with pytest.raises(NeverBound):
            await asyncio.wait_for(runner.run(asyncio.Event()), timeout=30)
        assert runner.stats.batches == 0
        with pytest.raises(NeverBound, match="nothing to verify against"):
            await audit.verify(c)
    assert await _binding(other_db) is None
    assert await _one(other_db, "SELECT count(*) FROM data_keys") == 0  # no key minted for an old session
    assert await _one(other_db, "SELECT count(*) FROM checkpoints") == 0
    for process in ("api", "commands", "compactor"):
        done = await asyncio.to_thread(chronicle_cli, lost.model_copy(update={"api_port": free_port()}), process)
        assert done.returncode == LOG_MISMATCH_EXIT, done.stderr
        assert done.stderr.startswith(f"chronicle {process}: refusing to start: database "), done.stderr
        assert "restore it from a backup" in done.stderr
        assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert await _binding(other_db) is None


async def test_a_rebuild_builds_a_new_database_from_the_whole_log_and_binds_it(
    nats_url: str, fresh_db: str, other_db: str, new_id: Callable[[str], str]
) -> None:
    """The lost database's key store and erasure records restored from a backup, the rest rebuilt:
    the read models equal the lost ones, and the stack starts on them."""
    settings = make_settings(nats_url, fresh_db, encryption=True)
    kept, erased, last = await _used_log(settings, new_id)
    async with await psycopg.AsyncConnection.connect(fresh_db) as conn:
        before = await checksums(conn, "public")
    lost = settings.model_copy(update={"database_url": other_db})
    await prepare_database(lost)
    assert await _copy(fresh_db, other_db, "data_keys") == 2  # the erased session's key is gone
    assert await _copy(fresh_db, other_db, "erasures") == 1
    done = await asyncio.to_thread(chronicle_cli, lost, "rebuild")
    assert done.returncode == 0, done.stderr
    assert f"swapped at sequence {last}\n" in done.stdout  # the stream's end: nothing left to the projector
    assert "the projector applies" not in done.stdout
    assert "the database held no read models: built, bound to stream" in done.stdout
    assert await _binding(other_db) == settings.stream
    assert await _one(other_db, "SELECT seq FROM checkpoints WHERE name = %s", settings.projector_name) == last
    async with await psycopg.AsyncConnection.connect(other_db) as conn:
        assert await checksums(conn, "public") == before
    assert await _one(other_db, "SELECT count(*) FROM messages WHERE session_id = %s", kept[0]) == 3
    assert await _one(other_db, "SELECT count(*) FROM sessions WHERE id = %s", erased) == 0
    assert await _one(other_db, "SELECT count(*) FROM quarantine") == 0  # the erasure is recorded: applied
    verified = await asyncio.to_thread(chronicle_cli, lost, "verify")
    assert verified.returncode == 0, verified.stdout + verified.stderr
    assert "identical" in verified.stdout
    async with running_stack(lost) as c:
        seq = await _append(c, kept[0], "m3", "after the rebuild")
        assert seq == last + 1
        assert await _one(other_db, "SELECT count(*) FROM messages WHERE session_id = %s", kept[0]) == 4


async def test_a_rebuild_without_the_key_store_quarantines_what_it_cannot_open(
    nats_url: str, fresh_db: str, other_db: str, new_id: Callable[[str], str]
) -> None:
    """What losing the database without a backup means: the sealed events stay unreadable (they
    are quarantined, not dropped silently); the real erasure, proven, is recorded again
    (tests/integration/test_proven_erasures.py)."""
    settings = make_settings(nats_url, fresh_db, encryption=True)
    kept, erased, last = await _used_log(settings, new_id)
    lost = settings.model_copy(update={"database_url": other_db})
    await prepare_database(lost)
    async with open_container(lost, log_check=False) as c:
        report = await audit.rebuild_and_swap(c)
        assert report.first
        assert not report.rebound
        assert report.swapped_at_seq == last
        assert (await audit.verify(c)).ok
    assert await _one(other_db, "SELECT count(*) FROM messages") == 0
    async with await psycopg.AsyncConnection.connect(other_db) as conn:
        reasons = {(subject, reason) for _, subject, reason, *_ in await quarantine_rows(conn, "public")}
    layout = settings.layout()
    for sid in kept:  # sealed with a key that is gone with the database
        assert (layout.session_subject(T, sid), "invalid") in reasons
    assert not any(subject == layout.session_subject(T, erased) for subject, _ in reasons)
    assert await _one(other_db, "SELECT count(*) FROM erasures WHERE session_id = %s", erased) == 1


async def test_a_partial_rebuild_of_a_new_database_is_refused(
    nats_url: str, fresh_db: str, other_db: str, new_id: Callable[[str], str]
) -> None:
    settings = make_settings(nats_url, fresh_db)
    await _used_log(settings, new_id)
    lost = settings.model_copy(update={"database_url": other_db})
    async with open_container(lost, log_check=False) as c:
        with pytest.raises(NeverBound, match="--projection all"):
            await audit.rebuild_and_swap(c, "history")
    assert await _binding(other_db) is None


async def test_a_rebuild_swaps_the_quarantine_so_verify_right_after_is_identical(
    nats_url: str, fresh_db: str, new_id: Callable[[str], str]
) -> None:
    """The trial: one session's data key gone (an older backup restored); the rebuild quarantines
    its sealed events and swaps the quarantine in with the read models."""
    settings = make_settings(nats_url, fresh_db, encryption=True)
    kept, _, last = await _used_log(settings, new_id)
    async with await psycopg.AsyncConnection.connect(fresh_db, autocommit=True) as conn:
        await conn.execute("DELETE FROM data_keys WHERE session_id = %s", (kept[1],))
    async with open_container(settings, log_check=False) as c:
        assert not (await audit.verify(c)).ok
        report = await audit.rebuild_and_swap(c)
        assert not report.first
        assert not report.rebound
        result = await audit.verify(c)
    assert result.ok, result.differences
    async with await psycopg.AsyncConnection.connect(fresh_db) as conn:
        rows = await quarantine_rows(conn, "public")
    assert len(rows) >= 3  # its three appends at least, all of them its own
    assert {(subject, reason) for _, subject, reason, *_ in rows} == {
        (settings.layout().session_subject(T, kept[1]), "invalid")
    }
    assert await _one(fresh_db, "SELECT count(*) FROM messages WHERE session_id = %s", kept[1]) == 0
    assert await _one(fresh_db, "SELECT count(*) FROM messages WHERE session_id = %s", kept[0]) == 3
    assert await _one(fresh_db, "SELECT seq FROM checkpoints WHERE name = %s", settings.projector_name) == last


async def test_a_rebuild_of_a_bound_database_without_checkpoints_builds_from_the_whole_log(
    nats_url: str, fresh_db: str, new_id: Callable[[str], str]
) -> None:
    """Bound while the stream was empty, no projector ran since: the checkpoints start where the
    rebuild ended, so no projector applies the log a second time on top of it."""
    settings = make_settings(nats_url, fresh_db)
    sid = new_id("s")
    async with open_container(settings) as c:  # binds the empty stream; no projector runs
        for event in chain(T, sid, 3):
            await c.publisher.publish(event)
        last = (await c.js.stream_info(settings.stream)).state.last_seq
    assert await _binding(fresh_db) == settings.stream
    async with open_container(settings) as c:
        report = await audit.rebuild_and_swap(c)
        assert report.first
        assert report.swapped_at_seq == last
        assert (await audit.verify(c)).ok
    assert await _one(fresh_db, "SELECT count(*) FROM messages WHERE session_id = %s", sid) == 3
    assert await _one(fresh_db, "SELECT seq FROM checkpoints WHERE name = %s", settings.projector_name) == last
