"""Search migrations on a database that already holds messages and search entries: the rows
written before 010 become searchable the new way (stop words kept, Porter stems, phrases); rows
written before 016 and 017 (storage) are found and ranked as before, and show the same text."""

from __future__ import annotations

import random
from typing import Any

import psycopg
import pytest

from events.messages import stored_json, text_of
from projections import context_queries, queries
from projections.migrate import migrate
from tests.support import migrate_before
from tests.unit.test_history_plan import TEXT_CASES


def body_json(message_id: str, text: str) -> str:
    """A message's stored body, as the projector writes it: the text in a text part."""
    return stored_json({"id": message_id, "role": "user", "parts": [{"type": "text", "text": text}]})


async def test_existing_rows_are_reindexed(fresh_db: str) -> None:
    async with await psycopg.AsyncConnection.connect(fresh_db, autocommit=True) as conn:
        await migrate_before(conn, 10)
        text = "Who is on call? The one on the left"
        await conn.execute(
            "INSERT INTO messages (tenant, session_id, id, role, content, body_sha256, text_content, created_at, "
            "seq, updated_seq) VALUES ('t', 's', 'm1', 'user', %s, 'x', %s, now(), 1, 1)",
            (body_json("m1", text), text),
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


async def test_rows_written_before_016_and_017_stay_searchable(fresh_db: str) -> None:
    """Migration 016 (storage, issue #13): tenant-wide newest-first reads use the ascending index
    backwards; the FTS indexes keep a small pending list (018). Migration 017: the text is no longer
    stored; rows written before keep their vectors, get their length from their bodies, and search
    finds, ranks and shows them as before."""
    texts = ["Who is on call? The one on the left", "the deploy failed twice", "deployment of the left wing"]
    queries_before = ("left", '"on the left"', "dep*", "the")  # searched after the migration
    async with await psycopg.AsyncConnection.connect(fresh_db, autocommit=True) as conn:
        await migrate_before(conn, 16)
        for i, text in enumerate(texts, 1):
            await conn.execute(
                "INSERT INTO messages (tenant, session_id, id, role, content, body_sha256, text_content, "
                "created_at, seq, updated_seq) VALUES ('t', 's', %s, 'user', %s, 'x', %s, now(), %s, %s)",
                (f"m{i}", body_json(f"m{i}", text), text, i, i),
            )
        cur = await conn.execute("SELECT id, content_tsv::text, octet_length(text_content) FROM messages ORDER BY id")
        rows = await cur.fetchall()

    assert {"016_storage_indexes.sql", "017_messages_text_derived.sql"} <= set(await migrate(fresh_db))

    async with await psycopg.AsyncConnection.connect(fresh_db, autocommit=True) as conn:
        cur = await conn.execute("SELECT id, content_tsv::text, text_bytes FROM messages ORDER BY id")
        assert await cur.fetchall() == rows  # the same vectors, the same lengths
        after = {q: await queries.search(conn, "t", None, q, 10) for q in queries_before}
        assert [h.id for h in after["left"]] == ["m3", "m1"]  # shorter first
        assert [h.id for h in after['"on the left"']] == ["m1"]
        assert {h.id for h in after["dep*"]} == {"m2", "m3"}
        assert [h.id for h in after["the"]] == ["m1", "m2", "m3"]  # twice in m1; then the shorter (lengths kept)
        shown = {h.id: (h.content, h.snippet) for h in after["left"]}
        assert shown["m1"] == (texts[0], "call? The one on the **left**")  # the text, from the body
        cur = await conn.execute(
            "SELECT attname, attgenerated FROM pg_attribute WHERE attrelid = 'messages'::regclass "
            "AND attname IN ('content_tsv', 'text_content') AND NOT attisdropped"
        )
        assert await cur.fetchall() == [("content_tsv", "")]  # a plain column, the text gone
        cur = await conn.execute(
            "SELECT relname, reloptions FROM pg_class WHERE relname IN ('messages_fts', 'search_entries_fts') "
            "ORDER BY 1"
        )
        small_list = ["fastupdate=on", "gin_pending_list_limit=128"]  # migration 018
        assert await cur.fetchall() == [("messages_fts", small_list), ("search_entries_fts", small_list)]
        cur = await conn.execute("SELECT indexdef FROM pg_indexes WHERE indexname = 'messages_by_tenant_seq'")
        row = await cur.fetchone()
        assert row is not None
        assert row[0].endswith("(tenant, seq)")


@pytest.mark.parametrize(("body", "text"), TEXT_CASES)
async def test_message_text_derives_the_text_that_text_of_does(db_url: str, body: dict[str, Any], text: str) -> None:
    """chronicle_search.message_text (migration 017) over a stored body is events.messages.text_of."""
    await migrate(db_url)
    async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as conn:
        cur = await conn.execute("SELECT chronicle_search.message_text(%s)", (stored_json(body),))
        assert await cur.fetchone() == (text,)
        assert text_of(body) == text


async def test_message_text_agrees_with_text_of_on_random_bodies(db_url: str) -> None:
    rng = random.Random(15)
    leaves: list[Any] = ["text", "Text", "", "a b", 'q"\\', "\n", "é🙂", 1, 2.5, None, True, [], {}]

    def part() -> Any:
        p = {k: rng.choice(leaves) for k in rng.sample(["type", "text", "x"], rng.randint(0, 3))}
        return p if rng.random() < 0.9 else rng.choice(leaves)

    bodies = [{"id": "m", "role": "user", "parts": [part() for _ in range(rng.randint(0, 4))]} for _ in range(300)]
    bodies += [{"id": "m", "parts": rng.choice(leaves)} for _ in range(20)]
    await migrate(db_url)
    async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as conn:
        cur = await conn.execute(
            "SELECT chronicle_search.message_text(b) FROM unnest(%s::text[]) WITH ORDINALITY AS u(b, i) ORDER BY i",
            ([stored_json(b) for b in bodies],),
        )
        assert [r[0] for r in await cur.fetchall()] == [text_of(b) for b in bodies]


async def test_a_message_is_found_while_its_lexemes_wait_in_the_pending_list(db_url: str) -> None:
    """Migration 018: a new row's lexemes go to the index's small pending list first; search finds
    it there, and the list is merged (by the insert that fills it, or here by hand) without loss."""
    await migrate(db_url)
    async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as conn:
        await conn.execute("SELECT gin_clean_pending_list('messages_fts'::regclass)")  # an empty list to begin
        text = "the zebracorn deploys at dawn"
        await conn.execute(
            "INSERT INTO messages (tenant, session_id, id, role, content, body_sha256, content_tsv, text_bytes, "
            "created_at, seq, updated_seq) VALUES ('pending', 's', 'm1', 'user', %s, 'x', "
            "to_tsvector('chronicle_search.english', %s), %s, now(), 1, 1)",
            (body_json("m1", text), text, len(text)),
        )
        assert [h.id for h in await queries.search(conn, "pending", "s", "zebracorn", 10)] == ["m1"]
        cur = await conn.execute("SELECT gin_clean_pending_list('messages_fts'::regclass)")
        row = await cur.fetchone()
        assert row is not None
        assert row[0] >= 1  # the row was found in the list, and only now merged
        assert [h.id for h in await queries.search(conn, "pending", "s", "zebracorn", 10)] == ["m1"]
