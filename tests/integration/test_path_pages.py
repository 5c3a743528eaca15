"""A history read's path (:func:`projections.queries.path_from`: the session read newest first,
a page at a time, walked as it comes) is the path the whole-session walk finds
(:func:`projections.queries.history`), on random trees with branches, deletes, re-appends and
cycles, for every message as the leaf and for the latest leaf, with pages small enough that most
walks take several; the row stats of a path (:func:`projections.queries.path_stats`) are its rows."""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from typing import Any

import pytest

from events.catalog import MessageAppended, MessagesCleared, MessagesDeleted
from events.envelope import Event
from projections import queries
from projections.history import HistoryProjection
from projections.overlays import OverlayProjection
from projections.runner import apply_batch
from services.bootstrap import Container
from tests.integration.helpers import appended, summary_recorded

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
            await check_stats(conn, sid, leaf)
        expected = [(r.id, r.content) for r in await queries.history(conn, T, sid, latest)] if latest else []
        got_leaf, got = await queries.path_from(conn, T, sid, None)
        assert (got_leaf, [(r.id, r.content) for r in got]) == (latest, expected)
        await check_stats(conn, sid, None)
        for leaf in [None, *stored]:
            await check_single_branch(conn, sid, leaf)
    assert walked_any  # some walk took several pages


async def check_stats(conn: Any, sid: str, leaf: str | None) -> None:
    """The row stats of a path (:func:`projections.queries.path_stats`, measured in Postgres) are
    the walked path's rows, with their roles and their bodies' UTF-8 lengths."""
    got_leaf, path = await queries.path_from(conn, T, sid, leaf)
    rows = {r.id: r for r in await queries.history(conn, T, sid, got_leaf)} if got_leaf else {}
    expected = [(r.id, rows[r.id].role, len(r.content.encode())) for r in path]
    stats_leaf, stats = await queries.path_stats(conn, T, sid, leaf)
    assert [tuple(s) for s in stats] == expected, leaf
    assert stats_leaf == (got_leaf if path else None)


async def chained(conn: Any, sid: str) -> tuple[bool, str | None]:
    """(whether the session's messages in append order are one chain from a root, the newest)."""
    cur = await conn.execute(
        "SELECT id, parent_id FROM messages WHERE tenant = %s AND session_id = %s ORDER BY seq", (T, sid)
    )
    rows = await cur.fetchall()
    ok = all(pid == (rows[i - 1][0] if i else None) for i, (_, pid) in enumerate(rows))
    return ok, rows[-1][0] if rows else None


async def check_single_branch(conn: Any, sid: str, leaf: str | None) -> None:
    """:func:`queries.single_branch` answers exactly when the session is one chain and the leaf
    asked for is its newest message, and then with the path's bodies."""
    leaf_id, path = await queries.path_from(conn, T, sid, leaf)
    one_chain, newest = await chained(conn, sid)
    found = await single(conn, sid, leaf)
    if one_chain and newest is not None and leaf in (None, newest):
        assert found is not None, (leaf, newest)
        assert (found.leaf_id, found.body, found.count) == (leaf_id, ",".join(r.content for r in path), len(path))
    else:
        assert found is None, (leaf, newest, [r.id for r in path])


@pytest.mark.parametrize("seed", range(8))
async def test_the_single_branch_flag_follows_every_batch(
    stack: Container, new_id: Callable[[str], str], seed: int
) -> None:
    """``sessions.single_branch``, kept batch by batch (appends under the leaf, branches,
    deletes, clears, re-appends of stored ids, batches of every size), is always what the rows
    say."""
    rng = random.Random(1000 + seed)
    sid = new_id("shape")
    events: list[Event] = []
    for i in range(60):
        roll = rng.random()
        if roll < 0.03:
            events.append(MessagesCleared(tenant=T, session=sid))
        elif roll < 0.08:
            events.append(MessagesDeleted(tenant=T, session=sid, message_ids=[f"m{rng.randrange(max(i, 1))}"]))
        elif roll < 0.12:
            events.append(appended(T, sid, f"m{rng.randrange(max(i, 1))}", None))  # an id maybe stored
        elif roll < 0.2:
            events.append(appended(T, sid, f"m{i}", f"m{rng.randrange(max(i, 1))}"))  # maybe a branch
        else:
            events.append(appended(T, sid, f"m{i}", None))  # placeholder parent, set below
    leaf: str | None = None
    fixed: list[Event] = []
    for e in events:  # most plain appends go under the latest leaf, as the API would put them
        if isinstance(e, MessagesCleared):
            leaf = None
        elif isinstance(e, MessageAppended):
            if e.parent_id is None and rng.random() < 0.9:
                e = appended(T, sid, e.message_id, leaf)
            leaf = e.message_id
        fixed.append(e)
    seq, i = 70_000_000 + seed * 1_000, 0
    while i < len(fixed):
        size = rng.choice([1, 1, 2, 3, 7, 20])
        batch = [(seq + j, e) for j, e in enumerate(fixed[i : i + size])]
        async with stack.pool.connection() as conn, conn.transaction():
            await apply_batch(conn, "shape-test-" + sid, [HistoryProjection()], batch, notify=False)
        seq, i = seq + size, i + size
        async with stack.pool.connection() as conn:
            cur = await conn.execute("SELECT single_branch FROM sessions WHERE tenant = %s AND id = %s", (T, sid))
            row = await cur.fetchone()
            assert row is not None
            assert row[0] == (await chained(conn, sid))[0], i
            await check_single_branch(conn, sid, None)


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
        over = await single(conn, sid, limit=9)  # over the limit: its recent end, as path_from gives it
        _, recent = await queries.path_from(conn, T, sid, None, want=9)
        assert over is not None
        assert (over.body, over.count, over.truncated) == (",".join(r.content for r in recent), 9, True)
        whole = await single(conn, sid, limit=10)
        assert whole is not None
        assert (whole.count, whole.truncated) == (10, False)
        cur = await conn.execute("SELECT last_seq FROM sessions WHERE tenant = %s AND id = %s", (T, sid))
        row = await cur.fetchone()
        assert row is not None
        assert await single(conn, sid, min_seq=row[0]) is not None
        assert await single(conn, sid, min_seq=row[0] + 1) is None  # not applied yet: the read waits elsewhere


async def single(
    conn: Any, sid: str, leaf: str | None = None, *, limit: int = 1000, min_seq: int | None = None
) -> queries.SingleBranch | None:
    return await queries.single_branch(
        conn, T, sid, leaf, min_seq=min_seq, checkpoints=["no-such-checkpoint"], limit=limit, overlays=True
    )


@pytest.mark.parametrize("seed", range(4))
async def test_the_recent_end_of_a_path_is_the_walked_paths_end(
    stack: Container, new_id: Callable[[str], str], monkeypatch: pytest.MonkeyPatch, seed: int
) -> None:
    """``path_from`` with ``want`` is the newest ``want`` rows of the whole path, for every leaf
    of random trees (branches, deletes, re-appends, cycles) and pages of 3."""
    rng = random.Random(100 + seed)
    sid = new_id("want")
    items = [(51_000_000 + seed * 1_000 + i, e) for i, e in enumerate(random_tree(rng, sid, 60))]
    async with stack.pool.connection() as conn, conn.transaction():
        await apply_batch(conn, "want-test-" + sid, [HistoryProjection()], items, notify=False)
    monkeypatch.setattr(queries, "PATH_PAGE", 3)
    async with stack.pool.connection() as conn:
        cur = await conn.execute("SELECT id FROM messages WHERE tenant = %s AND session_id = %s", (T, sid))
        for leaf in [None, *[r[0] for r in await cur.fetchall()]]:
            whole_leaf, whole = await queries.path_from(conn, T, sid, leaf)
            for want in (1, 2, 4, 7, 100):
                got_leaf, got = await queries.path_from(conn, T, sid, leaf, want)
                assert (got_leaf, got) == (whole_leaf, whole[-want:]), (leaf, want)


class _CountingConn:
    """A connection that counts the path pages (``_PATH_PAGE_SQL``) read through it."""

    def __init__(self, conn: Any, pages: list[int]) -> None:
        self._conn, self._pages = conn, pages

    async def execute(self, sql: Any, params: Any = None) -> Any:
        if sql == queries._PATH_PAGE_SQL:
            self._pages.append(1)
        return await self._conn.execute(sql, params)


async def test_a_history_read_of_a_long_sessions_recent_end_reads_only_that_end(
    stack: Container, new_id: Callable[[str], str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``GET …/history?limit=N`` of a session of many messages on several branches (so not the
    single-branch read) reads about N rows of the path, not the whole path: a 50,000-message
    session's history with ``limit=100`` read every body (160 ms against 3 ms for a small one).
    The answer is the path's newest N messages, ``truncated``."""
    from services.api.history import read_history

    sid = new_id("recent-end")
    events: list[Event] = [appended(T, sid, "side", None)]
    events += [appended(T, sid, f"m{i}", f"m{i - 1}" if i else None) for i in range(60)]
    items = [(52_000_000 + i, e) for i, e in enumerate(events)]
    async with stack.pool.connection() as conn, conn.transaction():
        await apply_batch(conn, "recent-end-" + sid, [HistoryProjection()], items, notify=False)
    monkeypatch.setattr(queries, "PATH_PAGE", 3)
    pages: list[int] = []
    real = queries.path_from

    async def counted(conn: Any, *args: Any, **kwargs: Any) -> Any:
        return await real(_CountingConn(conn, pages), *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(queries, "path_from", counted)
    answer = await read_history(stack, T, sid, limit=4)
    body = json.loads(bytes(answer.body))
    assert [m["id"] for m in body["messages"]] == ["m56", "m57", "m58", "m59"]
    assert body["truncated"] is True
    assert len(pages) <= 2  # 5 rows (limit + 1) in pages of 3; the whole path is 21 pages


async def test_a_cut_history_of_a_compacted_session_counts_the_overlay_as_one_message(
    stack: Container, new_id: Callable[[str], str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where an overlay stands over the part of the path a ``limit`` leaves out, the path is read
    whole (the overlay counts as one message): ``limit=4`` over 60 messages whose first 57 are
    summarised is the summary and the last 3."""
    from services.api.history import read_history

    sid = new_id("recent-ov")
    events: list[Event] = [appended(T, sid, "side", None)]
    events += [appended(T, sid, f"m{i}", f"m{i - 1}" if i else None) for i in range(60)]
    events.append(summary_recorded(T, sid, "m0", "m56"))
    items = [(53_000_000 + i, e) for i, e in enumerate(events)]
    async with stack.pool.connection() as conn, conn.transaction():
        await apply_batch(conn, "recent-ov-" + sid, [HistoryProjection(), OverlayProjection()], items, notify=False)
    monkeypatch.setattr(queries, "PATH_PAGE", 3)
    body = json.loads(bytes((await read_history(stack, T, sid, limit=4)).body))
    ids = [m["id"] for m in body["messages"]]
    assert ids[0].startswith("compaction_")
    assert ids[1:] == ["m57", "m58", "m59"]
    assert "truncated" not in body  # the summary and the last 3 are the whole compacted path


class _BodyCountingConn:
    """A connection that counts the message bodies the statements sent through it asked for:
    path pages with bodies (their row count) and bodies asked by sequence."""

    def __init__(self, conn: Any, asked: list[int]) -> None:
        self._conn, self._asked = conn, asked

    def pipeline(self) -> Any:
        return self._conn.pipeline()

    async def execute(self, sql: Any, params: Any = None) -> Any:
        if sql == queries._PATH_PAGE_SQL:
            self._asked.append(params[3])
        elif sql == getattr(queries, "_MESSAGES_AT_SQL", None):
            self._asked.append(len(params[2]))
        return await self._conn.execute(sql, params)


async def test_a_compacted_history_reads_the_bodies_of_what_shows_only(
    stack: Container, new_id: Callable[[str], str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A history read of a compacted session walks the path without its bodies and reads the
    bodies of the messages that show: 200 messages whose first 190 are summarised (a sibling
    branch's message among the last ones) ask for 10 bodies, not 200 (a compacted session of
    20,000 messages read every body, ~20 MB, for a 43 KB answer: 485 ms against 118 ms for the
    same session uncompacted). The answer is the summary and the last ten, in order."""
    from services.api.history import read_history

    sid = new_id("compacted-bodies")
    events: list[Event] = [appended(T, sid, f"m{i}", f"m{i - 1}" if i else None, f"text {i}") for i in range(196)]
    events.append(appended(T, sid, "sibling", "m195", "a sibling"))
    events += [appended(T, sid, f"m{i}", f"m{i - 1}", f"text {i}") for i in range(196, 200)]
    events.append(summary_recorded(T, sid, "m0", "m189"))
    items = [(54_000_000 + i, e) for i, e in enumerate(events)]
    async with stack.pool.connection() as conn, conn.transaction():
        await apply_batch(conn, "compacted-" + sid, [HistoryProjection(), OverlayProjection()], items, notify=False)
    monkeypatch.setattr(queries, "PATH_PAGE", 3)  # the walk in pages of 15 rows without bodies
    asked: list[int] = []
    real = queries.path_from
    real_bodies = getattr(queries, "bodies_of", None)

    async def counted(conn: Any, *args: Any, **kwargs: Any) -> Any:
        return await real(_BodyCountingConn(conn, asked), *args, **kwargs)  # type: ignore[arg-type]

    async def counted_bodies(conn: Any, *args: Any) -> Any:
        assert real_bodies is not None
        return await real_bodies(_BodyCountingConn(conn, asked), *args)

    monkeypatch.setattr(queries, "path_from", counted)
    monkeypatch.setattr(queries, "bodies_of", counted_bodies, raising=False)
    body = json.loads(bytes((await read_history(stack, T, sid)).body))
    ids = [m["id"] for m in body["messages"]]
    assert ids[0].startswith("compaction_")
    assert ids[1:] == [f"m{i}" for i in range(190, 200)]
    assert [m["parts"][0]["text"] for m in body["messages"][1:]] == [f"text {i}" for i in range(190, 200)]
    assert body["leaf_id"] == "m199"
    assert sum(asked) == 11  # the ten below the newest (the sibling among them), then m190 by sequence
