"""The read-your-writes waiter's LISTEN connection, while Postgres cannot be used: one line per
failed attempt (no traceback), retries that back off to a cap, one line when it listens again,
and the backoff started over after that (it logged a traceback every 0.5 s)."""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Callable

import psycopg
import pytest
from psycopg_pool import AsyncConnectionPool

from services.ops.localstack import with_database
from services.writes import waiting
from services.writes.waiting import AppliedWaiter

pytestmark = pytest.mark.timeout(60)


class Lines(logging.Handler):
    """The waiter's log records, with a wake-up for each."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.records: list[logging.LogRecord] = []
        self.arrived = asyncio.Event()

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)
        self.arrived.set()

    async def until(self, enough: Callable[[list[logging.LogRecord]], bool]) -> None:
        async with asyncio.timeout(30):
            while not enough(self.records):
                self.arrived.clear()
                await self.arrived.wait()


def lost(records: list[logging.LogRecord]) -> list[logging.LogRecord]:
    return [r for r in records if r.getMessage().startswith("LISTEN connection lost")]


def back(records: list[logging.LogRecord]) -> list[logging.LogRecord]:
    return [r for r in records if r.getMessage().startswith("LISTEN connection back")]


async def test_a_listen_connection_that_fails_backs_off_in_one_line_each_and_starts_over_once_back(
    pg_admin: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(waiting, "LISTEN_RETRY_S", 0.02)
    monkeypatch.setattr(waiting, "LISTEN_RETRY_CAP_S", 0.08)
    name = "chronicle_listen_" + uuid.uuid4().hex[:12]
    url = with_database(pg_admin, name)  # not there yet: every attempt fails
    lines = Lines()
    logger = logging.getLogger("chronicle.waiting")
    logger.addHandler(lines)
    logger.setLevel(logging.INFO)
    waiter = AppliedWaiter(AsyncConnectionPool(url, open=False), url, 5)
    starting = asyncio.create_task(waiter.start())
    try:
        await lines.until(lambda rs: len(lost(rs)) >= 5)
        async with await psycopg.AsyncConnection.connect(pg_admin, autocommit=True) as admin:
            await admin.execute(f'CREATE DATABASE "{name}"')
            await lines.until(lambda rs: len(back(rs)) == 1)
            await starting
            failed = len(lost(lines.records))
            await admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s AND query LIKE 'LISTEN%%'",
                [name],
            )
            await lines.until(lambda rs: len(lost(rs)) > failed)
    finally:
        await waiter.stop()
        logger.removeHandler(lines)
        logger.setLevel(logging.NOTSET)
        async with await psycopg.AsyncConnection.connect(pg_admin, autocommit=True) as admin:
            await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    down = lost(lines.records)
    assert all(r.exc_info is None and r.levelno == logging.WARNING for r in down)
    assert all("\n" not in r.getMessage() for r in down)
    assert down[0].getMessage().startswith("LISTEN connection lost (OperationalError: ")
    delays = [r.args[-1] for r in down if isinstance(r.args, tuple)]
    assert delays[:5] == [0.02, 0.04, 0.08, 0.08, 0.08]  # doubling, capped
    assert delays[failed] == 0.02  # started over after the reconnect
    assert back(lines.records)[0].getMessage() == f"LISTEN connection back after {failed} failed attempt(s)"
