"""Search queries: the user's syntax parsed into parts (pure), and the SQL that matches and ranks them.

Syntax (it never raises; anything else is words):

- ``"blue green"``: a phrase, its words adjacent and in order; an unclosed quote runs to the end;
- ``deploy*``: a prefix (of the stemmed word, as FTS5's porter tokenizer stems a prefix);
- every other whitespace-separated word must match, in any order; a word with punctuation inside
  (``blue-green``, ``it's``, ``client/server``, ``config.yaml``, ``bob@example.com``) is the phrase
  of its parts, as the reference quotes each word. Text is indexed, and a query parsed, as words
  between any characters that are not letters or digits (migration 024), as FTS5's ``unicode61``
  tokenizer splits it, and folded alike on both sides (migration 029): ``cafe`` and ``café``
  find "café" and "cafe" (accents of Latin letters, as unicode61 removes them), ``friday`` finds
  "FRIDAY" in fullwidth letters (compatibility forms: width, ligatures; unicode61 keeps those).
  Both are ``chronicle_search.folded_words``.

Ranking is Okapi BM25 (FTS5's ``bm25()``: k1 = 1.2, b = 0.75) with the parts as its terms:
term frequency from the stored positions, inverse document frequency over the search's scope,
document length in bytes of indexed text against the candidates' average. Two bounds keep every
query cheap: only the newest ``candidates`` matches are ranked, and document frequencies (needed
only when a query has several parts) come from the scope's newest ``sample`` messages (exact
whenever the scope is smaller).

Reference: the Cloudflare Agents SDK Session API, §1.3 and §7.6.1 of docs/reference.md.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Literal

# The text search configuration of a tenant without a language setting (migration 010).
CONFIG = "chronicle_search.english"
MAX_PARTS = 16  # later parts of a longer query are ignored (each part costs a term in the SQL)
MAX_QUERY_CHARS = 1000  # the longest query the search routes take; the tools find nothing for longer
K1 = 1.2
B = 0.75

_TOKEN = re.compile(r"[^\W_]+")
_QUOTED = re.compile(r'"([^"]*)"?')


@dataclass(frozen=True, slots=True)
class Part:
    """One term of a query: a word (or the phrase of a word's parts), a quoted phrase or a prefix."""

    kind: Literal["phrase", "prefix"]
    text: str


def parse(query: str) -> list[Part]:
    """The query's parts, in order, duplicates dropped; ``[]`` when nothing searchable is left."""
    parts: list[Part] = []
    pos = 0
    for m in _QUOTED.finditer(query):
        parts.extend(_words(query[pos : m.start()]))
        if _TOKEN.search(m.group(1)):
            parts.append(Part("phrase", " ".join(m.group(1).split())))
        pos = m.end()
    parts.extend(_words(query[pos:]))
    unique = list(dict.fromkeys(parts))
    return unique[:MAX_PARTS]


def _words(text: str) -> list[Part]:
    out: list[Part] = []
    for word in text.split():
        tokens = _TOKEN.findall(word)
        if not tokens:
            continue
        if word.endswith("*"):
            out.extend(Part("phrase", t) for t in tokens[:-1])
            out.append(Part("prefix", tokens[-1]))
        else:
            out.append(Part("phrase", word))
    return out


def part_sql(i: int, part: Part) -> str:
    """The tsquery of part ``i`` (its text is the parameter ``p{i}``; ``cfg`` the configuration)."""
    if part.kind == "prefix":
        # folded as the rows are (`café*` is `'cafe':*`). The prefix is letters and digits, and what
        # folded_words gives has no ASCII punctuation (it makes it spaces): no tsquery syntax, quote
        # or backslash can get in. Quoted, a prefix that folds to several words is their phrase,
        # each word a prefix, instead of a syntax error.
        return f"to_tsquery(%(cfg)s::regconfig, '''' || chronicle_search.folded_words(%(p{i})s::text) || ''':*')"
    # parsed as the rows are indexed (migrations 024, 029): `client/server` is the phrase `client server`
    return f"phraseto_tsquery(%(cfg)s::regconfig, chronicle_search.folded_words(%(p{i})s::text))"


def params(parts: list[Part], config: str = CONFIG) -> dict[str, Any]:
    return {"cfg": config} | {f"p{i}": p.text for i, p in enumerate(parts)}


def match_sql(parts: list[Part]) -> str:
    """All parts must match: one tsquery, written inline so the planner sees how common it is."""
    return "(" + " && ".join(part_sql(i, p) for i, p in enumerate(parts)) + ")"


def tf_sql(parts: list[Part], tsv: str) -> str:
    """Select-list items ``tf{i}``: how often part ``i`` occurs in the document ``tsv``.

    ``ts_rank_cd`` with unit weights and no normalisation counts a query's covers: the word's
    (prefix's, phrase's) occurrences.
    """
    tfs = (f"ts_rank_cd('{{1,1,1,1}}', {tsv}, {part_sql(i, p)}, 0)::float8 AS tf{i}" for i, p in enumerate(parts))
    return ", ".join(tfs)


def stats_sql(parts: list[Part], sample: str) -> str:
    """The CTE ``stats``: ``avgdl`` over the candidates (``scored.len``), and for a query of several
    parts ``n`` and ``df{i}`` over ``sample`` (a query selecting ``content_tsv``: the scope's newest
    rows). A query of one part needs no document frequency (its idf scales every score alike), so
    it reads no row beyond its candidates."""
    avgdl = "(SELECT greatest(avg(scored.len), 1) FROM scored)"
    if len(parts) == 1:
        return f"stats AS (SELECT {avgdl} AS avgdl)"
    dfs = "".join(
        f", count(*) FILTER (WHERE sample.content_tsv @@ {part_sql(i, p)})::float8 AS df{i}"
        for i, p in enumerate(parts)
    )
    return f"sample AS ({sample}), stats AS (SELECT {avgdl} AS avgdl, count(*)::float8 AS n{dfs} FROM sample)"


def bm25_sql(parts: list[Part], length: str, stats: str, cand: str) -> str:
    """BM25 of a candidate (``{cand}.tf{i}``, ``length``) against the statistics relation ``stats``."""
    norm = f"{K1} * (1 - {B} + {B} * {length} / {stats}.avgdl)"
    terms = []
    for i in range(len(parts)):
        idf = f"ln(1 + ({stats}.n - {stats}.df{i} + 0.5) / ({stats}.df{i} + 0.5)) * " if len(parts) > 1 else ""
        terms.append(f"{idf}{cand}.tf{i} * {K1 + 1} / ({cand}.tf{i} + {norm})")
    return " + ".join(terms)
