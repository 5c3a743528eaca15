"""Versioned SQL migrations: files ``NNN_name.sql`` applied once each, in order, under a lock."""

from __future__ import annotations

from importlib import resources
from typing import Any

import psycopg

LOCK_KEY = 7_234_001


class SchemaTooNew(RuntimeError):
    """The database was migrated by a newer release than this process: its writes would not be
    what that schema expects (a vector built the old way, a column left unset), so it refuses to
    start. ``str()`` says what to do."""


class DatabaseNotUtf8(RuntimeError):
    """The database's encoding is not UTF8. Search folds text with ``normalize()``, which Postgres
    runs in UTF8 only (migration 029), and its snippets' marks are noncharacters that no other
    encoding holds (migration 024, whose SQL another encoding cannot even read); a text that LATIN1
    cannot hold could not be stored either. Nothing is migrated; ``str()`` says what to do."""


def migration_files() -> list[tuple[int, str, str]]:
    found: list[tuple[int, str, str]] = []
    for entry in resources.files("projections.migrations").iterdir():
        if entry.name.endswith(".sql"):
            found.append((int(entry.name.split("_", 1)[0]), entry.name, entry.read_text()))
    return sorted(found)


async def migrate(conninfo: str, schema: str = "public") -> list[str]:
    """Apply pending migrations to ``schema``; returns the names applied. Safe to run concurrently.
    Raises :class:`DatabaseNotUtf8`, before anything is created, in a database of another encoding,
    and :class:`SchemaTooNew`, applying nothing, when ``schema`` was migrated by a newer release
    (an older release's ``chronicle migrate`` run against it, a downgrade: "up to date" was wrong)."""
    applied: list[str] = []
    async with await psycopg.AsyncConnection.connect(conninfo, autocommit=True) as conn:
        cur = await conn.execute("SELECT current_setting('server_encoding'), current_database()")
        encoding, database = await cur.fetchone() or ("", "")
        if encoding != "UTF8":
            raise DatabaseNotUtf8(
                f"the database {database} is encoded {encoding}; Chronicle's must be UTF8: create it with "
                f"CREATE DATABASE ... ENCODING 'UTF8' (initdb's default with a UTF-8 locale) and migrate that one"
            )
        await conn.execute("SELECT pg_advisory_lock(%s)", (LOCK_KEY,))
        try:
            await conn.execute(f'CREATE SCHEMA IF NOT EXISTS "{schema}"')
            await conn.execute(f'SET search_path TO "{schema}"')
            await check_schema(conn)
            await conn.execute(
                "CREATE TABLE IF NOT EXISTS schema_migrations "
                "(version int PRIMARY KEY, name text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())"
            )
            cur = await conn.execute("SELECT version FROM schema_migrations")
            done = {row[0] for row in await cur.fetchall()}
            for version, name, sql in migration_files():
                if version in done:
                    continue
                async with conn.transaction():
                    await conn.execute(sql.encode())
                    await conn.execute("INSERT INTO schema_migrations (version, name) VALUES (%s, %s)", (version, name))
                applied.append(name)
        finally:
            await conn.execute("SELECT pg_advisory_unlock(%s)", (LOCK_KEY,))
    return applied


async def check_schema(conn: psycopg.AsyncConnection[Any]) -> None:
    """Raise :class:`SchemaTooNew` when ``conn``'s database holds a migration this release does
    not know (one of a newer release: during a rolling upgrade, a process of the earlier release
    must not keep writing under the new schema)."""
    cur = await conn.execute("SELECT to_regclass('schema_migrations') IS NOT NULL")
    if not (row := await cur.fetchone()) or not row[0]:
        return  # never migrated: nothing newer
    cur = await conn.execute("SELECT max(version) FROM schema_migrations")
    row = await cur.fetchone()
    newest = row[0] if row else None
    known = max(version for version, _, _ in migration_files())
    if newest is not None and newest > known:
        raise SchemaTooNew(
            f"the database was migrated to version {newest} by a newer Chronicle; this one knows up to {known}: "
            "stop this process and run the newer release's (an upgrade stops the earlier release's processes "
            "before migrating)"
        )
