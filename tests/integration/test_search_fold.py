"""Search folds accents of Latin letters and compatibility forms on both sides (migration 029):
`cafe` finds "café" and `café` finds "cafe", as the reference's FTS5 ``unicode61`` tokenizer
finds them; `friday` finds "FRIDAY" in fullwidth letters and a fullwidth query finds "Friday".
Other scripts search as before (Cyrillic letters keep their marks, kana and Hangul come back
composed); snippets mark a word found through folding as the text writes it; the migration
re-indexes the rows written before it, and a rebuild (which runs every migration again) neither
differs from the live read model nor unfolds the live one meanwhile. Real NATS and Postgres."""

from __future__ import annotations

import itertools
import re
import sqlite3
import unicodedata
import uuid
from typing import Any

import psycopg
import pytest

from events.catalog import SearchEntryIndexed
from events.messages import stored_json
from events.omitted import OMITTED
from events.publisher import Publisher
from projections import context_queries, queries, search_languages
from projections.migrate import migrate
from tests.conftest import make_settings, running_stack
from tests.integration.helpers import assert_rebuild_equals_live, text_message
from tests.integration.test_search_oracle import chronicle_index
from tests.support import migrate_before

ACCENTED = "Une naïve idée au café: le résumé de Zoë, déjà vu à Genève"
PLAIN = "A naive idea at the cafe: Zoe's resume, deja vu in Geneve"
DECOMPOSED = unicodedata.normalize("NFD", "Un été à Noël")  # e and U+0301, as macOS writes file names


def fullwidth(text: str) -> str:
    """``text`` in fullwidth forms (U+FF01-U+FF5E for ASCII ``!``-``~``)."""
    return "".join(chr(ord(c) + 0xFEE0) if "!" <= c <= "~" else c for c in text)


FW_FRIDAY = fullwidth("FRIDAY")
FULLWIDTH = f"{FW_FRIDAY}: the ﬁnal review, ｶﾞｯｺｳ"  # fullwidth, a ligature, halfwidth kana
FRIDAY = "Meeting on Friday at the ガッコウ"
SYMBOL = "Acme™ widgets cost 5℃ less"
JAPANESE = "東京タワー に 行きました がっこう で べんきょう します"
KOREAN = "한국어 공부 를 합니다 서울 에서"
CHINESE = "我们 学习 中文 北京 天气 很好"
RUSSIAN = "мой йогурт и ёж"
GREEK = "η Ελλάδα είναι ωραία"
TEXTS = [ACCENTED, PLAIN, DECOMPOSED, FULLWIDTH, FRIDAY, SYMBOL, JAPANESE, KOREAN, CHINESE, RUSSIAN, GREEK]
M = {text: f"m{k}" for k, text in enumerate(TEXTS)}

# query -> the texts it finds
FOUND: dict[str, list[str]] = {
    "cafe": [ACCENTED, PLAIN],
    "café": [ACCENTED, PLAIN],
    "CAFÉ": [ACCENTED, PLAIN],
    "naive": [ACCENTED, PLAIN],
    "naïve": [ACCENTED, PLAIN],
    "résumé": [ACCENTED, PLAIN],
    "zoe": [ACCENTED, PLAIN],
    '"naive idea"': [PLAIN],  # ACCENTED has "naïve idée": another word (idee)
    '"naïve idée"': [ACCENTED],
    '"deja vu"': [ACCENTED, PLAIN],
    "caf*": [ACCENTED, PLAIN],
    "café*": [ACCENTED, PLAIN],
    "genè*": [ACCENTED, PLAIN],
    "ete": [DECOMPOSED],
    "été": [DECOMPOSED],
    "noel": [DECOMPOSED],
    "friday": [FULLWIDTH, FRIDAY],
    FW_FRIDAY: [FULLWIDTH, FRIDAY],
    "final": [FULLWIDTH],
    "ﬁnal": [FULLWIDTH],
    "ガッコウ": [FULLWIDTH, FRIDAY],
    "ｶﾞｯｺｳ": [FULLWIDTH, FRIDAY],
    "acme": [SYMBOL],  # ™ is no letter: it still ends the word (its form, TM, is a word of its own)
    "widget": [SYMBOL],
    "東京タワー": [JAPANESE],
    "がっこう": [JAPANESE],
    "べんきょう": [JAPANESE],
    "한국어": [KOREAN],
    "서울": [KOREAN],
    "学习": [CHINESE],
    "北京": [CHINESE],
    "йогурт": [RUSSIAN],
    "ёж": [RUSSIAN],
    "мой": [RUSSIAN],
    "Ελλάδα": [GREEK],
}
NOT_FOUND = [
    "мои",  # й keeps its breve: another letter than и
    "Ελλαδα",  # Greek keeps its tonos, as unicode61 does
    "acmetm",
    "naivete",
]


async def ids(conn: psycopg.AsyncConnection[Any], tenant: str, query: str) -> list[str]:
    return sorted(h.id for h in await queries.search(conn, tenant, "s0", query, 20))


async def entries(conn: psycopg.AsyncConnection[Any], tenant: str, query: str) -> list[str]:
    return sorted(k for k, _ in await context_queries.search_entries(conn, tenant, "s0", "kb", query, 20))


async def index_entries(conn: psycopg.AsyncConnection[Any], tenant: str, texts: list[str]) -> None:
    for k, text in enumerate(texts):
        await conn.execute(
            "INSERT INTO search_entries (tenant, session_id, label, key, content, created_seq, updated_seq) "
            "VALUES (%s, 's0', 'kb', %s, %s, %s, %s)",
            (tenant, f"m{k}", text, 100 + k, 100 + k),
        )


async def test_accents_widths_and_other_scripts_in_messages_and_entries(fresh_db: str) -> None:
    await migrate(fresh_db)
    await chronicle_index(fresh_db, [(0, k, t) for k, t in enumerate(TEXTS)], "t")
    async with await psycopg.AsyncConnection.connect(fresh_db, autocommit=True) as conn:
        await index_entries(conn, "t", TEXTS)
        for q, texts in FOUND.items():
            expected = sorted(M[t] for t in texts)
            assert await ids(conn, "t", q) == expected, q
            assert await entries(conn, "t", q) == expected, q
        for q in NOT_FOUND:
            assert await ids(conn, "t", q) == [], q
            assert await entries(conn, "t", q) == [], q


async def test_text_without_anything_to_fold_is_indexed_as_before(db_url: str) -> None:
    """Chinese, Japanese, Korean, Russian, Greek and ASCII text: folded_words is words, character
    for character (kana and Hangul decomposed and composed again come back as they were)."""
    await migrate(db_url)
    texts = [JAPANESE, KOREAN, CHINESE, RUSSIAN, GREEK, "plain ASCII, config.yaml", "がガぱパ각갂뷁 ヴ ゔ"]
    async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as conn:
        cur = await conn.execute(
            "SELECT t, chronicle_search.folded_words(t), chronicle_search.words(t) FROM unnest(%s::text[]) AS u(t)",
            (texts,),
        )
        for text, folded, words in await cur.fetchall():
            assert folded == words, text


@pytest.mark.parametrize(
    ("text", "folded"),
    [
        ("naïve café", "naive cafe"),
        (DECOMPOSED, "Un ete a Noel"),
        ("Việt Nam, ǅ, ĳ", "Viet Nam  Dz  ij"),  # several marks, digraphs, ligatures
        ("ø ß æ ł", "ø ß æ ł"),  # letters of their own, no mark: kept (as unicode61)
        (fullwidth("ABC123") + " ｶﾞ", "ABC123 ガ"),  # width; the halfwidth voiced mark composes again
        ("x² H₂O ①", "x2 H2O 1"),  # compatibility digits join their word (as unicode61 keeps ²)
        ("Acme™ 5℃", "Acme TM  5 °C "),  # a symbol with letters in its form stays apart
        ("й ё Ё ά ώ", "й ё Ё ά ώ"),  # marks of other scripts stay
        ("e\u0301\u0327 a\u0308\u0304", "e a"),  # stacked marks on a Latin letter
    ],
)
async def test_folded_words(db_url: str, text: str, folded: str) -> None:
    await migrate(db_url)
    async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as conn:
        cur = await conn.execute("SELECT chronicle_search.folded_words(%s)", (text,))
        assert await cur.fetchone() == (folded,)


async def test_chronicle_finds_what_fts5_unicode61_finds(fresh_db: str) -> None:
    """The reference's index (``porter unicode61``) on texts of accented Latin, Cyrillic and Greek
    words: every query finds, in Chronicle, every text FTS5 finds."""
    words = ["café", "cafe", "naïve", "naive", "résumé", "resume", "über", "uber", "Zoë", "zoe", "mañana",
             "manana", "été", "ete", "Ærø", "søren", "мой", "мои", "ёж", "еж", "Ελλάδα", "Ελλαδα"]  # fmt: skip
    texts = [" ".join(words[(k * 7 + j * 3) % len(words)] for j in range(4)) for k in range(40)]
    fts = sqlite3.connect(":memory:")
    fts.execute("CREATE VIRTUAL TABLE fts USING fts5(id UNINDEXED, content, tokenize='porter unicode61')")
    fts.executemany("INSERT INTO fts VALUES (?, ?)", [(f"m{k}", t) for k, t in enumerate(texts)])
    await migrate(fresh_db)
    await chronicle_index(fresh_db, [(0, k, t) for k, t in enumerate(texts)], "t")
    async with await psycopg.AsyncConnection.connect(fresh_db, autocommit=True) as conn:
        for w in words:
            theirs = sorted(str(r[0]) for r in fts.execute("SELECT id FROM fts WHERE fts MATCH ?", (f'"{w}"',)))
            assert theirs, w
            assert await ids(conn, "t", w) == theirs, w


async def test_snippets_mark_the_words_found_through_folding_as_written(fresh_db: str) -> None:
    await migrate(fresh_db)
    texts = [ACCENTED, PLAIN, FULLWIDTH, "Les cafés ferment; x½ et y", SYMBOL]
    await chronicle_index(fresh_db, [(0, k, t) for k, t in enumerate(texts)], "t")

    async def snippets(q: str) -> dict[str, str]:
        async with await psycopg.AsyncConnection.connect(fresh_db, autocommit=True) as conn:
            return {h.id: h.snippet for h in await queries.search(conn, "t", "s0", q, 10)}

    # (ts_headline leaves out words of up to three letters at a fragment's ends, as before)
    cafes = "**cafés** ferment"  # porter: cafés is café, folded cafe
    marked = {"m0": "naïve idée au **café**: le résumé de Zoë, déjà vu à Genève",
              "m1": "naive idea at the **cafe**: Zoe's resume, deja vu in Geneve", "m3": cafes}  # fmt: skip
    for q in ("cafe", "café", "caf*", "café*", "CAFÉ"):
        assert await snippets(q) == marked, q
    assert await snippets('"naive idea"') == {"m1": "**naive** **idea** at the cafe: Zoe's resume, deja vu in Geneve"}
    assert await snippets('"naïve idée"') == {"m0": "**naïve** **idée** au café: le résumé de Zoë, déjà vu à Genève"}
    assert await snippets("resume zoe") == {
        "m0": "naïve idée au café: le **résumé** de **Zoë**, déjà vu à Genève",
        "m1": "naive idea at the cafe: **Zoe**'s **resume**, deja vu in Geneve",
    }
    assert await snippets("friday") == {"m2": f"**{FW_FRIDAY}**: the ﬁnal review, ｶﾞｯｺｳ"}
    assert await snippets("final") == {"m2": f"{FW_FRIDAY}: the **ﬁnal** review, ｶﾞｯｺｳ"}
    # a word that folds to several ("x½" is x1 and 2) is found and not marked: no mark is wrong
    assert await snippets('"x1 2"') == {"m3": "Les cafés ferment; x½ et y"}
    assert await snippets("tm") == {"m4": "Acme™ widgets cost 5℃ less"}
    # ASCII text is marked as before
    assert await snippets("idea") == {"m1": "naive **idea** at the cafe: Zoe's resume, deja vu in Geneve"}


async def test_every_prefix_the_parser_lets_through_makes_a_query(db_url: str) -> None:
    """A prefix is letters and digits (Python's ``[^\\W_]``) and its folded words are quoted into
    to_tsquery: no letter or digit of the Basic Multilingual Plane folds to nothing or to tsquery
    syntax (to_tsquery raises on an empty quote)."""
    await migrate(db_url)
    chars = [c for c in map(chr, range(0x80, 0x10000)) if re.fullmatch(r"[^\W_]", c) and not 0xD800 <= ord(c) < 0xE000]
    async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as conn:
        cur = await conn.execute(
            "SELECT count(*), count(*) FILTER (WHERE btrim(chronicle_search.folded_words(p)) = '') "
            "FROM unnest(%s::text[]) AS u(p) "
            "WHERE to_tsquery('chronicle_search.english', '''' || chronicle_search.folded_words(p) || ''':*') "
            "IS NOT NULL",
            (chars,),
        )
        assert await cur.fetchone() == (len(chars), 0)
        for q in ("ﷺ*", "⑴*", "½*", "ｶﾞ*"):  # forms of several words or with punctuation
            assert await queries.search(conn, "t", "s0", q, 10) == [], q


async def insert_as_before_029(conn: psycopg.AsyncConnection[Any], tenant: str, texts: list[str]) -> None:
    """The rows the projector wrote before migration 029 (session ``s0``, ids m0, m1, ...: the
    vector of the text's words, not folded), and search entries of the same texts."""
    for k, text in enumerate(texts):
        body = {"id": f"m{k}", "role": "user", "parts": [{"type": "text", "text": text}]}
        await conn.execute(
            "INSERT INTO messages (tenant, session_id, id, role, content, body_sha256, content_tsv, text_bytes, "
            "created_at, seq, updated_seq) VALUES (%s, 's0', %s, 'user', %s, 'x', "
            "to_tsvector('chronicle_search.english', chronicle_search.words(%s)), octet_length(%s), now(), %s, %s)",
            (tenant, f"m{k}", stored_json(body), text, text, k + 1, k + 1),
        )
    await index_entries(conn, tenant, texts)


async def test_rows_written_before_029_are_reindexed_and_only_those_folding_changes(fresh_db: str) -> None:
    texts = [ACCENTED, PLAIN, FULLWIDTH, RUSSIAN, JAPANESE]
    async with await psycopg.AsyncConnection.connect(fresh_db, autocommit=True) as conn:
        await migrate_before(conn, 29)
        await insert_as_before_029(conn, "t", texts)
        cur = await conn.execute(  # before: "café" was the word café
            "SELECT (SELECT count(*) FROM messages WHERE content_tsv @@ 'cafe'::tsquery), "
            "(SELECT count(*) FROM search_entries WHERE content_tsv @@ 'cafe'::tsquery)"
        )
        assert await cur.fetchone() == (1, 1)
        cur = await conn.execute("SELECT id, ctid::text FROM messages ORDER BY id")
        before = {str(i): str(t) for i, t in await cur.fetchall()}

    assert "029_search_fold.sql" in await migrate(fresh_db)

    async with await psycopg.AsyncConnection.connect(fresh_db, autocommit=True) as conn:
        for q in ("cafe", "café", "friday", "йогурт", "がっこう"):
            expected = [f"m{texts.index(t)}" for t in FOUND[q] if t in texts]
            assert await ids(conn, "t", q) == sorted(expected), q
            assert await entries(conn, "t", q) == sorted(expected), q
        # the vectors are the projector's now (an append after the migration writes the same)
        await chronicle_index(fresh_db, [(0, k, t) for k, t in enumerate(texts)], "u", 100)
        cur = await conn.execute(
            "SELECT a.id, a.content_tsv = b.content_tsv FROM messages a "
            "JOIN messages b ON b.tenant = 'u' AND b.id = a.id WHERE a.tenant = 't' ORDER BY a.id"
        )
        assert await cur.fetchall() == [(f"m{k}", True) for k in range(len(texts))]
        cur = await conn.execute("SELECT id, ctid::text FROM messages WHERE tenant = 't' ORDER BY id")
        after = {str(i): str(t) for i, t in await cur.fetchall()}
        assert after["m1"] == before["m1"]  # ASCII: not written
        assert after["m3"] == before["m3"]  # Russian: nothing folds, not written
        assert after["m4"] == before["m4"]  # Japanese: nothing folds, not written
        assert after["m0"] != before["m0"]
        assert after["m2"] != before["m2"]
        cur = await conn.execute("SELECT relname, reloptions FROM pg_class WHERE relname = 'search_entries_fts'")
        assert await cur.fetchall() == [("search_entries_fts", ["fastupdate=on", "gin_pending_list_limit=128"])]
        # a change of language re-indexes them folded too
        assert await search_languages.apply(conn, {"t": "simple"}) == ["t"]
        assert await ids(conn, "t", "cafe") == ["m0", "m1"]
        assert await entries(conn, "t", "cafe") == ["m0", "m1"]


async def test_a_rebuild_equals_the_live_model_and_leaves_the_live_one_folding(nats_url: str, fresh_db: str) -> None:
    """Through the command service and the projector. A rebuild runs every migration again in its
    shadow schema; 024 and 028 define words() (unfolded) there again, and the live projector and
    searches, which use folded_words(), fold all the while."""
    settings = make_settings(nats_url, fresh_db)
    async with running_stack(settings) as c:
        last = 0
        for k, text in enumerate([ACCENTED, FULLWIDTH, KOREAN]):
            last = (await c.commands.append("t", "s", text_message(f"m{k}", text), OMITTED)).seq
        entry = SearchEntryIndexed(tenant="t", session="s", label="kb", key="k1", content=ACCENTED)
        last = max(last, (await Publisher(c.js, c.layout).publish(entry)).seq)
        await c.waiter.wait_all(last)
        await assert_rebuild_equals_live(c, fresh_db, f"rebuild-{uuid.uuid4().hex[:6]}")
        # the middle of a rebuild: the migrations before 029 applied to a shadow schema
        async with await psycopg.AsyncConnection.connect(fresh_db, autocommit=True) as conn:
            await conn.execute("CREATE SCHEMA mid_rebuild")
            await conn.execute("SET search_path TO mid_rebuild")
            await migrate_before(conn, 29)
        r = await c.commands.append("t", "s", text_message("m9", "Un autre café"), OMITTED)
        await c.waiter.wait_all(r.seq)
        async with c.pool.connection() as conn:
            assert sorted(h.id for h in await queries.search(conn, "t", "s", "cafe", 10)) == ["m0", "m9"]
            assert await context_queries.search_entries(conn, "t", "s", "kb", "cafe") == [("k1", ACCENTED)]
            assert [h.id for h in await queries.search(conn, "t", "s", "friday", 10)] == ["m1"]
            assert [h.id for h in await queries.search(conn, "t", "s", "한국어", 10)] == ["m2"]


async def test_a_text_folding_lengthens_is_bounded_after_folding(db_url: str) -> None:
    """Arabic ligatures whose forms are two to four letters (`ﷲ` is الله): 100,000 characters of
    distinct words of three of them fold to ~226,000; words() cuts the folded text at the bound of
    migration 028, so the vector stays well under Postgres's 1 MiB."""
    await migrate(db_url)
    ligatures = [chr(c) for c in range(0xFDF0, 0xFDFA)] + [chr(c) for c in range(0xFC00, 0xFC40)]
    text = " ".join("".join(w) for w in itertools.islice(itertools.product(ligatures, repeat=3), 25_000))
    async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as conn:
        for config in ("chronicle_search.english", "chronicle_search.simple"):
            cur = await conn.execute(
                "SELECT length(chronicle_search.fold(left(%(t)s, 100000))), "
                "pg_column_size(to_tsvector(%(c)s::regconfig, chronicle_search.folded_words(%(t)s)))",
                {"t": text, "c": config},
            )
            folded, size = await cur.fetchone() or (0, 0)
            assert folded > 2 * 100_000, folded
            assert size < 700_000, (config, size)
