"""How many Postgres connections a local stack's processes may open, against the server's
``max_connections``.

Each process opens a pool of up to ``CHRONICLE_DB_POOL_MAX`` connections (20), and beside it a
connection for each compaction lease it holds (``CHRONICLE_COMPACTOR_CONCURRENCY``, 4), one for
its read-your-writes ``LISTEN``, and briefly one more (a check at its start, an audit read). At the
defaults ``chronicle up`` starts four such processes or more (projector workers, compactor, command
service, API processes): some 100 connections under load, as many as a stock Postgres allows,
less the slots it reserves for superusers. Past that, a request is refused by the database
("too many clients") while it is busiest. :func:`pool_decision` is the pure rule ``chronicle up``
applies before it starts them: the pools as asked when they fit, smaller ones when they do not
and the pool size was not set, or a refusal naming what to change.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import psycopg

HEADROOM = 5
"""Connections left free for what runs beside the stack: ``chronicle verify``, a migration, psql."""
MIN_POOL = 4
"""The smallest pool a process is given: below it, requests would queue for connections."""


def extra_connections(compactor_concurrency: int, *, compacts: bool = True, compactor: bool = False) -> int:
    """Connections one process holds besides its pool: its ``LISTEN``, one passing, in a
    process that compacts (compactor, API, command service: not a projector) its leases, and in a
    compactor its presence (services/compaction/presence.py)."""
    return (compactor_concurrency if compacts else 0) + 2 + (1 if compactor else 0)


@dataclass(frozen=True)
class PoolDecision:
    """The pool size each process gets (``pool_max``; None: the stack does not start) and what to
    tell the operator (empty: nothing)."""

    pool_max: int | None
    message: str = ""


def pool_decision(
    *, allowed: int, extras: Sequence[int], pool_max: int, pool_max_set: bool, max_connections: int
) -> PoolDecision:
    """One process for each of ``extras``, each holding that many connections besides a pool of up
    to ``pool_max``, against the ``allowed`` connections the server leaves them (of its
    ``max_connections``). A pool size set by the operator is never changed: it fits, or the stack
    does not start."""
    processes, extra = len(extras), sum(extras)
    needed = processes * pool_max + extra
    if needed <= allowed:
        return PoolDecision(pool_max)
    fitting = (allowed - extra) // processes
    what = (
        f"{processes} processes of up to {pool_max} pooled connections each (CHRONICLE_DB_POOL_MAX) and "
        f"{extra} more in all (compaction leases, LISTEN, compactor presence) could open {needed} Postgres "
        f"connections; the server leaves {allowed} of its max_connections {max_connections} (less its reserved "
        f"slots, those open now and {HEADROOM} for commands run beside the stack)"
    )
    if pool_max_set or fitting < MIN_POOL:
        least = needed if pool_max_set else processes * MIN_POOL + extra
        fix = (
            f"set CHRONICLE_DB_POOL_MAX to {fitting} or less, " if pool_max_set and fitting >= MIN_POOL else ""
        ) + f"raise max_connections (at least {least + (max_connections - allowed)}), or start fewer processes"
        return PoolDecision(None, f"{what}: {fix}")
    return PoolDecision(fitting, f"{what}: each process's pool is capped at {fitting}")


@dataclass(frozen=True)
class ServerRoom:
    """What the server allows: its ``max_connections``, the slots it reserves (for superusers, and
    ``reserved_connections`` where it has them) and the client connections open when asked."""

    max_connections: int
    reserved: int
    open_now: int

    @property
    def allowed(self) -> int:
        """What a stack may open: the rest, less :data:`HEADROOM`."""
        return self.max_connections - self.reserved - self.open_now - HEADROOM


def server_room(url: str) -> ServerRoom:
    """Ask the server at ``url`` (the connection asking counts among those open)."""
    with psycopg.connect(url, connect_timeout=5) as conn:
        rows: dict[str, Any] = dict(
            conn.execute(
                "SELECT name, setting::int FROM pg_settings WHERE name IN "
                "('max_connections', 'superuser_reserved_connections', 'reserved_connections')"
            ).fetchall()
        )
        row = conn.execute("SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend'").fetchone()
    reserved = int(rows.get("superuser_reserved_connections", 0)) + int(rows.get("reserved_connections", 0))
    return ServerRoom(int(rows["max_connections"]), reserved, int(row[0]) if row else 0)
