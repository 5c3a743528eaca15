"""Signals an on-call trial found missing or misleading. The compactors on ``/metrics``: the
requests waiting on the work queue and whether any compactor is taking them (its open pull
requests; a dead compactor left readiness and the metrics unchanged while requests waited).
``/readyz`` on a database without Chronicle's tables: Postgres answers, the database needs
migrating (it said Postgres did not answer)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from prometheus_client import generate_latest

from events.context import CompactionConfig, SessionConfig
from events.omitted import OMITTED
from services.api import metrics
from services.bootstrap import Container
from tests.conftest import make_settings, running_stack
from tests.integration.helpers import text_message

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


async def test_pending_compactions_and_whether_a_compactor_takes_them(
    nats_url: str, fresh_db: str, s3_endpoint: str
) -> None:
    settings = make_settings(nats_url, fresh_db, s3_endpoint=s3_endpoint)
    async with running_stack(settings) as c:  # the projector requests compactions; no compactor yet
        cfg = CompactionConfig(compact_after=400, protect_head=1, tail_token_budget=50, min_tail_messages=2)
        await c.context.configure(T, "auto", SessionConfig(compaction=cfg))
        for i in range(12):
            await c.commands.append(T, "auto", text_message(f"m{i}", "words to summarise " * 8), OMITTED)
        waiting = await until(queue_when(c, lambda q: q.pending > 0), "a pending compaction request")
        assert waiting.pulls_waiting == 0
        text = generate_latest(metrics.REGISTRY).decode()
        assert f"chronicle_compaction_requests_pending {float(waiting.pending)}" in text
        assert "chronicle_compactor_pulls_waiting 0.0" in text

        stop = asyncio.Event()
        task = asyncio.create_task(c.compactor().run(stop))
        try:
            await until(queue_when(c, lambda q: q.pending == 0), "the request taken and done")
            taking = await until(queue_when(c, lambda q: q.pulls_waiting > 0), "a compactor's open pull request")
            assert taking.pending == 0
        finally:
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
