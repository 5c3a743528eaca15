"""What an operator sees while one backend is down: ``/metrics`` still answers 200 within a probe's
bound, with the last known values and ``chronicle_backend_up`` saying which backend is down;
``/readyz`` marks only the component that is down false (and is 503); with Postgres down, reads
and appends answer ``503 unavailable`` within seconds (not the 30 s pool timeout), and everything
answers again after the outage. Real parts: a nats-server of the test's own (stopped and started
again), Postgres behind a TCP proxy the test cuts, a projector and the HTTP API on a port."""

from __future__ import annotations

import asyncio
import re
import signal
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
from psycopg_pool import PoolTimeout

from services.api.app import build_app
from services.api.metrics import PROBE_TIMEOUT_S
from services.bootstrap import Container
from services.dbpool import FAIL_FAST_S, DatabaseUnreachable, Pool
from services.ops.localstack import free_port
from services.settings import Settings
from tests.conftest import KEYS, make_settings, running_stack
from tests.integration.helpers import text_message
from tests.integration.test_sdk_nats_outage import Restartable
from tests.support import Cuttable, scratch_database, served

PROMPT_S = PROBE_TIMEOUT_S * 2 + 1.0
"""An answer that waits on no backend longer than a probe's bound (two probes at most, in series)."""


class Stack:
    def __init__(self, c: Container, url: str, nats: Restartable, db: Cuttable) -> None:
        self.c, self.url, self.nats, self.db = c, url, nats, db


@pytest.fixture
def backends(tmp_path: Path, pg_admin: str, s3_endpoint: str) -> Iterator[tuple[Settings, Restartable, Cuttable]]:
    with scratch_database(pg_admin) as db_url:
        proxy = Cuttable(db_url)
        settings = make_settings(f"nats://127.0.0.1:{free_port()}", proxy.url, s3_endpoint=s3_endpoint)
        nats = Restartable(tmp_path, settings)
        nats.start()
        try:
            yield settings, nats, proxy
        finally:
            nats.stop()


@pytest.fixture
async def stack(backends: tuple[Settings, Restartable, Cuttable]) -> AsyncIterator[Stack]:
    settings, nats, proxy = backends
    await proxy.restore()
    try:
        async with running_stack(settings) as c, served(build_app(settings, c)) as url:
            yield Stack(c, url, nats, proxy)
    finally:
        await proxy.cut()


def gauge(text: str, name: str, labels: str = "") -> float:
    m = re.search(rf"^{re.escape(name + labels)} (\S+)$", text, re.MULTILINE)
    assert m, f"{name}{labels} is not in the metrics"
    return float(m.group(1))


async def timed(call: Awaitable[httpx.Response]) -> tuple[httpx.Response, float]:
    t0 = time.monotonic()
    r = await call
    return r, time.monotonic() - t0


async def until(check: Callable[[], Awaitable[bool]], deadline_s: float = 60.0) -> None:
    end = time.monotonic() + deadline_s
    while not await check():
        assert time.monotonic() < end, "the condition never held"
        await asyncio.sleep(0.1)


async def readyz_while_down(client: httpx.AsyncClient) -> dict[str, Any]:
    """``/readyz`` answered promptly, 503; its body."""
    r, took = await timed(client.get("/readyz"))
    assert r.status_code == 503, r.text
    assert took < PROMPT_S
    body: dict[str, Any] = r.json()
    return body


async def metrics_while_down(client: httpx.AsyncClient, up: dict[str, int]) -> str:
    """``/metrics`` answered promptly, 200, with ``chronicle_backend_up`` as ``up`` says; its text."""
    r, took = await timed(client.get("/metrics"))
    assert r.status_code == 200, r.text
    assert took < PROMPT_S
    for backend, value in up.items():
        assert gauge(r.text, "chronicle_backend_up", f'{{backend="{backend}"}}') == value, backend
    return r.text


def api(url: str) -> httpx.AsyncClient:
    return httpx.AsyncClient(base_url=url, headers={"Authorization": f"Bearer {KEYS['tenant-a']}"}, timeout=60)


async def test_with_postgres_down_metrics_answer_readyz_names_it_and_requests_fail_fast(stack: Stack) -> None:
    sid = f"pg-{uuid.uuid4().hex[:8]}"
    async with api(stack.url) as client:
        r = await client.post(f"/v1/sessions/{sid}/messages", json={"message": text_message("m1", "before")})
        assert r.status_code == 201, r.text
        seq = r.json()["seq"]
        assert (await client.get(f"/v1/sessions/{sid}/history", params={"min_seq": seq})).status_code == 200
        before = (await client.get("/metrics")).text
        assert gauge(before, "chronicle_backend_up", '{backend="postgres"}') == 1
        assert gauge(before, "chronicle_metrics_refresh_age_seconds", '{backend="postgres"}') == 0

        await stack.db.cut()
        body = await readyz_while_down(client)
        assert (body["postgres"], body["nats"], body["stream"]) == (False, True, True), body
        assert any(reason.startswith("Postgres does not answer") for reason in body["reasons"]), body

        text = await metrics_while_down(client, {"postgres": 0, "nats": 1, "stream": 1})
        assert gauge(text, "chronicle_metrics_refresh_age_seconds", '{backend="postgres"}') > 0
        assert gauge(text, "chronicle_stream_last_seq") >= seq  # the stream's value is fresh
        assert gauge(text, "chronicle_events_published_total", '{type="message.appended"}') >= 1  # process-local

        # the pool has found the database unreachable (its reconnection failed): no 30 s waits now
        async def pool_knows() -> bool:
            return stack.c.pool.unreachable_since is not None

        await until(pool_knows)
        for call in (
            client.get(f"/v1/sessions/{sid}/history"),
            client.post(
                f"/v1/sessions/{sid}/messages", json={"message": text_message("m2", "during"), "parent_id": "m1"}
            ),
        ):
            r, took = await timed(call)
            assert r.status_code == 503, r.text
            assert took < FAIL_FAST_S + 2.0
            problem = r.json()
            assert (problem["code"], problem["detail"]) == ("unavailable", "DatabaseUnreachable"), problem
            assert r.headers["Retry-After"] == "1"

        await stack.db.restore()

        async def ready() -> bool:
            return (await client.get("/readyz")).status_code == 200

        await until(ready)
        text = (await client.get("/metrics")).text
        assert gauge(text, "chronicle_backend_up", '{backend="postgres"}') == 1
        assert gauge(text, "chronicle_metrics_refresh_age_seconds", '{backend="postgres"}') == 0
        r = await client.post(
            f"/v1/sessions/{sid}/messages", json={"message": text_message("m2", "after"), "parent_id": "m1"}
        )
        assert r.status_code == 201, r.text


async def test_with_postgres_silent_metrics_and_readyz_answer_within_the_probe_bound(stack: Stack) -> None:
    """A database that never answers (packets dropped) is the case the bound exists for."""
    async with api(stack.url) as client:
        assert (await client.get("/readyz")).status_code == 200
        stack.db.silent = True
        body = await readyz_while_down(client)
        assert (body["postgres"], body["nats"], body["stream"]) == (False, True, True), body
        assert f"Postgres does not answer: no answer within {PROBE_TIMEOUT_S:g}s" in body["reasons"], body
        await metrics_while_down(client, {"postgres": 0, "nats": 1, "stream": 1})
        stack.db.silent = False
        await stack.db.cut()  # the silenced connections are lost with the outage
        await stack.db.restore()

        async def ready() -> bool:
            return (await client.get("/readyz")).status_code == 200

        await until(ready)


async def test_with_nats_down_metrics_answer_and_readyz_marks_only_nats_and_the_stream(stack: Stack) -> None:
    async with api(stack.url) as client:
        assert (await client.get("/readyz")).status_code == 200
        stack.nats.stop()

        async def disconnected() -> bool:
            return not stack.c.nc.is_connected

        await until(disconnected)
        body = await readyz_while_down(client)
        assert (body["nats"], body["stream"], body["postgres"]) == (False, False, True), body
        assert body["reasons"] == ["NATS is not connected"], body

        text = await metrics_while_down(client, {"nats": 0, "stream": 0, "postgres": 1})
        assert gauge(text, "chronicle_metrics_refresh_age_seconds", '{backend="stream"}') > 0
        assert gauge(text, "chronicle_metrics_refresh_age_seconds", '{backend="postgres"}') == 0

        stack.nats.start()

        async def ready() -> bool:
            return (await client.get("/readyz")).status_code == 200

        await until(ready)
        text = (await client.get("/metrics")).text
        assert gauge(text, "chronicle_backend_up", '{backend="stream"}') == 1


@pytest.fixture
async def proxied_db(pg_admin: str) -> AsyncIterator[Cuttable]:
    with scratch_database(pg_admin) as db_url:
        proxy = Cuttable(db_url)
        await proxy.restore()
        try:
            yield proxy
        finally:
            await proxy.cut()


async def test_a_busy_pool_waits_its_timeout_and_is_no_outage(proxied_db: Cuttable) -> None:
    async with Pool(proxied_db.url, min_size=1, max_size=1, open=False) as pool:
        await pool.open(wait=True)
        async with pool.connection():
            with pytest.raises(PoolTimeout) as caught:
                await pool.getconn(timeout=FAIL_FAST_S + 0.5)
        assert not isinstance(caught.value, DatabaseUnreachable)
        assert pool.unreachable_since is None


async def test_the_pool_fails_fast_after_a_failed_connection_attempt_until_one_succeeds(proxied_db: Cuttable) -> None:
    async with Pool(proxied_db.url, min_size=1, max_size=2, open=False, timeout=30) as pool:
        await pool.open(wait=True)
        await proxied_db.cut()
        with pytest.raises(psycopg.OperationalError):  # the idle connection was lost
            async with pool.connection() as conn:
                await conn.execute("SELECT 1")

        async def pool_knows() -> bool:
            return pool.unreachable_since is not None

        await until(pool_knows)
        t0 = time.monotonic()
        with pytest.raises(DatabaseUnreachable):
            await pool.getconn()
        assert time.monotonic() - t0 < FAIL_FAST_S + 1.0  # not the pool's 30 s

        await proxied_db.restore()

        async def answers() -> bool:
            try:
                async with pool.connection() as conn:
                    await conn.execute("SELECT 1")
            except psycopg.OperationalError:
                return False
            return True

        await until(answers)
        assert pool.unreachable_since is None


async def test_with_nats_stopped_readyz_says_nats_does_not_answer(stack: Stack) -> None:
    """A nats-server that is stopped (SIGSTOP) keeps its TCP connections: the client still counts
    itself connected, and ``nats`` said true beside ``stream: false`` (an SRE trial). A PING that
    the server does not answer within the probe's bound makes ``nats`` false, named; once the
    server continues, the same PING's answer makes it ready again (no client error)."""
    proc = stack.nats.proc
    assert proc is not None
    async with api(stack.url) as client:
        assert (await client.get("/readyz")).status_code == 200
        proc.send_signal(signal.SIGSTOP)
        try:
            body = await readyz_while_down(client)
            for _ in range(5):  # under load, once, a PONG of the moment the signal landed answered the first
                if not body["nats"]:
                    break
                body = await readyz_while_down(client)
            assert (body["nats"], body["stream"], body["postgres"]) == (False, False, True), body
            assert body["reasons"] == [f"NATS does not answer: no answer within {PROBE_TIMEOUT_S:g}s"], body
            assert stack.c.nc.is_connected  # what the check said alone
        finally:
            proc.send_signal(signal.SIGCONT)

        async def ready() -> bool:
            return (await client.get("/readyz")).status_code == 200

        await until(ready)
        assert stack.c.nc.stats["reconnects"] == 0
        # the connection still reads: a PING abandoned after its timeout would have ended the
        # client's read loop when its PONG came (nats-py), leaving it "connected" and deaf
        nc = stack.c.nc
        inbox = nc.new_inbox()
        sub = await nc.subscribe(inbox)
        await nc.publish(inbox, b"still reading")
        assert (await sub.next_msg(timeout=5)).data == b"still reading"
        await sub.unsubscribe()
