"""The search language of each tenant: which text search configuration indexes and parses its text.

A tenant's language is a setting (``CHRONICLE_SEARCH_LANGUAGES``), and the languages in force are
the ones the database keeps: ``chronicle migrate`` (and the first migration of a new database)
makes them the setting's; a service started with other ones keeps them and says so
(:func:`drift`), so a process started with an old setting never silently changes them back. A
rebuild takes them from the database too (:func:`stored`). :func:`apply` records them in the
read model, where the projector takes every new message's configuration from it and an insert
trigger (present only while some tenant is not English, so English costs nothing) gives every
new search entry of the tenant its configuration; it re-indexes the rows of a tenant whose
language changed. Queries
read the tenant's configuration from the same table (:func:`config_of`), so a query is always
parsed as the rows it searches were indexed. Tenants not named are English.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal, get_args

from psycopg import AsyncConnection

from projections.search_query import CONFIG

Language = Literal[
    "english", "simple", "german", "french", "spanish", "italian", "portuguese", "dutch", "swedish", "russian"
]
DEFAULT: Language = "english"
# language -> text search configuration (migration 010): english is Porter, as the reference's
# FTS5 tokenizer; simple does not stem; the others are Snowball stemmers. No configuration drops
# stop words.
LANGUAGES: dict[str, str] = {lang: f"chronicle_search.{lang}" for lang in get_args(Language)}
# search_entries' vector is generated from its stored text with the row's configuration, which the
# trigger sets; a message's text is not stored (migration 017): the projector computes its vector
# with the tenant's configuration itself, and a change of language re-derives it from the body
# (through chronicle_search.folded_words, which folds it as the projector does and cuts it at the
# bound the projector's vector has: migrations 028 and 029).
TRIGGERED = ("search_entries",)
REINDEX = {
    "messages": (
        ", content_tsv = to_tsvector(%(c)s::regconfig, "
        "chronicle_search.folded_words(chronicle_search.message_text(content)))"
    ),
    "search_entries": "",
}


async def config_of(conn: AsyncConnection[Any], tenant: str) -> str:
    """The configuration ``tenant``'s rows are indexed with."""
    cur = await conn.execute("SELECT config::text FROM search_languages WHERE tenant = %s", (tenant,))
    row = await cur.fetchone()
    return str(row[0]) if row else CONFIG


_BY_CONFIG: dict[str, Language] = {LANGUAGES[lang]: lang for lang in get_args(Language)}


async def stored(conn: AsyncConnection[Any]) -> dict[str, Language]:
    """The languages the database keeps (tenant -> language; tenants not named are English)."""
    cur = await conn.execute("SELECT tenant, config::text FROM search_languages")
    return {str(t): _BY_CONFIG[str(c)] for t, c in await cur.fetchall() if str(c) in _BY_CONFIG}


def drift(configured: Mapping[str, Language], kept: Mapping[str, Language]) -> list[str]:
    """``tenant: configured X, stored Y`` for each tenant whose language differs (sorted)."""
    tenants = sorted(configured.keys() | kept.keys())
    return [
        f"{t}: configured {configured.get(t, DEFAULT)}, stored {kept.get(t, DEFAULT)}"
        for t in tenants
        if configured.get(t, DEFAULT) != kept.get(t, DEFAULT)
    ]


def changes(tenants: Sequence[str], configured: Mapping[str, Language], kept: Mapping[str, Language]) -> list[str]:
    """``tenant (language, was language)`` for each of ``tenants`` (whose language :func:`apply`
    changed from ``kept`` to ``configured``), in order."""
    return [f"{t} ({configured.get(t, DEFAULT)}, was {kept.get(t, DEFAULT)})" for t in tenants]


async def apply(conn: AsyncConnection[Any], languages: Mapping[str, Language]) -> list[str]:
    """Make the read model match ``languages`` (tenant -> language); returns the
    tenants whose language changed, whose rows were re-indexed.

    A change locks the tables against writers for its transaction, so no row is inserted with the
    old language after the re-index has passed it. Without a change it only reads.
    """
    wanted = {t: LANGUAGES[lang] for t, lang in languages.items() if lang != DEFAULT}
    cur = await conn.execute("SELECT tenant, config::text FROM search_languages")
    current = {str(t): str(c) for t, c in await cur.fetchall()}
    changed = sorted(t for t in wanted.keys() | current.keys() if wanted.get(t) != current.get(t))
    if not changed:
        return []
    async with conn.transaction():
        await conn.execute("LOCK TABLE search_languages, messages, search_entries IN SHARE ROW EXCLUSIVE MODE")
        for tenant in changed:
            config = wanted.get(tenant, CONFIG)
            if tenant in wanted:
                await conn.execute(
                    "INSERT INTO search_languages (tenant, config) VALUES (%s, %s::regconfig) "
                    "ON CONFLICT (tenant) DO UPDATE SET config = excluded.config",
                    (tenant, config),
                )
            else:
                await conn.execute("DELETE FROM search_languages WHERE tenant = %s", (tenant,))
        for table in TRIGGERED:  # the insert trigger exists while some tenant is not English
            if wanted:
                await conn.execute(
                    f"CREATE OR REPLACE TRIGGER {table}_search_config BEFORE INSERT ON {table} "
                    "FOR EACH ROW EXECUTE FUNCTION chronicle_search.tenant_config()"
                )
            else:
                await conn.execute(f"DROP TRIGGER IF EXISTS {table}_search_config ON {table}")
        for tenant in changed:
            config = wanted.get(tenant, CONFIG)
            for table, reindex in REINDEX.items():
                await conn.execute(
                    f"UPDATE {table} SET search_config = %(c)s::regconfig{reindex} "
                    "WHERE tenant = %(t)s AND search_config <> %(c)s::regconfig",
                    {"c": config, "t": tenant},
                )
    return changed
