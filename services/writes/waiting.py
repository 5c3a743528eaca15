"""Read-your-writes: wait, bounded, until the projector has applied a stream sequence.

One dedicated connection LISTENs on the projector's ``NOTIFY`` channel; every notification wakes
all waiters, which re-check their condition with one indexed query. No sleep loops.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import psycopg
from psycopg_pool import AsyncConnectionPool

from events.subjects import partition_of
from projections.runner import NOTIFY_CHANNEL, describe, partition_checkpoint
from services.errors import ProjectionTimeout

log = logging.getLogger("chronicle.waiting")

LISTEN_RETRY_S = 0.5
"""The first wait before the LISTEN connection is opened again; each failure in a row doubles it."""
LISTEN_RETRY_CAP_S = 5.0
"""The longest wait between two attempts (a read-your-writes wait re-checks every 0.25 s meanwhile)."""


class AppliedWaiter:
    def __init__(
        self,
        pool: AsyncConnectionPool[psycopg.AsyncConnection[Any]],
        conninfo: str,
        timeout_s: float,
        projector: str = "projector",
        partitions: int = 1,
    ) -> None:
        self._projector = projector
        self._partitions = partitions
        self._pool = pool
        self._conninfo = conninfo
        self._timeout = timeout_s
        self._changed: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._task: asyncio.Task[None] | None = None
        self._listening = asyncio.Event()

    @property
    def timeout_s(self) -> float:
        """How long a read waits for the projection (``CHRONICLE_READ_WAIT_TIMEOUT_S``)."""
        return self._timeout

    async def start(self) -> None:
        self._task = asyncio.create_task(self._listen(), name="chronicle-listen")
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._listening.wait(), timeout=5)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    def _wake(self) -> None:
        fut, self._changed = self._changed, asyncio.get_running_loop().create_future()
        if not fut.done():
            fut.set_result(None)

    async def _listen(self) -> None:
        """Keep one LISTEN connection. While Postgres cannot be reached each failure is one line
        and the retries back off (``LISTEN_RETRY_S`` doubling up to ``LISTEN_RETRY_CAP_S``); a
        connection that listens again is logged once and starts the backoff over."""
        failures = 0
        while True:
            try:
                async with await psycopg.AsyncConnection.connect(self._conninfo, autocommit=True) as conn:
                    await conn.execute(f"LISTEN {NOTIFY_CHANNEL}")
                    self._listening.set()
                    if failures:
                        log.info("LISTEN connection back after %d failed attempt(s)", failures)
                        failures = 0
                    self._wake()  # anything applied while we were not listening
                    async for _ in conn.notifies():
                        self._wake()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self._listening.clear()
                delay = min(LISTEN_RETRY_S * 2**failures, LISTEN_RETRY_CAP_S)
                failures += 1
                log.warning("LISTEN connection lost (%s); reconnecting in %.1fs", describe(exc), delay)
                self._wake()
                await asyncio.sleep(delay)

    async def wait_until(self, check: Callable[[], Awaitable[bool]], what: str, timeout_s: float | None = None) -> None:
        """Return once ``check()`` is true; raise :class:`ProjectionTimeout` after the bound."""
        deadline = asyncio.get_running_loop().time() + (timeout_s or self._timeout)
        while True:
            changed = self._changed
            if await check():
                return
            remaining = deadline - asyncio.get_running_loop().time()
            if remaining <= 0:
                raise ProjectionTimeout(f"the read model has not applied {what} yet")
            # Without a live LISTEN connection, re-check at a coarse interval instead.
            step = remaining if self._listening.is_set() else min(remaining, 0.25)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(changed), timeout=step)

    async def session_applied(self, tenant: str, session: str, seq: int) -> bool:
        """Every event of the session up to ``seq`` is applied or quarantined: the session row has
        reached ``seq`` (one index lookup), or else the projector
        checkpoint that covers the session's subject has (the unpartitioned projector's, or its
        partition's). A quarantined event never moves the session row, only the checkpoint, which
        moves in stream order in the same transaction; a quarantine row alone would prove
        nothing (the compactor may record it before the projector got there)."""
        if seq <= 0:
            return True
        async with self._pool.connection() as conn:
            answer = await self.send_applied_check(conn, tenant, session, seq)
            return await answer()

    def checkpoints_of(self, tenant: str, session: str) -> list[str]:
        """The checkpoints that cover the session's subject: the unpartitioned projector's and
        its partition's (either may be the one in use)."""
        return [
            self._projector,
            partition_checkpoint(self._projector, partition_of(tenant, session, self._partitions)),
        ]

    async def send_applied_check(
        self, conn: psycopg.AsyncConnection[Any], tenant: str, session: str, seq: int
    ) -> Callable[[], Awaitable[bool]]:
        """:meth:`session_applied`, sent on ``conn`` now and answered when the returned function is
        awaited: in pipeline mode the check travels with the statements that follow it, and in a
        snapshot it sees the same state they do (a read that proves itself fresh)."""
        names = self.checkpoints_of(tenant, session)
        cur = await conn.execute(
            "SELECT coalesce((SELECT last_seq >= %(q)s FROM sessions WHERE tenant = %(t)s AND id = %(s)s), false) "
            "OR EXISTS (SELECT 1 FROM checkpoints WHERE name = ANY(%(n)s) AND seq >= %(q)s)",
            {"q": seq, "t": tenant, "s": session, "n": names},
        )

        async def answer() -> bool:
            row = await cur.fetchone()
            return bool(row and row[0])

        return answer

    async def wait_session(self, tenant: str, session: str, seq: int, timeout_s: float | None = None) -> None:
        """Wait until every event of ``session`` up to ``seq`` is applied."""
        await self.wait_until(lambda: self.session_applied(tenant, session, seq), f"sequence {seq}", timeout_s)

    async def all_applied(self, seq: int) -> bool:
        """Every projector checkpoint (not the compactor's) has reached ``seq``: the one of an
        unpartitioned projector, or all partitions' (while projectors switch from one layout to
        the other, both count)."""
        async with self._pool.connection() as conn:
            cur = await conn.execute(
                "SELECT min(seq) FILTER (WHERE name <> %(p)s), count(*) FILTER (WHERE name <> %(p)s), "
                "min(seq) FILTER (WHERE name = %(p)s) FROM checkpoints WHERE name = %(p)s OR starts_with(name, %(pp)s)",
                {"p": self._projector, "pp": self._projector + ".p"},
            )
            row = await cur.fetchone()
        assert row is not None
        partitions_min, partitions_seen, whole = row
        if partitions_seen == self._partitions:
            applied = int(partitions_min)
        elif whole is not None:
            applied = min(int(whole), int(partitions_min)) if partitions_seen else int(whole)
        else:
            return False
        return applied >= seq

    async def wait_all(self, seq: int, timeout_s: float | None = None) -> None:
        """Wait until every projector checkpoint has reached ``seq`` (tenant-wide reads)."""
        if seq > 0:
            await self.wait_until(lambda: self.all_applied(seq), f"sequence {seq}", timeout_s)
