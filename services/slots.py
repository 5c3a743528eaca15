"""How many of one costly kind of request a process runs at once: a few a tenant, a bound in all.

A tenant past its share is refused at once (``429`` with ``Retry-After``: nothing waits on it); a
request past the process's total waits for a slot up to its wait, then gets the same answer. The
kinds name their own refusal and settings: :class:`Gate` subclasses (searches:
services/context/search_gate.py; time-travel reads: :class:`AsOfGate`, below).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import ClassVar

from services.errors import RateLimited

RETRY_AFTER_S = 1.0


class Gate:
    """Slots for one kind of request; subclasses say what the kind is called and how it is refused."""

    what: ClassVar[str]  # the requests, plural ("searches")
    total_setting: ClassVar[str]
    tenant_setting: ClassVar[str]
    busy: ClassVar[type[RateLimited]]

    def __init__(self, total: int, per_tenant: int) -> None:
        self.total = total
        self.per_tenant = per_tenant
        self._slots = asyncio.Semaphore(total)
        self._held: dict[str, int] = {}  # tenant -> requests it runs now (or waits to)

    def running(self, tenant: str) -> int:
        """The requests of this kind ``tenant`` runs (or waits to run) in this process now."""
        return self._held.get(tenant, 0)

    @contextlib.asynccontextmanager
    async def slot(self, tenant: str, wait_s: float) -> AsyncIterator[None]:
        """Hold one of the process's slots for ``tenant``; :attr:`busy` when the tenant already
        runs ``per_tenant`` requests of this kind, or no slot frees within ``wait_s``."""
        held = self.running(tenant)
        if held >= self.per_tenant:
            raise self.busy(
                RETRY_AFTER_S,
                f"this tenant runs {held} {self.what} at once in this process, as many as it may "
                f"({self.tenant_setting}); send the next when one has answered",
            )
        self._held[tenant] = held + 1
        try:
            try:
                async with asyncio.timeout(wait_s):
                    await self._slots.acquire()
            except TimeoutError:
                raise self.busy(
                    RETRY_AFTER_S,
                    f"this process runs {self.total} {self.what} at once ({self.total_setting}) and none "
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


# -- time-travel reads ---------------------------------------------------------------------------
#
# How many time-travel reads (``as_of_seq``) one process folds at once.
#
# A time-travel read folds the session from the log's first event: every event of the session up
# to ``as_of_seq`` is read from JetStream, every claim-checked body fetched from object storage, and
# every message body held in memory until the answer is cut. Nothing bounded how many ran at once,
# and a read-only key may send them, so a tenant could hold a process's memory with a few dozen reads
# of one long session. A tenant now folds at most ``CHRONICLE_AS_OF_SLOTS_PER_TENANT`` sessions at
# once in a process (one more is ``429 as_of_busy`` at once), and the process at most
# ``CHRONICLE_AS_OF_SLOTS`` (one more waits for a slot up to :data:`AS_OF_WAIT_S`, then the same
# answer).

AS_OF_WAIT_S = 10.0


class AsOfBusy(RateLimited):
    """Too many time-travel reads at once: this tenant's share of the process's, or its all."""

    code = "as_of_busy"
    title = "Too many time-travel reads at once"


class AsOfGate(Gate):
    what = "time-travel reads"
    total_setting = "CHRONICLE_AS_OF_SLOTS"
    tenant_setting = "CHRONICLE_AS_OF_SLOTS_PER_TENANT"
    busy = AsOfBusy
