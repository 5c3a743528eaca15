"""Appends decided from the read model plus this process's chain of unapplied appends.

A process that published a session's last appends (each expecting the one before) knows the
session's state without waiting for the projector; a writer elsewhere breaks the chain through
optimistic concurrency and the next append decides the slow way.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from events.catalog import MessagesDeleted
from events.omitted import OMITTED
from events.publisher import Publisher
from projections import queries
from services.bootstrap import Container
from services.errors import MessageConflict, ParentCycle, UnknownParent
from tests.conftest import make_settings, running_stack
from tests.integration.helpers import appended, text_message

T = "tenant-a"


async def _path(c: Container, sid: str, leaf: str) -> list[tuple[str, str | None]]:
    async with c.pool.connection() as conn:
        return [(r.id, r.parent_id) for r in await queries.history(conn, T, sid, leaf)]


async def _run_projector_until(c: Container, sid: str, seq: int) -> None:
    stop = asyncio.Event()
    task = asyncio.create_task(c.projector().run(stop))
    try:
        await c.waiter.wait_session(T, sid, seq, timeout_s=20)
    finally:
        stop.set()
        await asyncio.wait_for(task, timeout=15)


async def test_a_chain_of_appends_needs_no_projector(
    nats_url: str, fresh_db: str, new_id: Callable[[str], str]
) -> None:
    sid = new_id("chain")
    async with running_stack(make_settings(nats_url, fresh_db), projector=False) as c:
        a = await c.commands.append(T, sid, text_message("m1", "one"), None)
        b = await asyncio.wait_for(c.commands.append(T, sid, text_message("m2", "two"), "m1"), timeout=5)
        # parent omitted: the latest leaf is m2, which only this process's chain knows of
        d = await asyncio.wait_for(c.commands.append(T, sid, text_message("m3", "three"), OMITTED), timeout=5)
        assert (a.parent_id, b.parent_id, d.parent_id) == (None, "m1", "m2")
        assert a.seq < b.seq < d.seq
        await _run_projector_until(c, sid, d.seq)
        assert await _path(c, sid, "m3") == [("m1", None), ("m2", "m1"), ("m3", "m2")]


async def test_replays_and_refusals_after_a_chain_are_decided_the_slow_way(
    stack: Container, new_id: Callable[[str], str]
) -> None:
    sid = new_id("replay")
    first = await stack.commands.append(T, sid, text_message("m1", "one"), None)
    again = await stack.commands.append(T, sid, text_message("m1", "one"), None)
    assert (again.created, again.seq) == (False, first.seq)
    with pytest.raises(MessageConflict):
        await stack.commands.append(T, sid, text_message("m1", "other"), None)
    with pytest.raises(UnknownParent):
        await stack.commands.append(T, sid, text_message("m2", "two"), "nope")
    assert await stack.publisher.last_subject_seq(T, sid) == first.seq  # nothing else was published


async def test_a_writer_elsewhere_ends_the_chain(stack: Container, new_id: Callable[[str], str]) -> None:
    sid = new_id("elsewhere")
    await stack.commands.append(T, sid, text_message("m1", "one"), None)
    m2 = await stack.commands.append(T, sid, text_message("m2", "two"), "m1")
    # another process appends x under m2, expecting m2 (a valid write this process never saw)
    other = Publisher(stack.js, stack.layout)
    x = await other.publish(appended(T, sid, "x", "m2"), expected_last_subject_seq=m2.seq)
    m3 = await stack.commands.append(T, sid, text_message("m3", "three"), OMITTED)
    assert m3.parent_id == "x"  # the chain's guess (m2) conflicted; the slow way saw x
    assert m3.seq > x.seq
    await stack.waiter.wait_session(T, sid, m3.seq)
    assert await _path(stack, sid, "m3") == [("m1", None), ("m2", "m1"), ("x", "m2"), ("m3", "x")]


async def test_a_delete_ends_the_chain(stack: Container, new_id: Callable[[str], str]) -> None:
    sid = new_id("deleted")
    await stack.commands.append(T, sid, text_message("m1", "one"), None)
    await stack.commands.append(T, sid, text_message("m2", "two"), "m1")
    await stack.commands.delete_messages(T, sid, ["m2"])
    with pytest.raises(UnknownParent):
        await stack.commands.append(T, sid, text_message("m3", "three"), "m2")
    m3 = await stack.commands.append(T, sid, text_message("m3", "three"), OMITTED)
    assert m3.parent_id == "m1"


async def test_refusals_and_replays_are_not_taken_from_a_stale_chain(
    stack: Container, new_id: Callable[[str], str]
) -> None:
    """A refusal or a no-op publishes nothing for a conflict to catch: after a writer elsewhere,
    an append under its message is accepted, and a message it deleted is appended anew."""
    sid = new_id("stale")
    await stack.commands.append(T, sid, text_message("m1", "one"), None)
    m2 = await stack.commands.append(T, sid, text_message("m2", "two"), "m1")
    other = Publisher(stack.js, stack.layout)
    x = await other.publish(appended(T, sid, "x", "m2"), expected_last_subject_seq=m2.seq)
    y = await stack.commands.append(T, sid, text_message("y", "under x"), "x")  # the chain never saw x
    assert (y.parent_id, y.created) == ("x", True)
    assert y.seq > x.seq

    gone = await other.publish(
        MessagesDeleted(tenant=T, session=sid, message_ids=["y"]), expected_last_subject_seq=y.seq
    )
    again = await stack.commands.append(T, sid, text_message("y", "under x"), "x")  # not a replay: y was deleted
    assert again.created is True
    assert again.seq > gone.seq


async def _known_chain(c: Container, sid: str, n: int) -> list[int]:
    """``n`` appends m1..mn on one chain; from the third on the chain knows the session's ids."""
    seqs = [(await c.commands.append(T, sid, text_message("m1", "one"), None)).seq]
    for i in range(2, n + 1):
        seqs.append((await c.commands.append(T, sid, text_message(f"m{i}", str(i)), OMITTED)).seq)
    tip = c.commands.optimistic._chains[(T, sid)]
    assert tip.ids == {f"m{i}" for i in range(1, n + 1)}
    assert tip.leaf == f"m{n}"
    return seqs


async def test_a_chain_that_knows_the_ids_appends_without_reading_the_read_model(
    nats_url: str, fresh_db: str, new_id: Callable[[str], str], monkeypatch: pytest.MonkeyPatch
) -> None:
    sid = new_id("known")
    async with running_stack(make_settings(nats_url, fresh_db), projector=False) as c:
        await _known_chain(c, sid, 3)

        async def no_read(*_: object, **__: object) -> None:
            raise AssertionError("the read model was read")

        monkeypatch.setattr(queries, "append_state", no_read)
        m4 = await asyncio.wait_for(c.commands.append(T, sid, text_message("m4", "four"), OMITTED), timeout=5)
        m5 = await c.commands.append(T, sid, text_message("m5", "five"), "m2")  # a branch under a known id
        m6 = await c.commands.append(T, sid, text_message("m6", "six"), OMITTED)
        assert (m4.parent_id, m5.parent_id, m6.parent_id) == ("m3", "m2", "m5")
        monkeypatch.undo()
        await _run_projector_until(c, sid, m6.seq)
        assert await _path(c, sid, "m6") == [("m1", None), ("m2", "m1"), ("m5", "m2"), ("m6", "m5")]
        assert await _path(c, sid, "m4") == [("m1", None), ("m2", "m1"), ("m3", "m2"), ("m4", "m3")]


async def test_replays_and_refusals_after_a_known_chain_are_exact(
    stack: Container, new_id: Callable[[str], str]
) -> None:
    sid = new_id("known-replay")
    seqs = await _known_chain(stack, sid, 4)
    again = await stack.commands.append(T, sid, text_message("m2", "2"), OMITTED)
    assert (again.created, again.seq, again.parent_id) == (False, seqs[1], "m1")
    with pytest.raises(MessageConflict):
        await stack.commands.append(T, sid, text_message("m3", "other"), OMITTED)
    with pytest.raises(UnknownParent):
        await stack.commands.append(T, sid, text_message("m9", "nine"), "nope")
    assert await stack.publisher.last_subject_seq(T, sid) == seqs[-1]  # nothing else was published


async def test_a_writer_elsewhere_ends_a_known_chain(stack: Container, new_id: Callable[[str], str]) -> None:
    """Another process's append and delete make the known chain's next publish conflict: the
    append after them sees both (the latest leaf, and a deleted parent refused)."""
    sid = new_id("known-elsewhere")
    seqs = await _known_chain(stack, sid, 4)
    other = Publisher(stack.js, stack.layout)
    x = await other.publish(appended(T, sid, "x", "m2"), expected_last_subject_seq=seqs[-1])
    gone = await other.publish(
        MessagesDeleted(tenant=T, session=sid, message_ids=["m4"]), expected_last_subject_seq=x.seq
    )
    with pytest.raises(UnknownParent):
        await stack.commands.append(T, sid, text_message("m5", "five"), "m4")
    m5 = await stack.commands.append(T, sid, text_message("m5", "five"), OMITTED)
    assert m5.parent_id == "x"
    assert m5.seq > gone.seq


async def test_a_known_chain_sends_a_deleted_id_with_children_to_the_read_model(
    stack: Container, new_id: Callable[[str], str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A chain that knows the session's ids knows its dangling parent ids too (m, deleted, still
    k's parent): m appended under the latest leaf (x, below k) is not decided from the chain,
    whose ids cannot see the cycle, but from the read model, and refused; nothing is published.
    Another new id is still decided from the chain alone, and m under a message that does not
    descend from it is appended."""
    sid = new_id("known-cycle")
    cmd = stack.commands
    await cmd.append(T, sid, text_message("r", "root"), None)
    await cmd.append(T, sid, text_message("m", "one"), "r")
    await cmd.append(T, sid, text_message("k", "two"), "m")
    await cmd.delete_messages(T, sid, ["m"])  # ends the chain
    await cmd.append(T, sid, text_message("y", "three"), "r")  # the slow way: a new chain
    last = (await cmd.append(T, sid, text_message("x", "four"), "k")).seq  # the chain learns the ids
    tip = cmd.optimistic._chains[(T, sid)]
    assert (tip.ids, tip.leaf, tip.dangling) == ({"r", "k", "y", "x"}, "x", frozenset({"m"}))
    for parent in (OMITTED, "x", "k"):  # the first from the known chain, had it not sent it on
        with pytest.raises(ParentCycle):
            await cmd.append(T, sid, text_message("m", "again"), parent)
    assert await stack.publisher.last_subject_seq(T, sid) == last  # nothing was published

    x2 = await cmd.append(T, sid, text_message("x2", "five"), "x")  # the slow way again: a new chain
    z = await cmd.append(T, sid, text_message("z", "six"), "y")
    assert cmd.optimistic._chains[(T, sid)].dangling == frozenset({"m"})

    async def no_read(*_: object, **__: object) -> None:
        raise AssertionError("the read model was read")

    monkeypatch.setattr(queries, "append_state", no_read)
    w = await cmd.append(T, sid, text_message("w", "seven"), OMITTED)  # a new id: from the chain alone
    monkeypatch.undo()
    m = await cmd.append(T, sid, text_message("m", "again"), "w")  # w is not below m: appended
    assert (x2.parent_id, z.parent_id, w.parent_id, m.parent_id, m.created) == ("x", "y", "z", "w", True)
    await stack.waiter.wait_session(T, sid, m.seq)
    assert await _path(stack, sid, "x2") == [
        ("r", None),
        ("y", "r"),
        ("z", "y"),
        ("w", "z"),
        ("m", "w"),
        ("k", "m"),
        ("x", "k"),
        ("x2", "x"),
    ]


async def test_an_unapplied_append_below_a_deleted_id_is_one_of_its_descendants(
    nats_url: str, fresh_db: str, new_id: Callable[[str], str]
) -> None:
    """With the projector behind, the read model knows m's descendants (k) but not the chain's
    append below them (x): the decision adds the chain's, so m under x is refused before any
    publish (the refusal is then decided again the slow way, once the projector caught up)."""
    sid = new_id("unapplied-cycle")
    async with running_stack(make_settings(nats_url, fresh_db), projector=False) as c:
        await c.commands.append(T, sid, text_message("m", "one"), None)
        k = await c.commands.append(T, sid, text_message("k", "two"), "m")
        await _run_projector_until(c, sid, k.seq)
        deleted = await c.commands.delete_messages(T, sid, ["m"])
        await _run_projector_until(c, sid, deleted.seq)
        x = await c.commands.append(T, sid, text_message("x", "three"), "k")  # unapplied from here on
        appending = asyncio.create_task(c.commands.append(T, sid, text_message("m", "again"), OMITTED))
        # decided from the read model plus the chain: a publish would not wait for the projector
        done, _ = await asyncio.wait({appending}, timeout=1)
        assert not done or isinstance(appending.exception(), ParentCycle)
        assert await c.publisher.last_subject_seq(T, sid) == x.seq
        stop = asyncio.Event()
        projector = asyncio.create_task(c.projector().run(stop))
        try:
            with pytest.raises(ParentCycle):
                await asyncio.wait_for(appending, timeout=20)
        finally:
            stop.set()
            await asyncio.wait_for(projector, timeout=15)
        assert await c.publisher.last_subject_seq(T, sid) == x.seq
