"""``Publisher.publish_many(…, into=…)`` leaves, after an error, the unbroken acknowledged prefix
of the events: an ack that came back for an event after the one that failed is not counted (acks
of a pipeline can come back out of order)."""

from __future__ import annotations

import asyncio
from typing import cast

import pytest
from nats.js import JetStreamContext
from nats.js.api import PubAck
from nats.js.errors import APIError

from events.publisher import Published, Publisher
from events.subjects import SubjectLayout
from tests.integration.helpers import appended

LAYOUT = SubjectLayout()


class AckingJs:
    """Acks every pipelined publish but those of ``failing`` (answered with an error, as a stream
    that refuses it), whose retry one by one is refused too."""

    def __init__(self, failing: set[int]) -> None:
        self.failing = failing
        self.sent = 0

    async def publish_async(self, subject: str, payload: bytes, **_: object) -> asyncio.Future[PubAck]:
        n, self.sent = self.sent, self.sent + 1
        future: asyncio.Future[PubAck] = asyncio.get_running_loop().create_future()
        if n in self.failing:
            future.set_exception(APIError(code=400, description="refused"))
        else:
            future.set_result(PubAck(stream=LAYOUT.stream, seq=100 + n))
        return future

    async def publish(self, subject: str, payload: bytes, **_: object) -> PubAck:
        raise APIError(code=400, description="refused again")


async def test_after_an_error_into_holds_the_acknowledged_prefix_not_the_acks_after_it() -> None:
    publisher = Publisher(cast(JetStreamContext, AckingJs({2})), LAYOUT, attempts=1, timeout_s=0.5)
    events = [appended("tenant-a", "s-1", f"m{i}", None) for i in range(5)]
    into: list[Published] = []
    with pytest.raises(APIError):
        await publisher.publish_many(events, into=into)
    assert into == [Published(seq=100, duplicate=False), Published(seq=101, duplicate=False)]


async def test_into_is_what_publish_many_returns() -> None:
    publisher = Publisher(cast(JetStreamContext, AckingJs(set())), LAYOUT, attempts=1, timeout_s=0.5)
    events = [appended("tenant-a", "s-1", f"m{i}", None) for i in range(3)]
    into: list[Published] = []
    assert await publisher.publish_many(events, into=into) is into
    assert [p.seq for p in into] == [100, 101, 102]
