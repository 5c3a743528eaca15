"""Headers a publisher stores with its events are never taken for the server's status or control
messages (services/natsclient.py): NATS permissions filter subjects, not headers, so a tenant
publishing straight to its subjects chooses them. An event stored with ``Status: 404`` was skipped
by the projector's fetch, which then re-positioned for ever (every tenant's projections halted);
an empty one stored as a stalled heartbeat had a reader of the log publish, as the operator, to the
subject its ``Nats-Consumer-Stalled`` header named (``$JS.API.STREAM.DELETE.<stream>``: the log
deleted)."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator, Callable

import psycopg
import pytest

from events import log as eventlog
from events.catalog import SessionCreated
from events.log import StoredEvent
from events.publisher import ForeignDuplicate
from services.bootstrap import work_broker
from services.commands_nats.app import broker_for
from services.natsclient import Broker
from services.settings import Settings
from tests.conftest import make_settings, operator_nats, running_stack
from tests.integration.helpers import text_message

STATUS_HEADERS = [
    {"Status": "404"},
    {"Status": "408", "Description": "Request Timeout"},
    {"Status": "409", "Description": "Exceeded MaxWaiting"},
    {"Status": "400", "Description": "Bad Request"},
    {"Status": "503"},
    {"Status": "100", "Description": "Idle Heartbeat"},
]


async def first_event(events: AsyncIterator[StoredEvent | None]) -> StoredEvent:
    async for stored in events:
        if stored is not None:
            return stored
    raise AssertionError("the follower ended")


async def test_events_stored_with_status_headers_are_projected_as_events(
    nats_url: str, fresh_db: str, s3_endpoint: str
) -> None:
    settings = make_settings(nats_url, fresh_db, s3_endpoint=s3_endpoint)
    async with running_stack(settings) as c:
        outside = await operator_nats(nats_url)  # headers pass NATS permissions: any publisher's will do
        try:
            js = outside.jetstream()
            b = f"b-{uuid.uuid4().hex[:8]}"
            subject = c.layout.session_subject("tenant-b", b)
            created = SessionCreated(tenant="tenant-b", session=b, name="stored with Status: 404")
            await js.publish(subject, created.to_json(), headers=STATUS_HEADERS[0], stream=settings.stream)
            junk = [
                (await js.publish(subject, b"not json", headers=h, stream=settings.stream)).seq for h in STATUS_HEADERS
            ]
        finally:
            await outside.close()
        r = await c.commands.append("tenant-a", f"a-{b}", text_message("m0", "after the headers"), None)
        await c.waiter.wait_all(r.seq, timeout_s=20)  # the projector went past every one of them
        async with await psycopg.AsyncConnection.connect(fresh_db) as conn:
            cur = await conn.execute("SELECT name FROM sessions WHERE tenant = 'tenant-b' AND id = %s", (b,))
            assert await cur.fetchone() == ("stored with Status: 404",)
            cur = await conn.execute("SELECT seq, reason FROM quarantine WHERE subject = %s ORDER BY seq", (subject,))
            assert await cur.fetchall() == [(seq, "not_json") for seq in junk]


async def test_an_event_stored_as_a_stalled_heartbeat_is_read_as_an_event_and_answered_by_no_one(
    nats_url: str, fresh_db: str, s3_endpoint: str
) -> None:
    settings = make_settings(nats_url, fresh_db, s3_endpoint=s3_endpoint)
    async with running_stack(settings, projector=False) as c:
        token = uuid.uuid4().hex[:8]
        victim = f"VICTIM-{token}"
        await c.js.add_stream(name=victim, subjects=[f"victim.{token}"])
        stalled = {
            "Status": "100",
            "Description": "Idle Heartbeat",
            "Nats-Consumer-Stalled": f"$JS.API.STREAM.DELETE.{victim}",
        }
        subject = c.layout.session_subject("tenant-b", f"b-{token}")
        outside = await operator_nats(nats_url)
        try:
            ack = await outside.jetstream().publish(subject, b"", headers=stalled, stream=settings.stream)
        finally:
            await outside.close()
        async with contextlib.aclosing(eventlog.follow(c.js, c.layout, subject)) as followed:
            followed_first = await asyncio.wait_for(first_event(followed), 20)  # an ordered consumer of the session
        whole_log = [e async for e in eventlog.read(c.js, c.layout, None, ack.seq, ack.seq)]  # of the whole log
        assert (followed_first.seq, followed_first.data) == (ack.seq, b"")
        assert [(e.seq, e.headers) for e in whole_log] == [(ack.seq, stalled)]
        await c.js._nc.flush()  # what the readers published, if anything, has reached the server
        assert (await c.js.stream_info(victim)).config.name == victim  # nobody asked to delete it
        await c.js.delete_stream(victim)


async def test_a_session_whose_newest_event_is_stored_empty_with_a_status_header_keeps_its_log(
    nats_url: str, fresh_db: str, s3_endpoint: str
) -> None:
    settings = make_settings(nats_url, fresh_db, s3_endpoint=s3_endpoint)
    async with running_stack(settings, projector=False) as c:
        outside = await operator_nats(nats_url)
        try:
            js = outside.jetstream()
            for status in ("404", "503"):
                b = f"b-{uuid.uuid4().hex[:8]}"
                subject = c.layout.session_subject("tenant-b", b)
                created = SessionCreated(tenant="tenant-b", session=b)
                first = (await js.publish(subject, created.to_json(), stream=settings.stream)).seq
                newest = (await js.publish(subject, b"", headers={"Status": status}, stream=settings.stream)).seq
                # a direct get of it was the server saying "no message" (404) or failing (503):
                # the session's last sequence was 0 (its events page empty, every write a conflict)
                assert await c.publisher.last_subject_seq("tenant-b", b) == newest
                assert [e.seq async for e in eventlog.read(c.js, c.layout, subject)] == [first, newest]
        finally:
            await outside.close()


async def test_an_id_held_by_another_subjects_event_stored_with_status_503_is_a_foreign_duplicate(
    nats_url: str, fresh_db: str, s3_endpoint: str
) -> None:
    settings = make_settings(nats_url, fresh_db, s3_endpoint=s3_endpoint)
    async with running_stack(settings, projector=False) as c:
        event = SessionCreated(tenant="tenant-a", session=f"a-{uuid.uuid4().hex[:8]}")
        taken = {"Nats-Msg-Id": event.id, "Status": "503"}
        outside = await operator_nats(nats_url)
        try:  # tenant B takes the id A's event is about to be published under, its event stored with Status: 503
            subject = c.layout.session_subject("tenant-b", "b-1")
            held = (await outside.jetstream().publish(subject, b"{}", headers=taken, stream=settings.stream)).seq
        finally:
            await outside.close()
        with pytest.raises(ForeignDuplicate):  # it read as "no responders", and failed A's write
            await c.publisher.check_duplicate(event, held)
        published = await c.publisher.publish(event, fresh_id_on_foreign=True)
        assert (published.seq > held, published.duplicate) == (True, False)


@pytest.mark.parametrize("make_broker", [work_broker, broker_for], ids=["compactor", "commands"])
async def test_the_brokers_connections_read_an_event_stored_as_a_heartbeat_as_an_event(
    nats_url: str, fresh_db: str, make_broker: Callable[[Settings], Broker]
) -> None:
    """The FastStream brokers (the compactor's work queue, ``chronicle commands``) connect with the
    guarded client too: nats-py's own took such an event, delivered to a push consumer, for an idle
    heartbeat and dropped it."""
    broker = make_broker(make_settings(nats_url, fresh_db))
    nc = await broker.connect()
    try:
        js = nc.jetstream()
        token = uuid.uuid4().hex[:8]
        await js.add_stream(name=f"HEARTBEAT-{token}", subjects=[f"heartbeat.{token}"])
        heartbeat = {"Status": "100", "Description": "Idle Heartbeat"}
        ack = await js.publish(f"heartbeat.{token}", b"", headers=heartbeat)
        sub = await js.subscribe(f"heartbeat.{token}", ordered_consumer=True)
        msg = await sub.next_msg(timeout=10)
        assert (msg.metadata.sequence.stream, msg.data, msg.headers) == (ack.seq, b"", heartbeat)
        await sub.unsubscribe()
        await js.delete_stream(f"HEARTBEAT-{token}")
    finally:
        await broker.stop()
