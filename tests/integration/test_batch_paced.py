"""A batch stores its messages at most two chunks of ``BATCH_CHUNK_BYTES`` ahead of the projector,
so another tenant's events wait behind two chunks of it, not the whole batch (the log is one
order for every tenant, and a message's projection costs about its text: a batch of 1,000
messages of 95 KB held every other tenant's writes and ``min_seq`` reads ~16 s). A projector that
does not apply a chunk within the read wait ends the pacing: the rest is stored at once."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from events import log as eventlog
from events.omitted import OMITTED
from services.bootstrap import Container
from services.requests import writes
from tests.integration.conftest import Projector, observed_waits
from tests.integration.test_compaction import T

CHUNK_BYTES = 2000  # two of these messages


def message(i: int) -> dict[str, Any]:
    return {"id": f"m{i}", "role": "user", "parts": [{"type": "text", "text": f"{i} " + "x" * 1000}]}


async def stored(c: Container, sid: str) -> int:
    subject = c.layout.session_subject(T, sid)
    return sum([json.loads(e.data)["type"] == "message.appended" async for e in eventlog.read(c.js, c.layout, subject)])


async def test_a_batch_is_at_most_two_chunks_ahead_of_the_projector(
    stack_and_projector: tuple[Container, Projector], monkeypatch: pytest.MonkeyPatch
) -> None:
    """(A batch stored every message at once.) With the projector stopped, a batch of 10 messages
    in chunks of 2 stores 4, then waits for the projector to apply the first chunk; started
    again, the projector applies them and the batch stores the rest."""
    c, projector = stack_and_projector
    monkeypatch.setattr(writes, "BATCH_CHUNK_BYTES", CHUNK_BYTES, raising=False)
    sid = "paced-batch"
    await projector.stop()
    waits, waiting = observed_waits(c, monkeypatch, sid)
    batch = asyncio.create_task(writes.append_batch(c, T, sid, [message(i) for i in range(10)], OMITTED))
    first_wait = asyncio.create_task(waiting.wait())
    done, _ = await asyncio.wait({batch, first_wait}, timeout=30, return_when=asyncio.FIRST_COMPLETED)
    assert first_wait in done, "the batch stored its messages without waiting for the projector"
    assert not batch.done()
    assert await stored(c, sid) == 4

    projector.start()
    answer = await asyncio.wait_for(batch, timeout=30)
    assert [m["id"] for m in answer["messages"]] == [f"m{i}" for i in range(10)]
    assert len(waits) == 3  # before the third, fourth and fifth chunks
    assert await stored(c, sid) == 10


async def test_a_projector_that_does_not_catch_up_ends_the_batch_s_pacing(
    stack_and_projector: tuple[Container, Projector], monkeypatch: pytest.MonkeyPatch
) -> None:
    c, projector = stack_and_projector
    monkeypatch.setattr(writes, "BATCH_CHUNK_BYTES", CHUNK_BYTES, raising=False)
    monkeypatch.setattr(c.waiter, "_timeout", 0.5)  # the read wait
    sid = "stalled-batch"
    await projector.stop()
    waits, _ = observed_waits(c, monkeypatch, sid)
    answer = await asyncio.wait_for(writes.append_batch(c, T, sid, [message(i) for i in range(10)], OMITTED), 30)
    assert len(answer["messages"]) == 10
    assert len(waits) == 1  # the first wait timed out: no other chunk waited
    assert await stored(c, sid) == 10
