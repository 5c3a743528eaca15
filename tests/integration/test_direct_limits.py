"""A tenant publishing straight to JetStream is held to the API's field limits (events/limits.py).

Before, a session created by an event published to the tenant's own subject with a 900 KB name
was projected and listed as it was, where the API refuses a name over 512 characters. Now the
projector quarantines such an event (``too_long``, the field named), applies nothing of it, and
goes on with the next; a rebuild decides the same (``verify`` is exact). Real NATS and Postgres."""

from __future__ import annotations

import psycopg

from events.catalog import SessionCreated, SessionRenamed, SkillLoaded
from events.envelope import Event
from events.limits import MAX_ROLE, MAX_SESSION_NAME, MAX_TOOL_CALL_ID
from services.audit import readers as audit
from tests.conftest import make_settings, running_stack
from tests.integration.helpers import appended

TENANT = "tenant-b"


async def test_direct_events_past_the_api_limits_are_quarantined_as_too_long_and_the_next_one_applies(
    nats_url: str, fresh_db: str, s3_endpoint: str
) -> None:
    settings = make_settings(nats_url, fresh_db, s3_endpoint=s3_endpoint)
    bad = [
        ("name", SessionCreated(tenant=TENANT, session="huge", name="n" * 900_000)),
        ("name", SessionRenamed(tenant=TENANT, session="ok", name="n" * (MAX_SESSION_NAME + 1))),
        ("role", appended(TENANT, "ok", "m1", None, role="r" * (MAX_ROLE + 1))),
        (
            "tool_call_id",
            SkillLoaded(tenant=TENANT, session="ok", label="sk", key="k", tool_call_id="t" * (MAX_TOOL_CALL_ID + 1)),
        ),
    ]
    async with running_stack(settings) as c:

        async def publish(event: Event) -> int:
            """Straight to the stream, as a tenant's own NATS client may: no contract check first."""
            subject = c.layout.session_subject(event.tenant, event.session)
            return (await c.js.publish(subject, event.to_json(), stream=settings.stream)).seq

        created = await publish(SessionCreated(tenant=TENANT, session="ok", name="n" * MAX_SESSION_NAME))
        expected = [(await publish(event), field) for field, event in bad]
        after = await publish(SessionRenamed(tenant=TENANT, session="ok", name="renamed after"))
        await c.waiter.wait_all(after, timeout_s=20)

        async with c.pool.connection() as conn:
            cur = await conn.execute("SELECT seq, reason, detail FROM quarantine ORDER BY seq")
            rows = await cur.fetchall()
            assert [(seq, reason) for seq, reason, _ in rows] == [(seq, "too_long") for seq, _ in expected]
            for (_, _, detail), (_, field) in zip(rows, expected, strict=True):
                assert str(detail).startswith(f"{field}: "), detail
                assert "more than the" in str(detail)
            assert min(seq for seq, _ in expected) > created
            # nothing of them applied: no session "huge", no message, no loaded skill; the name at
            # the limit was taken, and the rename after them applied
            cur = await conn.execute("SELECT id, name FROM sessions WHERE tenant = %s", (TENANT,))
            assert await cur.fetchall() == [("ok", "renamed after")]
            cur = await conn.execute("SELECT count(*) FROM messages WHERE tenant = %s", (TENANT,))
            assert await cur.fetchone() == (0,)
            cur = await conn.execute("SELECT count(*) FROM loaded_skills WHERE tenant = %s", (TENANT,))
            assert await cur.fetchone() == (0,)
        report = await audit.verify(c)  # a rebuild of the log quarantines the same events
        assert report.ok, report.differences
        assert report.live["quarantine"][0] == len(bad)


async def test_a_name_at_the_limit_published_straight_is_listed_whole(
    nats_url: str, fresh_db: str, s3_endpoint: str
) -> None:
    """The limit is the API's, not lower: a direct publisher's 512-character name is projected."""
    settings = make_settings(nats_url, fresh_db, s3_endpoint=s3_endpoint)
    name = "é" * MAX_SESSION_NAME  # characters, not bytes (1,024 of UTF-8)
    async with running_stack(settings) as c:
        event = SessionCreated(tenant=TENANT, session="at-limit", name=name)
        ack = await c.js.publish(c.layout.session_subject(TENANT, "at-limit"), event.to_json(), stream=settings.stream)
        await c.waiter.wait_all(ack.seq, timeout_s=20)
        async with await psycopg.AsyncConnection.connect(fresh_db) as conn:
            cur = await conn.execute("SELECT name FROM sessions WHERE tenant = %s", (TENANT,))
            assert await cur.fetchall() == [(name,)]
            cur = await conn.execute("SELECT count(*) FROM quarantine")
            assert await cur.fetchone() == (0,)
