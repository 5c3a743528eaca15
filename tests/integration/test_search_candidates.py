"""A search's candidates (the scope's newest matches) are read without planner statistics
(autovacuum may be off): a common word is found in the scope's newest messages, read in ``seq``
order, and no other match is read; a word rarer than that is read from the word index, as
before. Earlier every match of the scope was read and sorted: a word in 105,000 of a tenant's
206,000 messages took 525 ms. Real Postgres; the plan's rows, not a timing."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from events.envelope import Event
from projections import queries, search_languages
from projections import search_query as sq
from projections.history import HistoryProjection
from projections.runner import apply_batch
from services.bootstrap import Container
from tests.integration.helpers import appended

N = 600


def _messages_rows(plan: dict[str, Any]) -> int:
    """The rows every scan of ``messages`` in the plan produced (times its loops)."""
    own = plan.get("Actual Rows", 0) * plan.get("Actual Loops", 0) if plan.get("Relation Name") == "messages" else 0
    return int(own) + sum(_messages_rows(p) for p in plan.get("Plans", []))


async def _explain(conn: Any, tenant: str, query: str, session: str | None) -> tuple[int, list[str]]:
    """(the rows read from ``messages`` by the search's statements, as ``_search`` runs them; the
    hits' ids)."""
    parts = sq.parse(query)
    config = await search_languages.config_of(conn, tenant)
    params: dict[str, Any] = {
        "t": tenant,
        "s": session,
        "window": queries.SEARCH_WINDOW,
        "cand": queries.SEARCH_CANDIDATES,
        "sample": queries.SEARCH_SAMPLE,
        "limit": 5,
        **sq.params(parts, config),
    }
    explain = "EXPLAIN (ANALYZE, FORMAT JSON) "
    async with conn.transaction():
        await conn.execute(queries._PLAN_FIXED)
        cur = await conn.execute(explain + queries.newest_matches_sql(parts), params)
        rows = _messages_rows((await cur.fetchone())[0][0]["Plan"])
        found = await (await conn.execute(queries.newest_matches_sql(parts), params)).fetchall()
        await conn.execute(queries._PLAN_FREE)
        newest = len(found) >= queries.SEARCH_CANDIDATES
        params |= {"ns": [r[0] for r in found], "ni": [r[1] for r in found]}
        cur = await conn.execute(explain + queries.search_sql(parts, newest=newest), params)
        rows += _messages_rows((await cur.fetchone())[0][0]["Plan"])
    hits = await queries.search(conn, tenant, session, query, 5)
    return rows, [h.id for h in hits]


@pytest.mark.parametrize("scoped", [False, True])
async def test_a_common_words_candidates_are_read_from_the_newest_messages_alone(
    stack: Container, new_id: Callable[[str], str], monkeypatch: pytest.MonkeyPatch, scoped: bool
) -> None:
    tenant, sid = new_id("cand-t"), new_id("cand")
    events: list[Event] = [
        appended(tenant, sid, f"m{i}", f"m{i - 1}" if i else None, f"common words {'rare' if i < 3 else 'x'} {i}")
        for i in range(N)
    ]
    async with stack.pool.connection() as conn, conn.transaction():
        await apply_batch(conn, "cand-" + sid, [HistoryProjection()], list(enumerate(events, 60_000_000)), notify=False)
    monkeypatch.setattr(queries, "SEARCH_CANDIDATES", 10)
    monkeypatch.setattr(queries, "SEARCH_WINDOW", 50)
    monkeypatch.setattr(queries, "SEARCH_SAMPLE", 10)
    scope = sid if scoped else None
    async with stack.pool.connection() as conn:
        rows, hits = await _explain(conn, tenant, "common", scope)
        # the newest 10 matches (the first 10 rows read newest first), each read again by its key,
        # and the sample: never the 600 matches (before: 600 read from the index, then sorted)
        assert rows <= 10 + 10 + 10, rows
        assert len(hits) == 5
        assert all(int(h.removeprefix("m")) >= N - 10 for h in hits), hits
        rows, hits = await _explain(conn, tenant, "rare", scope)  # under 10 in the window: the index
        assert sorted(hits) == ["m0", "m1", "m2"]
        assert rows <= 50 + 3 + 3 + 10, rows
