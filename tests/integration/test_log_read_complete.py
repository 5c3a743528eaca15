"""``events.log.read`` (rebuild, verify, archive, replay, the events API, erasure's object list) is
complete: a reader slower than the server's delivery misses no event. nats-py counts a push
message as delivered for its ordered consumer before it drops it for a full buffer (the slow
consumer limit), so the consumer never noticed the hole and a rebuild of a large log silently
lacked events. Real NATS: a log of large events read slowly."""

from __future__ import annotations

import asyncio
import uuid

import pytest

from events import log as eventlog
from events.stream import ensure_stream
from events.subjects import SubjectLayout
from tests.conftest import operator_nats


def _layout() -> SubjectLayout:
    tag = uuid.uuid4().hex[:8]
    return SubjectLayout(stream=f"R{tag}", prefix=f"r{tag}.ev", commands=f"r{tag}.cmd")


EVENTS = 400
EVENT_BYTES = 256 * 1024  # 100 MiB in all: past nats-py's 64 MiB buffer of a subscription


async def test_a_slow_reader_of_a_log_larger_than_the_client_buffer_reads_every_event(nats_url: str) -> None:
    nc = await operator_nats(nats_url)
    js = nc.jetstream()
    layout = _layout()
    try:
        await ensure_stream(js, layout)
        subject = layout.session_subject("t", "s")
        body = b"x" * EVENT_BYTES
        for _ in range(EVENTS // 50):
            await asyncio.gather(*(js.publish(subject, body) for _ in range(50)))
        seen: list[int] = []
        async for stored in eventlog.read(js, layout, None, 1, None, idle_timeout_s=30):
            if not seen:
                await asyncio.sleep(3)  # the server delivers meanwhile: the client's buffer fills
            seen.append(stored.seq)
        assert seen == list(range(1, EVENTS + 1))
    finally:
        await js.delete_stream(layout.stream)
        await nc.close()


async def test_a_jump_over_sequences_the_stream_holds_is_a_lost_delivery_and_over_deleted_ones_is_not(
    nats_url: str,
) -> None:
    nc = await operator_nats(nats_url)
    js = nc.jetstream()
    layout = _layout()
    try:
        # a stream that allows deletes (Chronicle's denies them: its log never has a hole)
        await js.add_stream(name=layout.stream, subjects=[layout.wildcard])
        for i in range(5):
            await js.publish(layout.session_subject("t", "s"), f"{i}".encode())
        with pytest.raises(eventlog.ReadIncomplete, match="did not receive sequence 3, which the stream holds"):
            await eventlog.check_hole(js, layout, 2, 4)
        await js.delete_msg(layout.stream, 3)
        await eventlog.check_hole(js, layout, 2, 4)  # deleted: not a hole
        assert [e.seq async for e in eventlog.read(js, layout)] == [1, 2, 4, 5]
    finally:
        await js.delete_stream(layout.stream)
        await nc.close()
