"""A compaction request JetStream gave up (its ``MAX_DELIVERIES`` advisory: the compactor that held
its last allowed delivery died or hung on it) is recorded as the session's ``compaction.failed``,
once however often the advisory is heard, and the request is deleted from the work queue."""

from __future__ import annotations

import asyncio

import pytest
from nats.aio.msg import Msg

from events.context import CompactionConfig, SessionConfig
from events.omitted import OMITTED
from services.bootstrap import Container
from tests.conftest import make_settings, running_stack
from tests.integration.helpers import assert_rebuild_equals_live, text_message
from tests.integration.test_oncall_signals import abandoned_on_its_last_delivery, pull

T = "tenant-a"
SID = "dies-on-it"


async def failures(c: Container) -> list[tuple[int, str]]:
    async with c.pool.connection() as conn:
        cur = await conn.execute(
            "SELECT attempt, error FROM compaction_failures WHERE tenant = %s AND session_id = %s ORDER BY seq",
            (T, SID),
        )
        return [(attempt, error) for attempt, error in await cur.fetchall()]


async def test_a_request_jetstream_gave_up_is_recorded_as_a_compaction_failure_once(
    nats_url: str, fresh_db: str, s3_endpoint: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The advisory handled twice at once (delivered twice, or to two compactors) while the request
    is still on the stream, then once more after: one ``compaction.failed`` in the session's
    compaction failures, saying what happened, the request deleted and counted once; a rebuild
    from the log gives the live read models."""
    settings = make_settings(nats_url, fresh_db, s3_endpoint=s3_endpoint)
    async with running_stack(settings) as c:
        cfg = CompactionConfig(compact_after=100_000, protect_head=1, tail_token_budget=50, min_tail_messages=2)
        await c.context.configure(T, SID, SessionConfig(compaction=cfg))
        await c.commands.append(T, SID, text_message("m0", "words to summarise"), OMITTED)
        compactor = c.compactor()
        heard: asyncio.Queue[Msg] = asyncio.Queue()
        subject = f"$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES.{c.layout.work_stream}.{settings.compaction_queue}"
        listening = await c.nc.subscribe(subject, cb=heard.put)
        try:
            sub, _ = await abandoned_on_its_last_delivery(c, SID, "m0")
            for _ in range(150):
                await pull(sub)  # a pull makes the server give the request up
                if not heard.empty():
                    break
            advisory = heard.get_nowait()
        finally:
            await listening.unsubscribe()

        await asyncio.gather(compactor._exhausted(advisory), compactor._exhausted(advisory))
        await compactor._exhausted(advisory)

        ((attempt, error),) = await failures(c)
        assert attempt == 1
        assert "the compactor stopped answering on its last allowed delivery (1 delivery)" in error
        assert compactor.work.exhausted == 1
        (line,) = [r.getMessage() for r in caplog.records if "without an answer" in r.getMessage()]
        assert f"{T}/{SID}" in line
        assert "recorded as compaction.failed (attempt 1" in line
        assert (await c.js.stream_info(c.layout.work_stream)).state.messages == 0
        await assert_rebuild_equals_live(c, fresh_db, settings.projector_name)


async def test_a_running_compactor_records_a_request_jetstream_gave_up(
    nats_url: str, fresh_db: str, s3_endpoint: str
) -> None:
    """The advisory heard on the compactor's own subscription (settled in a task of its own): the
    failure is in the session's compaction failures and the request is off the work queue."""
    settings = make_settings(nats_url, fresh_db, s3_endpoint=s3_endpoint)
    async with running_stack(settings) as c:
        await c.commands.append(T, SID, text_message("m0", "words to summarise"), OMITTED)
        compactor = c.compactor()
        watching = await compactor.watch_exhausted()
        try:
            sub, _ = await abandoned_on_its_last_delivery(c, SID, "m0")
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
        assert (await c.js.stream_info(c.layout.work_stream)).state.messages == 0
