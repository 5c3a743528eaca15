"""No query a user can type makes search fail: random strings of syntax characters, quotes,
scripts and symbols through message search and search_context, against real Postgres."""

from __future__ import annotations

import random

import psycopg

from events.messages import stored_json, text_of
from projections import context_queries, queries
from projections.migrate import migrate

ALPHABET = [*"abc XYZ\"'*:&|!()<->\\_-.,;%{}[]$@#~`^+=?/\t\n", "²", "٣", "日本", "é", "ß", "\u200b", "\U0001f600", "ǅ"]


async def test_random_queries_never_raise(fresh_db: str) -> None:
    await migrate(fresh_db)
    async with await psycopg.AsyncConnection.connect(fresh_db, autocommit=True) as conn:
        body = {"id": "m", "role": "user", "parts": [{"type": "text", "text": "abc xyz the 日本 café ß"}]}
        await conn.execute(
            "INSERT INTO messages (tenant, session_id, id, role, content, body_sha256, content_tsv, text_bytes, "
            "created_at, seq, updated_seq) VALUES ('t', 's', 'm', 'user', %s, 'x', "
            "to_tsvector('chronicle_search.english', %s), 20, now(), 1, 1)",
            (stored_json(body), text_of(body)),
        )
        await conn.execute(
            "INSERT INTO search_entries (tenant, session_id, label, key, content, created_seq, updated_seq) "
            "VALUES ('t', 's', 'kb', 'k', 'abc xyz the 日本 café ß', 2, 2)"
        )
        rng = random.Random(16)
        found = 0
        for i in range(400):
            q = "".join(rng.choice(ALPHABET) for _ in range(rng.randint(0, 24)))
            hits = await queries.search(conn, "t", "s" if i % 2 else None, q, 5)
            entries = await context_queries.search_entries(conn, "t", "s", "kb", q)
            assert {h.id for h in hits} <= {"m"}
            assert len(entries) <= 1
            found += len(hits)
        assert found > 0  # some of them match: the queries are searched, not dropped
