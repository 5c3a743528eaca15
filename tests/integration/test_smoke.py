from __future__ import annotations

import psycopg

from bench.data import create_baseline_table
from events.omitted import OMITTED
from projections import queries
from services.bootstrap import Container


async def test_append_and_read(stack: Container) -> None:
    c = stack
    r1 = await c.commands.append(
        "tenant-a", "smoke", {"id": "m1", "role": "user", "parts": [{"type": "text", "text": "hello world"}]}, OMITTED
    )
    r2 = await c.commands.append(
        "tenant-a", "smoke", {"id": "m2", "role": "assistant", "parts": [{"type": "text", "text": "hi"}]}, OMITTED
    )
    assert r2.parent_id == "m1"
    await c.waiter.wait_session("tenant-a", "smoke", r2.seq)
    async with c.pool.connection() as conn:
        rows = await queries.history(conn, "tenant-a", "smoke", "m2")
    assert [r.id for r in rows] == ["m1", "m2"]
    assert r1.created


async def test_message_bodies_are_stored_uncompressed_inline(stack: Container) -> None:
    """A history read returns every body on the path: a ~1 KB message is kept inline and not
    compressed (migration 008), so reads never pay decompression; a large one is still toasted."""
    c = stack
    small = {"id": "s1", "role": "user", "parts": [{"type": "text", "text": "word " * 200}]}
    large = {"id": "s2", "role": "user", "parts": [{"type": "text", "text": "word " * 4000}]}
    await c.commands.append("tenant-a", "inline", small, OMITTED)
    w = await c.commands.append("tenant-a", "inline", large, OMITTED)
    await c.waiter.wait_session("tenant-a", "inline", w.seq)
    async with c.pool.connection() as conn:
        cur = await conn.execute(
            "SELECT id, pg_column_compression(content), pg_column_size(content) < octet_length(content) "
            "FROM messages WHERE tenant = 'tenant-a' AND session_id = 'inline' ORDER BY id"
        )
        rows = await cur.fetchall()
    assert rows == [("s1", None, False), ("s2", "pglz", True)]


async def test_the_ingest_baseline_table_has_the_storage_of_messages(db_url: str) -> None:
    """The raw-insert baseline must write rows the way ``messages`` does, reloptions included."""
    async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as conn:
        await create_baseline_table(conn, "baseline_storage_check")
        try:
            cur = await conn.execute(
                "SELECT relname, reloptions FROM pg_class WHERE relname IN ('messages', 'baseline_storage_check')"
            )
            options: dict[str, list[str] | None] = dict(await cur.fetchall())
        finally:
            await conn.execute('DROP TABLE "baseline_storage_check"')
    assert options["messages"] == ["toast_tuple_target=8160"]
    assert options["baseline_storage_check"] == options["messages"]
