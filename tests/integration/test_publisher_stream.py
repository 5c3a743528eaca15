"""Events are published without ``Nats-Expected-Stream`` (stored with every event, it cost ~35 B
a message); the publisher still refuses to count an event another stream stored as appended."""

from __future__ import annotations

import uuid

import pytest

from events.publisher import Publisher, PublishFailed
from events.subjects import SubjectLayout
from tests.conftest import operator_nats
from tests.integration.helpers import appended


async def test_an_event_another_stream_stored_is_a_failure_not_an_append(nats_url: str) -> None:
    nc = await operator_nats(nats_url)
    tag = uuid.uuid4().hex[:8]
    js = nc.jetstream()
    try:
        await js.add_stream(name=f"OTHER{tag}", subjects=[f"o{tag}.ev.>"])
        layout = SubjectLayout(stream=f"MINE{tag}", prefix=f"o{tag}.ev", commands=f"o{tag}.cmd")  # not made
        publisher = Publisher(js, layout, attempts=1)
        with pytest.raises(PublishFailed, match=f"stream 'OTHER{tag}' stored the event, not 'MINE{tag}'"):
            await publisher.publish(appended("tenant-a", "s-1", "m1", None))
        with pytest.raises(PublishFailed, match=f"'OTHER{tag}'"):
            await publisher.publish_many([appended("tenant-a", "s-1", "m2", None)])
        mine = Publisher(js, SubjectLayout(stream=f"OTHER{tag}", prefix=f"o{tag}.ev", commands=f"o{tag}.cmd"))
        stored = await mine.publish(appended("tenant-a", "s-1", "m3", None))
        assert stored.seq == 3  # the layout that names it appends to it
    finally:
        await js.delete_stream(f"OTHER{tag}")
        await nc.close()
