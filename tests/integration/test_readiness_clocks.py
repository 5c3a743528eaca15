"""``/readyz``'s judgements against a real stream and database: a projector that was quiet for an
hour and just received an event is not stalled (the stall clock ran from the checkpoint's last
move, so for a moment after a quiet period readiness said it was)."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

from events import log as eventlog
from services.api import metrics
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
