"""The API's Postgres connections run the hot reads once before they serve a request: a backend's
first use of the tables and indexes costs milliseconds, paid off the request path."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

import psycopg
import pytest

from projections.queries import warm_reads
from services.api.app import build_app
from services.bootstrap import Container, open_container
from tests.conftest import make_settings
from tests.support import scratch_database

APPEND_STATE = "LEFT JOIN messages e ON e.tenant"  # the last statement warm_reads runs


async def last_statement(db: str, pid: int) -> str:
    async with await psycopg.AsyncConnection.connect(db, autocommit=True) as conn:
        cur = await conn.execute("SELECT query FROM pg_stat_activity WHERE pid = %s", (pid,))
        row = await cur.fetchone()
        assert row is not None, f"backend {pid} is gone"
        return str(row[0])


@contextlib.asynccontextmanager
async def new_connection(c: Container) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
    """A connection the pool makes now: every idle one is held first, so it must grow."""
    held = [await c.pool.getconn() for _ in range(c.pool.get_stats()["pool_available"])]
    try:
        async with c.pool.connection() as conn:
            assert conn not in held
            yield conn
    finally:
        for conn in held:
            await c.pool.putconn(conn)


@pytest.mark.parametrize("warm", [True, False])
async def test_a_new_api_connection_has_run_the_hot_reads_before_it_is_handed_out(
    nats_url: str, fresh_db: str, warm: bool
) -> None:
    async with open_container(make_settings(nats_url, fresh_db), warm_reads=warm) as c, new_connection(c) as conn:
        last = await last_statement(fresh_db, conn.info.backend_pid)
    assert (APPEND_STATE in last) is warm, last


async def test_the_api_warms_its_new_connections(nats_url: str, fresh_db: str) -> None:
    app = build_app(make_settings(nats_url, fresh_db))
    async with app.router.lifespan_context(app), new_connection(app.state.c) as conn:
        assert APPEND_STATE in await last_statement(fresh_db, conn.info.backend_pid)


async def test_warming_a_connection_to_a_database_without_the_schema_leaves_it_usable(pg_admin: str) -> None:
    with scratch_database(pg_admin) as empty:
        async with await psycopg.AsyncConnection.connect(empty, autocommit=True) as conn:
            await warm_reads(conn)  # the tables are missing: nothing to warm, nothing raised
            cur = await conn.execute("SELECT 41 + 1")
            assert await cur.fetchone() == (42,)


async def test_the_pools_connections_run_without_jit(stack: Container) -> None:
    """A statement whose estimate passes ``jit_above_cost`` (the append's walk, with statistics
    that find its id common) compiled for ~230 ms on each run: JIT is off on every connection."""
    async with stack.pool.connection() as conn:
        cur = await conn.execute("SHOW jit")
        assert await cur.fetchone() == ("off",)
