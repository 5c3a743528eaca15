"""Benchmark data: deterministic English-ish messages, their events, their rows, and raw loaders.

The corpus is pseudo-random but reproducible (a fixed seed): sentences of common English words
with Zipf-like frequencies, so a common word matches most messages, plus two rare made-up words per
message, so a selective query matches a handful. The same corpus feeds the events (ingest,
rebuild), the raw-insert baseline and the direct ``COPY`` loader (history, search), so Chronicle
and its baselines always write identical rows.
"""

from __future__ import annotations

import itertools
import random
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg

from events.catalog import MessageAppended
from events.messages import body_hash, stored_json, text_of
from projections.search_query import CONFIG

TENANT = "bench"
EPOCH = datetime(2025, 1, 1, tzinfo=UTC)

# Frequent English words, most frequent first (stop words included, as in real text).
_COMMON_WORDS = (
    "the of and to a in is it you that he was for on are with as i his they be at one have this from or had by "
    "hot word but what some we can out other were all there when up use your how said an each she which do their "
    "time if will way about many then them write would like so these her long make thing see him two has look more "
    "day could go come did number sound no most people my over know water than call first who may down side been "
    "now find any new work part take get place made live where after back little only round man year came show "
    "every good me give our under name very through just form sentence great think say help low line differ turn "
    "cause much mean before move right boy old too same tell does set three want air well also play small end put "
    "home read hand port large spell add even land here must big high such follow act why ask men change went "
    "light kind off need house picture try us again animal point mother world near build self earth father head "
    "stand own page should country found answer school grow study still learn plant cover food sun four between "
    "state keep eye never last let thought city tree cross farm hard start might story saw far sea draw left late "
    "run while press close night real life few north open seem together next white children begin got walk "
    "example ease paper group always music those both mark often letter until mile river car feet care second "
    "book carry took science eat room friend began idea fish mountain stop once base hear horse cut sure watch "
    "color face wood main enough plain girl usual young ready above ever red list though feel talk bird soon body "
    "dog family direct pose leave song measure door product black short numeral class wind question happen "
    "complete ship area half rock order fire south problem piece told knew pass since top whole king space heard "
    "best hour better true during hundred five remember step early hold west ground interest reach fast verb sing "
    "listen six table travel less morning ten simple several vowel toward war lay against pattern slow center "
    "love person money serve appear road map rain rule govern pull cold notice voice unit power town fine certain "
    "fly fall lead cry dark machine note wait plan figure star box noun field rest correct able pound done beauty "
    "drive stood contain front teach week final gave green quick develop ocean warm free minute strong special "
    "mind behind clear tail produce fact street inch multiply nothing course stay wheel full force blue object "
    "decide surface deep moon island foot system busy test record boat common gold possible plane stead dry "
    "wonder laugh thousand ago ran check game shape equate miss brought heat snow tire bring yes distant fill east "
    "paint language among deploy server request database agent memory session context summary token model"
)
COMMON = tuple(_COMMON_WORDS.split())

_SYLLABLE_TEXT = "ka lo mi ra tu ve zo ni pe sa du fi go ha je ku ly mo nu qui ro si ta wu"
_SYLLABLES = _SYLLABLE_TEXT.split()
# Made-up words (13,824): each message carries two, so each one matches about N / 6,912 messages.
RARE = tuple("".join(s) + "n" for s in itertools.product(_SYLLABLES, repeat=3))
# A frequent word that the English configuration neither drops nor shares with many stems.
COMMON_QUERY = "people"

SENTENCES = 4096
TEXT_BYTES = 1000


@dataclass(frozen=True, slots=True)
class Msg:
    """One generated message: where it goes, its tree position and its body."""

    index: int
    session: str
    id: str
    parent_id: str | None
    body: dict[str, Any]
    rare: tuple[str, str]


class Corpus:
    """Reproducible ~1 KB messages; the same seed gives the same texts in the same order."""

    def __init__(self, seed: int = 7, text_bytes: int = TEXT_BYTES) -> None:
        self._rng = random.Random(seed)  # noqa: S311 - test data, not security
        self._text_bytes = text_bytes
        weights = list(itertools.accumulate(1.0 / (rank + 1) for rank in range(len(COMMON))))
        self._sentences: list[str] = []
        for _ in range(SENTENCES):
            words = self._rng.choices(COMMON, cum_weights=weights, k=self._rng.randint(6, 18))
            self._sentences.append(" ".join(words).capitalize() + ".")

    def text(self) -> tuple[str, tuple[str, str]]:
        """A text of about ``text_bytes`` characters and the two rare words it contains."""
        rng = self._rng
        rare = (RARE[rng.randrange(len(RARE))], RARE[rng.randrange(len(RARE))])
        parts: list[str] = []
        size = 0
        while size < self._text_bytes:
            sentence = self._sentences[rng.randrange(SENTENCES)]
            parts.append(sentence)
            size += len(sentence) + 1
        parts.insert(rng.randrange(len(parts) + 1), rare[0])
        parts.insert(rng.randrange(len(parts) + 1), rare[1])
        return " ".join(parts), rare


def session_name(i: int) -> str:
    return f"s{i:05d}"


def message_id(k: int) -> str:
    return f"m{k:07d}"


def messages(count: int, sessions: int, *, seed: int = 7, prefix: str = "") -> Iterator[Msg]:
    """``count`` messages dealt round-robin over ``sessions`` sessions, one chain per session."""
    corpus = Corpus(seed)
    last: dict[int, str] = {}
    for i in range(count):
        s = i % sessions
        mid = message_id(i // sessions)
        text, rare = corpus.text()
        body = {"id": mid, "role": "user" if i % 2 == 0 else "assistant", "parts": [{"type": "text", "text": text}]}
        yield Msg(i, prefix + session_name(s), mid, last.get(s), body, rare)
        last[s] = mid


def chain(session: str, length: int, *, seed: int = 11) -> Iterator[Msg]:
    """One linear branch of ``length`` messages in ``session``."""
    corpus = Corpus(seed)
    parent: str | None = None
    for k in range(length):
        mid = message_id(k)
        text, rare = corpus.text()
        body = {"id": mid, "role": "user" if k % 2 == 0 else "assistant", "parts": [{"type": "text", "text": text}]}
        yield Msg(k, session, mid, parent, body, rare)
        parent = mid


def to_event(m: Msg) -> MessageAppended:
    return MessageAppended(
        tenant=TENANT,
        session=m.session,
        message_id=m.id,
        parent_id=m.parent_id,
        role=str(m.body["role"]),
        body_sha256=body_hash(m.body),
        message=m.body,
        occurred_at=EPOCH + timedelta(milliseconds=m.index),
    )


# A message row as generated: its columns in ``messages`` but the text in place of its vector and
# length (the text is not stored: migration 017).
ROW_COLUMNS = (
    "tenant, session_id, id, parent_id, role, content, body_sha256, indexed_text, created_at, seq, updated_seq"
)
Row = tuple[str, str, str, str | None, str, str, str | None, str, datetime, int, int]
# What a projector writes into ``messages``, from a relation of ``ROW_COLUMNS`` (``{source}``).
INSERT_ROWS = (
    "INSERT INTO {table} (tenant, session_id, id, parent_id, role, content, body_sha256, content_tsv, text_bytes, "
    "created_at, seq, updated_seq) SELECT tenant, session_id, id, parent_id, role, content, body_sha256, "
    f"to_tsvector('{CONFIG}'::regconfig, chronicle_search.folded_words(indexed_text)), octet_length(indexed_text), "
    "created_at, seq, updated_seq "
    "FROM {source}"
)


def to_row(m: Msg, seq: int) -> Row:
    at = EPOCH + timedelta(milliseconds=m.index)
    return (
        TENANT,
        m.session,
        m.id,
        m.parent_id,
        str(m.body["role"]),
        stored_json(m.body),
        None,  # the hash is the body's own: a row keeps none (migration 019)
        text_of(m.body),
        at,
        seq,
        seq,
    )


async def create_baseline_table(conn: psycopg.AsyncConnection[Any], name: str) -> None:
    """A scratch table exactly like ``messages``: columns, generated tsvector, primary key, GIN,
    and its storage parameters (``LIKE`` does not copy those)."""
    await conn.execute(f'DROP TABLE IF EXISTS "{name}"')
    await conn.execute(f'CREATE TABLE "{name}" (LIKE messages INCLUDING ALL)')
    cur = await conn.execute("SELECT reloptions FROM pg_class WHERE oid = 'messages'::regclass")
    row = await cur.fetchone()
    if row and row[0]:
        await conn.execute(f'ALTER TABLE "{name}" SET ({", ".join(row[0])})')


async def baseline_insert(
    conninfo: str,
    rows: list[Row],
    *,
    table: str = "bench_baseline",
    batch: int = 1000,
    progress: Callable[[int, int], None] | None = None,
) -> float:
    """Seconds to insert ``rows`` with plain psycopg ``executemany``, one transaction a batch."""
    values = "(VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s::timestamptz, %s::bigint, %s::bigint))"
    sql = INSERT_ROWS.format(table=f'"{table}"', source=f"{values} AS v({ROW_COLUMNS})")
    async with await psycopg.AsyncConnection.connect(conninfo, autocommit=True) as conn:
        await create_baseline_table(conn, table)
        start = time.perf_counter()
        for i in range(0, len(rows), batch):
            async with conn.transaction(), conn.cursor() as cur:
                await cur.executemany(sql, rows[i : i + batch])
            if progress is not None:
                progress(min(i + batch, len(rows)), len(rows))
        elapsed = time.perf_counter() - start
        await conn.execute(f'DROP TABLE "{table}"')
    return elapsed


async def copy_rows(conninfo: str, rows: Iterable[Row], *, on_row: Callable[[], None] | None = None) -> int:
    """``COPY`` rows into ``messages`` on one connection (one transaction, through a temporary
    table: each vector is computed by the backend); returns the count."""
    n = 0
    async with await psycopg.AsyncConnection.connect(conninfo) as conn:
        async with conn.cursor() as cur:
            await cur.execute(
                "CREATE TEMP TABLE bench_rows (tenant text, session_id text, id text, parent_id text, role text, "
                "content text, body_sha256 text, indexed_text text, created_at timestamptz, seq bigint, "
                "updated_seq bigint) ON COMMIT DROP"
            )
            async with cur.copy(f"COPY bench_rows ({ROW_COLUMNS}) FROM STDIN") as copy:
                for row in rows:
                    await copy.write_row(row)
                    n += 1
                    if on_row is not None:
                        on_row()
            await cur.execute(INSERT_ROWS.format(table="messages", source="bench_rows"))
        await conn.commit()
    return n


async def add_sessions(conninfo: str, names: Iterable[str], last_seq: int) -> None:
    """Session rows for directly loaded messages (the history projection would have made them)."""
    async with await psycopg.AsyncConnection.connect(conninfo, autocommit=True) as conn, conn.cursor() as cur:
        await cur.executemany(
            "INSERT INTO sessions (tenant, id, created_at, updated_at, created_seq, last_seq) "
            "VALUES (%s, %s, %s, %s, %s, %s) ON CONFLICT DO NOTHING",
            [(TENANT, s, EPOCH, EPOCH, 1, last_seq) for s in names],
        )
