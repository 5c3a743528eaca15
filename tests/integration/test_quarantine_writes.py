"""A write to a session whose last event was quarantined does not wait for it.

A command that depends on state waits until the projection has applied the session subject's
last sequence. A quarantined event never moves the session row, but it moves the projector's
checkpoint of the session's partition (or the unpartitioned one): the wait ends there. The read
wait is short in these tests, so a write that waited for the quarantined event would fail.
"""

from __future__ import annotations

import pytest

from events.omitted import OMITTED
from services.errors import ProjectionTimeout
from tests.conftest import make_settings, running_stack
from tests.integration.helpers import text_message
from tests.integration.test_quarantine import projectors, quarantined

WAIT_S = 2.0  # the read wait of these tests' settings: well under the default


@pytest.mark.parametrize("shares", [[None], [[0], [1]]], ids=["one-projector", "partition-workers"])
async def test_an_append_after_a_quarantined_event_of_its_session_is_answered(
    nats_url: str, fresh_db: str, shares: list[list[int] | None]
) -> None:
    settings = make_settings(nats_url, fresh_db, partitions=2, read_wait_timeout_s=WAIT_S)
    async with running_stack(settings, projector=False) as c, projectors(c, settings, shares):
        first = await c.commands.append("tenant-a", "w-1", text_message("m0", "before the bad event"), OMITTED)
        subject = c.layout.session_subject("tenant-a", "w-1")
        bad = await c.js.publish(subject, b"this is not json", stream=settings.stream)  # the operator's connection

        after = await c.commands.append("tenant-a", "w-1", text_message("m1", "after the bad event"), OMITTED)
        assert (after.created, after.parent_id) == (True, "m0")  # decided on the applied projection
        assert first.seq < bad.seq < after.seq
        again = await c.commands.append("tenant-a", "w-1", text_message("m2", "and again"), OMITTED)
        assert (again.created, again.parent_id) == (True, "m1")

        # a session whose only event is quarantined: no session row at all, still answered
        lonely = await c.js.publish(c.layout.session_subject("tenant-a", "w-2"), b"\xff", stream=settings.stream)
        created = await c.commands.append("tenant-a", "w-2", text_message("n0", "first of w-2"), OMITTED)
        assert (created.created, created.parent_id) == (True, None)
        assert created.seq > lonely.seq

        await c.waiter.wait_session("tenant-a", "w-1", again.seq)
        async with c.pool.connection() as conn:
            cur = await conn.execute(
                "SELECT id, parent_id FROM messages WHERE tenant = 'tenant-a' AND session_id = 'w-1' ORDER BY seq"
            )
            assert await cur.fetchall() == [("m0", None), ("m1", "m0"), ("m2", "m1")]
        assert await quarantined(fresh_db) == [(bad.seq, "not_json"), (lonely.seq, "not_json")]


async def test_a_write_still_waits_for_an_event_no_projector_has_reached(nats_url: str, fresh_db: str) -> None:
    """The checkpoint decides, not the presence of a quarantine row: with no projector running,
    a quarantined-looking event is not applied, so the write keeps waiting (and times out)."""
    settings = make_settings(nats_url, fresh_db, read_wait_timeout_s=0.5)
    async with running_stack(settings, projector=False) as c:
        await c.js.publish(c.layout.session_subject("tenant-a", "w-3"), b"not json", stream=settings.stream)
        with pytest.raises(ProjectionTimeout):
            await c.commands.append("tenant-a", "w-3", text_message("x", "waits"), OMITTED)
