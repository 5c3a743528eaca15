"""Reads that need a few rows of one session read about that many, whatever the session's size
and whatever the planner knows of ``messages`` (autovacuum may be off; a session may be far
larger than the tenant's average one): the latest leaf, a message by id, which of a few ids
exist, the newest rows of a single branch, the recent end of a path. Earlier, Postgres took a
session for a few rows and read every row of it through its bitmap (then sorted them): 20-45 ms
for any of these on a 50,000-message session; and in a table as it is here, a lookup by key read
the whole session through ``messages_by_seq`` (the planner's costs tie, the smaller index wins:
3,000 rows for the leaf or one message). Real Postgres, in a database of the test's own: the
table as it is (a few thousand rows, never analysed) and as the planner sees a large one with no
column statistics (``pg_class``: a million rows). Counted in rows the transaction fetched from
``messages`` (``pg_stat_xact_user_tables``: scans inside the PL/pgSQL functions of migrations
034 and 037 included), not a timing."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from events.envelope import Event
from projections import queries
from projections.history import HistoryProjection
from projections.runner import apply_batch
from tests.conftest import make_settings, running_stack
from tests.integration.helpers import appended

N = 3_000
T = "tenant-a"


async def _fetched(conn: Any, read: Callable[[], Awaitable[Any]]) -> tuple[Any, int]:
    """``read()``'s answer and the rows of ``messages`` its statements fetched."""
    count = (
        "SELECT coalesce(sum(seq_tup_read + coalesce(idx_tup_fetch, 0)), 0)::bigint "
        "FROM pg_stat_xact_user_tables WHERE relname = 'messages'"
    )
    async with conn.transaction():
        before = (await (await conn.execute(count)).fetchone())[0]
        answer = await read()
        after = (await (await conn.execute(count)).fetchone())[0]
    return answer, int(after - before)


@pytest.mark.parametrize("large", [False, True], ids=["as-it-is", "seen-as-large"])
async def test_reads_of_a_few_rows_of_a_large_session_fetch_about_that_many(
    nats_url: str, fresh_db: str, new_id: Callable[[str], str], large: bool
) -> None:
    sid = new_id("bounded")
    events: list[Event] = [appended(T, sid, f"m{i}", f"m{i - 1}" if i else None, f"text {i}") for i in range(N)]
    async with running_stack(make_settings(nats_url, fresh_db), projector=False) as stack:
        async with stack.pool.connection() as conn, conn.transaction():
            await apply_batch(conn, "bounded-" + sid, [HistoryProjection()], list(enumerate(events, 1)), notify=False)
            if large:
                await conn.execute(
                    "UPDATE pg_class SET reltuples = 1e6, relpages = pg_relation_size('messages') / 8192 "
                    "WHERE relname = 'messages'"
                )
        async with stack.pool.connection() as conn:
            leaf, rows = await _fetched(conn, lambda: queries.latest_leaf(conn, T, sid))
            assert leaf is not None
            assert leaf.id == f"m{N - 1}"
            assert rows <= 1, (rows, "leaf")

            row, rows = await _fetched(conn, lambda: queries.get_message(conn, T, sid, "m7"))
            assert row is not None
            assert row.id == "m7"
            assert rows <= 1, (rows, "message")

            ids, rows = await _fetched(conn, lambda: queries.existing_ids(conn, T, sid, ["m1", f"m{N - 1}", "zz"]))
            assert ids == {"m1", f"m{N - 1}"}
            assert rows <= 2, (rows, "ids")

            single, rows = await _fetched(
                conn,
                lambda: queries.single_branch(
                    conn, T, sid, None, min_seq=None, checkpoints=[], limit=50, overlays=True
                ),
            )
            assert single is not None
            assert single.truncated  # longer than the limit: its recent end
            _, recent = await queries.path_from(conn, T, sid, None, want=50)
            assert (single.count, single.body) == (50, ",".join(r.content for r in recent))
            assert rows <= 51, rows

            (leaf_id, path), rows = await _fetched(conn, lambda: queries.path_from(conn, T, sid, None, want=21))
            assert leaf_id == f"m{N - 1}"
            assert [r.id for r in path] == [f"m{i}" for i in range(N - 21, N)]
            assert rows <= 22, rows

            (_, whole), rows = await _fetched(conn, lambda: queries.path_from(conn, T, sid, f"m{N - 1}"))
            assert len(whole) == N  # the whole path, page after page, each row once
            assert rows <= N, rows
