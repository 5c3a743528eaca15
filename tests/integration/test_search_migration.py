"""Migration 010 on a database that already holds messages and search entries: the rows written
before it become searchable the new way (stop words kept, Porter stems, phrases)."""

from __future__ import annotations

import psycopg

from projections import context_queries, queries
from projections.migrate import migrate
from tests.support import migrate_before


async def test_existing_rows_are_reindexed(fresh_db: str) -> None:
    async with await psycopg.AsyncConnection.connect(fresh_db, autocommit=True) as conn:
        await migrate_before(conn, 10)
        await conn.execute(
            "INSERT INTO messages (tenant, session_id, id, role, content, body_sha256, text_content, created_at, "
            "seq, updated_seq) VALUES ('t', 's', 'm1', 'user', '{}', 'x', 'Who is on call? The one on the left', "
            "now(), 1, 1)"
        )
        await conn.execute(
            "INSERT INTO search_entries (tenant, session_id, label, key, content, created_seq, updated_seq) "
            "VALUES ('t', 's', 'kb', 'k1', 'When the build fails, who fixes it?', 2, 2)"
        )
        # Before: the English configuration dropped "who" as a stop word.
        cur = await conn.execute("SELECT content_tsv::text FROM messages")
        assert await cur.fetchone() == ("'call':4 'left':9 'one':6",)

    assert "010_search_porter.sql" in await migrate(fresh_db)

    async with await psycopg.AsyncConnection.connect(fresh_db, autocommit=True) as conn:
        assert [h.id for h in await queries.search(conn, "t", "s", "who", 10)] == ["m1"]
        assert [h.id for h in await queries.search(conn, "t", None, '"on the left"', 10)] == ["m1"]
        assert await context_queries.search_entries(conn, "t", "s", "kb", "when who") == [
            ("k1", "When the build fails, who fixes it?")
        ]
