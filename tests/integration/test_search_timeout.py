"""A search runs at most ``CHRONICLE_SEARCH_TIMEOUT_S`` (projections/search_bound.py).

Nothing bounded one before: a costly query (16 short prefixes over a large tenant) held a
Postgres backend and a pool connection as long as it ran. Past the bound Postgres cancels it: HTTP
answers ``503 search_timeout`` (no ``Retry-After``), a search tool answers ``Error: …``, and the
connection goes back to the pool as it came (the timeout does not outlive the search). The search
is made to run long without data or ``pg_sleep``: another transaction holds the messages table
locked, and the search's statement waits on the lock until its timeout cancels it. Real NATS,
Postgres and the API app."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import psycopg
import pytest
from psycopg import pq

from events.context import SessionConfig
from events.omitted import OMITTED
from projections import context_queries, queries
from projections.search_bound import SearchTimedOut
from services.api.app import build_app
from services.bootstrap import Container
from tests.conftest import KEYS, make_settings, running_stack
from tests.integration.helpers import tenant_client, text_message

TENANT = "tenant-a"
TIMEOUT_S = 0.5
UNBOUNDED_S = TIMEOUT_S + 10
"""Past this a search under the lock was not cancelled by its timeout: the test fails instead of
waiting for a lock it holds itself."""


@asynccontextmanager
async def messages_locked(db_url: str) -> AsyncIterator[None]:
    """The messages table locked by another transaction (every read of it waits) while inside."""
    async with await psycopg.AsyncConnection.connect(db_url) as conn:
        await conn.execute("LOCK TABLE messages, search_entries IN ACCESS EXCLUSIVE MODE")
        yield
        await conn.rollback()


@pytest.fixture
async def stack(nats_url: str, fresh_db: str, s3_endpoint: str) -> AsyncIterator[Container]:
    settings = make_settings(nats_url, fresh_db, s3_endpoint=s3_endpoint, search_timeout_s=TIMEOUT_S)
    async with running_stack(settings) as c:
        r = await c.commands.append(TENANT, "s1", text_message("m1", "we deploy on Friday"), OMITTED)
        await c.waiter.wait_all(r.seq)
        yield c


async def test_a_search_past_its_timeout_answers_503_search_timeout_and_the_next_one_is_served(
    stack: Container,
) -> None:
    app = build_app(stack.settings, stack)
    headers = {"Authorization": f"Bearer {KEYS[TENANT]}"}
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://c", headers=headers) as h:
        for path in ("/v1/search", "/v1/sessions/s1/search"):
            async with messages_locked(stack.settings.database_url):
                started = time.monotonic()
                r = await asyncio.wait_for(h.get(path, params={"q": "friday"}), UNBOUNDED_S)
                took = time.monotonic() - started
            assert r.status_code == 503, r.text
            assert r.headers["content-type"] == "application/problem+json"
            assert "retry-after" not in r.headers  # the same query would run as long again
            body = r.json()
            assert body["code"] == "search_timeout"
            assert "retry_after" not in body
            assert "CHRONICLE_SEARCH_TIMEOUT_S (0.5 s)" in body["detail"]
            assert TIMEOUT_S <= took < TIMEOUT_S + 5  # cancelled at the bound, not after the lock went
            r = await h.get(path, params={"q": "friday"})  # the same app, its pool, at once
            assert r.status_code == 200, r.text
            assert [hit["id"] for hit in r.json()["results"]] == ["m1"]


async def test_the_connection_a_search_timed_out_on_is_as_it_was(stack: Container) -> None:
    """The transaction is rolled back and the timeout was local to it: the same connection is idle,
    has no statement timeout, and searches (and runs a long statement) as before."""
    async with await psycopg.AsyncConnection.connect(stack.settings.database_url, autocommit=True) as conn:
        for search in (
            lambda: queries.search(conn, TENANT, None, "friday", 10, TIMEOUT_S),
            lambda: context_queries.search_entries(conn, TENANT, "s1", "kb", "friday", 10, TIMEOUT_S),
        ):
            async with messages_locked(stack.settings.database_url):
                with pytest.raises(SearchTimedOut) as caught:
                    await asyncio.wait_for(search(), UNBOUNDED_S)
            assert caught.value.timeout_s == TIMEOUT_S
            assert conn.info.transaction_status == pq.TransactionStatus.IDLE
            cur = await conn.execute("SHOW statement_timeout")
            assert await cur.fetchone() == ("0",)
        assert [h.id for h in await queries.search(conn, TENANT, None, "friday", 10, TIMEOUT_S)] == ["m1"]
        await conn.execute("SELECT pg_sleep(%s)", (TIMEOUT_S * 2,))  # no timeout outside a search


async def test_a_cancellation_that_is_no_timeout_is_not_called_one(stack: Container) -> None:
    """An operator's ``pg_cancel_backend`` of a search is raised as Postgres's own error (answered
    ``503 unavailable`` as any lost query is), never as the search's timeout."""
    async with await psycopg.AsyncConnection.connect(stack.settings.database_url, autocommit=True) as conn:
        pid = conn.info.backend_pid
        async with (
            messages_locked(stack.settings.database_url),
            await psycopg.AsyncConnection.connect(stack.settings.database_url, autocommit=True) as admin,
        ):
            task = asyncio.create_task(queries.search(conn, TENANT, None, "friday", 10, 30.0))
            while True:  # until the search waits on the lock: a positive signal, not a sleep
                cur = await admin.execute("SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s", (pid,))
                if await cur.fetchone() == ("Lock",):
                    break
                await asyncio.sleep(0.01)
            await admin.execute("SELECT pg_cancel_backend(%s)", (pid,))
            with pytest.raises(psycopg.errors.QueryCanceled):
                await task


async def test_a_search_tool_past_its_timeout_answers_an_error_result(stack: Container) -> None:
    await stack.context.configure(TENANT, "s1", SessionConfig(searchable_history="history"))
    args: dict[str, Any] = {"query": "friday"}
    async with messages_locked(stack.settings.database_url):
        out = await asyncio.wait_for(stack.context.execute(TENANT, "s1", "session_search", args), UNBOUNDED_S)
    assert out.startswith("Error: the search ran past CHRONICLE_SEARCH_TIMEOUT_S (0.5 s)"), out
    assert await stack.context.execute(TENANT, "s1", "session_search", args) == "[user] we deploy on Friday"


async def test_a_tenant_past_its_concurrent_searches_is_told_search_busy_and_another_tenant_is_served(
    nats_url: str, fresh_db: str, s3_endpoint: str
) -> None:
    """One tenant's slow searches held every pooled connection of the API process, and every other
    tenant's requests waited seconds for one (an outside trial: 40 in flight, another tenant's
    appends 16 s). A tenant runs ``search_slots_per_tenant`` searches at once: its next one is
    ``429 search_busy`` at once (``Retry-After``), while another tenant's search gets a slot."""
    settings = make_settings(
        nats_url,
        fresh_db,
        s3_endpoint=s3_endpoint,
        search_timeout_s=TIMEOUT_S,
        search_slots=2,
        search_slots_per_tenant=1,
    )
    async with running_stack(settings) as c:
        r = await c.commands.append("tenant-b", "s1", text_message("m1", "we deploy on Friday"), OMITTED)
        await c.waiter.wait_all(r.seq)
        app = build_app(c.settings, c)
        gate = c.context.search_gate
        assert (gate.total, gate.per_tenant) == (2, 1)
        async with tenant_client(app, TENANT) as a, tenant_client(app, "tenant-b") as b:
            async with messages_locked(c.settings.database_url):
                slow = asyncio.create_task(a.get("/v1/search", params={"q": "friday"}))
                for _ in range(500):
                    if gate.running(TENANT) == 1:
                        break
                    await asyncio.sleep(0.01)
                assert gate.running(TENANT) == 1
                busy = await a.get("/v1/search", params={"q": "friday"})
                other = asyncio.create_task(b.get("/v1/search", params={"q": "friday"}))
                await asyncio.wait_for(asyncio.shield(slow), UNBOUNDED_S)
            assert busy.status_code == 429, busy.text
            assert busy.json()["code"] == "search_busy"
            assert busy.headers["retry-after"] == "1"
            assert (await slow).status_code == 503  # its own: the lock outlived its timeout
            answered = await asyncio.wait_for(other, UNBOUNDED_S)
            assert answered.status_code in (200, 503), answered.text  # a slot, whatever the lock made of it
            assert answered.json().get("code") != "search_busy"
            assert gate.running(TENANT) == 0
            assert gate.running("tenant-b") == 0
