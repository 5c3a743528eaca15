"""Writes of one process to one session take turns (services/writes/turns.py), against real NATS
and Postgres: cancelled writes, waiting or holding the turn, leave the others fine and the session
one chain; a write that waits too long for its turn is ``contention`` and publishes nothing; two
processes (two command services) still race, and optimistic concurrency still decides."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from events.omitted import OMITTED
from projections import queries
from services.bootstrap import Container
from services.errors import ContentionExhausted
from services.writes.commands import AppendResult
from tests.conftest import operator_nats
from tests.integration.helpers import other_process, text_message

T = "tenant-a"


async def _one_chain(c: Container, sid: str, seq: int) -> list[str]:
    """The session's messages from the root down once ``seq`` is applied, asserting that they are
    one chain (the latest leaf's path holds every message of the session)."""
    await c.waiter.wait_session(T, sid, seq)
    async with c.pool.connection() as conn:
        leaf = await queries.latest_leaf(conn, T, sid)
        assert leaf is not None
        path = [r.id for r in await queries.history(conn, T, sid, leaf.id)]
        cur = await conn.execute("SELECT count(*) FROM messages WHERE tenant = %s AND session_id = %s", (T, sid))
        row = await cur.fetchone()
    assert row is not None
    assert row[0] == len(path), "a message of the session is off the latest leaf's path"
    return path


async def _until(condition: Callable[[], bool]) -> None:
    """Return once ``condition()`` holds (checked each time the loop comes round)."""
    deadline = asyncio.get_running_loop().time() + 30
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, "never happened"
        await asyncio.sleep(0)


async def _burst(c: Container, sid: str, n: int) -> list[asyncio.Task[AppendResult]]:
    """A root, then ``n`` concurrent appends without a parent (m0…), each in a task of its own."""
    await c.commands.append(T, sid, text_message("root", "root"), None)
    return [
        asyncio.create_task(c.commands.append(T, sid, text_message(f"m{i}", f"message {i}"), OMITTED)) for i in range(n)
    ]


async def test_writes_cancelled_while_they_wait_leave_the_others_fine(
    stack: Container, new_id: Callable[[str], str]
) -> None:
    sid = new_id("turns-cancel")
    turns = stack.commands.optimistic.turns
    tasks = await _burst(stack, sid, 60)
    await _until(lambda: turns.waiting >= 50)
    cancelled = [t for t in tasks[1::3] if not t.done()]
    for t in cancelled:
        t.cancel()
    results = await asyncio.gather(*tasks, return_exceptions=True)
    assert all(t.cancelled() for t in cancelled)
    kept = [r for t, r in zip(tasks, results, strict=True) if t not in cancelled]
    assert all(isinstance(r, AppendResult) and r.created for r in kept), kept
    assert len(turns) == 0
    path = await _one_chain(stack, sid, max(r.seq for r in kept if isinstance(r, AppendResult)))
    assert len(path) == 1 + len(kept)  # a write cancelled while it waited stored nothing


async def test_a_write_cancelled_while_it_holds_the_turn_hands_it_on(
    stack: Container, new_id: Callable[[str], str]
) -> None:
    sid = new_id("turns-holder")
    turns = stack.commands.optimistic.turns
    tasks = await _burst(stack, sid, 40)
    stopped = 0
    while stopped < 5:  # the writes holding the turn, cancelled mid-decision or mid-publish
        await _until(lambda: turns.waiting > 0 and turns._turns[(T, sid)].owner is not None)
        holder = turns._turns[(T, sid)].owner
        assert holder is not None
        holder.cancel()
        stopped += 1
        await asyncio.sleep(0)
    results = await asyncio.gather(*tasks, return_exceptions=True)
    done = [r for r in results if isinstance(r, AppendResult)]
    assert len(done) >= 40 - stopped
    assert all(isinstance(r, AppendResult | asyncio.CancelledError) for r in results), results
    assert len(turns) == 0
    # a cancelled holder's publish may have reached the log: the next write's conflicted, and the
    # session stayed one chain all the same
    last = await stack.publisher.last_subject_seq(T, sid)
    path = await _one_chain(stack, sid, last)
    assert {r.id for r in done} <= set(path)
    after = await stack.commands.append(T, sid, text_message("after", "after"), OMITTED)
    assert after.parent_id == path[-1]


async def test_a_write_that_waits_too_long_for_its_turn_is_contention_and_publishes_nothing(
    stack: Container, new_id: Callable[[str], str]
) -> None:
    sid = new_id("turns-timeout")
    first = await stack.commands.append(T, sid, text_message("m1", "one"), None)
    turns = stack.commands.optimistic.turns
    held = await turns.take((T, sid))  # another write of this process holds the turn
    before, turns.timeout_s = turns.timeout_s, 0.2
    try:
        with pytest.raises(ContentionExhausted, match="waited"):  # another task: this one would re-enter
            await asyncio.create_task(stack.commands.append(T, sid, text_message("m2", "two"), OMITTED))
        assert await stack.publisher.last_subject_seq(T, sid) == first.seq
        assert turns.waiting == 0
    finally:
        turns.timeout_s = before
        turns.give_back((T, sid), held)
    assert len(turns) == 0
    again = await stack.commands.append(T, sid, text_message("m2", "two"), OMITTED)
    assert (again.parent_id, again.created) == ("m1", True)


async def test_two_processes_still_race_and_make_one_chain(stack: Container, new_id: Callable[[str], str]) -> None:
    """Two command services with their own connections (as two API processes): each queues its
    own writes, and the log's optimistic concurrency orders the two."""
    sid = new_id("turns-two")
    conns = [await operator_nats(stack.settings.nats_url) for _ in range(2)]
    try:
        services = [other_process(stack, nc) for nc in conns]
        results = await asyncio.gather(
            *(
                cmd.append(T, sid, text_message(f"p{p}-{i}", f"process {p} message {i}"), OMITTED)
                for i in range(60)
                for p, cmd in enumerate(services)
            )
        )
    finally:
        for nc in conns:
            await nc.close()
    assert all(r.created for r in results)
    assert len({r.parent_id for r in results}) == len(results)  # no two took the same parent
    path = await _one_chain(stack, sid, max(r.seq for r in results))
    assert len(path) == 120
    assert all(len(s.optimistic.turns) == 0 for s in services)
