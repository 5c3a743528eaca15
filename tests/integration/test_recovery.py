"""Crash recovery and replay: SIGKILL mid-run, and rebuilding read models from sequence 1."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
from collections.abc import Callable

import psycopg

from bench.support import settings_env
from projections.rebuild import checksums, rebuild_into
from services.bootstrap import Container
from tests.conftest import make_settings, running_stack
from tests.integration.helpers import chain


async def _checkpoint(conninfo: str, name: str) -> int:
    async with await psycopg.AsyncConnection.connect(conninfo) as conn:
        cur = await conn.execute("SELECT coalesce(max(seq), 0) FROM checkpoints WHERE name = %s", (name,))
        row = await cur.fetchone()
        return int(row[0]) if row else 0


async def _publish_history(c: Container, sessions: int, per_session: int) -> int:
    events = [ev for s in range(sessions) for ev in chain("tenant-a", f"crash-{s}", per_session)]
    results = await c.publisher.publish_many(events)
    return max(r.seq for r in results)


async def _wait_checkpoint(conninfo: str, name: str, target: int, timeout: float = 60) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while await _checkpoint(conninfo, name) < target:
        assert asyncio.get_running_loop().time() < deadline, "projector did not catch up"
        await asyncio.sleep(0.05)


async def test_projector_killed_mid_run_ends_with_exactly_the_logged_rows(nats_url: str, fresh_db: str) -> None:
    settings = make_settings(nats_url, fresh_db, projector_batch=25)
    async with running_stack(settings, projector=False) as c:
        last = await _publish_history(c, sessions=20, per_session=150)
        env = settings_env(settings)
        cmd = [sys.executable, "-m", "services.ops.cli", "projector"]
        proc = subprocess.Popen(cmd, env=env, stderr=subprocess.DEVNULL)
        try:
            await _wait_checkpoint(fresh_db, settings.projector_name, 500)
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.wait()
        killed_at = await _checkpoint(fresh_db, settings.projector_name)
        assert 0 < killed_at < last, "the kill should land mid-run"
        proc = subprocess.Popen(cmd, env=env, stderr=subprocess.DEVNULL)
        try:
            await _wait_checkpoint(fresh_db, settings.projector_name, last)
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=20)
        async with await psycopg.AsyncConnection.connect(fresh_db) as conn:
            cur = await conn.execute(
                "SELECT count(*), count(DISTINCT (session_id, id)) FROM messages WHERE tenant = 'tenant-a'"
            )
            assert await cur.fetchone() == (3000, 3000)
            live = await checksums(conn, "public")
        await rebuild_into(c.js, c.layout, fresh_db, "shadow", c.projections(), settings.projector_name, keys=c.keys)
        async with await psycopg.AsyncConnection.connect(fresh_db) as conn:
            assert await checksums(conn, "shadow") == live


async def test_dropping_read_models_and_replaying_gives_identical_rows(nats_url: str, fresh_db: str) -> None:
    settings = make_settings(nats_url, fresh_db)
    async with running_stack(settings) as c:
        await _publish_history(c, sessions=5, per_session=40)
        for s in range(5):
            sid = f"crash-{s}"
            await c.commands.update(
                "tenant-a", sid, {"id": "m3", "role": "user", "parts": [{"type": "text", "text": "edited"}]}
            )
            await c.commands.delete_messages("tenant-a", sid, ["m5", "m6"])
        await c.commands.rename_session("tenant-a", "crash-0", "renamed")
        await c.commands.clear("tenant-a", "crash-1")
        await c.commands.delete_session("tenant-a", "crash-2")
        last = await c.publisher.last_subject_seq("tenant-a", "crash-2")
        await c.waiter.wait_all(last)
        async with c.pool.connection() as conn:
            before = await checksums(conn, "public")
            assert before["messages"][0] == 5 * 40 - 40 - 40 - 2 * 3  # clear, delete, 2 deleted each
    # drop every read model, then let a projector replay the log from sequence 1
    async with await psycopg.AsyncConnection.connect(fresh_db, autocommit=True) as conn:
        await conn.execute("TRUNCATE sessions, messages, checkpoints")
    async with running_stack(settings) as c:
        await c.waiter.wait_all(last)
        async with c.pool.connection() as conn:
            assert await checksums(conn, "public") == before


async def _lock_holders(conninfo: str) -> dict[int, int]:
    """``{backend pid: advisory locks it holds}`` in this database."""
    async with await psycopg.AsyncConnection.connect(conninfo) as conn:
        cur = await conn.execute(
            "SELECT pid, count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted "
            "AND database = (SELECT oid FROM pg_database WHERE datname = current_database()) GROUP BY pid"
        )
        return {int(pid): int(n) for pid, n in await cur.fetchall()}


async def _wait_holders(conninfo: str, ok: Callable[[dict[int, int]], bool], timeout: float = 30) -> dict[int, int]:
    deadline = asyncio.get_running_loop().time() + timeout
    while not ok(holders := await _lock_holders(conninfo)):
        assert asyncio.get_running_loop().time() < deadline, f"advisory locks: {holders}"
        await asyncio.sleep(0.05)
    return holders


async def test_a_projector_whose_lock_session_ends_takes_its_locks_again_and_keeps_applying(
    nats_url: str, fresh_db: str
) -> None:
    settings = make_settings(nats_url, fresh_db)
    async with running_stack(settings, projector=False) as c:
        runner = c.projector()
        runner.lock_check_s = 0.2
        stop = asyncio.Event()
        task = asyncio.create_task(runner.run(stop))
        try:
            expected = 1 + settings.partitions  # its own checkpoint's and every partition's
            before = await _wait_holders(fresh_db, lambda h: sum(h.values()) == expected)
            (pid,) = before
            async with await psycopg.AsyncConnection.connect(fresh_db, autocommit=True) as conn:
                await conn.execute("SELECT pg_terminate_backend(%s)", (pid,))  # nothing else fails
            after = await _wait_holders(fresh_db, lambda h: sum(h.values()) == expected and pid not in h)
            assert len(after) == 1
            assert runner.stats.lock_losses == 1
            last = await _publish_history(c, sessions=2, per_session=10)
            await _wait_checkpoint(fresh_db, settings.projector_name, last)
        finally:
            stop.set()
            await asyncio.wait_for(task, timeout=20)
