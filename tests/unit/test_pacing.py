"""A long write's pacing (services/writes/pacing.py): its waits share one budget, and a wait that
fails ends the pacing rather than the write. (Each wait had the whole read wait: a projector
slow but under it per chunk held a 20,000-copy fork ~5 s a chunk, past the SDK's timeout.)"""

from __future__ import annotations

import asyncio
from typing import Any

import psycopg
from psycopg_pool import PoolTimeout

from services.errors import ProjectionTimeout
from services.writes.pacing import Pacer


class _Waiter:
    """Each wait takes ``each_s`` (or raises ``fails``); the timeouts asked are kept."""

    def __init__(self, each_s: float = 0.0, fails: BaseException | None = None) -> None:
        self.each_s, self.fails = each_s, fails
        self.asked: list[tuple[int, float]] = []

    async def wait_session(self, tenant: str, session: str, seq: int, timeout_s: float | None = None) -> None:
        assert timeout_s is not None
        self.asked.append((seq, timeout_s))
        if self.fails is not None:
            raise self.fails
        if self.each_s >= timeout_s:
            await asyncio.sleep(timeout_s)
            raise ProjectionTimeout("not applied")
        await asyncio.sleep(self.each_s)


def _pacer(waiter: _Waiter, budget_s: float) -> Pacer:
    fake: Any = waiter
    return Pacer(fake, "t", "s", budget_s)


async def test_the_waits_of_one_write_share_the_budget_then_the_rest_goes_at_once() -> None:
    waiter = _Waiter(each_s=0.1)
    pacer = _pacer(waiter, budget_s=0.35)
    for chunk in range(10):
        await pacer.turn()
        pacer.stored(100 * (chunk + 1))
    # chunks 0 and 1 wait for nothing; from chunk 2 on each waits for the one before the last,
    # 0.1 s each, until the 0.35 s are spent: no wait after that, whatever is left of the write
    assert [seq for seq, _ in waiter.asked] == [100, 200, 300, 400]
    assert all(b < a for (_, a), (_, b) in zip(waiter.asked, waiter.asked[1:], strict=False))  # what is left
    assert not pacer.on


async def test_the_time_spent_storing_chunks_is_not_counted_against_the_budget() -> None:
    """A write that takes longer to store than the budget, its waits short, stays paced to the end
    (the budget counted the whole write: the largest writes lost their pacing partway)."""
    waiter = _Waiter(each_s=0.01)
    pacer = _pacer(waiter, budget_s=0.2)
    for chunk in range(8):
        await pacer.turn()
        await asyncio.sleep(0.05)  # storing the chunk: 0.4 s in all, twice the budget
        pacer.stored(chunk + 1)
    assert [seq for seq, _ in waiter.asked] == [1, 2, 3, 4, 5, 6]
    assert pacer.on


async def test_a_wait_that_fails_ends_the_pacing_and_not_the_write() -> None:
    for fails in (PoolTimeout("pool"), psycopg.OperationalError("gone"), ProjectionTimeout("late")):
        waiter = _Waiter(fails=fails)
        pacer = _pacer(waiter, budget_s=5)
        for chunk in range(5):
            await pacer.turn()  # never raises
            pacer.stored(chunk + 1)
        assert (len(waiter.asked), pacer.on) == (1, False)
