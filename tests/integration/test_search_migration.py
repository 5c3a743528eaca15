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


async def test_rows_written_before_016_stay_searchable_without_a_pending_list(fresh_db: str) -> None:
    """Migration 016 (storage, issue #13): the FTS indexes keep no pending list, the rows written
    before it are found and ranked as before, and tenant-wide newest-first reads use the
    ascending index backwards."""
    async with await psycopg.AsyncConnection.connect(fresh_db, autocommit=True) as conn:
        await migrate_before(conn, 16)
        texts = ["Who is on call? The one on the left", "the deploy failed twice", "deployment of the left wing"]
        for i, text in enumerate(texts, 1):
            await conn.execute(
                "INSERT INTO messages (tenant, session_id, id, role, content, body_sha256, text_content, "
                "created_at, seq, updated_seq) VALUES ('t', 's', %s, 'user', '{}', 'x', %s, now(), %s, %s)",
                (f"m{i}", text, i, i),
            )

    assert "016_storage_indexes.sql" in await migrate(fresh_db)

    async with await psycopg.AsyncConnection.connect(fresh_db, autocommit=True) as conn:
        assert [h.id for h in await queries.search(conn, "t", None, "left", 10)] == ["m3", "m1"]  # shorter first
        assert [h.id for h in await queries.search(conn, "t", None, '"on the left"', 10)] == ["m1"]
        assert {h.id for h in await queries.search(conn, "t", "s", "dep*", 10)} == {"m2", "m3"}
        cur = await conn.execute(
            "SELECT relname, reloptions FROM pg_class WHERE relname IN ('messages_fts', 'search_entries_fts') "
            "ORDER BY 1"
        )
        assert await cur.fetchall() == [
            ("messages_fts", ["fastupdate=off"]),
            ("search_entries_fts", ["fastupdate=off"]),
        ]
        cur = await conn.execute("SELECT indexdef FROM pg_indexes WHERE indexname = 'messages_by_tenant_seq'")
        row = await cur.fetchone()
        assert row is not None
        assert row[0].endswith("(tenant, seq)")
