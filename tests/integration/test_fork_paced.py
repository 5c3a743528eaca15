"""A fork publishes its copies in chunks, at most two ahead of the projector (a chunk once the one
before the last is applied), so another tenant's events wait behind two chunks of them, not the
whole fork (the log is one order for every tenant). A projector that does not apply a chunk within the read wait ends
the pacing: the rest is published at once, and the fork is made all the same."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from events import log as eventlog
from services.bootstrap import Container
from services.writes import commands as commands_module
from services.writes.commands import fork
from tests.integration.conftest import Projector, observed_waits
from tests.integration.test_compaction import T, _append_chain

CHUNK = 10


async def fork_types(c: Container, sid: str) -> list[str]:
    subject = c.layout.session_subject(T, sid)
    return [json.loads(e.data)["type"] async for e in eventlog.read(c.js, c.layout, subject)]


async def test_a_fork_is_at_most_two_chunks_of_its_copies_ahead_of_the_projector(
    stack_and_projector: tuple[Container, Projector], monkeypatch: pytest.MonkeyPatch
) -> None:
    """(A fork published every copy but the last at once: 20,000 in ~3 s, which every other
    tenant's events then waited behind.) With the projector stopped after the source is applied,
    the fork publishes its creation and two chunks, then waits for the projector to apply the
    first; started again, the projector applies them and the fork publishes the rest."""
    c, projector = stack_and_projector
    monkeypatch.setattr(commands_module, "FORK_CHUNK", CHUNK, raising=False)
    sid, fork_id = "paced-src", "paced-fork"
    await _append_chain(c, sid, [f"m{i}" for i in range(25)])
    await c.commands.optimistic.catch_up(T, sid)
    await projector.stop()

    waits, waiting = observed_waits(c, monkeypatch, fork_id)

    sizes: list[int] = []
    publish_many = c.commands._pub.publish_many

    async def counted(events: list[Any], **kw: Any) -> Any:
        sizes.append(len(events))
        return await publish_many(events, **kw)

    monkeypatch.setattr(c.commands._pub, "publish_many", counted)
    forking = asyncio.create_task(fork(c.commands, c.eraser, T, sid, "m24", fork_id, None))
    first_wait = asyncio.create_task(waiting.wait())
    done, _ = await asyncio.wait({forking, first_wait}, timeout=30, return_when=asyncio.FIRST_COMPLETED)
    assert first_wait in done, "the fork published its copies without waiting for the projector"
    assert not forking.done()
    assert await fork_types(c, fork_id) == ["session.created"] + ["message.appended"] * 2 * CHUNK

    projector.start()
    forked = await asyncio.wait_for(forking, timeout=30)
    assert forked.messages == 25
    assert sizes == [CHUNK, CHUNK, 4, 1]  # the copy of m24 last, alone
    assert len(waits) == 1  # before the third chunk, for the first
    assert await fork_types(c, fork_id) == ["session.created"] + ["message.appended"] * 25


async def test_a_projector_that_does_not_catch_up_ends_the_pacing_and_the_fork_is_made(
    stack_and_projector: tuple[Container, Projector], monkeypatch: pytest.MonkeyPatch
) -> None:
    c, projector = stack_and_projector
    monkeypatch.setattr(commands_module, "FORK_CHUNK", CHUNK, raising=False)
    monkeypatch.setattr(c.waiter, "_timeout", 0.5)  # the read wait
    sid, fork_id = "stalled-src", "stalled-fork"
    await _append_chain(c, sid, [f"m{i}" for i in range(35)])
    await c.commands.optimistic.catch_up(T, sid)
    await projector.stop()
    waits, _ = observed_waits(c, monkeypatch, fork_id)
    forked = await asyncio.wait_for(fork(c.commands, c.eraser, T, sid, "m34", fork_id, None), timeout=30)
    assert forked.messages == 35
    assert len(waits) == 1  # the wait for the first chunk timed out: no other chunk waited
    assert await fork_types(c, fork_id) == ["session.created"] + ["message.appended"] * 35
