"""``/readyz``'s judgements against a real stream and database: a projector that was quiet for an
hour and just received an event is not stalled (the stall clock ran from the checkpoint's last
move, so for a moment after a quiet period readiness said it was). A compactor that is not running
makes it unready, named (it said ready while compaction requests waited for no one)."""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

from events import log as eventlog
from services.api import metrics
from services.bootstrap import Container
from tests.conftest import make_settings, running_stack
from tests.integration.helpers import appended


async def test_a_projector_quiet_for_an_hour_is_not_stalled_when_an_event_just_arrived(
    nats_url: str, fresh_db: str, s3_endpoint: str
) -> None:
    settings = make_settings(nats_url, fresh_db, s3_endpoint=s3_endpoint, partitions=1)
    async with running_stack(settings, projector=False) as c:
        last = await eventlog.last_seq(c.js, c.layout)
        async with c.pool.connection() as conn:  # caught up an hour ago, quiet since
            await conn.execute(
                "INSERT INTO checkpoints (name, seq, updated_at) VALUES (%s, %s, now() - interval '1 hour')",
                (settings.projector_name, last),
            )
        stored = await c.publisher.publish(appended("tenant-a", f"quiet-{uuid.uuid4().hex[:8]}", "m0", None))
        assert stored.seq > last

        body = await metrics.readiness(c, stall_s=60)
        assert not any("not advanced" in r for r in body["reasons"]), body
        arrived = await metrics.waiting_since(c, {settings.projector_name: last + 1})
        assert abs(arrived[settings.projector_name] - datetime.now(UTC)) < timedelta(seconds=30)

        # the same checkpoint with events that have waited past the threshold is a stall
        body = await metrics.readiness(c, stall_s=0)
        assert any(r.startswith(f"consumer {settings.projector_name} has not advanced") for r in body["reasons"])


async def compactor_seen(c: Container, present: bool) -> dict[str, Any]:
    """readyz's body once it reports the compactor ``present`` (the positive signal), within 15 s."""
    for _ in range(150):
        body = await metrics.readiness(c)
        if body["compactor"] is present:
            return body
        await asyncio.sleep(0.1)
    raise AssertionError(f"readyz never reported compactor {present}: {body}")


async def test_readyz_names_the_compactor_when_none_runs(nats_url: str, fresh_db: str, s3_endpoint: str) -> None:
    settings = make_settings(nats_url, fresh_db, s3_endpoint=s3_endpoint, readiness_compactor=True)
    async with running_stack(settings) as c:
        body = await metrics.readiness(c)
        assert (body["ready"], body["compactor"]) == (False, False), body
        assert [r for r in body["reasons"] if "compactor" in r] == body["reasons"], body

        stop = asyncio.Event()
        task = asyncio.create_task(c.compactor().run(stop))
        try:
            body = await compactor_seen(c, True)
            assert body["ready"] is True, body

            # its presence connection cut (a database restart): not ready, then taken again
            async with c.pool.connection() as conn:
                await conn.execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_locks WHERE locktype = 'advisory' AND mode = 'ShareLock' "
                    "AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"
                )
            body = await compactor_seen(c, False)
            assert body["ready"] is False
            body = await compactor_seen(c, True)
            assert body["ready"] is True, body
        finally:
            stop.set()
            await asyncio.wait_for(task, 15)

        body = await compactor_seen(c, False)  # stopped: its presence goes with its connection's lock
        assert (body["ready"], body["compactor"]) == (False, False), body
        assert any(r.startswith("no compactor is running") for r in body["reasons"]), body


async def test_a_deployment_without_a_compactor_on_purpose_is_ready(
    nats_url: str, fresh_db: str, s3_endpoint: str
) -> None:
    settings = make_settings(nats_url, fresh_db, s3_endpoint=s3_endpoint, readiness_compactor=False)
    async with running_stack(settings) as c:
        body = await metrics.readiness(c)
        assert (body["ready"], body["compactor"]) == (True, False), body
