"""How many searches one process runs at once: a few a tenant, and at most part of its pool.

A search may hold a pooled Postgres connection for up to ``CHRONICLE_SEARCH_TIMEOUT_S``. Without
a bound, one tenant sending dozens of slow searches at once (prefixes of one letter over a large
corpus) held every connection of the API process, and every other tenant's appends and reads
waited seconds for one (an outside trial: 40 such searches in flight, another tenant's appends
took 16 s). Here a tenant runs at most ``per_tenant`` searches at once in a process (one more is
``429 search_busy`` at once, with ``Retry-After``: nothing waits on it), and the process at most
``total`` (a search waits for a slot up to the search timeout, then the same answer), so the
pool always keeps connections for everything else.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from services.errors import RateLimited

RETRY_AFTER_S = 1.0


class SearchBusy(RateLimited):
    """Too many searches at once: this tenant's share of the process's, or the process's all."""

    code = "search_busy"
    title = "Too many searches at once"


def search_slots(pool_max: int, total: int | None, per_tenant: int | None) -> tuple[int, int]:
    """``(total, per_tenant)``: given, or half the pool's connections for searches (at least
    one) and half of those for one tenant (at least one)."""
    whole = total if total is not None else max(1, pool_max // 2)
    return whole, per_tenant if per_tenant is not None else max(1, whole // 2)


class SearchGate:
    def __init__(self, total: int, per_tenant: int) -> None:
        self.total = total
        self.per_tenant = per_tenant
        self._slots = asyncio.Semaphore(total)
        self._held: dict[str, int] = {}  # tenant -> searches it runs now (or waits to)

    def running(self, tenant: str) -> int:
        """The searches ``tenant`` runs (or waits to run) in this process now."""
        return self._held.get(tenant, 0)

    @contextlib.asynccontextmanager
    async def slot(self, tenant: str, wait_s: float) -> AsyncIterator[None]:
        """Hold one of the process's search slots for ``tenant``; :class:`SearchBusy` when the
        tenant already runs ``per_tenant`` searches, or no slot frees within ``wait_s``."""
        held = self.running(tenant)
        if held >= self.per_tenant:
            raise SearchBusy(
                RETRY_AFTER_S,
                f"this tenant runs {held} searches at once in this process, as many as it may "
                f"(CHRONICLE_SEARCH_SLOTS_PER_TENANT); send the next when one has answered",
            )
        self._held[tenant] = held + 1
        try:
            try:
                async with asyncio.timeout(wait_s):
                    await self._slots.acquire()
            except TimeoutError:
                raise SearchBusy(
                    RETRY_AFTER_S,
                    f"this process runs {self.total} searches at once (CHRONICLE_SEARCH_SLOTS) and none "
                    f"ended within {wait_s:g} s",
                ) from None
            try:
                yield
            finally:
                self._slots.release()
        finally:
            left = self._held[tenant] - 1
            if left:
                self._held[tenant] = left
            else:
                del self._held[tenant]
