"""Sessions most recently active first (``order=recent``, migration 022): the projector's touches
of a session's row stay HOT while its coarse ``activity`` bucket holds; the list walks the
``(tenant, activity)`` index whatever the planner knows of the table; pages are exact and never
repeat a session; a rebuild gives the same rows and the same list."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest

from events.catalog import SessionCreated
from projections import queries
from projections.history import HistoryProjection
from projections.migrate import migrate
from projections.runner import apply_batch
from tests.conftest import make_settings, running_stack
from tests.integration.helpers import appended, assert_rebuild_equals_live, text_message

T = "tenant-a"
BUCKET = 1 << queries.ACTIVITY_SHIFT


async def _updates(conn: psycopg.AsyncConnection[Any]) -> tuple[int, int]:
    """(updates, HOT updates) of ``sessions`` in this transaction so far."""
    cur = await conn.execute("SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_xact_user_tables WHERE relname = 'sessions'")
    row = await cur.fetchone()
    assert row is not None
    return int(row[0]), int(row[1])


async def test_touches_within_a_bucket_are_hot_and_one_into_the_next_bucket_is_not(fresh_db: str) -> None:
    """The projector's own statements (its batch: the touch, then the leaf), one batch per event."""
    await migrate(fresh_db)
    start = 7 * BUCKET + 100
    async with await psycopg.AsyncConnection.connect(fresh_db) as conn, conn.transaction():

        async def project(seq: int, event: Any) -> None:
            await apply_batch(conn, "hot-test", [HistoryProjection()], [(seq, event)], notify=False)

        await project(start, SessionCreated(tenant=T, session="s1", name="hot"))
        before = await _updates(conn)
        for i in range(1, 6):  # five appends in the same bucket, far apart in the log
            await project(start + i * 10_000, appended(T, "s1", f"m{i}", f"m{i - 1}" if i > 1 else None))
        within = await _updates(conn)
        assert within[0] - before[0] >= 10  # a touch and a leaf update per batch
        assert within[0] - before[0] == within[1] - before[1], "an update within the bucket was not HOT"
        await project(8 * BUCKET + 1, appended(T, "s1", "m6", "m5"))  # the next bucket
        crossed = await _updates(conn)
        assert crossed[0] - within[0] == 2
        assert crossed[1] - within[1] == 1  # the touch moved the row in the index; its leaf update is HOT
        cur = await conn.execute("SELECT activity, last_seq FROM sessions WHERE tenant = %s AND id = 's1'", (T,))
        assert await cur.fetchone() == (8, 8 * BUCKET + 1)


SIZES = {"big": 20_000, "small": 30, "other": 5_000}


async def _populate(db: str) -> None:
    await migrate(db)
    async with await psycopg.AsyncConnection.connect(db, autocommit=True) as conn:
        for n, (tenant, size) in enumerate(SIZES.items()):
            await conn.execute(
                "INSERT INTO sessions (tenant, id, created_at, updated_at, created_seq, last_seq) "
                "SELECT %s, 's' || g, now(), now(), g * 3 + %s, (g * 7919 %% %s) * 3 + %s "
                "FROM generate_series(1, %s) g",
                (tenant, n, size * 37, n, size),
            )
        await conn.execute(
            "INSERT INTO sessions (tenant, id, created_at, updated_at, created_seq, last_seq) "
            "VALUES ('big', '', now(), now(), 10, 200000000)"  # the tenant-scope row: never listed
        )
        await conn.execute("UPDATE sessions SET deleted_at = now() WHERE tenant = 'big' AND id = 's5'")
        cur = await conn.execute("SELECT reltuples FROM pg_class WHERE relname = 'sessions'")
        assert await cur.fetchone() == (-1,)  # never analysed nor vacuumed


async def _expected(conn: psycopg.AsyncConnection[Any], tenant: str) -> list[str]:
    cur = await conn.execute(
        "SELECT id, last_seq FROM sessions WHERE tenant = %s AND deleted_at IS NULL AND id <> ''", (tenant,)
    )
    return [i for i, _ in sorted(await cur.fetchall(), key=lambda r: (r[1], r[0]), reverse=True)]


def _nodes(plan: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield plan
    for child in plan.get("Plans", []):
        yield from _nodes(child)


async def _plan(conn: psycopg.AsyncConnection[Any], tenant: str, limit: int, after: tuple[int, str]) -> dict[str, Any]:
    """The list's plan as it runs (its statement, with its setting), with what each node read."""
    async with conn.transaction():
        await conn.execute(queries.RECENT_PLAN)
        cur = await conn.execute(
            f"EXPLAIN (ANALYZE, FORMAT JSON) {queries.RECENT}", queries.recent_params(tenant, limit, after)
        )
        row = await cur.fetchone()
    assert row is not None
    doc = row[0] if isinstance(row[0], list) else json.loads(row[0])
    return dict(doc[0]["Plan"])


@pytest.mark.parametrize("analysed", [False, True])
async def test_the_list_walks_the_activity_index_and_reads_about_one_bucket(fresh_db: str, analysed: bool) -> None:
    await _populate(fresh_db)
    async with await psycopg.AsyncConnection.connect(fresh_db, autocommit=True) as conn:
        if analysed:
            await conn.execute("ANALYZE sessions")
        cur = await conn.execute(
            "SELECT max(n) FROM (SELECT count(*) AS n FROM sessions WHERE tenant = 'big' GROUP BY activity) b"
        )
        bucket_max = int((await cur.fetchone() or [0])[0])
        assert SIZES["big"] > 8 * bucket_max  # the tenant's sessions span many buckets
        expected = await _expected(conn, "big")
        cur = await conn.execute("SELECT last_seq FROM sessions WHERE tenant = 'big' AND id = %s", (expected[3000],))
        middle = (int((await cur.fetchone() or [0])[0]), expected[3000])
        for after in ((queries.MAX_BIGINT, ""), middle):
            plan = await _plan(conn, "big", 50, after)
            nodes = list(_nodes(plan))
            assert [n["Node Type"] for n in nodes] == ["Limit", "Incremental Sort", "Index Scan"], plan
            scan = nodes[-1]
            assert (scan["Index Name"], scan["Scan Direction"]) == ("sessions_by_activity", "Backward"), scan
            assert nodes[1]["Presorted Key"] == ["activity"], nodes[1]
            read = scan["Actual Rows"] + scan.get("Rows Removed by Filter", 0)
            assert 50 <= read <= 50 + bucket_max, (read, bucket_max)  # never all the tenant's sessions


async def test_pages_are_exact_and_a_session_active_meanwhile_is_never_listed_twice(fresh_db: str) -> None:
    await _populate(fresh_db)
    async with await psycopg.AsyncConnection.connect(fresh_db, autocommit=True) as conn:
        for tenant in SIZES:
            walked: list[str] = []
            after: tuple[int, str] | None = None
            while True:
                page = await queries.list_sessions_recent(conn, tenant, 997, after)
                walked += [r.id for r in page]
                if len(page) < 997:
                    break
                after = (page[-1].last_seq, page[-1].id)
            assert walked == await _expected(conn, tenant)

        before = await _expected(conn, "other")
        seen: list[str] = []
        after = None
        next_seq = 10**9
        moved_unseen: list[str] = []
        while True:
            page = await queries.list_sessions_recent(conn, "other", 400, after)
            seen += [r.id for r in page]
            if len(page) < 400:
                break
            after = (page[-1].last_seq, page[-1].id)
            # between pages: one session already listed and one not yet listed become the most recent
            unseen = next(i for i in before if i not in seen and i not in moved_unseen)
            for sid in (seen[0], unseen):
                next_seq += 1
                await conn.execute(
                    "UPDATE sessions SET last_seq = %s WHERE tenant = 'other' AND id = %s", (next_seq, sid)
                )
            moved_unseen.append(unseen)
        assert len(seen) == len(set(seen))  # no session on two pages
        assert set(seen) == set(before) - set(moved_unseen)  # every session not active meanwhile
        assert [s for s in before if s in set(seen)] == seen  # in the order the walk started with


async def test_live_order_follows_every_kind_of_event_and_a_rebuild_lists_the_same(
    nats_url: str, fresh_db: str, new_id: Callable[[str], str]
) -> None:
    settings = make_settings(nats_url, fresh_db)
    async with running_stack(settings) as c:
        a, b, d = sids = [new_id(p) for p in "abd"]
        for sid in sids:
            await c.commands.create_session(T, sid, "", None, {})
        order: list[list[str]] = []

        async def listed(seq: int) -> None:
            await c.waiter.wait_all(seq)
            async with c.pool.connection() as conn:
                order.append([r.id for r in await queries.list_sessions_recent(conn, T, 3, None)])

        await listed((await c.commands.append(T, a, text_message("m1", "hello"), None)).seq)
        await listed((await c.commands.rename_session(T, d, "renamed")).seq)
        await listed((await c.commands.add_usage(T, b, 1, 1, 0.0)).seq)
        assert order == [[a, d, b], [d, a, b], [b, d, a]]
        await assert_rebuild_equals_live(c, fresh_db, settings.projector_name)  # whole rows, activity included
        async with await psycopg.AsyncConnection.connect(fresh_db, autocommit=True) as conn:
            await conn.execute('SET search_path TO "shadow"')
            assert [r.id for r in await queries.list_sessions_recent(conn, T, 3, None)] == order[-1]
