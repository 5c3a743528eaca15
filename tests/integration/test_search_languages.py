"""A search language per tenant: rows are indexed, and queries parsed, in the tenant's language;
changing it re-indexes the tenant's rows and nobody else's."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from datetime import UTC, datetime

import psycopg
import pytest
from pydantic import ValidationError

from events.catalog import MessageAppended
from events.messages import body_hash
from events.omitted import OMITTED
from projections import context_queries, queries, search_languages
from projections.history import HistoryProjection
from projections.migrate import migrate
from services.audit import readers as audit
from services.bootstrap import prepare_database
from services.settings import Settings
from tests.conftest import make_settings, running_stack
from tests.integration.helpers import text_message


def appended(tenant: str, mid: str, text: str) -> MessageAppended:
    body = {"id": mid, "role": "user", "parts": [{"type": "text", "text": text}]}
    return MessageAppended(
        tenant=tenant,
        session="s",
        message_id=mid,
        parent_id=None,
        role="user",
        body_sha256=body_hash(body),
        message=body,
        occurred_at=datetime(2025, 1, 1, tzinfo=UTC),
    )


async def ids(conn: psycopg.AsyncConnection[object], tenant: str, q: str) -> list[str]:
    return [h.id for h in await queries.search(conn, tenant, "s", q, 10)]


async def test_each_tenant_is_indexed_and_searched_in_its_language(fresh_db: str) -> None:
    await migrate(fresh_db)
    async with await psycopg.AsyncConnection.connect(fresh_db, autocommit=True) as conn:
        assert await search_languages.apply(conn, {"a": "english", "b": "simple"}) == ["b"]
        assert await search_languages.apply(conn, {"a": "english", "b": "simple"}) == []  # no change
        # search entries take theirs from a trigger; the projector gives a message its own (017)
        cur = await conn.execute("SELECT tgname FROM pg_trigger WHERE tgname LIKE '%%search_config'")
        assert await cur.fetchall() == [("search_entries_search_config",)]
        async with conn.transaction():
            await HistoryProjection().apply(
                conn, [(1, appended("a", "m1", "running the tests")), (2, appended("b", "m1", "running the tests"))]
            )
        await conn.execute(
            "INSERT INTO search_entries (tenant, session_id, label, key, content, created_seq, updated_seq) "
            "VALUES ('b', 's', 'kb', 'k', 'Die Häuser laufen', 3, 3)"
        )
        assert await ids(conn, "a", "run") == ["m1"]  # English: Porter
        assert await ids(conn, "b", "run") == []  # simple: no stemming
        assert await ids(conn, "b", "running") == ["m1"]
        assert await context_queries.search_entries(conn, "b", "s", "kb", "haus") == []

        # German for b: b's rows are re-indexed, a's are untouched
        assert await search_languages.apply(conn, {"b": "german"}) == ["b"]
        assert await context_queries.search_entries(conn, "b", "s", "kb", "haus") == [("k", "Die Häuser laufen")]
        cur = await conn.execute("SELECT tenant, search_config::text FROM messages ORDER BY tenant")
        assert await cur.fetchall() == [("a", "chronicle_search.english"), ("b", "chronicle_search.german")]
        # the message's vector is derived again from its body (its text is not stored)
        cur = await conn.execute(
            "SELECT tenant, content_tsv = to_tsvector(search_config, 'running the tests') FROM messages ORDER BY 1"
        )
        assert await cur.fetchall() == [("a", True), ("b", True)]
        cur = await conn.execute(
            "SELECT content_tsv = to_tsvector('chronicle_search.simple', 'running the tests') FROM messages "
            "WHERE tenant = 'b'"
        )
        assert await cur.fetchone() == (False,)  # it was the simple one before the change

        # back to the default: the setting's row goes, the rows are English again
        assert await search_languages.apply(conn, {}) == ["b"]
        assert await ids(conn, "b", "run") == ["m1"]
        cur = await conn.execute("SELECT count(*) FROM search_languages")
        assert await cur.fetchone() == (0,)
        # every tenant English: no insert trigger is left to cost anything
        cur = await conn.execute("SELECT count(*) FROM pg_trigger WHERE tgname LIKE '%%search_config'")
        assert await cur.fetchone() == (0,)


def test_an_unknown_language_is_refused() -> None:
    with pytest.raises(ValidationError, match="search_languages"):
        Settings.model_validate({"search_languages": {"t": "klingon"}})
    assert Settings.model_validate({"search_languages": {"t": "german"}}).search_languages == {"t": "german"}


async def test_services_apply_the_setting_and_a_rebuild_equals_the_live_model(nats_url: str, fresh_db: str) -> None:
    settings = make_settings(nats_url, fresh_db, search_languages={"tenant-b": "simple"})
    async with running_stack(settings) as c:
        for tenant in ("tenant-a", "tenant-b"):
            r = await c.commands.append(tenant, "s", text_message("m1", "running the tests"), OMITTED)
            await c.waiter.wait_session(tenant, "s", r.seq)
        async with c.pool.connection() as conn:
            assert await ids(conn, "tenant-a", "run") == ["m1"]
            assert await ids(conn, "tenant-b", "run") == []
            assert await ids(conn, "tenant-b", "running") == ["m1"]
        report = await audit.verify(c)
        assert report.ok, report.differences
        assert (await audit.rebuild_and_swap(c)).swapped_at_seq > 0
        async with c.pool.connection() as conn:
            assert await ids(conn, "tenant-b", "run") == []
            assert await ids(conn, "tenant-b", "running") == ["m1"]


def test_drift_names_each_tenant_whose_configured_language_is_not_the_stored_one() -> None:
    assert search_languages.drift({"a": "german"}, {"a": "german"}) == []
    assert search_languages.drift({"a": "english"}, {}) == []  # English is the default either way
    assert search_languages.drift({}, {"b": "simple"}) == ["b: configured english, stored simple"]
    assert search_languages.drift({"a": "german", "b": "simple"}, {"a": "french", "b": "simple"}) == [
        "a: configured german, stored french"
    ]


def test_a_tenant_id_the_api_would_refuse_is_refused_in_the_setting() -> None:
    with pytest.raises(ValidationError, match="search_languages names 'Bad Tenant', not a tenant"):
        Settings.model_validate({"search_languages": {"Bad Tenant": "german"}})


def test_chronicle_migrate_refuses_a_bad_tenant_in_one_line_and_changes_nothing(fresh_db: str) -> None:
    env = {**os.environ, "CHRONICLE_DATABASE_URL": fresh_db, "CHRONICLE_SEARCH_LANGUAGES": '{"Bad Tenant": "german"}'}
    done = subprocess.run(
        [sys.executable, "-m", "services.ops.cli", "migrate"], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode != 0
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith("chronicle migrate: ")
    assert "CHRONICLE_SEARCH_LANGUAGES" in line
    assert "'Bad Tenant', not a tenant" in line
    with psycopg.connect(fresh_db) as conn:  # nothing was migrated
        assert conn.execute("SELECT to_regclass('schema_migrations')").fetchone() == (None,)


async def test_a_service_started_with_another_setting_keeps_the_stored_languages(
    nats_url: str, fresh_db: str, caplog: pytest.LogCaptureFixture
) -> None:
    """(Any process started with the old setting silently changed the language back.) The
    database keeps the languages in force; only `chronicle migrate` changes them."""
    changed = make_settings(nats_url, fresh_db, search_languages={"tenant-b": "german"})
    await prepare_database(changed, set_languages=True)  # `chronicle migrate` with the new setting
    old = changed.model_copy(update={"search_languages": {"tenant-b": "simple"}})
    with caplog.at_level(logging.WARNING, logger="chronicle"):
        async with running_stack(old) as c:
            r = await c.commands.append("tenant-b", "s", text_message("m1", "zwei Katzen"), OMITTED)
            await c.waiter.wait_session("tenant-b", "s", r.seq)
            async with c.pool.connection() as conn:
                assert await search_languages.stored(conn) == {"tenant-b": "german"}
                assert await ids(conn, "tenant-b", "katze") == ["m1"]  # stemmed as German: simple would not
            report = await audit.verify(c)  # the rebuild indexes as the stored languages do
            assert report.ok, report.differences
    (warned,) = [r.getMessage() for r in caplog.records if "CHRONICLE_SEARCH_LANGUAGES" in r.getMessage()]
    assert "tenant-b: configured simple, stored german" in warned
    assert "stay in force" in warned

    await prepare_database(old, set_languages=True)  # `chronicle migrate` with the old setting: it changes
    async with await psycopg.AsyncConnection.connect(fresh_db) as conn:
        assert await search_languages.stored(conn) == {"tenant-b": "simple"}
        assert await ids(conn, "tenant-b", "katze") == []  # re-indexed without stemming


def migrate_with(database: str, languages: str) -> list[str]:
    """What ``chronicle migrate`` printed, line by line, run with ``CHRONICLE_SEARCH_LANGUAGES``."""
    env = {**os.environ, "CHRONICLE_DATABASE_URL": database, "CHRONICLE_SEARCH_LANGUAGES": languages}
    done = subprocess.run(
        [sys.executable, "-m", "services.ops.cli", "migrate"], env=env, capture_output=True, text=True, timeout=90
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


def test_chronicle_migrate_says_which_tenants_it_re_indexed_and_why(fresh_db: str) -> None:
    """(It re-indexed a tenant whose language the setting changed without a word.) One line, only
    when it re-indexed: not for a new database (nothing to re-index), nor when nothing changed."""
    assert migrate_with(fresh_db, '{"tenant-a": "german"}')[1:] == []  # a new database: set, nothing re-indexed
    said = "CHRONICLE_SEARCH_LANGUAGES changed their search language"
    assert migrate_with(fresh_db, '{"tenant-a": "german", "tenant-b": "simple"}') == [
        "applied: nothing (up to date)",
        f"re-indexed the messages and search entries of tenant-b (simple, was english): {said}",
    ]
    assert migrate_with(fresh_db, '{"tenant-a": "german", "tenant-b": "simple"}') == ["applied: nothing (up to date)"]
    assert migrate_with(fresh_db, '{"tenant-b": "french"}') == [
        "applied: nothing (up to date)",
        "re-indexed the messages and search entries of tenant-a (english, was german), tenant-b (french, was "
        f"simple): {said}",
    ]
    with psycopg.connect(fresh_db) as conn:
        assert conn.execute("SELECT tenant, config::text FROM search_languages").fetchall() == [
            ("tenant-b", "chronicle_search.french")
        ]
