"""Oversized bodies travel by claim check: the event carries a reference, reads return the body."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable

import pytest

from events import log as eventlog
from events.omitted import OMITTED
from projections import queries
from services.bootstrap import Container
from services.errors import PayloadTooLarge
from tests.conftest import make_settings, running_stack


@pytest.fixture(scope="module")
async def small_limit_stack(nats_url: str, db_url: str) -> AsyncIterator[Container]:
    settings = make_settings(nats_url, db_url, payload_limit_bytes=1024, max_message_bytes=64 * 1024)
    async with running_stack(settings) as c:
        yield c


async def test_large_body_goes_to_object_storage_and_reads_whole(
    small_limit_stack: Container, new_id: Callable[[str], str]
) -> None:
    c = small_limit_stack
    sid = new_id("big")
    text = "lorem ipsum dolor sit amet " * 400  # ~10 KB
    body = {"id": "big1", "role": "user", "parts": [{"type": "text", "text": text}], "extra": {"kept": True}}
    result = await c.commands.append("tenant-a", sid, body, OMITTED)
    again = await c.commands.append("tenant-a", sid, body, OMITTED)
    assert (again.created, again.seq) == (False, result.seq)
    stored = [e async for e in eventlog.read(c.js, c.layout, c.layout.session_subject("tenant-a", sid))]
    assert len(stored) == 1
    raw = json.loads(stored[0].data)
    assert raw.get("message") is None  # (sealed: inside the seal, as null)
    assert raw["message_ref"]["size"] > 1024
    assert len(stored[0].data) < 1024
    await c.waiter.wait_session("tenant-a", sid, result.seq)
    async with c.pool.connection() as conn:
        row = await queries.get_message(conn, "tenant-a", sid, "big1")
        hits = await queries.search(conn, "tenant-a", sid, "lorem dolor", 5)
    assert row is not None
    assert json.loads(row.content) == body
    assert [h.id for h in hits] == ["big1"]


async def test_body_over_the_hard_limit_is_refused(small_limit_stack: Container, new_id: Callable[[str], str]) -> None:
    c = small_limit_stack
    sid = new_id("huge")
    body = {"id": "h", "role": "user", "parts": [{"type": "text", "text": "x" * 70_000}]}
    with pytest.raises(PayloadTooLarge):
        await c.commands.append("tenant-a", sid, body, OMITTED)
    assert await c.publisher.last_subject_seq("tenant-a", sid) == 0
