"""A ``session.usage_added`` event is counted once per event id, for the session's life: live and
in a rebuild, whatever the stream's duplicate window let through; a retry of a keyed usage call
is answered from the read model; an event id held by another event is a conflict."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Callable
from typing import Any

import pytest

from events.catalog import SessionCreated, SessionRenamed, SessionUsageAdded
from events.ids import derived_id
from events.publisher import Publisher
from services.audit import readers as audit
from services.bootstrap import Container
from services.errors import IdempotencyKeyConflict, IdempotencyKeyReused
from tests.conftest import make_settings, running_stack
from tests.integration.helpers import assert_rebuild_equals_live

T = "tenant-a"


async def counters(c: Container, sid: str) -> tuple[int, int, float] | None:
    async with c.pool.connection() as conn:
        cur = await conn.execute(
            "SELECT input_tokens, output_tokens, estimated_cost FROM sessions WHERE tenant = %s AND id = %s", (T, sid)
        )
        row = await cur.fetchone()
    return (int(row[0]), int(row[1]), float(row[2])) if row else None


async def applied_ids(c: Container, sid: str) -> list[tuple[str, int]]:
    async with c.pool.connection() as conn:
        cur = await conn.execute(
            "SELECT event_id, seq FROM usage_applied WHERE tenant = %s AND session_id = %s ORDER BY seq", (T, sid)
        )
        return [(str(e), int(s)) for e, s in await cur.fetchall()]


async def stored_again(c: Container, sid: str, seq: int) -> int:
    """The bytes stored at ``seq`` published again with no ``Nats-Msg-Id`` (what a retry after the
    duplicate window stores: the same event id twice in the log); returns the new sequence."""
    msg = await c.js.get_msg(c.layout.stream, seq)
    ack = await c.js.publish(c.layout.session_subject(T, sid), msg.data or b"", stream=c.layout.stream)
    return int(ack.seq)


async def test_a_usage_event_stored_twice_is_counted_once_live_and_in_a_rebuild(
    nats_url: str, fresh_db: str, new_id: Callable[[str], str]
) -> None:
    settings = make_settings(nats_url, fresh_db)
    async with running_stack(settings) as c:
        sid = new_id("twice")
        await c.commands.create_session(T, sid, "", None, {})
        first = await c.commands.add_usage(T, sid, 10, 2, 0.5, "call-1")
        unkeyed = await c.commands.add_usage(T, sid, 1, 0, 0.0)
        again = await stored_again(c, sid, first.seq)
        again_unkeyed = await stored_again(c, sid, unkeyed.seq)
        await c.waiter.wait_all(max(again, again_unkeyed))
        assert await counters(c, sid) == (11, 2, 0.5)
        [(keyed_id, keyed_seq), (_, unkeyed_seq)] = await applied_ids(c, sid)
        assert (keyed_id, keyed_seq, unkeyed_seq) == (derived_id("usage", T, sid, "call-1"), first.seq, unkeyed.seq)
        await assert_rebuild_equals_live(c, fresh_db, settings.projector_name)


async def test_the_same_event_twice_in_one_batch_is_counted_once(
    nats_url: str, fresh_db: str, new_id: Callable[[str], str]
) -> None:
    """Both copies in the projector's batch (and a rebuild's): the second statement sees the first's row."""
    settings = make_settings(nats_url, fresh_db)
    sid = new_id("batch")
    async with running_stack(settings, projector=False) as c:
        publisher = Publisher(c.js, c.layout)
        await publisher.publish(SessionCreated(tenant=T, session=sid))
        event = SessionUsageAdded(tenant=T, session=sid, input_tokens=7, output_tokens=1, cost=0.25)
        seq = (await publisher.publish(event)).seq
        last = await stored_again(c, sid, seq)
    async with running_stack(settings) as c:  # the projector reads both in one fetch
        await c.waiter.wait_all(last)
        assert await counters(c, sid) == (7, 1, 0.25)
        assert await applied_ids(c, sid) == [(event.id, seq)]
        await assert_rebuild_equals_live(c, fresh_db, settings.projector_name)


async def window_passed(c: Container, window_s: float) -> None:
    """Wait until the stream's duplicate window has demonstrably passed: a probe id published
    again is stored anew (the positive signal), within a bound."""
    probe = Publisher(c.js, c.layout)
    event = SessionRenamed(tenant=T, session=f"probe-{uuid.uuid4().hex[:8]}", name="probe")
    await probe.publish(event)
    async with asyncio.timeout(30):
        while (await probe.publish(event)).duplicate:
            await asyncio.sleep(window_s / 4)


async def test_a_retry_after_the_duplicate_window_adds_nothing_and_answers_the_first(
    nats_url: str, fresh_db: str, new_id: Callable[[str], str]
) -> None:
    settings = make_settings(nats_url, fresh_db)
    async with running_stack(settings) as c:
        info = await c.js.stream_info(c.layout.stream)
        info.config.duplicate_window = 0.5
        await c.js.update_stream(info.config)
        sid = new_id("late")
        await c.commands.create_session(T, sid, "", None, {})
        first = await c.commands.add_usage(T, sid, 10, 1, 0.01, "call-1")
        await c.waiter.wait_all(first.seq)
        await window_passed(c, 0.5)
        before = await c.publisher.last_subject_seq(T, sid)
        retry = await c.commands.add_usage(T, sid, 10, 1, 0.01, "call-1")
        assert (retry.seq, retry.written) == (first.seq, False)
        with pytest.raises(IdempotencyKeyReused, match="call-1"):
            await c.commands.add_usage(T, sid, 11, 1, 0.01, "call-1")
        assert await c.publisher.last_subject_seq(T, sid) == before  # neither published
        assert await counters(c, sid) == (10, 1, 0.01)


async def test_a_deleted_or_erased_session_loses_its_applied_usage_ids_in_a_rebuild_too(
    nats_url: str, fresh_db: str, new_id: Callable[[str], str]
) -> None:
    settings = make_settings(nats_url, fresh_db)
    async with running_stack(settings) as c:
        deleted, erased, kept = new_id("del"), new_id("era"), new_id("kept")
        for sid in (deleted, erased, kept):
            await c.commands.create_session(T, sid, "", None, {})
            await c.commands.add_usage(T, sid, 3, 0, 0.0, "k")
        await c.commands.delete_session(T, deleted)
        gone = await c.eraser.erase_session(T, erased)
        await c.waiter.wait_all(gone.seq)
        assert (await applied_ids(c, deleted), await applied_ids(c, erased)) == ([], [])
        assert len(await applied_ids(c, kept)) == 1
        await assert_rebuild_equals_live(c, fresh_db, settings.projector_name)


def foreign_bytes(sid: str, key: str) -> list[tuple[str, bytes]]:
    """What a tenant may publish straight to the stream under the id a usage call derives."""
    other = SessionUsageAdded(
        id=derived_id("usage", T, sid, key), tenant=T, session=f"{sid}-x", input_tokens=1, output_tokens=0, cost=0.0
    )
    renamed = SessionRenamed(id=derived_id("usage", T, sid, key), tenant=T, session=sid, name="taken")
    return [
        ("another event of the session", renamed.to_json()),
        ("a usage event of another session", other.to_json()),
        ("bytes that are no event", b"not an event"),
        ("JSON that is no event", json.dumps([1, 2]).encode()),
    ]


@pytest.mark.parametrize("case", range(4), ids=[name for name, _ in foreign_bytes("s", "k")])
async def test_an_id_held_by_another_event_is_a_conflict_and_nothing_is_added(
    stack: Container, new_id: Callable[[str], str], case: int
) -> None:
    c, sid, key = stack, new_id("taken"), "call-1"
    await c.commands.create_session(T, sid, "", None, {})
    _, data = foreign_bytes(sid, key)[case]
    subject = c.layout.session_subject(T, f"{sid}-x" if case == 1 else sid)
    headers: dict[str, Any] = {"Nats-Msg-Id": derived_id("usage", T, sid, key)}
    await c.js.publish(subject, data, stream=c.layout.stream, headers=headers)
    before = await c.publisher.last_subject_seq(T, sid)
    with pytest.raises(IdempotencyKeyConflict, match="another key"):
        await c.commands.add_usage(T, sid, 5, 0, 0.0, key)
    assert await c.publisher.last_subject_seq(T, sid) == before
    await c.waiter.wait_all(before)
    assert await counters(c, sid) == (0, 0, 0.0)


async def test_verify_of_a_database_upgraded_to_021_compares_the_usage_ids_applied_since(
    nats_url: str, fresh_db: str, new_id: Callable[[str], str]
) -> None:
    """Migration 021 finds usage already applied and no ids recorded: a rebuild records them all,
    so verify compares the ids applied past the mark the migration left, and still finds a
    tampered one of those."""
    async with running_stack(make_settings(nats_url, fresh_db)) as c:
        sid = new_id("upgraded")
        await c.commands.create_session(T, sid, "", None, {})
        before = await c.commands.add_usage(T, sid, 10, 2, 0.5, "before-021")
        await c.waiter.wait_all(before.seq)
        async with c.pool.connection() as conn:  # the state 021 leaves on a database with usage
            await conn.execute("DELETE FROM usage_applied")
            await conn.execute("UPDATE usage_applied_since SET seq = %s", (before.seq,))
        after = await c.commands.add_usage(T, sid, 1, 1, 0.0, "after-021")
        await c.waiter.wait_all(after.seq)
        assert [seq for _, seq in await applied_ids(c, sid)] == [after.seq]
        assert (await audit.verify(c)).ok
        async with c.pool.connection() as conn:
            await conn.execute("DELETE FROM usage_applied")
        report = await audit.verify(c)
        assert list(report.differences) == ["usage_applied"]
        assert str(after.seq) in report.differences["usage_applied"][0]
