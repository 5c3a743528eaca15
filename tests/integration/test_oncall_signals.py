"""Signals an on-call trial found missing or misleading. The compactors on ``/metrics``: the
requests waiting on the work queue and those a compactor is on (a dead compactor left readiness
and the metrics unchanged while requests waited).
``/readyz`` on a database without Chronicle's tables: Postgres answers, the database needs
migrating (it said Postgres did not answer)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from datetime import datetime

import nats.errors
import pytest
from nats.js import JetStreamContext
from nats.js.api import AckPolicy, ConsumerConfig
from prometheus_client import generate_latest

from events.context import CompactionConfig, SessionConfig
from events.omitted import OMITTED
from services.api import metrics
from services.bootstrap import Container
from services.compaction.queue import KIND, request
from tests.conftest import make_settings, running_stack
from tests.integration.helpers import text_message
from tests.integration.test_compaction import _Blocking

T = "tenant-a"


Check = Callable[[], Awaitable[metrics.WorkQueue | None]]


async def until(check: Check, what: str) -> metrics.WorkQueue:
    for _ in range(150):
        found = await check()
        if found is not None:
            return found
        await asyncio.sleep(0.1)
    raise AssertionError(f"never: {what}")


def queue_when(
    c: Container, wanted: Callable[[metrics.WorkQueue], bool]
) -> Callable[[], Awaitable[metrics.WorkQueue | None]]:
    async def check() -> metrics.WorkQueue | None:
        found = await metrics.refresh(c, work=True)
        assert isinstance(found.work, metrics.WorkQueue), found.work
        return found.work if wanted(found.work) else None

    return check


async def test_waiting_compactions_and_whether_a_compactor_is_on_them(
    nats_url: str, fresh_db: str, s3_endpoint: str
) -> None:
    """No compactor: the request waits, none in progress (the alert's condition). A compactor busy
    summarising: in progress, none waiting, and no open pull request (which is why open pulls
    alone cannot tell a dead compactor from a busy one). Done: all zero, the idle compactor's
    pull request open."""
    settings = make_settings(nats_url, fresh_db, s3_endpoint=s3_endpoint)
    async with running_stack(settings) as c:  # the projector requests compactions; no compactor yet
        blocking = _Blocking()
        c.compaction.summarizer = blocking
        cfg = CompactionConfig(compact_after=400, protect_head=1, tail_token_budget=50, min_tail_messages=2)
        await c.context.configure(T, "auto", SessionConfig(compaction=cfg))
        for i in range(12):
            await c.commands.append(T, "auto", text_message(f"m{i}", "words to summarise " * 8), OMITTED)
        waiting = await until(queue_when(c, lambda q: q.waiting > 0), "a waiting compaction request")
        assert (waiting.in_progress, waiting.pulls_waiting) == (0, 0)
        text = generate_latest(metrics.REGISTRY).decode()
        assert f"chronicle_compaction_requests_waiting {float(waiting.waiting)}" in text
        assert "chronicle_compaction_requests_in_progress 0.0" in text

        stop = asyncio.Event()
        task = asyncio.create_task(c.compactor().run(stop))
        try:
            await asyncio.wait_for(blocking.entered.wait(), 15)
            busy = await until(queue_when(c, lambda q: q.in_progress > 0), "the request in progress")
            assert busy.waiting == 0
            blocking.release.set()
            await until(queue_when(c, lambda q: q.waiting == q.in_progress == 0), "the request done")
            idle = await until(queue_when(c, lambda q: q.pulls_waiting > 0), "the idle compactor's pull request")
            assert (idle.waiting, idle.in_progress) == (0, 0)
        finally:
            blocking.release.set()
            stop.set()
            await asyncio.wait_for(task, 15)


async def test_readiness_says_a_database_without_chronicles_tables_needs_migrating(
    nats_url: str, fresh_db: str, s3_endpoint: str
) -> None:
    """The database dropped and made again under the running stack: Postgres answers (its flag
    stays true) and the reason names the missing migration, not an unanswering server."""
    settings = make_settings(nats_url, fresh_db, s3_endpoint=s3_endpoint)
    async with running_stack(settings, projector=False) as c:
        async with c.pool.connection() as conn:
            await conn.execute("DROP SCHEMA public CASCADE")
            await conn.execute("CREATE SCHEMA public")
        body = await metrics.readiness(c)
        assert (body["ready"], body["postgres"], body["nats"]) == (False, True, True), body
        assert any(
            r.startswith("Postgres answers, but the database holds no Chronicle tables") for r in body["reasons"]
        )
        assert not any(r.startswith("Postgres does not answer") for r in body["reasons"]), body


def quarantined_counter(reason: str) -> float:
    return metrics.REGISTRY.get_sample_value("chronicle_quarantined_events_total", {"reason": reason}) or 0.0


async def test_the_quarantine_counter_counts_every_new_refusal_after_an_erasure_deleted_rows(
    nats_url: str, fresh_db: str, s3_endpoint: str
) -> None:
    """``chronicle_quarantined_events_total`` counts each event quarantined once, also after rows
    were deleted (an erasure forgets its session's): it followed the table's size, so it stayed put
    until the table grew past its old size again and an alert on its increase never fired."""
    settings = make_settings(nats_url, fresh_db, s3_endpoint=s3_endpoint)
    subject = settings.layout().session_subject(T, "bad-bytes")
    async with running_stack(settings) as c:
        await metrics.refresh(c)
        start = quarantined_counter("not_json")
        seqs = [(await c.js.publish(subject, b"not json %d" % i)).seq for i in range(2)]
        await c.waiter.wait_all(seqs[-1])
        await metrics.refresh(c)
        assert quarantined_counter("not_json") == start + 2
        await metrics.refresh(c)
        assert quarantined_counter("not_json") == start + 2  # counted once
        async with c.pool.connection() as conn:
            await conn.execute("DELETE FROM quarantine")  # as an erasure deletes its session's
        seqs = [(await c.js.publish(subject, b"not json again %d" % i)).seq for i in range(2)]
        await c.waiter.wait_all(seqs[-1])
        await metrics.refresh(c)
        assert quarantined_counter("not_json") == start + 4


async def abandoned_on_its_last_delivery(
    c: Container, session: str, leaf: str | None = None
) -> tuple[JetStreamContext.PullSubscription, datetime]:
    """The compactors' consumer made with one delivery allowed and a half-second ack wait, a request
    of ``session`` (its branch ending at ``leaf``) on the work queue and its one delivery taken and
    never acknowledged (a compactor killed on it): the pull subscription, and when the request was
    stored."""
    layout = c.layout
    config = ConsumerConfig(
        durable_name=c.settings.compaction_queue,
        ack_policy=AckPolicy.EXPLICIT,
        filter_subject=f"{layout.work_prefix}.{KIND}.>",
        max_deliver=1,
        ack_wait=0.5,
    )
    await c.js.add_consumer(layout.work_stream, config)
    ack = await c.js.publish(
        layout.work_subject(KIND, T, session), request(T, session, leaf, 500, 1).to_json(), stream=layout.work_stream
    )
    stored = (await c.js.get_msg(layout.work_stream, ack.seq)).time
    assert stored is not None
    sub = await c.js.pull_subscribe_bind(c.settings.compaction_queue, stream=layout.work_stream)
    await sub.fetch(1, timeout=5)  # its one delivery, never acknowledged
    return sub, stored


async def pull(sub: JetStreamContext.PullSubscription) -> None:
    """Ask for a request: a pull is what makes the server give up one whose last delivery expired."""
    with contextlib.suppress(nats.errors.TimeoutError):
        await sub.fetch(1, timeout=0.2)


async def test_a_request_whose_last_delivery_went_unanswered_no_longer_counts_as_waiting(
    nats_url: str, fresh_db: str, s3_endpoint: str
) -> None:
    """A compactor killed on a request's last allowed delivery leaves it on the work-queue stream,
    unacknowledged, and JetStream delivers it no more: it waits for nothing, so the oldest wait
    (and readiness's) leaves it out; a request stored after it is the oldest that waits. The
    ages are the server's (``at``: its time when it answered)."""
    settings = make_settings(nats_url, fresh_db, s3_endpoint=s3_endpoint)
    async with running_stack(settings, projector=False) as c:
        layout = c.layout
        sub, stored = await abandoned_on_its_last_delivery(c, "dies-on-it")
        busy = await until(queue_when(c, lambda q: q.in_progress == 1), "the request in progress")
        assert busy.oldest_at == stored  # in progress: it waits to be finished

        async def exhausted() -> metrics.WorkQueue | None:
            await pull(sub)
            return await queue_when(c, lambda q: q.in_progress == 0)()

        gone = await until(exhausted, "the request's deliveries exhausted")
        assert (await c.js.stream_info(layout.work_stream)).state.messages == 1  # still on the stream
        assert (gone.waiting, gone.oldest_at) == (0, None)
        assert generate_latest(metrics.REGISTRY).decode().count("chronicle_compaction_oldest_wait_seconds 0.0") == 1

        later = request(T, "stored-after", None, 500, 2)
        ack = await c.js.publish(
            layout.work_subject(KIND, T, "stored-after"), later.to_json(), stream=layout.work_stream
        )
        stored_after = (await c.js.get_msg(layout.work_stream, ack.seq)).time
        waits = await until(queue_when(c, lambda q: q.waiting == 1), "the later request waiting")
        assert waits.oldest_at == stored_after
        assert waits.at is not None  # the pinned nats-server reports its time: the ages are its


async def test_a_compactor_drops_and_logs_a_request_whose_deliveries_ran_out(
    nats_url: str, fresh_db: str, s3_endpoint: str, caplog: pytest.LogCaptureFixture
) -> None:
    """JetStream tells (an advisory) when it gives up a request whose last delivery went
    unanswered; a running compactor logs it, naming the session, counts it, and deletes the
    request from the work-queue stream, which then holds only requests that still wait (it held
    the request until it expired, a day later)."""
    settings = make_settings(nats_url, fresh_db, s3_endpoint=s3_endpoint)
    async with running_stack(settings, projector=False) as c:
        compactor = c.compactor()
        watching = await compactor.watch_exhausted()
        try:
            sub, _ = await abandoned_on_its_last_delivery(c, "dies-on-it")
            for _ in range(150):
                await pull(sub)
                info = await c.js.stream_info(c.layout.work_stream)
                if compactor.work.exhausted and info.state.messages == 0:
                    break
                await asyncio.sleep(0.1)
            assert (compactor.work.exhausted, info.state.messages) == (1, 0)
        finally:
            await watching.unsubscribe()
    (line,) = [r.getMessage() for r in caplog.records if "without an answer" in r.getMessage()]
    assert f"{T}/dies-on-it" in line
