"""The README's backup (`pg_dump … -t …`, Backups) names every table of a migrated database that
`chronicle rebuild` does not make again from the log: a table left out is lost with the database.
It named `data_keys` and `erasures` only, while migration 030 had added `tenant_erasure_buckets`
(the buckets a tenant's erasure cleans, noted before its first session goes): a database restored
that way forgot them, and the rerun of a tenant's erasure that had left a bucket no longer cleaned
it. Real Postgres."""

from __future__ import annotations

import re
from pathlib import Path

import psycopg

from projections.migrate import migrate
from projections.rebuild import TABLES

README = Path(__file__).resolve().parents[2] / "README.md"

MADE_AGAIN = {
    *TABLES,  # the read models a rebuild makes and swaps in
    "quarantine",  # swapped in with them
    "checkpoints",  # a rebuild sets them at its end
    "log_binding",  # a rebuild binds the database to the log it read
    "schema_migrations",  # `chronicle migrate`
    "usage_applied_since",  # migration 021's mark, made by `chronicle migrate`
    "search_languages",  # set from CHRONICLE_SEARCH_LANGUAGES as the processes start
    "compactor_sessions",  # the projector's compaction state, kept from the log as it applies it
    "compactor_overlays",
    "compactor_messages",
}


def dumped_tables(readme: str) -> set[str]:
    """The tables of the README's `pg_dump --data-only … -t T …` backup commands."""
    lines = [line for line in readme.splitlines() if "pg_dump" in line and "--data-only" in line]
    assert lines, "the README shows no pg_dump backup command"
    named = [set(re.findall(r"-t (\w+)", line)) for line in lines]
    assert all(n == named[0] for n in named), named  # every command shown dumps the same tables
    return named[0]


async def test_the_readme_backup_dumps_every_table_a_rebuild_does_not_make_again(fresh_db: str) -> None:
    await migrate(fresh_db)
    async with await psycopg.AsyncConnection.connect(fresh_db) as conn:
        cur = await conn.execute("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")
        tables = {str(name) for (name,) in await cur.fetchall()}
    assert MADE_AGAIN - set(TABLES) <= tables  # the list above names tables that exist
    assert dumped_tables(README.read_text()) == tables - MADE_AGAIN
