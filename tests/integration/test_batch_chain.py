"""A batch (``messages:batch``, the ``append_batch`` command) under concurrent writers.

Each message of a batch is its own append. A single append without a parent (another process's,
or this one's) that lands between two of them attached to the batch's previous message, the
latest leaf then; the batch's next message follows it, so the session stays one chain and every
acknowledged message is on the latest leaf's path. A writer on another branch does not move the
batch there. The interleaving is made at a known point: the batch's own appends are wrapped.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest

from events.omitted import OMITTED
from projections import queries
from services.bootstrap import Container, open_container
from services.requests import writes
from services.writes.commands import AppendResult
from tests.integration.helpers import text_message

T = "tenant-a"

Hook = Callable[[str], Awaitable[None]]


@pytest.fixture
async def elsewhere(stack: Container) -> AsyncIterator[Container]:
    """Another API process: its own command handlers and chains, the same log and read model."""
    async with open_container(stack.settings) as c:
        yield c


def _after_each(c: Container, monkeypatch: pytest.MonkeyPatch, hook: Hook) -> None:
    """``hook(id)`` runs after each of ``c``'s appends is answered (before the batch's next)."""
    original = c.commands.append

    async def append(*args: Any, **kw: Any) -> AppendResult:
        result = await original(*args, **kw)
        await hook(result.id)
        return result

    monkeypatch.setattr(c.commands, "append", append)


async def _batch(c: Container, sid: str, ids: list[str], parent: Any = OMITTED) -> dict[str, Any]:
    return await writes.append_batch(c, T, sid, [text_message(i, i) for i in ids], parent)


async def _tree(c: Container, sid: str, seq: int) -> tuple[dict[str, str | None], list[str]]:
    """Every message's parent, and the latest leaf's path (root first), once ``seq`` is applied."""
    await c.waiter.wait_session(T, sid, seq)
    async with c.pool.connection() as conn:
        rows, _ = await queries.tree_page(conn, T, sid, 0, 1000)
        leaf = await queries.latest_leaf(conn, T, sid)
        assert leaf is not None
        path = [r.id for r in await queries.history(conn, T, sid, leaf.id)]
    return {r.id: r.parent_id for r in rows}, path


def _parents(out: dict[str, Any]) -> list[tuple[str, str | None]]:
    return [(m["id"], m["parent_id"]) for m in out["messages"]]


@pytest.mark.parametrize("where", ["another process", "this process"])
async def test_an_implicit_append_between_two_batch_messages_stays_on_the_one_chain(
    stack: Container,
    elsewhere: Container,
    new_id: Callable[[str], str],
    monkeypatch: pytest.MonkeyPatch,
    where: str,
) -> None:
    sid = new_id("batch-between")
    writer = elsewhere if where == "another process" else stack
    await stack.commands.append(T, sid, text_message("r", "root"), None)
    single: list[AppendResult] = []

    async def between(mid: str) -> None:
        if mid == "b3" and not single:  # the latest leaf is b3: the single append attaches there
            single.append(await writer.commands.append(T, sid, text_message("w", "single"), OMITTED))

    _after_each(stack, monkeypatch, between)
    out = await _batch(stack, sid, ["b1", "b2", "b3", "b4", "b5"])
    monkeypatch.undo()
    (w,) = single
    assert (w.parent_id, w.created) == ("b3", True)
    # b4 continues after w, which was appended onto the batch's line
    assert _parents(out) == [("b1", "r"), ("b2", "b1"), ("b3", "b2"), ("b4", "w"), ("b5", "b4")]
    assert all(m["created"] for m in out["messages"])
    assert w.seq < out["messages"][3]["seq"]

    parents, path = await _tree(stack, sid, out["seq"])
    assert path == ["r", "b1", "b2", "b3", "w", "b4", "b5"]  # every acknowledged message
    assert set(parents) == set(path)  # nothing off the path: one linear chain

    # a retried batch re-answers what was appended, as it was (nothing is published)
    again = await _batch(stack, sid, ["b1", "b2", "b3", "b4", "b5"])
    assert _parents(again) == _parents(out)
    assert [m["seq"] for m in again["messages"]] == [m["seq"] for m in out["messages"]]
    assert not any(m["created"] for m in again["messages"])
    assert await stack.publisher.last_subject_seq(T, sid) == out["seq"]


async def test_a_batch_follows_several_appends_onto_its_line(
    stack: Container, elsewhere: Container, new_id: Callable[[str], str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two appends without a parent after b1 (the second under the first): b2 follows the
    newest, a descendant of b1 that is not its child."""
    sid = new_id("batch-deeper")
    done: list[AppendResult] = []

    async def between(mid: str) -> None:
        if mid == "b1" and not done:
            done.append(await elsewhere.commands.append(T, sid, text_message("w1", "one"), OMITTED))
            done.append(await elsewhere.commands.append(T, sid, text_message("w2", "two"), OMITTED))

    _after_each(stack, monkeypatch, between)
    out = await _batch(stack, sid, ["b1", "b2", "b3"], None)
    monkeypatch.undo()
    assert [(a.id, a.parent_id) for a in done] == [("w1", "b1"), ("w2", "w1")]
    assert _parents(out) == [("b1", None), ("b2", "w2"), ("b3", "b2")]
    parents, path = await _tree(stack, sid, out["seq"])
    assert path == ["b1", "w1", "w2", "b2", "b3"]
    assert set(parents) == set(path)


async def test_a_writer_on_another_branch_does_not_move_the_batch(
    stack: Container, elsewhere: Container, new_id: Callable[[str], str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A message appended under another message (not the batch's line) is the latest leaf for a
    moment; the batch goes on after its own previous message, and ends as the latest leaf."""
    sid = new_id("batch-unrelated")
    await stack.commands.append(T, sid, text_message("r", "root"), None)
    other: list[AppendResult] = []

    async def aside(mid: str) -> None:
        if mid == "b1" and not other:
            other.append(await elsewhere.commands.append(T, sid, text_message("u", "aside"), "r"))
            other.append(await elsewhere.commands.append(T, sid, text_message("v", "new root"), None))

    _after_each(stack, monkeypatch, aside)
    out = await _batch(stack, sid, ["b1", "b2", "b3"])
    monkeypatch.undo()
    assert [(a.id, a.parent_id) for a in other] == [("u", "r"), ("v", None)]
    assert _parents(out) == [("b1", "r"), ("b2", "b1"), ("b3", "b2")]
    assert other[-1].seq < out["messages"][1]["seq"]
    parents, path = await _tree(stack, sid, out["seq"])
    assert path == ["r", "b1", "b2", "b3"]
    assert (parents["u"], parents["v"]) == ("r", None)  # where their writer put them


async def test_a_batch_under_a_given_parent_follows_appends_onto_its_line(
    stack: Container, elsewhere: Container, new_id: Callable[[str], str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The rule holds whatever the first message's parent: here one given, not the latest leaf
    when the batch starts."""
    sid = new_id("batch-given")
    await stack.commands.append(T, sid, text_message("r", "root"), None)
    await stack.commands.append(T, sid, text_message("x", "leaf"), "r")
    single: list[AppendResult] = []

    async def between(mid: str) -> None:
        if mid == "b1" and not single:
            single.append(await elsewhere.commands.append(T, sid, text_message("w", "single"), OMITTED))

    _after_each(stack, monkeypatch, between)
    out = await _batch(stack, sid, ["b1", "b2"], "r")
    monkeypatch.undo()
    assert single[0].parent_id == "b1"
    assert _parents(out) == [("b1", "r"), ("b2", "w")]
    _, path = await _tree(stack, sid, out["seq"])
    assert path == ["r", "b1", "w", "b2"]


async def test_after_a_replayed_message_the_next_is_its_child_a_sibling_of_what_was_under_it(
    stack: Container, new_id: Callable[[str], str]
) -> None:
    """The reference's "send the prefix again, then a regenerated answer": m1 and m2 are stored;
    a batch of m1 (a replay) and m2b makes m2b the child of m1, a sibling of m2, as the
    reference's ``appendMessages`` does (it followed the latest leaf, m2: the model then saw both
    answers). A message this batch stored is still followed by what lands under it meanwhile."""
    sid = new_id("batch-replay")
    await stack.commands.append(T, sid, text_message("m1", "m1"), None)
    await stack.commands.append(T, sid, text_message("m2", "first answer"), "m1")
    out = await _batch(stack, sid, ["m1", "m2b", "m3"])
    assert _parents(out) == [("m1", None), ("m2b", "m1"), ("m3", "m2b")]
    assert [m["created"] for m in out["messages"]] == [False, True, True]
    parents, path = await _tree(stack, sid, out["seq"])
    assert path == ["m1", "m2b", "m3"]
    assert parents["m2"] == "m1"


async def test_batches_and_single_appends_at_once_leave_one_chain(
    stack: Container, elsewhere: Container, new_id: Callable[[str], str]
) -> None:
    """The trial's load in small: batches and single appends without a parent, from two
    processes at once; every acknowledged message ends on the latest leaf's path."""
    sid = new_id("batch-load")
    await stack.commands.append(T, sid, text_message("r", "root"), None)
    procs = (stack, elsewhere)

    async def batch(k: int) -> list[str]:
        ids = [f"b{k}-{i}" for i in range(6)]
        out = await _batch(procs[k % 2], sid, ids)
        return [m["id"] for m in out["messages"]]

    async def single(k: int) -> list[str]:
        return [(await procs[k % 2].commands.append(T, sid, text_message(f"s{k}", "s"), OMITTED)).id]

    done = await asyncio.gather(*(batch(k) for k in range(4)), *(single(k) for k in range(24)))
    acked = {"r", *(i for ids in done for i in ids)}
    assert len(acked) == 1 + 4 * 6 + 24
    parents, path = await _tree(stack, sid, await stack.publisher.last_subject_seq(T, sid))
    assert set(path) == acked == set(parents)
