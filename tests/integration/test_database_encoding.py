"""A database not encoded UTF8 is refused by ``migrate()`` before anything is created, and by
``chronicle migrate`` in one line: Postgres normalizes text (search folding, migration 029) in UTF8
only. Such a database never got past migration 024 either: its SQL (noncharacters, which only
UTF8 holds) did not convert. Real Postgres."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import psycopg
import pytest

from projections.migrate import DatabaseNotUtf8, migrate
from services.ops.cli import LOG_MISMATCH_EXIT
from services.ops.localstack import with_database
from tests.conftest import make_settings
from tests.integration.test_cli_errors import one_line
from tests.support import chronicle_cli


@pytest.fixture
def latin1(pg_admin: str) -> Iterator[tuple[str, str]]:
    """(name, URL) of a new database encoded LATIN1; dropped at the end."""
    name = f"chronicle_latin1_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(pg_admin, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE \"{name}\" ENCODING 'LATIN1' LC_COLLATE 'C' LC_CTYPE 'C' TEMPLATE template0")
    try:
        yield name, with_database(pg_admin, name)
    finally:
        with psycopg.connect(pg_admin, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


async def test_migrate_refuses_it_before_anything_is_created(latin1: tuple[str, str]) -> None:
    name, url = latin1
    with pytest.raises(DatabaseNotUtf8, match=f"the database {name} is encoded LATIN1; Chronicle's must be UTF8"):
        await migrate(url)
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        cur = await conn.execute("SELECT to_regclass('public.schema_migrations') IS NULL")
        assert await cur.fetchone() == (True,)


async def test_chronicle_migrate_says_why_in_one_line(nats_url: str, latin1: tuple[str, str]) -> None:
    name, url = latin1
    done = chronicle_cli(make_settings(nats_url, url), "migrate", timeout=90)
    assert done.returncode == LOG_MISMATCH_EXIT, done.stderr
    line = one_line(done)
    assert line.startswith(f"chronicle migrate: refusing to start: the database {name} is encoded LATIN1; "), line
    assert "ENCODING 'UTF8'" in line
