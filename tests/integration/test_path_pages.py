"""A history read's path (:func:`projections.queries.path_from`: the session read newest first,
a page at a time, walked as it comes) is the path the whole-session walk finds
(:func:`projections.queries.history`), on random trees with branches, deletes, re-appends and
cycles, for every message as the leaf and for the latest leaf, with pages small enough that most
walks take several."""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

import pytest

from events.catalog import MessagesDeleted
from events.envelope import Event
from projections import queries
from projections.history import HistoryProjection
from projections.runner import apply_batch
from services.bootstrap import Container
from tests.integration.helpers import appended

T = "tenant-a"


def random_tree(rng: random.Random, sid: str, n: int) -> list[Event]:
    events: list[Event] = []
    ids: list[str] = []
    for i in range(n):
        roll = rng.random()
        if ids and roll < 0.1:  # delete one or two
            events.append(MessagesDeleted(tenant=T, session=sid, message_ids=rng.sample(ids, min(2, len(ids)))))
            continue
        if ids and roll < 0.15:  # a re-append of an old id (dropped when it is still stored)
            mid = rng.choice(ids)
        else:
            mid = f"m{i}"
            ids.append(mid)
        parent = None if not ids or roll > 0.95 else (ids[-2] if len(ids) > 1 and roll < 0.7 else rng.choice(ids))
        events.append(appended(T, sid, mid, parent if parent != mid else None))
    if len(ids) > 2:  # a cycle: a message whose parent is its own descendant (only a raw log can say so)
        events.append(appended(T, sid, "cyc-a", "cyc-b"))
        events.append(appended(T, sid, "cyc-b", "cyc-a"))
    return events


@pytest.mark.parametrize("seed", range(8))
async def test_the_paged_path_is_the_walked_path(
    stack: Container, new_id: Callable[[str], str], monkeypatch: pytest.MonkeyPatch, seed: int
) -> None:
    rng = random.Random(seed)
    sid = new_id("pages")
    events = random_tree(rng, sid, rng.choice([30, 60]))
    items = [(50_000_000 + seed * 1_000 + i, e) for i, e in enumerate(events)]
    async with stack.pool.connection() as conn, conn.transaction():
        await apply_batch(conn, "pages-test-" + sid, [HistoryProjection()], items, notify=False)
    monkeypatch.setattr(queries, "PATH_PAGE", 3)
    async with stack.pool.connection() as conn:
        cur = await conn.execute("SELECT id FROM messages WHERE tenant = %s AND session_id = %s", (T, sid))
        stored = [r[0] for r in await cur.fetchall()]
        cur = await conn.execute("SELECT leaf_id FROM sessions WHERE tenant = %s AND id = %s", (T, sid))
        row = await cur.fetchone()
        latest = row[0] if row else None
        walked_any = False
        for leaf in [*stored, "no-such-message"]:
            expected = [(r.id, r.content) for r in await queries.history(conn, T, sid, leaf)]
            got_leaf, got = await queries.path_from(conn, T, sid, leaf)
            assert [(r.id, r.content) for r in got] == expected, leaf
            assert got_leaf == leaf
            walked_any = walked_any or len(got) > 3
        expected = [(r.id, r.content) for r in await queries.history(conn, T, sid, latest)] if latest else []
        got_leaf, got = await queries.path_from(conn, T, sid, None)
        assert (got_leaf, [(r.id, r.content) for r in got]) == (latest, expected)
        for leaf in [None, *stored]:
            await check_single_branch(conn, sid, leaf)
    assert walked_any  # some walk took several pages


async def check_single_branch(conn: Any, sid: str, leaf: str | None) -> None:
    """:func:`queries.single_branch` answers exactly when the path is every message of the
    session in append order, and then with the path's bodies."""
    leaf_id, path = await queries.path_from(conn, T, sid, leaf)
    cur = await conn.execute("SELECT id FROM messages WHERE tenant = %s AND session_id = %s ORDER BY seq", (T, sid))
    every = [r[0] for r in await cur.fetchall()]
    single = await queries.single_branch(conn, T, sid, leaf, min_seq=None, checkpoints=[], limit=1000, overlays=True)
    if path and [r.id for r in path] == every:
        assert single is not None, (leaf, every)
        assert (single.leaf_id, single.body, single.count) == (leaf_id, ",".join(r.content for r in path), len(path))
    else:
        assert single is None, (leaf, every, [r.id for r in path])


async def test_a_session_without_messages_has_no_path(stack: Container, new_id: Callable[[str], str]) -> None:
    async with stack.pool.connection() as conn:
        assert await queries.path_from(conn, T, new_id("none"), None) == (None, [])
        assert await queries.path_from(conn, T, new_id("none"), "m1") == ("m1", [])


async def test_a_long_chain_is_read_a_page_at_a_time(
    stack: Container, new_id: Callable[[str], str], monkeypatch: pytest.MonkeyPatch
) -> None:
    sid = new_id("chain")
    items = [(60_000_000 + i, appended(T, sid, f"m{i}", f"m{i - 1}" if i else None)) for i in range(10)]
    async with stack.pool.connection() as conn, conn.transaction():
        await apply_batch(conn, "pages-test-" + sid, [HistoryProjection()], items, notify=False)
    monkeypatch.setattr(queries, "PATH_PAGE", 3)
    async with stack.pool.connection() as conn:
        leaf, path = await queries.path_from(conn, T, sid, None)
        assert (leaf, [r.id for r in path]) == ("m9", [f"m{i}" for i in range(10)])
        await check_single_branch(conn, sid, None)
        await check_single_branch(conn, sid, "m9")
        await check_single_branch(conn, sid, "m5")  # not the newest: the path is not every message
        args = {"min_seq": None, "checkpoints": [], "overlays": True}
        assert await queries.single_branch(conn, T, sid, None, limit=9, **args) is None  # over the limit
        assert await queries.single_branch(conn, T, sid, None, limit=10, **args) is not None
        cur = await conn.execute("SELECT last_seq FROM sessions WHERE tenant = %s AND id = %s", (T, sid))
        row = await cur.fetchone()
        assert row is not None
        fresh = {"checkpoints": ["no-such-checkpoint"], "overlays": True, "limit": 100}
        assert await queries.single_branch(conn, T, sid, None, min_seq=row[0], **fresh) is not None
        assert await queries.single_branch(conn, T, sid, None, min_seq=row[0] + 1, **fresh) is None  # not yet
