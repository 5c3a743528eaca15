"""The projector keeps each session's latest leaf in ``sessions.leaf_id``: always what the
definition (the newest message without children) finds by scanning the session."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from events.catalog import MessagesDeleted
from projections import queries
from projections.history import HistoryProjection
from projections.runner import apply_batch
from services.bootstrap import Container
from services.errors import ParentCycle
from tests.integration.helpers import appended, text_message

T = "tenant-a"


async def _leaves(stack: Container, sid: str) -> tuple[str | None, str | None]:
    """(the kept leaf, the leaf found by scanning every message of the session)."""
    async with stack.pool.connection() as conn:
        cur = await conn.execute(
            "SELECT (SELECT leaf_id FROM sessions WHERE tenant = %(t)s AND id = %(s)s), "
            "(SELECT m.id FROM messages m WHERE m.tenant = %(t)s AND m.session_id = %(s)s AND NOT EXISTS "
            "(SELECT 1 FROM messages c WHERE c.tenant = m.tenant AND c.session_id = m.session_id "
            "AND c.parent_id = m.id) ORDER BY m.seq DESC LIMIT 1)",
            {"t": T, "s": sid},
        )
        row = await cur.fetchone()
    assert row is not None
    return row[0], row[1]


async def test_latest_leaf_follows_appends_branches_deletes_cycles_and_clears(
    stack: Container, new_id: Callable[[str], str]
) -> None:
    sid = new_id("leaf")
    cmd = stack.commands

    async def step(seq: int, expected: str | None) -> None:
        await stack.waiter.wait_session(T, sid, seq)
        assert await _leaves(stack, sid) == (expected, expected)

    await step((await cmd.append(T, sid, text_message("a", "root"), None)).seq, "a")
    await step((await cmd.append(T, sid, text_message("b", "one"), "a")).seq, "b")
    await step((await cmd.append(T, sid, text_message("c", "branch"), "a")).seq, "c")
    await step((await cmd.delete_messages(T, sid, ["c"])).seq, "b")  # the older branch is the leaf again
    await step((await cmd.delete_messages(T, sid, ["a"])).seq, "b")  # b keeps its parent id
    # a re-appended under b (b's parent is still "a": neither is childless), a cycle the append
    # command refuses (409 parent_cycle) but a log may hold: published straight to the stream
    with pytest.raises(ParentCycle):
        await cmd.append(T, sid, text_message("a", "again"), "b")
    last = await stack.publisher.last_subject_seq(T, sid)
    await step((await stack.publisher.publish(appended(T, sid, "a", "b"), expected_last_subject_seq=last)).seq, None)
    await step((await cmd.clear(T, sid)).seq, None)
    await step((await cmd.append(T, sid, text_message("z", "fresh"), None)).seq, "z")
    async with stack.pool.connection() as conn:
        row = await queries.latest_leaf(conn, T, sid)
    assert row is not None
    assert row.id == "z"


async def test_latest_leaf_of_one_batch_is_its_newest_kept_insert(
    stack: Container, new_id: Callable[[str], str]
) -> None:
    """Several inserts and a delete in one batch; then a batch whose newest insert is a duplicate."""
    sid = new_id("batch")
    items = [
        (40_000_001, appended(T, sid, "m1", None)),
        (40_000_002, appended(T, sid, "m2", "m1")),
        (40_000_003, appended(T, sid, "m3", "m2")),
        (40_000_004, MessagesDeleted(tenant=T, session=sid, message_ids=["m3"])),
    ]
    async with stack.pool.connection() as conn, conn.transaction():
        await apply_batch(conn, "leaf-test-" + sid, [HistoryProjection()], items, notify=False)
    assert await _leaves(stack, sid) == ("m2", "m2")
    again = [(40_000_005, appended(T, sid, "m4", "m1")), (40_000_006, appended(T, sid, "m2", "m1"))]
    async with stack.pool.connection() as conn, conn.transaction():
        await apply_batch(conn, "leaf-test-" + sid, [HistoryProjection()], again, notify=False)
    assert await _leaves(stack, sid) == ("m4", "m4")  # the second m2 was dropped: m4 is the newest leaf
