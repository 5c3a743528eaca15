"""Events are published without ``Nats-Expected-Stream`` (stored with every event, it cost ~35 B
a message); the publisher still refuses to count an event another stream stored as appended."""

from __future__ import annotations

import asyncio
import uuid

import pytest
from nats.js.api import DiscardPolicy, StreamConfig

from events.envelope import Event
from events.publisher import HDR_MSG_ID, ConcurrencyConflict, Publisher, PublishFailed
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


async def test_a_pipelined_publish_the_stream_refuses_fails_and_does_not_hang(nats_url: str) -> None:
    """The stream answers with an error (here: full, discarding new messages). nats-py never
    settles such a pipelined publish's future: ``publish_many`` waited for it forever. It now
    gives up on an ack that does not come, publishes again one by one and fails as ``publish``
    does."""
    nc = await operator_nats(nats_url)
    tag = uuid.uuid4().hex[:8]
    js = nc.jetstream()
    try:
        config = StreamConfig(name=f"FULL{tag}", subjects=[f"f{tag}.ev.>"], max_bytes=600, discard=DiscardPolicy.NEW)
        await js.add_stream(config)
        layout = SubjectLayout(stream=f"FULL{tag}", prefix=f"f{tag}.ev", commands=f"f{tag}.cmd")
        publisher = Publisher(js, layout, attempts=2, timeout_s=0.5, backoff_s=0.01)
        events = [appended("tenant-a", "s-1", f"m{i}", None) for i in range(5)]
        with pytest.raises(PublishFailed, match="failed: ServiceUnavailableError"):  # 503: maximum bytes exceeded
            await asyncio.wait_for(publisher.publish_many(events), timeout=30)
        info = await js.stream_info(f"FULL{tag}")
        assert 0 < info.state.messages < 5  # the first ones fit; the rest were refused, not stored
    finally:
        await js.delete_stream(f"FULL{tag}")
        await nc.close()


async def test_on_stored_is_told_of_each_event_stored_once_never_of_a_duplicate(nats_url: str) -> None:
    """What the API's ``chronicle_events_published_total`` counts: an ack that is not a
    duplicate, from ``publish`` and ``publish_many`` alike; a retried publish, a conflict and an
    id someone else took (published again under a fresh id: told once, as that one) are not
    told twice or at all."""
    nc = await operator_nats(nats_url)
    tag = uuid.uuid4().hex[:8]
    js = nc.jetstream()
    try:
        layout = SubjectLayout(stream=f"TOLD{tag}", prefix=f"t{tag}.ev", commands=f"t{tag}.cmd")
        await js.add_stream(StreamConfig(name=layout.stream, subjects=[f"{layout.prefix}.>"], allow_direct=True))
        told: list[Event] = []
        publisher = Publisher(js, layout, on_stored=told.append)
        e1, e2, e3 = (appended("tenant-a", "s-1", f"m{i}", None) for i in range(1, 4))
        await publisher.publish(e1)
        assert (await publisher.publish(e1)).duplicate
        results = await publisher.publish_many([e1, e2, e3])
        assert [r.duplicate for r in results] == [True, False, False]
        with pytest.raises(ConcurrencyConflict):
            await publisher.publish(appended("tenant-a", "s-1", "m4", None), expected_last_subject_seq=1)
        assert [e.id for e in told] == [e1.id, e2.id, e3.id]
        taken = appended("tenant-a", "s-2", "m5", None)
        other = publisher.layout.session_subject("tenant-a", "s-other")
        await js.publish(other, b"{}", headers={HDR_MSG_ID: taken.id})  # the id, taken on another subject
        await publisher.publish(taken, fresh_id_on_foreign=True)
        assert len(told) == 4
        assert told[-1].id != taken.id
        assert told[-1].type == "message.appended"
    finally:
        await js.delete_stream(f"TOLD{tag}")
        await nc.close()


async def test_a_publish_that_meets_a_lost_socket_is_retried_with_the_same_id(
    nats_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """nats-py writing to a socket the killed server's end closed, before it noticed (its flusher
    died on it, so the next publish writes itself): uvloop raises ``RuntimeError: unable to perform
    operation on <TCPTransport closed=True>``, which escaped the publisher (the API answered 500).
    It is retried, as a timeout is: the event is stored once; spent, it is :class:`PublishFailed`."""
    nc = await operator_nats(nats_url)
    tag = uuid.uuid4().hex[:8]
    js = nc.jetstream()
    layout = SubjectLayout(stream=f"LOST{tag}", prefix=f"l{tag}.ev", commands=f"l{tag}.cmd")
    lost = RuntimeError("unable to perform operation on <TCPTransport closed=True>; the handler is closed")
    real = js.publish
    tries: list[str] = []

    async def losing(*args: object, **kwargs: object) -> object:
        tries.append("x")
        if len(tries) == 1:
            raise lost  # the first write meets the lost socket
        return await real(*args, **kwargs)  # type: ignore[arg-type]

    try:
        await js.add_stream(name=layout.stream, subjects=[f"{layout.prefix}.>"])
        monkeypatch.setattr(js, "publish", losing)
        stored = await Publisher(js, layout, backoff_s=0.01).publish(appended("tenant-a", "s-1", "m1", None))
        assert (stored.seq, stored.duplicate, len(tries)) == (1, False, 2)

        async def always_lost(*args: object, **kwargs: object) -> object:
            raise lost

        monkeypatch.setattr(js, "publish", always_lost)
        with pytest.raises(PublishFailed, match="unable to perform operation"):
            await Publisher(js, layout, attempts=2, backoff_s=0.01).publish(appended("tenant-a", "s-1", "m2", None))
    finally:
        await js.delete_stream(layout.stream)
        await nc.close()
