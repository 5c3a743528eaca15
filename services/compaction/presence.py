"""A compactor's presence, for readiness: every running ``chronicle compactor`` holds a shared
Postgres advisory lock on one key, on a connection of its own, for as long as it runs; readiness
counts the holders in ``pg_locks`` (:data:`COUNT`).

As with the session leases (:mod:`services.compaction.lease`), nothing needs to clean up after a
compactor that dies: its connection ends and Postgres releases the lock at once; the connection
asks the server to probe the client (TCP keepalives), so a compactor whose machine vanished is
gone within about half a minute. A compactor whose presence connection is cut (a database
restart) takes it again as soon as the database answers.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

import psycopg

from services.compaction.lease import KEEPALIVES

log = logging.getLogger("chronicle.compactor")

# the two-key form of the advisory lock (no other lock of Chronicle takes this namespace); shared:
# compactors never wait for each other
_NAMESPACE = "hashtext('chronicle-compactor-present')"
HOLD = f"SELECT pg_advisory_lock_shared({_NAMESPACE}, 0)"
COUNT = (
    "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted AND mode = 'ShareLock' "
    "AND database = (SELECT oid FROM pg_database WHERE datname = current_database()) "
    f"AND classid = {_NAMESPACE}::oid AND objid = 0 AND objsubid = 2"
)


async def present(conn: psycopg.AsyncConnection[Any]) -> int:
    """How many compactors hold their presence in this database now."""
    cur = await conn.execute(COUNT)
    row = await cur.fetchone()
    return int(row[0]) if row else 0


async def hold(conninfo: str, stop: asyncio.Event, *, check_s: float = 5.0, retry_s: float = 2.0) -> None:
    """Hold this process's presence until ``stop``: take the lock, check the connection every
    ``check_s`` seconds, and take it again (every ``retry_s``) whenever the connection is lost."""
    failing = False
    while not stop.is_set():
        try:
            conn = await psycopg.AsyncConnection.connect(conninfo, autocommit=True, connect_timeout=10)
            try:
                await conn.execute(KEEPALIVES)
                await conn.execute(HOLD)
                if failing:
                    log.info("compactor presence taken again")
                failing = False
                while not stop.is_set():
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(stop.wait(), check_s)
                    if not stop.is_set():
                        await asyncio.wait_for(conn.execute("SELECT 1"), check_s)
            finally:
                with contextlib.suppress(psycopg.Error, OSError):
                    await conn.close()
        except (psycopg.Error, OSError, TimeoutError) as exc:
            if not failing:
                log.warning("compactor presence lost (readiness shows no compactor): %s", exc)
            failing = True
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), retry_s)
