"""A session's compaction lease, across processes: one summary of a session at a time in the whole
deployment, however many ``chronicle compactor`` processes (and API processes answering
``POST …/compact``) run.

The lease is a Postgres session-level advisory lock, on a key derived from (tenant, session),
taken on a connection of its own that is held for the whole compaction (the summary included)
and closed after it. Nothing needs to clean up after a holder that dies: when its process ends,
its connection ends and Postgres releases the lock. The connection asks the server to probe the
client every few seconds (TCP keepalives), so a holder whose machine vanished loses the lease in
about half a minute rather than the operating system's two hours.

The lease saves the second summary (billed) and the second attempt; it is not what keeps an
overlay from being recorded twice. That stays the overlay's conditional publish
(:meth:`~services.compaction.service.CompactionService.compact`): a holder whose lease connection
was cut while it summarised (a database restart) may still finish, and its publish then finds
the other's overlay and records nothing.

Two sessions whose keys collide (32-bit hashes) only wait for each other.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator

import psycopg

log = logging.getLogger("chronicle.compactor")

# the two-key form of the advisory lock: this namespace, then the session (other locks of
# Chronicle use other namespaces or the one-key form, which never overlaps the two-key one)
_KEY = "hashtext('chronicle-compaction'), hashtext(%s || '/' || %s)"
_TRY = f"SELECT pg_try_advisory_lock({_KEY})"
_WAIT = f"SELECT pg_advisory_lock({_KEY})"
_UNLOCK = f"SELECT pg_advisory_unlock({_KEY})"
# the server probes a silent client after 10 s, every 5 s, 3 times: a vanished holder's lease
# ends after ~25 s (settable by any role; no server configuration needed)
KEEPALIVES = "SET tcp_keepalives_idle = 10; SET tcp_keepalives_interval = 5; SET tcp_keepalives_count = 3"


class SessionBusy(Exception):
    """Another compaction of the session holds its lease (in this process or another)."""


class LeasesExhausted(Exception):
    """This process holds as many leases (connections) as it may: a compaction that may not wait
    is refused rather than opening one more connection."""


class LeaseWaitTimedOut(TimeoutError):
    """A wait for a session's lease ran out: another compaction of the session still holds it
    (or this process's other compactions hold every slot)."""


class Leases:
    """Takes a session's compaction lease, each on a new connection to ``conninfo``; at most
    ``limit`` at once in this process (each is a Postgres connection held through a summary: a
    burst of manual compactions must not use up the server's ``max_connections``)."""

    def __init__(self, conninfo: str, limit: int = 4) -> None:
        self._conninfo = conninfo
        self._slots = asyncio.Semaphore(limit)

    @contextlib.asynccontextmanager
    async def hold(self, tenant: str, session: str, *, wait_s: float = 0) -> AsyncIterator[None]:
        """Hold the session's lease for the body.

        ``wait_s`` 0: :class:`SessionBusy` at once when someone else holds it, and
        :class:`LeasesExhausted` when this process holds ``limit`` leases; otherwise wait up to
        ``wait_s`` seconds for a slot and the lease (then :class:`LeaseWaitTimedOut`, a
        :class:`TimeoutError`). A wait that is cancelled or times out cancels the query on the
        server: it leaves no waiter behind.
        """
        if wait_s <= 0:
            if self._slots.locked():
                raise LeasesExhausted("this process runs as many compactions as it may at once")
            await self._slots.acquire()
        else:
            try:
                async with asyncio.timeout(wait_s):
                    await self._slots.acquire()
            except TimeoutError as exc:
                raise LeaseWaitTimedOut(f"no lease slot came free in {wait_s:g}s") from exc
        try:
            async with self._held(tenant, session, wait_s):
                yield
        finally:
            self._slots.release()

    @contextlib.asynccontextmanager
    async def _held(self, tenant: str, session: str, wait_s: float) -> AsyncIterator[None]:
        conn = await psycopg.AsyncConnection.connect(self._conninfo, autocommit=True, connect_timeout=10)
        try:
            await conn.execute(KEEPALIVES)
            if wait_s <= 0:
                cur = await conn.execute(_TRY, (tenant, session))
                row = await cur.fetchone()
                if not (row and row[0]):
                    raise SessionBusy(f"{tenant}/{session} is being compacted by another compactor")
            else:
                try:
                    async with asyncio.timeout(wait_s):
                        await conn.execute(_WAIT, (tenant, session))
                except TimeoutError as exc:
                    raise LeaseWaitTimedOut(f"{tenant}/{session}: its lease stayed held for {wait_s:g}s") from exc
            try:
                yield
            finally:
                # a connection that ended has released the lock already; closing releases it too,
                # but unlocking first says so while the connection is still healthy
                with contextlib.suppress(psycopg.Error):
                    await conn.execute(_UNLOCK, (tenant, session))
        finally:
            await conn.close()
