"""`chronicle rebuild` of a database whose live projectors are behind the stream's end: the
rebuild stops where they stopped, so the projectors apply every later event once, to the
swapped-in tables and to their compaction state alike. Real NATS and Postgres."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest

from events.context import CompactionConfig, SessionConfig
from events.omitted import OMITTED
from events.subjects import partition_of
from projections.rebuild import apply_range, checksums, rebuild_into
from projections.runner import ProjectorRunner
from services.audit import readers as audit
from services.bootstrap import Container
from services.compaction.ranges import message_tokens
from services.ops.audit_text import rebuild_summary
from tests.conftest import make_settings, running_stack
from tests.integration.helpers import appended, assert_rebuild_equals_live, text_message
from tests.integration.test_partitions import projector_of

T = "tenant-a"
TRACKED = SessionConfig(compaction=CompactionConfig(compact_after=1_000_000))  # tracked, never due


@contextlib.asynccontextmanager
async def projecting(runner: ProjectorRunner) -> AsyncIterator[None]:
    """``runner`` runs inside the block and is stopped (its batch in flight finished) after it."""
    stop = asyncio.Event()
    task = asyncio.create_task(runner.run(stop))
    try:
        yield
    finally:
        stop.set()
        await asyncio.wait_for(task, 15)


async def _compaction_state(c: Container, sid: str) -> tuple[list[tuple[str, int]], tuple[Any, ...] | None]:
    """The projector's compaction state of ``sid``: its messages ``(id, seq)`` and ``(leaf, estimate)``."""
    worker = c.settings.projector_name
    async with c.pool.connection() as conn:
        cur = await conn.execute(
            "SELECT id, seq FROM compactor_messages WHERE worker = %s AND tenant = %s AND session_id = %s ORDER BY seq",
            (worker, T, sid),
        )
        messages = [(str(i), int(s)) for i, s in await cur.fetchall()]
        cur = await conn.execute(
            "SELECT leaf_id, estimate FROM compactor_sessions WHERE worker = %s AND tenant = %s AND session_id = %s",
            (worker, T, sid),
        )
        return messages, await cur.fetchone()


async def _single_branch(c: Container, sid: str) -> bool:
    async with c.pool.connection() as conn:
        cur = await conn.execute("SELECT single_branch FROM sessions WHERE tenant = %s AND id = %s", (T, sid))
        row = await cur.fetchone()
    assert row is not None
    return bool(row[0])


def _tokens(c: Container, *texts: str) -> int:
    return sum(message_tokens(text_message("x", t), c.context.counter.count) for t in texts)


async def _assert_consistent(c: Container, sids: list[str], seqs: dict[str, list[tuple[str, int]]]) -> None:
    """Verify is ok, the read models are what replaying the whole log gives, every session is
    one branch, and the compaction state holds each message once, at its own sequence."""
    report = await audit.verify(c)
    assert report.ok, report.differences
    await assert_rebuild_equals_live(c, c.settings.database_url, c.settings.projector_name, "reference")
    for sid in sids:
        assert await _single_branch(c, sid), sid
        messages, session = await _compaction_state(c, sid)
        assert messages == seqs[sid], sid
        assert session is not None
        assert session[0] == seqs[sid][-1][0]


async def _projected(c: Container) -> dict[str, tuple[int, str]]:
    async with c.pool.connection() as conn:
        return await checksums(conn, "public")


async def test_a_rebuild_behind_the_projector_stops_at_its_checkpoint_and_it_applies_the_rest_once(
    nats_url: str, fresh_db: str, s3_endpoint: str, backup: Callable[[str], str]
) -> None:
    """m0 applied live, m1 and m2 appended while the projector is stopped: the rebuilt tables
    hold m0 only (where the live checkpoint is), and the projector, started again, applies m1 and
    m2 once to them and to its compaction state: the same read models and compaction state as
    the projector alone gives a copy of the database."""
    settings = make_settings(nats_url, fresh_db, s3_endpoint=s3_endpoint)
    sid = "behind"
    async with running_stack(settings, projector=False) as c:
        async with projecting(projector_of(c, settings, None)):
            await c.context.configure(T, sid, TRACKED)
            m0 = await c.commands.append(T, sid, text_message("m0", "hello"), OMITTED)
            await c.waiter.wait_session(T, sid, m0.seq)
        m1 = await c.publisher.publish(appended(T, sid, "m1", "m0", "one"))
        m2 = await c.publisher.publish(appended(T, sid, "m2", "m1", "two"))
    twin = backup(fresh_db)
    async with running_stack(settings.model_copy(update={"database_url": twin})) as c:  # no rebuild
        await c.waiter.wait_all(m2.seq)
        projector_only = await _projected(c), await _compaction_state(c, sid)

    async with running_stack(settings, projector=False) as c:
        live = await _projected(c)
        report = await audit.rebuild_and_swap(c)

        assert report.swapped_at_seq == m0.seq
        assert report.stream_last_seq == m2.seq  # the CLI says the projector applies m1 and m2
        assert f"the projector applies what follows sequence {m0.seq} (the stream's last is {m2.seq})" in (
            rebuild_summary("all", report)
        )
        assert await _projected(c) == live  # nothing past the live checkpoint
        async with projecting(projector_of(c, settings, None)):
            await c.waiter.wait_all(m2.seq)
        assert (await _projected(c), await _compaction_state(c, sid)) == projector_only
        await _assert_consistent(c, [sid], {sid: [("m0", m0.seq), ("m1", m1.seq), ("m2", m2.seq)]})
        _, session = await _compaction_state(c, sid)
        assert session is not None
        assert session[1] == _tokens(c, "hello", "one", "two")


def _record_catch_ups(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, int]]:
    """``(from_seq, to_seq)`` of every catch-up a rebuild runs into its new tables."""
    calls: list[tuple[int, int]] = []

    async def recorded(conn: Any, js: Any, layout: Any, projections: Any, name: str, a: int, b: int, **kw: Any) -> int:
        calls.append((a, b))
        return await apply_range(conn, js, layout, projections, name, a, b, **kw)

    monkeypatch.setattr(audit, "apply_range", recorded)
    return calls


def _after_the_rebuild(monkeypatch: pytest.MonkeyPatch, meanwhile: Callable[[], Awaitable[None]]) -> None:
    """Run ``meanwhile`` once the next rebuild itself is done, before its catch-ups and its swap."""
    pending = [meanwhile]

    async def then(*args: Any, **kw: Any) -> int:
        built = await rebuild_into(*args, **kw)
        while pending:
            await pending.pop()()
        return built

    monkeypatch.setattr(audit, "rebuild_into", then)


async def test_what_the_projector_applies_during_the_rebuild_is_applied_under_the_lock_once(
    nats_url: str, fresh_db: str, s3_endpoint: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No catch-up before the lock: the one under it applies m1, which the projector applied
    while the rebuild ran, and only m1."""
    settings = make_settings(nats_url, fresh_db, s3_endpoint=s3_endpoint)
    async with running_stack(settings, projector=False) as c, projecting(projector_of(c, settings, None)):
        sid = "during"
        await c.context.configure(T, sid, TRACKED)
        m0 = await c.commands.append(T, sid, text_message("m0", "hello"), OMITTED)
        await c.waiter.wait_session(T, sid, m0.seq)
        appends: list[int] = []

        async def append_m1() -> None:
            m1 = await c.commands.append(T, sid, text_message("m1", "one"), "m0")
            await c.waiter.wait_session(T, sid, m1.seq)
            appends.append(m1.seq)

        _after_the_rebuild(monkeypatch, append_m1)
        calls = _record_catch_ups(monkeypatch)
        monkeypatch.setattr(audit, "CATCH_UP_ROUNDS", 0)

        report = await audit.rebuild_and_swap(c)

        assert calls == [(m0.seq + 1, appends[0])]
        assert report.swapped_at_seq == appends[0]
        m2 = await c.commands.append(T, sid, text_message("m2", "two"), "m1")
        await c.waiter.wait_all(m2.seq)
        await _assert_consistent(c, [sid], {sid: [("m0", m0.seq), ("m1", appends[0]), ("m2", m2.seq)]})


async def test_partitioned_projectors_one_behind_the_other_each_rebuilt_to_its_own_checkpoint(
    nats_url: str, fresh_db: str, s3_endpoint: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Partition 1's projector stopped behind, partition 0's running (and applying during the
    rebuild): the new tables hold each partition's events up to its own checkpoint; the catch-up
    reads only what partition 0 applied meanwhile (not from partition 1's checkpoint, nor from
    the single projector's, which never ran); partition 1's projector, started again, applies
    the rest once."""
    settings = make_settings(nats_url, fresh_db, s3_endpoint=s3_endpoint, partitions=2)
    sessions = {partition_of(T, f"h-{i}", 2): f"h-{i}" for i in range(20)}
    assert set(sessions) == {0, 1}
    s0, s1 = sessions[0], sessions[1]
    seqs: dict[str, list[tuple[str, int]]] = {s0: [], s1: []}
    async with running_stack(settings, projector=False) as c, projecting(projector_of(c, settings, [0])):
        async with projecting(projector_of(c, settings, [1])):
            for sid in (s0, s1):
                await c.context.configure(T, sid, TRACKED)
                m0 = await c.commands.append(T, sid, text_message("m0", "hello"), OMITTED)
                await c.waiter.wait_session(T, sid, m0.seq)
                seqs[sid].append(("m0", m0.seq))
        for mid, parent in (("m1", "m0"), ("m2", "m1")):  # partition 1: not applied
            seqs[s1].append((mid, (await c.publisher.publish(appended(T, s1, mid, parent, mid))).seq))
        m1 = await c.commands.append(T, s0, text_message("m1", "one"), "m0")
        await c.waiter.wait_session(T, s0, m1.seq)
        seqs[s0].append(("m1", m1.seq))

        async def append_m2() -> None:
            m2 = await c.commands.append(T, s0, text_message("m2", "two"), "m1")
            await c.waiter.wait_session(T, s0, m2.seq)
            seqs[s0].append(("m2", m2.seq))

        _after_the_rebuild(monkeypatch, append_m2)
        calls = _record_catch_ups(monkeypatch)

        await audit.rebuild_and_swap(c)

        assert calls == [(m1.seq + 1, seqs[s0][-1][1])]  # outside the lock; nothing moved after it
        assert seqs[s1][-1][1] < m1.seq
        async with c.pool.connection() as conn:
            cur = await conn.execute(
                "SELECT session_id, id FROM messages WHERE tenant = %s ORDER BY session_id, id", (T,)
            )
            assert sorted(await cur.fetchall()) == sorted(
                [(s0, "m0"), (s0, "m1"), (s0, "m2"), (s1, "m0")]
            )  # partition 1 where its checkpoint is
        async with projecting(projector_of(c, settings, [1])):
            await c.waiter.wait_all(seqs[s0][-1][1])
            await _assert_consistent(c, [s0, s1], seqs)
