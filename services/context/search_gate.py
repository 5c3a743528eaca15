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

from services.errors import RateLimited
from services.slots import RETRY_AFTER_S, Gate

__all__ = ["RETRY_AFTER_S", "SearchBusy", "SearchGate", "search_slots"]


class SearchBusy(RateLimited):
    """Too many searches at once: this tenant's share of the process's, or the process's all."""

    code = "search_busy"
    title = "Too many searches at once"


def search_slots(pool_max: int, total: int | None, per_tenant: int | None) -> tuple[int, int]:
    """``(total, per_tenant)``: given, or half the pool's connections for searches (at least
    one) and half of those for one tenant (at least one)."""
    whole = total if total is not None else max(1, pool_max // 2)
    return whole, per_tenant if per_tenant is not None else max(1, whole // 2)


class SearchGate(Gate):
    what = "searches"
    total_setting = "CHRONICLE_SEARCH_SLOTS"
    tenant_setting = "CHRONICLE_SEARCH_SLOTS_PER_TENANT"
    busy = SearchBusy
