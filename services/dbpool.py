"""The Postgres pool of a Chronicle process: psycopg's pool, answering fast while the database is
known to be unreachable instead of holding every request for the full pool timeout."""

from __future__ import annotations

import time
from typing import Any

import psycopg
from psycopg_pool import AsyncConnectionPool, PoolTimeout

FAIL_FAST_S = 2.0
"""How long a request waits for a connection while the database is known to be unreachable."""


class DatabaseUnreachable(PoolTimeout):
    """No connection while the pool's last attempt to connect to the database had failed (a
    :class:`~psycopg_pool.PoolTimeout`, so it is answered as one: ``503 unavailable``)."""


class Pool(AsyncConnectionPool[psycopg.AsyncConnection[Any]]):
    """psycopg's pool, knowing whether the database was reachable at its last connection attempt.

    Contract: after an attempt to open a connection failed (the pool's own reconnection after a
    connection was lost, or growing for a waiting request), and until one succeeds, a request
    waits at most ``fail_fast_s`` for a connection (not the pool timeout, 30 s) and then raises
    :class:`DatabaseUnreachable`. The pool keeps reconnecting meanwhile; the first connection that
    opens clears the state. While the database is reachable, a request costs one attribute read
    more than psycopg's pool."""

    fail_fast_s = FAIL_FAST_S

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.unreachable_since: float | None = None  # monotonic time of the first failed attempt

    async def getconn(self, timeout: float | None = None) -> psycopg.AsyncConnection[Any]:  # noqa: ASYNC109 (psycopg's)
        since = self.unreachable_since
        if since is None:
            return await super().getconn(timeout)
        wait = self.fail_fast_s if timeout is None else min(timeout, self.fail_fast_s)
        try:
            return await super().getconn(wait)
        except PoolTimeout as exc:
            down = time.monotonic() - since
            raise DatabaseUnreachable(
                f"the database has been unreachable for {down:.0f}s (no connection within {wait:g}s)"
            ) from exc

    async def _connect(self, timeout: float | None = None) -> psycopg.AsyncConnection[Any]:  # noqa: ASYNC109
        try:
            conn = await super()._connect(timeout)
        except Exception:
            if self.unreachable_since is None:
                self.unreachable_since = time.monotonic()
            raise
        self.unreachable_since = None
        return conn
