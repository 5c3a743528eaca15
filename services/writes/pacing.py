"""Pacing of a long write (a fork's copies, a batch's messages) behind the projector.

The log is one order for every tenant: a long write published at once held every other tenant's
events behind its own until the projector had applied them all. So such a write is stored in
chunks, at most two ahead of the projector: before a chunk, the one before the last must be
applied. The waits of one request share one budget, the read wait
(``CHRONICLE_READ_WAIT_TIMEOUT_S``), counted in time waited only (not the time the write spends
storing its chunks, which a projector that keeps up never makes it wait): a projector behind
for any reason (other tenants' load, or stopped) costs the request that much at most, then the
rest goes at once, as an unpaced write did. (A budget per wait let a 20,000-copy fork wait ~5 s
a chunk, past the SDK's 30 s timeout, which then sent it again on top of itself.) A wait that
fails (the pool, the database) ends the pacing too: pacing never fails a write."""

from __future__ import annotations

import asyncio
import logging

import psycopg
from psycopg_pool import PoolTimeout

from services.errors import ProjectionTimeout
from services.writes.waiting import AppliedWaiter

log = logging.getLogger("chronicle.writes")


class Pacer:
    """One request's pacing: :meth:`turn` before each chunk, :meth:`stored` after it."""

    def __init__(self, waiter: AppliedWaiter, tenant: str, session: str, budget_s: float) -> None:
        self._waiter, self._tenant, self._session = waiter, tenant, session
        self._left = budget_s  # of waiting: the time the write spends storing its chunks is not counted
        self._ends: list[int] = []  # the last sequence of each chunk stored
        self.on = True

    def stored(self, seq: int) -> None:
        """A chunk was stored, its last event at ``seq``."""
        self._ends.append(seq)

    async def turn(self) -> None:
        """Wait, within what is left of the budget, until the chunk before the last stored is applied."""
        if not self.on or len(self._ends) < 2:
            return
        if self._left <= 0:
            self.on = False
            return
        loop = asyncio.get_running_loop()
        began = loop.time()
        try:
            await self._waiter.wait_session(self._tenant, self._session, self._ends[-2], timeout_s=self._left)
        except ProjectionTimeout:
            self.on = False
        except (PoolTimeout, psycopg.Error) as exc:
            log.warning("pacing of a write to %s/%s ended: %s", self._tenant, self._session, exc)
            self.on = False
        finally:
            self._left -= loop.time() - began
