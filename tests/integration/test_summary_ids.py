"""A compaction summary's id (``compaction_<overlay id>``, what history shows an overlay as) is never
a message's: appends of it decided by the commands (a replay, a conflict, an id no overlay has) and
published straight to the stream (the projector does not store them while the overlay stands),
with time travel and a rebuild deciding the same as the live projector."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable
from typing import Any

import pytest

from events.catalog import CompactionRecorded, MessageAppended, MessagesCleared
from events.messages import body_hash
from events.omitted import OMITTED
from projections import queries
from projections.overlays import Overlay, overlay_of, overlays
from services.audit import readers as audit
from services.audit.readers import session_as_of
from services.bootstrap import Container
from services.compaction.service import compacted_view
from services.errors import InvalidId, MessageConflict
from services.requests import writes
from tests.conftest import make_settings, running_stack
from tests.integration.helpers import assert_rebuild_equals_live, summary_recorded, text_message

T = "tenant-a"


def _recorded(sid: str, first: str, last: str) -> CompactionRecorded:
    return summary_recorded(T, sid, first, last)


def _published(sid: str, body: dict[str, Any], parent: str | None) -> MessageAppended:
    """An append as a direct publisher writes it (no command decided it)."""
    return MessageAppended(
        tenant=T,
        session=sid,
        message_id=str(body["id"]),
        parent_id=parent,
        role=str(body["role"]),
        body_sha256=body_hash(body),
        message=body,
    )


async def _chain(c: Container, sid: str, n: int) -> int:
    seq = 0
    for i in range(n):
        seq = (await c.commands.append(T, sid, text_message(f"r{i}", f"turn {i} " + "lorem " * 30))).seq
    return seq


async def _view(c: Container, sid: str) -> list[str]:
    await c.commands.optimistic.catch_up(T, sid)
    async with c.pool.connection() as conn:
        _, _, view = await compacted_view(conn, T, sid, None)
    return [v.message_id if isinstance(v, Overlay) else v.id for v in view]


async def _summary(c: Container, sid: str) -> dict[str, Any]:
    """The session's newest overlay as history shows it."""
    await c.commands.optimistic.catch_up(T, sid)
    async with c.pool.connection() as conn:
        return (await overlays(conn, T, sid))[-1].as_message()


async def _stored_ids(c: Container, sid: str, wanted: list[str]) -> set[str]:
    async with c.pool.connection() as conn:
        return await queries.existing_ids(conn, T, sid, wanted)


@pytest.fixture
async def stack(nats_url: str, fresh_db: str) -> Any:
    settings = make_settings(nats_url, fresh_db)
    async with running_stack(settings) as c:
        yield c


async def test_a_summary_sent_back_is_a_replay_and_a_chain_goes_on_after_what_it_covers(
    stack: Container, new_id: Callable[[str], str]
) -> None:
    c, sid = stack, new_id("sum")
    await _chain(c, sid, 8)
    # recorded and appended at once: the command waits for the overlay (the projector may be behind)
    recorded = _recorded(sid, "r1", "r6")
    published = await c.publisher.publish(recorded)
    summary = overlay_of(recorded, published.seq).as_message()  # what history shows for it
    r = await c.commands.append(T, sid, summary)
    assert (r.id, r.parent_id, r.seq, r.created, r.tail) == (summary["id"], "r0", published.seq, False, "r6")

    history = [text_message("r0", "turn 0 " + "lorem " * 30), summary, text_message("r7", "turn 7 " + "lorem " * 30)]
    out = await writes.append_batch(c, T, sid, [*history, text_message("new", "next")], None)
    assert [(a["id"], a["parent_id"], a["created"]) for a in out["messages"]] == [
        ("r0", None, False),
        (summary["id"], "r0", False),
        ("r7", "r6", False),
        ("new", "r7", True),
    ]
    assert await _view(c, sid) == ["r0", summary["id"], "r7", "new"]
    assert await _stored_ids(c, sid, [summary["id"], "r7", "new"]) == {"r7", "new"}

    with pytest.raises(MessageConflict, match="compaction summary"):
        await c.commands.append(T, sid, {**summary, "parts": [{"type": "text", "text": "edited"}]})
    with pytest.raises(InvalidId, match="no overlay of this session"):
        await c.commands.append(T, sid, {**summary, "id": f"compaction_{uuid.uuid4()}"})
    assert await _view(c, sid) == ["r0", summary["id"], "r7", "new"]
    # an id with the prefix that is not in a summary's form stays a client's (docs/http-api.md)
    mine = await c.commands.append(T, sid, text_message("compaction_mine", "mine"), OMITTED)
    assert (mine.created, mine.parent_id) == (True, "new")


async def test_direct_appends_of_a_summarys_id_are_not_stored_while_it_stands_and_a_rebuild_agrees(
    stack: Container, new_id: Callable[[str], str], fresh_db: str
) -> None:
    c = stack
    apart, together, cleared = new_id("apart"), new_id("together"), new_id("cleared")
    for sid in (apart, together, cleared):
        await _chain(c, sid, 8)
    # the overlay applied before its id is published as a message (two batches) ...
    await c.publisher.publish(_recorded(apart, "r1", "r6"))
    summary = await _summary(c, apart)
    # ... sent back as history showed it, and with another body: neither is stored
    await c.publisher.publish_many(
        [
            _published(apart, summary, "r7"),
            _published(apart, {**summary, "parts": [{"type": "text", "text": "forged"}]}, "r7"),
        ]
    )
    # the overlay and the append in one publish (one batch, as a rebuild reads them too)
    ov = _recorded(together, "r1", "r6")
    body = text_message(f"compaction_{ov.overlay_id}", "x", "assistant")
    await c.publisher.publish_many([ov, _published(together, body, "r7")])
    # cleared since: the overlay is gone, so the id is a message's (as for any id after a clear)
    ov = _recorded(cleared, "r1", "r6")
    body = text_message(f"compaction_{ov.overlay_id}", "y", "assistant")
    last = await c.publisher.publish_many(
        [ov, MessagesCleared(tenant=T, session=cleared), _published(cleared, body, None)]
    )

    assert await _view(c, apart) == ["r0", summary["id"], "r7"]
    assert await _view(c, together) == ["r0", f"compaction_{_recorded(together, 'r1', 'r6').overlay_id}", "r7"]
    assert await _view(c, cleared) == [body["id"]]
    assert await _stored_ids(c, apart, [summary["id"], "r7"]) == {"r7"}
    # time travel folds the log by the same rule
    for sid in (apart, together, cleared):
        state = await session_as_of(c, T, sid, last[-1].seq)
        assert set(state.rows) == await _stored_ids(c, sid, [*state.rows, summary["id"], body["id"]])
    await asyncio.wait_for(c.waiter.wait_all(last[-1].seq), 10)
    await assert_rebuild_equals_live(c, fresh_db, c.settings.projector_name)


async def test_an_overlay_and_its_ids_append_a_hundred_events_apart_in_one_publish_decide_as_a_rebuild(
    stack: Container, new_id: Callable[[str], str], fresh_db: str
) -> None:
    """(The live projector prepares a batch in slices of 100 and decided each slice over itself: an
    overlay in one slice left the append of its id in a later one to the overlays table, which held
    none of the batch's overlays yet, so live stored it and a rebuild did not.)"""
    c = stack
    sid, other = new_id("far"), new_id("filler")
    await _chain(c, sid, 8)
    ov = _recorded(sid, "r1", "r6")
    body = text_message(f"compaction_{ov.overlay_id}", "x", "assistant")
    fillers = [_published(other, text_message(f"f{i}", f"filler {i}"), f"f{i - 1}" if i else None) for i in range(150)]
    last = await c.publisher.publish_many([ov, *fillers, _published(sid, body, "r7")])
    await asyncio.wait_for(c.waiter.wait_all(last[-1].seq), 10)
    assert await _view(c, sid) == ["r0", body["id"], "r7"]
    assert await _stored_ids(c, sid, [body["id"], "r7"]) == {"r7"}
    await assert_rebuild_equals_live(c, fresh_db, c.settings.projector_name)


async def _history(c: Container, sid: str) -> tuple[str | None, list[tuple[str, str | None]]]:
    """The session's latest leaf and its history, as ``(id, parent_id)`` pairs root first."""
    async with c.pool.connection() as conn:
        leaf = await queries.latest_leaf(conn, T, sid)
        path = [] if leaf is None else await queries.history(conn, T, sid, leaf.id)
    return (None if leaf is None else leaf.id), [(m.id, m.parent_id) for m in path]


async def test_messages_appended_under_a_summary_an_earlier_release_stored_keep_their_history_whole(
    stack: Container, new_id: Callable[[str], str]
) -> None:
    """An earlier release stored a summary sent back by a client as a message (without a parent:
    under the latest leaf), and the messages after it under it; this release leaves the summary
    out, and those messages are stored under the parent the summary was appended under, following
    a chain of such summaries, live and in a rebuild alike. (Before, their history started after
    the summary: a rebuild cut the earlier messages off.)"""
    c, sid = stack, new_id("legacy")
    await _chain(c, sid, 6)  # r0..r5
    first, second = _recorded(sid, "r1", "r3"), _recorded(sid, "r0", "r4")
    x, y = f"compaction_{first.overlay_id}", f"compaction_{second.overlay_id}"
    # published straight to the stream, as the earlier release wrote them: the summaries and the
    # first message under them in one batch (the live projector and a rebuild alike) ...
    last = await c.publisher.publish_many(
        [
            first,
            second,
            _published(sid, text_message(x, "what was said", "assistant"), "r5"),
            _published(sid, text_message(y, "what was said before", "assistant"), x),
            _published(sid, text_message("m0", "after the summaries"), y),
        ]
    )
    await asyncio.wait_for(c.waiter.wait_all(last[-1].seq), 10)
    # ... and the next ones in batches of their own (live, the summaries are the table's to say)
    last = await c.publisher.publish_many([_published(sid, text_message("m1", "next"), "m0")])
    await asyncio.wait_for(c.waiter.wait_all(last[-1].seq), 10)
    last = await c.publisher.publish_many([_published(sid, text_message("m2", "next again"), y)])
    await asyncio.wait_for(c.waiter.wait_all(last[-1].seq), 10)

    whole = [(f"r{i}", f"r{i - 1}" if i else None) for i in range(6)]
    assert await _history(c, sid) == ("m2", [*whole, ("m2", "r5")])
    async with c.pool.connection() as conn:
        assert [(m.id, m.parent_id) for m in await queries.history(conn, T, sid, "m1")] == [
            *whole,
            ("m0", "r5"),
            ("m1", "m0"),
        ]
    assert await _stored_ids(c, sid, [x, y]) == set()
    state = await session_as_of(c, T, sid, last[-1].seq)  # time travel folds the log alike
    assert [r.id for r in state.path_rows("m1")] == [*(m for m, _ in whole), "m0", "m1"]

    report = await audit.verify(c)
    assert report.ok, report.differences
    assert (await audit.rebuild_and_swap(c)).swapped_at_seq > 0
    assert await _history(c, sid) == ("m2", [*whole, ("m2", "r5")])
    report = await audit.verify(c)
    assert report.ok, report.differences


async def test_a_clear_forgets_the_left_out_summaries_in_its_batch_and_after_it_and_a_rebuild_agrees(
    stack: Container, new_id: Callable[[str], str], fresh_db: str
) -> None:
    c = stack
    together, apart = new_id("together"), new_id("apart")
    ids: dict[str, str] = {}
    for sid in (together, apart):
        await _chain(c, sid, 3)
        ov = _recorded(sid, "r0", "r1")
        ids[sid] = f"compaction_{ov.overlay_id}"
        last = await c.publisher.publish_many([ov, _published(sid, text_message(ids[sid], "s", "assistant"), "r2")])
        await asyncio.wait_for(c.waiter.wait_all(last[-1].seq), 10)
    # the clear and the message under the summary in one batch, and in two
    last = await c.publisher.publish_many(
        [MessagesCleared(tenant=T, session=together), _published(together, text_message("m", "m"), ids[together])]
    )
    await asyncio.wait_for(c.waiter.wait_all(last[-1].seq), 10)
    last = await c.publisher.publish_many([MessagesCleared(tenant=T, session=apart)])
    await asyncio.wait_for(c.waiter.wait_all(last[-1].seq), 10)
    last = await c.publisher.publish_many([_published(apart, text_message("m", "m"), ids[apart])])
    await asyncio.wait_for(c.waiter.wait_all(last[-1].seq), 10)
    for sid in (together, apart):  # the id it names is no summary's any more: kept as it is
        assert await _history(c, sid) == ("m", [("m", ids[sid])])
    await assert_rebuild_equals_live(c, fresh_db, c.settings.projector_name)
