"""A long text is stored whole and indexed by its first 100,000 characters (migration 028).

Postgres refuses a tsvector over 1 MiB; a ~900 KB message of distinct words was acknowledged and
then quarantined as ``data_error`` (never readable). Now the message, and a search entry as long,
are stored and readable, the words of the first 100,000 characters are found and those after
are not, and a re-index, a rebuild and the migration of rows written before all give the vector
the live projector gives. Real NATS and Postgres."""

from __future__ import annotations

from typing import Any

import psycopg

from events.catalog import SearchEntryIndexed
from events.omitted import OMITTED
from events.publisher import Publisher
from projections import context_queries, queries, search_languages
from projections.migrate import migrate
from services.audit import readers as audit
from tests.conftest import make_settings, running_stack
from tests.integration.helpers import text_message
from tests.integration.test_search_oracle import chronicle_index
from tests.integration.test_search_split import insert_as_before_024
from tests.support import migrate_before

BOUND = 100_000
UNBOUNDED_WORDS = """CREATE OR REPLACE FUNCTION chronicle_search.words(content text) RETURNS text
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE AS $$ SELECT regexp_replace(content, '[!-/:-@[-`{-~]', ' ', 'g') $$"""
# The projector and search of today index and show through folded_words and folded_snippet
# (migration 029); before 029 they stand for the words() and snippet() used then.
AS_THEN = """CREATE OR REPLACE FUNCTION chronicle_search.folded_words(content text) RETURNS text
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE AS $$ SELECT chronicle_search.words(content) $$;
CREATE OR REPLACE FUNCTION chronicle_search.folded_snippet(config regconfig, content text, query tsquery) RETURNS text
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE AS $$ SELECT chronicle_search.snippet(config, content, query) $$"""


def word(i: int) -> str:
    """The i-th distinct word of letters only (one ``asciiword`` token, never a stop word)."""
    out = "zq"
    while True:
        i, r = divmod(i, 26)
        out += chr(ord("a") + r)
        if not i:
            return out


def distinct_words(chars: int) -> str:
    """About ``chars`` characters of distinct words: far more lexemes than a tsvector holds."""
    parts: list[str] = []
    n = 0
    while n < chars:
        parts.append(word(len(parts)))
        n += len(parts[-1]) + 1
    return " ".join(parts)


LONG = distinct_words(900_000)
WORDS = LONG.split(" ")
FIRST, LAST = WORDS[0], WORDS[-1]
# the last word that starts and ends inside the bound, and the first wholly past it
INSIDE = next(w for k, w in enumerate(WORDS) if len(" ".join(WORDS[: k + 1])) > BOUND - 50)
OUTSIDE = next(w for k, w in enumerate(WORDS) if len(" ".join(WORDS[:k])) > BOUND + 10)


async def found(conn: psycopg.AsyncConnection[Any], tenant: str, session: str) -> dict[str, list[str]]:
    return {q: [h.id for h in await queries.search(conn, tenant, session, q, 10)] for q in (FIRST, INSIDE, OUTSIDE)}


async def test_a_long_message_and_entry_are_stored_readable_and_indexed_by_their_first_part(
    nats_url: str, fresh_db: str
) -> None:
    settings = make_settings(nats_url, fresh_db)
    async with running_stack(settings) as c:
        r = await c.commands.append("t", "s", text_message("m1", LONG), OMITTED)
        entry = SearchEntryIndexed(tenant="t", session="s", label="kb", key="k1", content=LONG)
        seq = (await Publisher(c.js, c.layout).publish(entry)).seq
        await c.waiter.wait_all(max(seq, r.seq))
        async with c.pool.connection() as conn:
            cur = await conn.execute("SELECT count(*) FROM quarantine")
            assert await cur.fetchone() == (0,)
            [hit] = await queries.search(conn, "t", "s", FIRST, 10)
            assert hit.id == "m1"
            assert hit.content == LONG  # stored whole
            assert await found(conn, "t", "s") == {FIRST: ["m1"], INSIDE: ["m1"], OUTSIDE: []}
            assert await context_queries.search_entries(conn, "t", "s", "kb", INSIDE) == [("k1", LONG)]
            assert await context_queries.search_entries(conn, "t", "s", "kb", OUTSIDE) == []
            assert await context_queries.search_entries(conn, "t", "s", "kb", LAST) == []
            cur = await conn.execute("SELECT text_bytes FROM messages WHERE id = 'm1'")
            assert await cur.fetchone() == (len(LONG),)  # BM25's length stays the whole text's
            # a change of language re-indexes it the same way (it raised before, rolling back the change)
            assert await search_languages.apply(conn, {"t": "simple"}) == ["t"]
            assert await found(conn, "t", "s") == {FIRST: ["m1"], INSIDE: ["m1"], OUTSIDE: []}
            assert await search_languages.apply(conn, {}) == ["t"]
        report = await audit.verify(c)
        assert report.ok, report.differences
        assert (await audit.rebuild_and_swap(c)).swapped_at_seq > 0
        report = await audit.verify(c)
        assert report.ok, report.differences
        async with c.pool.connection() as conn:
            assert await found(conn, "t", "s") == {FIRST: ["m1"], INSIDE: ["m1"], OUTSIDE: []}


async def test_the_worst_case_vector_of_the_bound_is_well_under_the_limit(db_url: str) -> None:
    """Distinct one-character words of 4-byte letters (CJK Extension B) between spaces cost the
    most bytes per character of text; three times the bound of them is one vector all the same."""
    await migrate(db_url)
    text = " ".join(chr(0x20000 + i) for i in range(150_000))
    async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as conn:
        for config in ("chronicle_search.english", "chronicle_search.simple", "chronicle_search.russian"):
            cur = await conn.execute(
                "SELECT pg_column_size(to_tsvector(%s::regconfig, chronicle_search.words(%s))), "
                "length(to_tsvector(%s::regconfig, chronicle_search.words(%s)))",
                (config, text, config, text),
            )
            size, lexemes = await cur.fetchone() or (0, 0)
            # the first 100,000 characters: 50,000 words (a few of those code points are no letters)
            assert BOUND // 2 - 100 < lexemes <= BOUND // 2, (config, lexemes)
            assert size < 700_000, (config, size)  # of 1 MiB


async def test_long_rows_written_before_028_get_the_vector_the_projector_writes(fresh_db: str) -> None:
    """A text past the bound whose whole vector fitted (repeated words, then distinct ones) was
    indexed whole; the migration re-indexes such rows, and only them, as the projector does now."""
    fits = "alpha beta " * 50_000 + "tailword"
    short = "a short message"
    async with await psycopg.AsyncConnection.connect(fresh_db, autocommit=True) as conn:
        await migrate_before(conn, 28)
        await conn.execute(UNBOUNDED_WORDS)  # a database migrated to 024 before it bounded its words too
        await conn.execute(AS_THEN)
        await chronicle_index(fresh_db, [(0, 0, fits), (0, 1, short)], "t")  # the projector before 028
        await conn.execute(
            "INSERT INTO search_entries (tenant, session_id, label, key, content, created_seq, updated_seq) "
            "VALUES ('t', 's0', 'kb', 'k1', %s, 9, 9), ('t', 's0', 'kb', 'k2', %s, 10, 10)",
            (fits, short),
        )
        assert [h.id for h in await queries.search(conn, "t", "s0", "tailword", 10)] == ["m0"]
        assert await context_queries.search_entries(conn, "t", "s0", "kb", "tailword") == [("k1", fits)]
        cur = await conn.execute("SELECT id, ctid::text FROM messages ORDER BY id")
        before = {str(i): str(t) for i, t in await cur.fetchall()}

    assert "028_search_bounded_text.sql" in await migrate(fresh_db)

    async with await psycopg.AsyncConnection.connect(fresh_db, autocommit=True) as conn:
        assert await queries.search(conn, "t", "s0", "tailword", 10) == []
        assert await context_queries.search_entries(conn, "t", "s0", "kb", "tailword") == []
        assert [h.id for h in await queries.search(conn, "t", "s0", "alpha", 10)] == ["m0"]
        await chronicle_index(fresh_db, [(0, 0, fits), (0, 1, short)], "u", 10)  # the projector's rows now
        cur = await conn.execute(
            "SELECT a.id, a.content_tsv = b.content_tsv FROM messages a "
            "JOIN messages b ON b.tenant = 'u' AND b.id = a.id WHERE a.tenant = 't' ORDER BY a.id"
        )
        assert await cur.fetchall() == [("m0", True), ("m1", True)]
        cur = await conn.execute("SELECT id, ctid::text FROM messages WHERE tenant = 't' ORDER BY id")
        after = {str(i): str(t) for i, t in await cur.fetchall()}
        assert after["m1"] == before["m1"]  # within the bound: not written
        assert after["m0"] != before["m0"]


async def test_an_upgrade_from_before_024_reindexes_a_long_text_its_words_would_not_fit(fresh_db: str) -> None:
    """Migration 024 re-indexes each message as its words (``q1.z1`` is two of them now, one
    before). 50,000 such tokens made a vector of ~1.0 MB then and would make one of ~1.2 MB split:
    the upgrade's UPDATE failed, and the database could not be migrated. words() is bounded from
    024 on, as 028 defines it."""
    text = " ".join(f"q{i}.z{i}" for i in range(100_000, 150_000))
    async with await psycopg.AsyncConnection.connect(fresh_db, autocommit=True) as conn:
        await migrate_before(conn, 24)
        await insert_as_before_024(conn, "t", [text, "q100000 z100000 short"])
    applied = await migrate(fresh_db)
    assert "024_search_split_punctuation.sql" in applied
    assert "028_search_bounded_text.sql" in applied
    async with await psycopg.AsyncConnection.connect(fresh_db, autocommit=True) as conn:
        assert sorted(h.id for h in await queries.search(conn, "t", "s0", "z100000", 10)) == ["m0", "m1"]
        assert [h.id for h in await queries.search(conn, "t", "s0", "z149999", 10)] == []  # past the bound
        await chronicle_index(fresh_db, [(0, 0, text)], "u", 10)  # the projector's row now
        cur = await conn.execute(
            "SELECT a.content_tsv = b.content_tsv FROM messages a JOIN messages b ON b.tenant = 'u' AND b.id = a.id "
            "WHERE a.tenant = 't' AND a.id = 'm0'"
        )
        assert await cur.fetchone() == (True,)
