"""What the append's one query (projections.queries.append_state) reads, counted in rows of
``messages`` by the statement's own plan (EXPLAIN ANALYZE): the walk under a re-used id and the
dangling parent ids cost nothing where their answer is not used, and stop where it is known."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import psycopg

from projections import queries
from projections.queries import AppendState
from services.bootstrap import Container
from tests.integration.helpers import text_message

T = "tenant-a"
DEPTH = 12  # k1 .. k12, one chain under m


class _Captured:
    """A connection that runs the statement and keeps it, to be explained after."""

    def __init__(self, conn: psycopg.AsyncConnection[Any]) -> None:
        self.conn = conn
        self.statement: tuple[str, dict[str, Any]] | None = None

    async def execute(self, query: str, params: dict[str, Any]) -> psycopg.AsyncCursor[Any]:
        self.statement = (query, params)
        return await self.conn.execute(query, params)


def _rows(node: dict[str, Any]) -> int:
    own = node["Actual Rows"] * node["Actual Loops"] if node.get("Relation Name") == "messages" else 0
    return own + sum(_rows(child) for child in node.get("Plans", ()))


async def _state(c: Container, sid: str, message_id: str, parent: str | None, **kw: Any) -> tuple[AppendState, int]:
    """append_state's answer and the rows of ``messages`` its statement reads."""
    async with c.pool.connection() as conn:
        captured = _Captured(conn)
        state = await queries.append_state(
            captured,  # type: ignore[arg-type]
            T,
            sid,
            message_id,
            parent,
            kw.pop("want_leaf", False),
            kw.pop("ids_cap", None),
            **kw,
        )
        assert captured.statement is not None
        query, params = captured.statement
        cur = await conn.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + query, params, prepare=False)
        row = await cur.fetchone()
    assert row is not None
    return state, _rows(row[0][0]["Plan"])


async def _deleted_root(c: Container, new_id: Callable[[str], str]) -> str:
    """m, k1 .. k12 under it, r a root of its own; then m deleted (its children keep it)."""
    sid = new_id("reads")
    await c.commands.append(T, sid, text_message("m", "root"), None)
    parent = "m"
    for i in range(1, DEPTH + 1):
        await c.commands.append(T, sid, text_message(f"k{i}", "under"), parent)
        parent = f"k{i}"
    await c.commands.append(T, sid, text_message("r", "other"), None)
    await c.commands.append(T, sid, text_message("r1", "other"), "r")
    deleted = await c.commands.delete_messages(T, sid, ["m"])
    await c.waiter.wait_session(T, sid, deleted.seq)
    return sid


async def test_a_re_used_id_as_a_new_root_or_under_an_unknown_parent_walks_nothing(
    stack: Container, new_id: Callable[[str], str]
) -> None:
    """No parent to look for (a new root; a parent that is not there, refused anyway): the walk
    under m is not made, and no row of ``messages`` is read (the id's own probe finds none)."""
    sid = await _deleted_root(stack, new_id)
    for parent in (None, "nope"):
        state, read = await _state(stack, sid, "m", parent)
        assert (state.under, read) == (None, 0)
    state, read = await _state(stack, sid, "m", None, chain_parents=[])  # parent null: nothing chained
    assert (state.under, read) == (None, 0)


async def test_the_walk_under_a_re_used_id_looks_for_the_parent_and_stops_there(
    stack: Container, new_id: Callable[[str], str]
) -> None:
    """Only the parents asked about come back, never the subtree; one near the id stops the walk
    (fewer rows read than the id's subtree holds), one far from it is still found."""
    sid = await _deleted_root(stack, new_id)
    state, near = await _state(stack, sid, "m", "k1")
    assert state.under == ["k1"]
    assert near < DEPTH
    state, far = await _state(stack, sid, "m", f"k{DEPTH}")
    assert state.under == [f"k{DEPTH}"]
    assert far > near
    state, _ = await _state(stack, sid, "m", None, want_leaf=True, leaf_parent=True)  # the latest leaf
    assert (state.latest_leaf, state.under) == ("r1", [])
    state, _ = await _state(stack, sid, "m", "r1")  # another branch: walked, not found
    assert state.under == []
    state, _ = await _state(stack, sid, "m", None, chain_parents=["k3", "r1"])  # above this process's appends
    assert state.under == ["k3"]


async def test_dangling_parent_ids_are_read_only_under_the_cap(stack: Container, new_id: Callable[[str], str]) -> None:
    """Under the cap: every id and the ids named as parents the session lacks (m). Over it:
    neither, and nothing is read beyond the bounded ids scan (cap + 1 rows)."""
    sid = await _deleted_root(stack, new_id)
    held = DEPTH + 2
    state, read = await _state(stack, sid, "new", None, ids_cap=100)
    assert (len(state.ids or ()), state.dangling) == (held, ["m"])
    assert read == held + held - 1  # the ids, then the parent index (every message names one but r)
    state, read = await _state(stack, sid, "new", None, ids_cap=3)
    assert (state.ids, state.dangling, read) == (None, None, 4)


async def test_a_single_branch_session_reads_only_its_ids(stack: Container, new_id: Callable[[str], str]) -> None:
    """No message of a single-branch session names a parent it lacks: the parent index is not read."""
    sid = new_id("single")
    last = None
    for i in range(5):
        last = (await stack.commands.append(T, sid, text_message(f"s{i}", "x"), f"s{i - 1}" if i else None)).seq
    assert last is not None
    await stack.waiter.wait_session(T, sid, last)
    state, read = await _state(stack, sid, "new", None, ids_cap=100)
    assert (sorted(state.ids or ()), state.dangling, read) == ([f"s{i}" for i in range(5)], [], 5)
