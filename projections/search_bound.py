"""The time a search may take: its statements run under a ``statement_timeout`` of their own.

A search's cost grows with its parts and the scope's size (16 short prefixes over a tenant of
millions of messages took over a second); without a bound one cheap request held a Postgres
backend and a pool connection as long as its query ran. :func:`bounded` runs the search in a
transaction whose ``statement_timeout`` is set with ``SET LOCAL`` (``set_config(…, true)``): it
ends with the transaction, so the connection goes back to the pool as it came, whether the
search finished, ran out of time (rolled back) or failed.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

import psycopg
from psycopg import AsyncConnection

SEARCH_TIMEOUT_S = 3.0
"""The default of ``CHRONICLE_SEARCH_TIMEOUT_S``: how long one search's statements may run."""


class SearchTimedOut(Exception):
    """Postgres cancelled a search that ran past its ``statement_timeout``."""

    def __init__(self, timeout_s: float) -> None:
        super().__init__(f"the search ran past its {timeout_s:g} s")
        self.timeout_s = timeout_s


@contextlib.asynccontextmanager
async def bounded(conn: AsyncConnection[Any], timeout_s: float) -> AsyncIterator[None]:
    """A transaction on ``conn`` whose statements each end after ``timeout_s`` (whole
    milliseconds, at least 1): :class:`SearchTimedOut` then, the transaction rolled back. A
    cancellation for another cause (an operator's ``pg_cancel_backend``) is raised as it came.
    ``conn`` in autocommit (a pool's): inside a caller's transaction the setting would last to
    that transaction's end."""
    ms = max(1, round(timeout_s * 1000))
    try:
        async with conn.transaction():
            await conn.execute("SELECT set_config('statement_timeout', %s, true)", (f"{ms}ms",))
            yield
    except psycopg.errors.QueryCanceled as exc:
        if "statement timeout" not in (exc.diag.message_primary or ""):
            raise
        raise SearchTimedOut(timeout_s) from exc
