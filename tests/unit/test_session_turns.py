"""One write at a time per session within a process (services.writes.turns.SessionTurns)."""

from __future__ import annotations

import asyncio
import re

import pytest

from services.errors import ContentionExhausted
from services.writes.turns import SessionTurns

A, B = ("acme", "chat"), ("acme", "other")


class Writes:
    """``n`` writes to session A, started in order: each logs when it has its turn and holds it
    until its gate opens."""

    def __init__(self, turns: SessionTurns, n: int) -> None:
        self.log: list[str] = []
        self.gates = [asyncio.Event() for _ in range(n)]
        self.tasks = [asyncio.create_task(self._write(turns, i)) for i in range(n)]

    async def _write(self, turns: SessionTurns, i: int) -> None:
        async with turns.turn(A):
            self.log.append(f"w{i} in")
            await self.gates[i].wait()
            self.log.append(f"w{i} out")

    async def finish(self, *opened: int) -> list[object]:
        """Open the gates ``opened`` (all: none named) and wait for every write to end."""
        for i in opened or range(len(self.gates)):
            self.gates[i].set()
        return await asyncio.gather(*self.tasks, return_exceptions=True)


async def _settle() -> None:
    """Let every ready task run until it waits on something of the test's."""
    for _ in range(5):
        await asyncio.sleep(0)


async def test_writes_to_one_session_take_turns_in_arrival_order_and_the_entry_goes() -> None:
    turns = SessionTurns(timeout_s=5)
    writes = Writes(turns, 3)
    await _settle()
    assert writes.log == ["w0 in"]
    assert (len(turns), turns.waiting) == (1, 2)
    await writes.finish(2, 1, 0)  # the later writes are ready first: they still wait their turn
    assert writes.log == ["w0 in", "w0 out", "w1 in", "w1 out", "w2 in", "w2 out"]
    assert (len(turns), turns.waiting) == (0, 0)


async def test_other_sessions_do_not_wait() -> None:
    turns = SessionTurns(timeout_s=5)
    writes = Writes(turns, 1)
    await _settle()
    async with turns.turn(B):
        assert len(turns) == 2
    await writes.finish()
    assert len(turns) == 0


async def test_a_write_cancelled_while_waiting_leaves_the_queue() -> None:
    turns = SessionTurns(timeout_s=5)
    writes = Writes(turns, 3)
    await _settle()
    writes.tasks[1].cancel()
    await _settle()
    assert writes.tasks[1].cancelled()
    assert turns.waiting == 1
    await writes.finish(0, 2)
    assert writes.log == ["w0 in", "w0 out", "w2 in", "w2 out"]
    assert len(turns) == 0


@pytest.mark.parametrize("cancel_first", [False, True])
async def test_a_write_cancelled_as_it_is_handed_the_turn_hands_it_on(cancel_first: bool) -> None:
    """Cancelled just after it was handed the turn, or just before (its wait is over, and the
    turn is given back before it runs): either way the next write has the turn."""
    turns = SessionTurns(timeout_s=5)
    held = await turns.take(A)
    writes = Writes(turns, 2)
    await _settle()
    if cancel_first:
        writes.tasks[0].cancel()
        turns.give_back(A, held)
    else:
        turns.give_back(A, held)
        writes.tasks[0].cancel()
    await writes.finish(1)
    assert writes.tasks[0].cancelled()
    assert writes.log == ["w1 in", "w1 out"]
    assert len(turns) == 0


async def test_the_last_waiting_write_cancelled_as_the_turn_is_given_back_leaves_nothing() -> None:
    turns = SessionTurns(timeout_s=5)
    held = await turns.take(A)
    waiting = asyncio.create_task(turns.take(A))
    await _settle()
    waiting.cancel()
    turns.give_back(A, held)
    await asyncio.gather(waiting, return_exceptions=True)
    assert waiting.cancelled()
    assert len(turns) == 0


async def test_a_write_cancelled_while_holding_gives_the_turn_back() -> None:
    turns = SessionTurns(timeout_s=5)
    writes = Writes(turns, 2)
    await _settle()
    writes.tasks[0].cancel()
    await writes.finish(1)
    assert writes.tasks[0].cancelled()
    assert writes.log == ["w0 in", "w1 in", "w1 out"]
    assert len(turns) == 0


async def test_a_write_that_waits_too_long_is_contention_and_leaves_the_queue() -> None:
    turns = SessionTurns(timeout_s=0.05)
    writes = Writes(turns, 1)
    await _settle()
    with pytest.raises(ContentionExhausted, match=r"waited 0\.05s"):
        await turns.take(A)
    assert (len(turns), turns.waiting) == (1, 0)
    await writes.finish()
    assert len(turns) == 0
    async with turns.turn(A):  # the session's turn is free again
        assert len(turns) == 1


async def test_a_write_that_waits_too_long_says_how_many_writes_were_ahead_and_for_how_long_one_held_it() -> None:
    """A client's write sent again after its timeout waits behind its own first attempt, still
    running (waiting for a database connection, say): the answer says so rather than blaming
    "other writes"."""
    turns = SessionTurns(timeout_s=0.05)
    writes = Writes(turns, 1)  # the first attempt, holding the turn
    await _settle()
    with pytest.raises(ContentionExhausted) as raised:
        await turns.take(A)  # the retry
    detail = str(raised.value)
    assert "behind 1 earlier write to this session in this process" in detail
    assert re.search(r"the one writing has held its turn for 0\.\d\ds", detail), detail
    assert "a write sent again waits behind its first attempt" in detail
    await writes.finish()


async def test_a_write_that_holds_its_sessions_turn_goes_on_when_it_writes_again() -> None:
    turns = SessionTurns(timeout_s=0.05)
    async with turns.turn(A), turns.turn(A):
        assert (len(turns), turns.waiting) == (1, 0)
    assert len(turns) == 0
