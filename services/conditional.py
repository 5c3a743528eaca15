"""The one shape of every state-dependent command (optimistic concurrency on the session subject):

1. read the session subject's last sequence from JetStream;
2. wait until the projection has applied it;
3. decide from the projection (``decide`` returns an event, or ``None`` for a no-op);
4. publish with that sequence as ``Nats-Expected-Last-Subject-Sequence``;
5. on a conflict (another writer got there first) repeat, a bounded number of times.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg_pool import AsyncConnectionPool

from events.envelope import Event
from events.publisher import ConcurrencyConflict, Publisher
from services.errors import ContentionExhausted
from services.waiting import AppliedWaiter

Conn = psycopg.AsyncConnection[Any]


@dataclass(frozen=True, slots=True)
class Decision:
    """An event to publish (or None for a no-op) and how to answer once it has a sequence."""

    event: Event | None
    answer: Callable[[int], Any]


class Conditional:
    def __init__(
        self, publisher: Publisher, pool: AsyncConnectionPool[Conn], waiter: AppliedWaiter, attempts: int
    ) -> None:
        self._pub = publisher
        self._pool = pool
        self._waiter = waiter
        self._attempts = attempts

    async def catch_up(self, tenant: str, session: str) -> int:
        """Wait until the projection has applied every event of the session; returns its last seq."""
        last = await self._pub.last_subject_seq(tenant, session)
        await self._waiter.wait_session(tenant, session, last)
        return last

    async def run(self, tenant: str, session: str, decide: Callable[[Conn], Awaitable[Decision]]) -> Any:
        for attempt in range(self._attempts):
            last = await self.catch_up(tenant, session)
            async with self._pool.connection() as conn:
                decision = await decide(conn)
            if decision.event is None:
                return decision.answer(last)
            try:
                published = await self._pub.publish(decision.event, expected_last_subject_seq=last)
            except ConcurrencyConflict:
                await asyncio.sleep(random.uniform(0, 0.002 * min(attempt + 1, 10)))  # noqa: S311
                continue
            return decision.answer(published.seq)
        raise ContentionExhausted(f"gave up after {self._attempts} conflicting attempts")
