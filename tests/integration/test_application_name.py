"""Each Chronicle process names its Postgres connections ``chronicle-<command>`` (libpq's
``PGAPPNAME``), so that an operator tells the API's from the projector's in ``pg_stat_activity``;
a name the operator gave (``PGAPPNAME``, ``application_name`` in the URL) wins."""

from __future__ import annotations

import psycopg
import pytest

from services.ops.cli import name_connections


def test_a_process_names_its_connections_after_its_command() -> None:
    env: dict[str, str] = {}
    name_connections("projector", env)
    assert env == {"PGAPPNAME": "chronicle-projector"}


def test_a_name_inherited_from_chronicle_up_is_replaced_and_the_operators_kept() -> None:
    inherited = {"PGAPPNAME": "chronicle-up"}
    name_connections("api", inherited)
    assert inherited["PGAPPNAME"] == "chronicle-api"
    chosen = {"PGAPPNAME": "billing-replica-reader"}
    name_connections("api", chosen)
    assert chosen["PGAPPNAME"] == "billing-replica-reader"


async def test_pg_stat_activity_shows_the_name_and_the_urls_own_wins(
    db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("PGAPPNAME", raising=False)
    env: dict[str, str] = {}
    name_connections("compactor", env)
    monkeypatch.setenv("PGAPPNAME", env["PGAPPNAME"])
    async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as conn:
        cur = await conn.execute("SELECT application_name FROM pg_stat_activity WHERE pid = pg_backend_pid()")
        assert await cur.fetchone() == ("chronicle-compactor",)
    named = psycopg.conninfo.make_conninfo(db_url, application_name="ours")
    async with await psycopg.AsyncConnection.connect(named, autocommit=True) as conn:
        cur = await conn.execute("SELECT application_name FROM pg_stat_activity WHERE pid = pg_backend_pid()")
        assert await cur.fetchone() == ("ours",)
