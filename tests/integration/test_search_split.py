"""Words joined by punctuation (``client/server``, ``config.yaml``, ``report_final.pdf``, e-mail
addresses, URLs) are indexed and searched as their parts, as the reference's FTS5 ``unicode61``
tokenizer splits them (migration 024): in messages (appended, edited, re-indexed for a language,
written before the migration) and in search entries, words, phrases and prefixes alike; snippets
highlight the words found and show the text as it is. Real Postgres."""

from __future__ import annotations

import random
import re
from datetime import UTC, datetime
from typing import Any

import psycopg
import pytest

from events.catalog import MessageUpdated, SearchEntryIndexed
from events.messages import body_hash, stored_json
from events.omitted import OMITTED
from events.publisher import Publisher
from projections import context_queries, queries, search_languages
from projections.history import HistoryProjection
from projections.migrate import migrate
from services.audit import readers as audit
from tests.conftest import make_settings, running_stack
from tests.integration.helpers import text_message
from tests.integration.test_search_oracle import chronicle_index
from tests.support import migrate_before

TEXT = "Compare client/server and TCP/IP; see config.yaml and report_final.pdf"
AT = datetime(2025, 1, 1, tzinfo=UTC)
PUNCTUATION = "!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~"


def body(message_id: str, text: str) -> dict[str, Any]:
    return {"id": message_id, "role": "user", "parts": [{"type": "text", "text": text}]}


async def append(db: str, tenant: str, texts: list[str], *, seq: int = 1) -> None:
    """The history projection's rows for these appends, in one session ``s0`` (ids m0, m1, ...)."""
    await chronicle_index(db, [(0, k, text) for k, text in enumerate(texts)], tenant, seq)


async def ids(conn: psycopg.AsyncConnection[Any], tenant: str, query: str) -> list[str]:
    return sorted(h.id for h in await queries.search(conn, tenant, "s0", query, 10))


FOUND = [
    "client", "server", "tcp", "ip", "config", "yaml", "report", "final", "pdf",
    "client/server", '"client server"', '"TCP/IP"', '"see config.yaml"', "report_final.pdf", "config.yaml",
    "conf*", "yam*", "fin*", "config.y*", '"report final pdf"',
]  # fmt: skip
NOT_FOUND = ['"server client"', '"config see"', "report.pdf", "yamlx*"]


async def test_joined_words_are_found_by_their_parts_in_messages_and_entries(fresh_db: str) -> None:
    await migrate(fresh_db)
    async with await psycopg.AsyncConnection.connect(fresh_db, autocommit=True) as conn:
        await append(fresh_db, "t", [TEXT, "User plans Lisbon/Porto trip.", "A state-of-the-art plan; it's done"])
        await conn.execute(
            "INSERT INTO search_entries (tenant, session_id, label, key, content, created_seq, updated_seq) "
            "VALUES ('t', 's0', 'kb', 'k1', %s, 9, 9), ('t', 's0', 'kb', 'k2', 'nothing joined here', 10, 10)",
            (TEXT,),
        )
        for q in FOUND:
            assert await ids(conn, "t", q) == ["m0"], q
            assert await context_queries.search_entries(conn, "t", "s0", "kb", q) == [("k1", TEXT)], q
        for q in NOT_FOUND:
            assert await ids(conn, "t", q) == [], q
            assert await context_queries.search_entries(conn, "t", "s0", "kb", q) == [], q
        assert await ids(conn, "t", "lisbon") == ["m1"]
        assert await ids(conn, "t", "porto") == ["m1"]
        # what already worked still does: hyphenated words and apostrophes
        assert await ids(conn, "t", "state") == ["m2"]
        assert await ids(conn, "t", '"state of the art"') == ["m2"]
        assert await ids(conn, "t", "it's") == ["m2"]
        # tenant-wide search too
        assert [h.id for h in await queries.search(conn, "t", None, "lisbon", 10)] == ["m1"]


async def test_live_services_find_the_parts_and_a_rebuild_equals_the_live_model(nats_url: str, fresh_db: str) -> None:
    """Through the command service and the projector: a verify finds the live rows as a replay
    computes them, and after a rebuild the same searches find the same rows."""
    settings = make_settings(nats_url, fresh_db)

    async def found(c: Any) -> tuple[list[str], list[tuple[str, str]]]:
        async with c.pool.connection() as conn:
            hits = [h.id for h in await queries.search(conn, "t", None, "lisbon yaml", 10)]
            return hits, await context_queries.search_entries(conn, "t", "s", "kb", '"config.yaml" final')

    async with running_stack(settings) as c:
        r = await c.commands.append("t", "s", text_message("m1", "Lisbon/Porto trip; " + TEXT), OMITTED)
        entry = SearchEntryIndexed(tenant="t", session="s", label="kb", key="k1", content=TEXT)
        seq = (await Publisher(c.js, c.layout).publish(entry)).seq
        await c.waiter.wait_all(max(seq, r.seq))
        assert await found(c) == (["m1"], [("k1", TEXT)])
        report = await audit.verify(c)
        assert report.ok, report.differences
        assert (await audit.rebuild_and_swap(c)).swapped_at_seq > 0
        assert await found(c) == (["m1"], [("k1", TEXT)])
        report = await audit.verify(c)
        assert report.ok, report.differences


async def test_addresses_urls_and_numbers_are_split_as_fts5_splits_them(fresh_db: str) -> None:
    """The README's former difference: e-mail addresses, URLs and host names are their parts now."""
    await migrate(fresh_db)
    text = "Mail bob@example.com or see https://docs.example.org/guide/setup?x=1 about v1.2.3 at 3.14 or -5"
    async with await psycopg.AsyncConnection.connect(fresh_db, autocommit=True) as conn:
        await append(fresh_db, "t", [text])
        for q in ("bob", "example", "com", "docs", "guide", "setup", "https", "v1", "14", "5",
                  "bob@example.com", '"docs.example.org"', "docs.example.org/guide", "v1.2.3", "3.14"):  # fmt: skip
            assert await ids(conn, "t", q) == ["m0"], q
        cur = await conn.execute("SELECT content_tsv::text FROM messages")
        assert await cur.fetchone() == (
            "'1':14 '14':21 '2':17 '3':18,20 '5':23 'about':15 'at':19 'bob':2 'com':4 'doc':8 'exampl':3,9 "
            "'guid':11 'http':7 'mail':1 'or':5,22 'org':10 'see':6 'setup':12 'v1':16 'x':13",
        )


async def test_snippets_highlight_the_parts_and_show_the_text_as_it_is(fresh_db: str) -> None:
    await migrate(fresh_db)
    async with await psycopg.AsyncConnection.connect(fresh_db, autocommit=True) as conn:
        await append(fresh_db, "t", [TEXT, "User plans Lisbon/Porto trip.", "A claim \ufdd0 about \ufdd1yaml, then"])
        [hit] = await queries.search(conn, "t", "s0", "yaml tcp", 10)
        assert hit.content == TEXT
        # ts_headline's fragment ends where it ends on the words alone ("... and report final")
        assert hit.snippet == "Compare client/server and **TCP**/IP; see config.**yaml** and report_final"
        [hit] = await queries.search(conn, "t", "s0", '"report_final"', 10)
        assert hit.snippet.endswith("and **report**_**final**")  # as on the words alone
        [hit] = await queries.search(conn, "t", "s0", "porto", 10)
        assert hit.snippet == "User plans Lisbon/**Porto** trip"  # a fragment ends with a word
        # a noncharacter of the text (the marks' stand-ins) makes no highlight of its own
        [hit] = await queries.search(conn, "t", "s0", "claim", 10)
        assert hit.snippet == "**claim** \ufffd about \ufffdyaml, then"


async def test_an_edit_and_a_change_of_language_reindex_the_parts(fresh_db: str) -> None:
    await migrate(fresh_db)
    async with await psycopg.AsyncConnection.connect(fresh_db, autocommit=True) as conn:
        await append(fresh_db, "t", ["nothing yet"])
        b = body("m0", "now see config.yaml")
        edit = MessageUpdated(
            tenant="t", session="s0", message_id="m0", role="user", body_sha256=body_hash(b), message=b, occurred_at=AT
        )
        async with conn.transaction():
            await HistoryProjection().apply(conn, [(2, edit)])
        assert await ids(conn, "t", "yaml") == ["m0"]
        assert await search_languages.apply(conn, {"t": "simple"}) == ["t"]
        assert await ids(conn, "t", "yaml") == ["m0"]
        assert await ids(conn, "t", '"config.yaml"') == ["m0"]
        cur = await conn.execute("SELECT content_tsv::text FROM messages")
        assert await cur.fetchone() == ("'config':3 'now':1 'see':2 'yaml':4",)


async def test_queries_of_punctuation_alone_find_nothing_and_never_raise(fresh_db: str) -> None:
    await migrate(fresh_db)
    async with await psycopg.AsyncConnection.connect(fresh_db, autocommit=True) as conn:
        await append(fresh_db, "t", [TEXT])
        for q in ("/", "./", '"./_"', "@*", "_*", "://", PUNCTUATION, f'"{PUNCTUATION}"', ".*"):
            assert await queries.search(conn, "t", "s0", q, 10) == [], q
            assert await context_queries.search_entries(conn, "t", "s0", "kb", q) == [], q
        # tsquery syntax joined to words is punctuation like any other
        assert await ids(conn, "t", "client&server") == ["m0"]
        assert await ids(conn, "t", "client|nothing") == []
        assert await ids(conn, "t", "tcp:*") == ["m0"]


def fts5_tokens(text: str) -> list[str]:
    """FTS5 unicode61's tokens of an ASCII text: runs of letters and digits, folded to lower case."""
    return [t.lower() for t in re.findall(r"[A-Za-z0-9]+", text)]


async def test_words_and_snippets_agree_with_fts5_tokens_on_random_texts(fresh_db: str) -> None:
    """Random texts of words, digits and every ASCII punctuation character: the indexed vector
    (``simple``: no stemming) is exactly FTS5's tokens at their positions, and a snippet's
    highlights are whole tokens equal to the word searched, in fragments of the text as it is."""
    await migrate(fresh_db)
    rng = random.Random(24)
    pieces = ["client", "server", "tcp", "ip", "yaml", "v1", "3", "14", "x"]
    texts: list[str] = []
    for _ in range(300):
        out = []
        for _ in range(rng.randint(1, 30)):
            out.append(rng.choice(pieces))
            out.append("".join(rng.choice([*PUNCTUATION, " ", " ", "\n"]) for _ in range(rng.randint(1, 3))))
        texts.append("".join(out))
    async with await psycopg.AsyncConnection.connect(fresh_db, autocommit=True) as conn:
        cur = await conn.execute(
            "SELECT t, to_tsvector('chronicle_search.simple', chronicle_search.words(t))::text, "
            "chronicle_search.snippet('chronicle_search.english', t, to_tsquery('chronicle_search.english', 'yaml')) "
            "FROM unnest(%s::text[]) AS u(t)",
            (texts,),
        )
        rows = await cur.fetchall()
    for text, vector, snippet in rows:
        positions: dict[str, list[int]] = {}
        for i, token in enumerate(fts5_tokens(text), 1):
            positions.setdefault(token, []).append(i)
        expected = " ".join(f"'{t}':{','.join(map(str, p))}" for t, p in sorted(positions.items()))
        assert vector == expected, text
        if "*" in text:
            continue  # its own ** would read as marks
        for fragment in snippet.split(" ... "):
            assert fragment.replace("**", "") in text, (text, snippet)
        highlighted = re.findall(r"\*\*(.*?)\*\*", snippet)
        assert all(h == "yaml" for h in highlighted), (text, snippet)
        assert bool(highlighted) == ("yaml" in positions), (text, snippet)


async def insert_as_before_024(conn: psycopg.AsyncConnection[Any], tenant: str, texts: list[str]) -> None:
    """The rows the projector wrote before migration 024 for these appends (session ``s0``, ids
    m0, m1, ...; the text parsed as it was, with no words of its own)."""
    for i, text in enumerate(texts):
        await conn.execute(
            "INSERT INTO messages (tenant, session_id, id, role, content, body_sha256, content_tsv, text_bytes, "
            "created_at, seq, updated_seq) VALUES (%s, 's0', %s, 'user', %s, 'x', "
            "to_tsvector('chronicle_search.english', %s), octet_length(%s), now(), %s, %s)",
            (tenant, f"m{i}", stored_json(body(f"m{i}", text)), text, text, i + 1, i + 1),
        )


async def test_rows_written_before_024_are_reindexed_and_only_they_are_rewritten(fresh_db: str) -> None:
    texts = [TEXT, "plain words, nothing joined here.", "User plans Lisbon/Porto trip."]
    async with await psycopg.AsyncConnection.connect(fresh_db, autocommit=True) as conn:
        await migrate_before(conn, 24)
        await insert_as_before_024(conn, "t", texts)
        await conn.execute(
            "INSERT INTO search_entries (tenant, session_id, label, key, content, created_seq, updated_seq) "
            "VALUES ('t', 's0', 'kb', 'k1', %s, 9, 9)",
            (TEXT,),
        )
        cur = await conn.execute(  # before: config.yaml was one word
            "SELECT (SELECT count(*) FROM messages WHERE content_tsv @@ 'yaml'::tsquery), "
            "(SELECT count(*) FROM search_entries WHERE content_tsv @@ 'yaml'::tsquery)"
        )
        assert await cur.fetchone() == (0, 0)
        cur = await conn.execute("SELECT id, ctid::text, text_bytes FROM messages ORDER BY id")
        before = {i: (ctid, n) for i, ctid, n in await cur.fetchall()}

    assert "024_search_split_punctuation.sql" in await migrate(fresh_db)

    async with await psycopg.AsyncConnection.connect(fresh_db, autocommit=True) as conn:
        assert await ids(conn, "t", "yaml") == ["m0"]
        assert await ids(conn, "t", "lisbon") == ["m2"]
        assert await context_queries.search_entries(conn, "t", "s0", "kb", "yaml") == [("k1", TEXT)]
        # the vectors are the projector's now (an append after the migration writes the same)
        await append(fresh_db, "u", texts, seq=10)
        cur = await conn.execute(
            "SELECT a.id, a.content_tsv = b.content_tsv, a.text_bytes = b.text_bytes FROM messages a "
            "JOIN messages b ON b.tenant = 'u' AND b.id = a.id WHERE a.tenant = 't' ORDER BY a.id"
        )
        assert await cur.fetchall() == [("m0", True, True), ("m1", True, True), ("m2", True, True)]
        cur = await conn.execute("SELECT id, ctid::text, text_bytes FROM messages WHERE tenant = 't' ORDER BY id")
        after = {i: (ctid, n) for i, ctid, n in await cur.fetchall()}
        assert after["m1"] == before["m1"]  # nothing joined: the row was not written
        assert after["m0"][0] != before["m0"][0]
        assert after["m0"][1] == before["m0"][1]  # the length stays the text's
        cur = await conn.execute("SELECT relname, reloptions FROM pg_class WHERE relname = 'search_entries_fts'")
        assert await cur.fetchall() == [("search_entries_fts", ["fastupdate=on", "gin_pending_list_limit=128"])]


@pytest.mark.parametrize("text", ["", "   ", PUNCTUATION, "ünïcödé/wörds café—au—lait", "日本/東京.txt"])
async def test_words_keeps_what_is_not_ascii_punctuation(db_url: str, text: str) -> None:
    """Only ASCII characters that are not letters or digits become spaces, one for one; the rest is
    left to the parser (which splits at a non-ASCII character that is no letter or digit)."""
    await migrate(db_url)
    async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as conn:
        cur = await conn.execute("SELECT chronicle_search.words(%s)", (text,))
        row = await cur.fetchone()
    assert row is not None
    assert row[0] == "".join(" " if c in PUNCTUATION else c for c in text)
