"""A compaction request JetStream gave up (its ``MAX_DELIVERIES`` advisory: the compactor that held
its last allowed delivery died or hung on it) is recorded as the session's ``compaction.failed``,
once however often the advisory is heard, and the request is deleted from the work queue; one
whose work was done before it was given up is deleted with nothing recorded, and one whose failure
could not be recorded stays on the stream."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import psycopg
import pytest
from nats.aio.msg import Msg

from events.context import CompactionConfig, SessionConfig
from events.omitted import OMITTED
from services.bootstrap import Container
from services.compaction import state
from services.compaction.exhausted import RECORD_RETRIES_S
from services.compaction.service import Series
from tests.conftest import make_settings, running_stack
from tests.integration.helpers import assert_rebuild_equals_live, text_message
from tests.integration.test_oncall_signals import abandoned_on_its_last_delivery, pull

T = "tenant-a"
SID = "dies-on-it"
LAST = "m11"


async def failures(c: Container) -> list[tuple[int, str]]:
    async with c.pool.connection() as conn:
        cur = await conn.execute(
            "SELECT attempt, error FROM compaction_failures WHERE tenant = %s AND session_id = %s ORDER BY seq",
            (T, SID),
        )
        return [(attempt, error) for attempt, error in await cur.fetchall()]


async def queued(c: Container) -> int:
    return int((await c.js.stream_info(c.layout.work_stream)).state.messages)


async def over_its_threshold(c: Container) -> None:
    """SID configured for compaction and grown past it: the projector's request of it is on the
    work queue (the request :func:`abandoned_on_its_last_delivery` publishes replaces it)."""
    cfg = CompactionConfig(compact_after=300, protect_head=1, tail_token_budget=50, min_tail_messages=2)
    await c.context.configure(T, SID, SessionConfig(compaction=cfg))
    for i in range(12):
        await c.commands.append(T, SID, text_message(f"m{i}", f"message m{i} " + "lorem ipsum " * 20), OMITTED)
    for _ in range(150):
        if await queued(c):
            return
        await asyncio.sleep(0.1)
    raise AssertionError("the projector published no compaction request")


async def given_up(c: Container) -> Msg:
    """SID's request abandoned on its last delivery and given up: JetStream's advisory of it."""
    heard: asyncio.Queue[Msg] = asyncio.Queue()
    subject = f"$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES.{c.layout.work_stream}.{c.settings.compaction_queue}"
    listening = await c.nc.subscribe(subject, cb=heard.put)
    try:
        sub, _ = await abandoned_on_its_last_delivery(c, SID, LAST)
        for _ in range(150):
            await pull(sub)  # a pull makes the server give the request up
            if not heard.empty():
                break
        return heard.get_nowait()
    finally:
        await listening.unsubscribe()


async def test_a_request_jetstream_gave_up_is_recorded_as_a_compaction_failure_once(
    nats_url: str, fresh_db: str, s3_endpoint: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The advisory handled twice at once (delivered twice, or to two compactors) while the request
    is still on the stream, then once more after: one ``compaction.failed`` in the session's
    compaction failures, saying what happened, the request deleted and counted once; a rebuild
    from the log gives the live read models."""
    settings = make_settings(nats_url, fresh_db, s3_endpoint=s3_endpoint)
    async with running_stack(settings) as c:
        await over_its_threshold(c)
        compactor = c.compactor()
        advisory = await given_up(c)

        await asyncio.gather(compactor.given_up.settle(advisory), compactor.given_up.settle(advisory))
        await compactor.given_up.settle(advisory)

        ((attempt, error),) = await failures(c)
        assert attempt == 1
        assert "the compactor stopped answering on its last allowed delivery (1 delivery)" in error
        assert compactor.work.exhausted == 1
        (line,) = [r.getMessage() for r in caplog.records if "without an answer" in r.getMessage()]
        assert f"{T}/{SID}" in line
        assert "recorded as compaction.failed (attempt 1" in line
        assert await queued(c) == 0
        await assert_rebuild_equals_live(c, fresh_db, settings.projector_name)


async def test_a_running_compactor_records_a_request_jetstream_gave_up(
    nats_url: str, fresh_db: str, s3_endpoint: str
) -> None:
    """The advisory heard on the compactor's own subscription (settled in a task of its own): the
    failure is in the session's compaction failures and the request is off the work queue."""
    settings = make_settings(nats_url, fresh_db, s3_endpoint=s3_endpoint)
    async with running_stack(settings) as c:
        await over_its_threshold(c)
        compactor = c.compactor()
        watching = await compactor.watch_exhausted()
        try:
            sub, _ = await abandoned_on_its_last_delivery(c, SID, LAST)
            for _ in range(150):
                await pull(sub)
                found = await failures(c)
                if found and compactor.work.exhausted:
                    break
                await asyncio.sleep(0.1)
        finally:
            await watching.unsubscribe()
        assert [attempt for attempt, _ in found] == [1]
        assert compactor.work.exhausted == 1
        assert await queued(c) == 0


async def test_a_request_whose_compaction_was_committed_before_it_was_given_up_records_no_failure(
    nats_url: str, fresh_db: str, s3_endpoint: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The compactor on the request's last delivery committed its summary and died before its ack:
    the request is no longer due, so its advisory deletes it and records nothing (no failure, no
    failing series that the session's next request would continue)."""
    settings = make_settings(nats_url, fresh_db, s3_endpoint=s3_endpoint)
    async with running_stack(settings) as c:
        await over_its_threshold(c)
        compactor = c.compactor()
        advisory = await given_up(c)
        async with c.compaction.leases.hold(T, SID, wait_s=10):
            await c.compaction.compact(T, SID, LAST)  # the overlay, committed before the (lost) ack
        for _ in range(150):
            async with c.pool.connection() as conn:
                if not await state.still_due(conn, settings.projector_name, T, SID, 1):
                    break
            await asyncio.sleep(0.1)
        else:
            raise AssertionError("the compaction state never saw the overlay")

        await compactor.given_up.settle(advisory)

        assert await failures(c) == []
        async with c.pool.connection() as conn:
            assert await state.series(conn, settings.projector_name, T, SID) == Series()
        assert await queued(c) == 0
        (line,) = [r.getMessage() for r in caplog.records if "without an answer" in r.getMessage()]
        assert "its work was done" in line


async def test_a_failure_that_could_not_be_recorded_leaves_the_request_on_the_stream(
    nats_url: str, fresh_db: str, s3_endpoint: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The database lost while the failure is recorded: the request is not deleted (the failure is
    not lost for good: a later hearing of the advisory records it), and nothing is counted."""
    settings = make_settings(nats_url, fresh_db, s3_endpoint=s3_endpoint)
    async with running_stack(settings) as c:
        await over_its_threshold(c)
        compactor = c.compactor()
        advisory = await given_up(c)
        record_failure = c.compaction.record_failure
        tries = 0

        async def lost(*args: object, **kwargs: object) -> None:
            nonlocal tries
            tries += 1
            raise psycopg.OperationalError("server closed the connection unexpectedly")

        monkeypatch.setattr(c.compaction, "record_failure", lost)
        await compactor.given_up.settle(advisory)

        assert tries == 1 + len(RECORD_RETRIES_S)  # tried again in its lease, then left
        assert await failures(c) == []
        assert await queued(c) == 1
        assert compactor.work.exhausted == 0

        monkeypatch.setattr(c.compaction, "record_failure", record_failure)
        await compactor.given_up.settle(advisory)
        assert [attempt for attempt, _ in await failures(c)] == [1]
        assert await queued(c) == 0


async def test_advisories_are_settled_one_at_a_time(
    nats_url: str, fresh_db: str, s3_endpoint: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """However many advisories come at once, one at a time waits for a lease (the pool's other
    slots stay the compactions'), and briefly (not a compaction's wait)."""
    settings = make_settings(nats_url, fresh_db, s3_endpoint=s3_endpoint)
    async with running_stack(settings) as c:
        await over_its_threshold(c)
        compactor = c.compactor()
        advisory = await given_up(c)
        hold = c.compaction.leases.hold
        inside = most = 0
        waits: list[float] = []

        @contextlib.asynccontextmanager
        async def counted(tenant: str, session: str, *, wait_s: float = 0) -> AsyncIterator[None]:
            nonlocal inside, most
            inside += 1
            most = max(most, inside)
            waits.append(wait_s)
            try:
                async with hold(tenant, session, wait_s=wait_s):
                    yield
            finally:
                inside -= 1

        monkeypatch.setattr(c.compaction.leases, "hold", counted)
        await asyncio.gather(*(compactor.given_up.settle(advisory) for _ in range(3)))

        assert most == 1
        assert 0 < max(waits) <= 30  # an advisory waits briefly, not a compaction's 600 s
        assert [attempt for attempt, _ in await failures(c)] == [1]
