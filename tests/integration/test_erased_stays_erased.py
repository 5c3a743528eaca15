"""Events of a session published after its ``session.erased`` (a write racing the erasure, or a
tenant publishing straight to JetStream; encryption off, so nothing is sealed) bring nothing of
it back: no projection (history, context, overlays, compaction state) applies them, the
checkpoint moves past them, and a rebuild from the log gives the same read models."""

from __future__ import annotations

from collections.abc import Callable

import psycopg

from events.catalog import (
    CompactionFailed,
    CompactionRecorded,
    CompactionSkipped,
    ContextWritten,
    PromptRendered,
    SearchEntryIndexed,
    SessionConfigured,
    SessionCreated,
    SessionEnded,
    SessionRenamed,
    SessionUsageAdded,
)
from events.context import CompactionConfig, SessionConfig, WritableBlock
from events.envelope import Event
from events.publisher import Publisher
from projections import queries
from projections.rebuild import checksums, rebuild_into
from services.bootstrap import Container
from tests.conftest import make_settings, running_stack
from tests.integration.helpers import appended

T = "tenant-a"

SESSION_ROWS = {  # table -> its session column
    "sessions": "id",
    "messages": "session_id",
    "usage_applied": "session_id",
    "left_out_summaries": "session_id",
    "session_configs": "session_id",
    "context_blocks": "session_id",
    "search_entries": "session_id",
    "prompts": "session_id",
    "overlays": "session_id",
    "compaction_failures": "session_id",
    "compaction_skips": "session_id",
    "compactor_messages": "session_id",
    "compactor_sessions": "session_id",
}


def after_erasure(sid: str) -> list[Event]:
    """One event of every projection's, as a tenant could publish it after the erasure."""
    config = SessionConfig(
        blocks=[WritableBlock(label="memory", description="notes", max_tokens=100)],
        compaction=CompactionConfig(compact_after=1_000_000),  # tracked by the compaction state, never due
    )
    return [
        SessionCreated(tenant=T, session=sid, name="back again"),
        SessionConfigured(tenant=T, session=sid, config=config),
        appended(T, sid, "late-1", None, "written after the erasure"),
        appended(T, sid, "late-2", "late-1", "and another"),
        SessionRenamed(tenant=T, session=sid, name="renamed after"),
        SessionUsageAdded(tenant=T, session=sid, input_tokens=5, output_tokens=1, cost=0.5),
        SessionEnded(tenant=T, session=sid, reason="after"),
        PromptRendered(tenant=T, session=sid, text="late prompt", tokens=2, version_no=1, reason="freeze"),
        ContextWritten(tenant=T, session=sid, label="memory", content="late", tokens=1, mode="replace", writer="api"),
        SearchEntryIndexed(tenant=T, session=sid, label="memory", key="k", content="late entry"),
        CompactionRecorded(
            tenant=T,
            session=sid,
            overlay_id="o1",
            from_message_id="late-1",
            to_message_id="late-1",
            leaf_id="late-2",
            tokens_before=10,
            tokens_after=2,
            summarizer="test",
            model=None,
            summary="late summary",
        ),
        appended(T, sid, "compaction_o1", "late-2", "the summary sent back", "assistant"),  # left out
        CompactionFailed(tenant=T, session=sid, leaf_id="late-2", summarizer="test", error="x", attempt=1),
        CompactionSkipped(tenant=T, session=sid, leaf_id="late-2", estimate=9, reason="x", config=config.compaction),
    ]


async def rows_of(conninfo: str, sid: str, schema: str = "public") -> dict[str, int]:
    out: dict[str, int] = {}
    async with await psycopg.AsyncConnection.connect(conninfo) as conn:
        for table, column in SESSION_ROWS.items():
            cur = await conn.execute(
                f'SELECT count(*) FROM "{schema}"."{table}" WHERE tenant = %s AND {column} = %s',
                (T, sid),
            )
            row = await cur.fetchone()
            out[table] = int(row[0]) if row else -1
    return out


async def published(c: Container, events: list[Event]) -> int:
    """Publish ``events`` as a tenant would (no Chronicle check in between); the last sequence."""
    plain = Publisher(c.js, c.layout)
    return max([(await plain.publish(e)).seq for e in events])


async def erased_session(c: Container, settings_db: str, sid: str) -> int:
    """A session with rows in every read model, erased by another process (its key store is not
    the projector's: the projector learns of the erasure from the log only); the erasure's seq."""
    await c.commands.create_session(T, sid, "doomed", None, {})
    seq = await published(c, after_erasure(sid)[1:])
    await c.waiter.wait_all(seq)
    before = await rows_of(settings_db, sid)
    assert all(n > 0 for n in before.values()), f"the session was not in every read model before its erasure: {before}"
    async with running_stack(c.settings, projector=False) as other:
        return (await other.eraser.erase_session(T, sid)).seq


async def test_events_after_an_erasure_bring_nothing_back_live_after_a_restart_and_in_a_rebuild(
    nats_url: str, fresh_db: str, new_id: Callable[[str], str]
) -> None:
    settings = make_settings(nats_url, fresh_db)
    sid = new_id("erased")
    nothing = dict.fromkeys(SESSION_ROWS, 0)
    async with running_stack(settings) as c:
        await c.waiter.wait_all(await erased_session(c, fresh_db, sid))
        assert await rows_of(fresh_db, sid) == nothing  # the compaction state's row too
        last = await published(c, after_erasure(sid))
        await c.waiter.wait_all(last)  # the checkpoint moved past them
        assert await rows_of(fresh_db, sid) == nothing
        async with c.pool.connection() as conn:
            listed = await queries.list_sessions(conn, T, 10_000, None)
        assert sid not in {s.id for s in listed}
    async with running_stack(settings) as c:  # a projector that never saw the session's events
        last = await published(c, [appended(T, sid, "later-1", None, "after a restart")])
        await c.waiter.wait_all(last)
        assert await rows_of(fresh_db, sid) == nothing
        async with await psycopg.AsyncConnection.connect(fresh_db) as conn:
            live = await checksums(conn, "public")
        await rebuild_into(c.js, c.layout, fresh_db, "shadow", c.projections(), settings.projector_name, keys=c.keys)
        async with await psycopg.AsyncConnection.connect(fresh_db) as conn:
            assert await checksums(conn, "shadow") == live
        assert await rows_of(fresh_db, sid, "shadow") == nothing


async def test_a_session_of_the_same_tenant_written_alongside_is_kept(
    nats_url: str, fresh_db: str, new_id: Callable[[str], str]
) -> None:
    """The skip is the erased session's only: another session's events in the same batches apply."""
    settings = make_settings(nats_url, fresh_db)
    sid, kept = new_id("erased"), new_id("kept")
    async with running_stack(settings) as c:
        await erased_session(c, fresh_db, sid)
        mixed = [e for pair in zip(after_erasure(sid), after_erasure(kept), strict=True) for e in pair]
        await c.waiter.wait_all(await published(c, mixed))
        assert (await rows_of(fresh_db, sid))["sessions"] == 0
        got = await rows_of(fresh_db, kept)
        assert (got["sessions"], got["messages"], got["usage_applied"], got["context_blocks"]) == (1, 2, 1, 1)
