"""The read models are bound to their event log: a stream made again under the same name (its
data wiped), or checkpoints beyond the stream's end, make every component refuse to start with
:class:`LogMismatch`; a rebuild and ``chronicle log rebind --yes`` bind the database again."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import logging
import subprocess
import sys
from datetime import datetime

import httpx
import psycopg
import pytest
from nats.js import JetStreamContext
from nats.js.errors import NotFoundError

from bench.support import settings_env
from events.omitted import OMITTED
from events.stream import ensure_stream
from projections import logbinding
from projections.logbinding import LogIdentity, LogMismatch
from services.api.app import build_app
from services.audit import readers as audit
from services.bootstrap import Container, open_container
from services.ops.cli import LOG_MISMATCH_EXIT
from services.ops.localstack import free_port
from services.ops.log_cli import run_log
from services.settings import Settings
from tests.conftest import make_settings, operator_nats, running_stack
from tests.integration.helpers import text_message

T = "tenant-a"


async def _append(c: Container, session: str, mid: str, text: str) -> int:
    r = await c.commands.append(T, session, text_message(mid, text), OMITTED)
    assert r.created
    await c.waiter.wait_session(T, session, r.seq)
    return r.seq


async def _binding(db: str, projector: str) -> tuple[str, datetime | None] | None:
    async with await psycopg.AsyncConnection.connect(db) as conn:
        cur = await conn.execute("SELECT stream, stream_created FROM log_binding WHERE projector = %s", (projector,))
        row = await cur.fetchone()
    return (str(row[0]), row[1]) if row else None


async def _checkpoint(db: str, name: str) -> int:
    async with await psycopg.AsyncConnection.connect(db) as conn:
        cur = await conn.execute("SELECT coalesce(max(seq), 0) FROM checkpoints WHERE name = %s", (name,))
        row = await cur.fetchone()
    return int(row[0]) if row else 0


async def _created(settings: Settings) -> datetime | None:
    nc = await operator_nats(settings.nats_url)
    try:
        return (await nc.jetstream().stream_info(settings.stream)).created
    finally:
        await nc.close()


async def _made_again(settings: Settings, events: int = 0) -> None:
    """Delete the stream and make it again under the same name (a wiped NATS data directory),
    with ``events`` new appends in it (their sequences start at 1 again)."""
    nc = await operator_nats(settings.nats_url)
    try:
        js = nc.jetstream()
        await js.delete_stream(settings.stream)
        await ensure_stream(js, settings.layout())
    finally:
        await nc.close()
    if events:
        async with open_container(settings, log_check=False) as c:
            for i in range(events):
                r = await c.commands.append(T, f"new-{i}", text_message("n0", f"new log {i}"), OMITTED)
                assert r.seq == i + 1


async def _used_log(settings: Settings) -> int:
    """A stack that applied three appends to the stream; returns the projector's checkpoint."""
    async with running_stack(settings) as c:
        for i in range(3):
            await _append(c, "old", f"m{i}", f"old log {i}")
    return await _checkpoint(settings.database_url, settings.projector_name)


async def test_first_start_binds_and_a_restart_on_the_same_stream_works(nats_url: str, fresh_db: str) -> None:
    settings = make_settings(nats_url, fresh_db)
    async with running_stack(settings) as c:
        await _append(c, "s", "m0", "first")
        created = await _created(settings)
        assert created is not None  # the pinned nats-server reports it
        assert await _binding(fresh_db, settings.projector_name) == (settings.stream, created)
    async with running_stack(settings) as c:
        seq = await _append(c, "s", "m1", "after the restart")
    assert await _checkpoint(fresh_db, settings.projector_name) >= seq
    assert await _binding(fresh_db, settings.projector_name) == (settings.stream, created)


async def test_the_projector_refuses_a_stream_made_again_and_consumes_nothing(nats_url: str, fresh_db: str) -> None:
    settings = make_settings(nats_url, fresh_db)
    checkpoint = await _used_log(settings)
    bound = await _binding(fresh_db, settings.projector_name)
    assert bound is not None
    await _made_again(settings, events=checkpoint + 2)  # past the checkpoint: only the identity tells
    created = await _created(settings)
    assert created != bound[1]
    async with open_container(settings, log_check=False) as c:
        runner = c.projector()
        with pytest.raises(LogMismatch) as refused:
            await asyncio.wait_for(runner.run(asyncio.Event()), timeout=30)
        with pytest.raises(NotFoundError):  # never positioned: no consumer was made
            await c.js.consumer_info(settings.stream, runner.durable)
    text = str(refused.value)
    assert settings.stream in text
    assert fresh_db.rsplit("/", 1)[1] in text  # the database, by name
    assert bound[1] is not None
    assert created is not None
    assert bound[1].isoformat() in text
    assert created.isoformat() in text
    assert "chronicle rebuild" in text
    assert "chronicle log rebind --yes" in text
    assert runner.stats.batches == 0
    assert await _checkpoint(fresh_db, settings.projector_name) == checkpoint
    async with await psycopg.AsyncConnection.connect(fresh_db) as conn:
        cur = await conn.execute("SELECT count(*) FROM sessions WHERE id LIKE 'new-%%'")
        assert await cur.fetchone() == (0,)
    assert await _binding(fresh_db, settings.projector_name) == bound  # unchanged


async def test_a_checkpoint_beyond_the_streams_end_is_refused(nats_url: str, fresh_db: str) -> None:
    """The stream is the bound one; only the checkpoint is further on (a truncated log)."""
    settings = make_settings(nats_url, fresh_db)
    checkpoint = await _used_log(settings)
    async with await psycopg.AsyncConnection.connect(fresh_db, autocommit=True) as conn:
        await conn.execute(
            "UPDATE checkpoints SET seq = %s WHERE name = %s", (checkpoint + 1000, settings.projector_name)
        )
    with pytest.raises(LogMismatch) as refused:
        async with open_container(settings):
            pass
    assert refused.value.checkpoint == (settings.projector_name, checkpoint + 1000)
    assert f"at sequence {checkpoint + 1000}, beyond the last sequence {checkpoint}" in str(refused.value)
    async with open_container(settings, log_check=False) as c:
        with pytest.raises(LogMismatch):
            await asyncio.wait_for(c.projector().run(asyncio.Event()), timeout=30)


async def test_an_unbound_database_with_checkpoints_past_a_new_stream_is_refused(nats_url: str, fresh_db: str) -> None:
    """No binding recorded (a database from before the binding): the checkpoints still tell, and
    nothing is bound to the new stream."""
    settings = make_settings(nats_url, fresh_db)
    await _used_log(settings)
    async with await psycopg.AsyncConnection.connect(fresh_db, autocommit=True) as conn:
        await conn.execute("DELETE FROM log_binding")
    await _made_again(settings)
    with pytest.raises(LogMismatch) as refused:
        async with open_container(settings):
            pass
    assert "beyond the last sequence 0" in str(refused.value)
    assert await _binding(fresh_db, settings.projector_name) is None


async def test_the_api_and_the_command_service_refuse_at_start(nats_url: str, fresh_db: str) -> None:
    """Both open the container (services/bootstrap.py) before they serve, as the compactor does:
    the refusal is one line and its exit status."""
    settings = make_settings(nats_url, fresh_db)
    await _used_log(settings)
    await _made_again(settings, events=1)
    for process in ("api", "commands"):
        done = await asyncio.to_thread(
            subprocess.run,
            [sys.executable, "-m", "services.ops.cli", process],
            env=settings_env(settings.model_copy(update={"api_port": free_port()})),
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == LOG_MISMATCH_EXIT, done.stderr
        assert done.stderr.startswith(f"chronicle {process}: refusing to start:"), done.stderr
        assert "chronicle rebuild" in done.stderr
        assert len(done.stderr.strip().splitlines()) == 1, done.stderr


async def test_a_rebuild_replaces_the_other_logs_read_models_and_binds(nats_url: str, fresh_db: str) -> None:
    settings = make_settings(nats_url, fresh_db)
    await _used_log(settings)
    await _made_again(settings, events=2)
    created = await _created(settings)
    async with open_container(settings, log_check=False) as c:
        with pytest.raises(LogMismatch, match="--projection all"):
            await audit.rebuild_and_swap(c, "history")
        report = await audit.rebuild_and_swap(c)
    assert report.rebound
    assert report.swapped_at_seq == 2
    assert await _binding(fresh_db, settings.projector_name) == (settings.stream, created)
    assert await _checkpoint(fresh_db, settings.projector_name) == 2
    async with running_stack(settings) as c:
        async with c.pool.connection() as conn:
            cur = await conn.execute("SELECT id FROM sessions WHERE tenant = %s ORDER BY id", (T,))
            assert [r[0] for r in await cur.fetchall()] == ["new-0", "new-1"]  # the old log's are gone
        seq = await _append(c, "old", "m0", "the new log's own m0")  # created: the old row is gone
        assert seq == 3


async def test_verify_refuses_read_models_of_another_log(nats_url: str, fresh_db: str) -> None:
    """A verify of a database bound to a wiped stream names the cause (the log) instead of
    reporting every table different; after the rebuild it verifies."""
    settings = make_settings(nats_url, fresh_db)
    await _used_log(settings)
    await _made_again(settings, events=1)
    async with open_container(settings, log_check=False) as c:
        with pytest.raises(LogMismatch, match="nothing to verify against"):
            await audit.verify(c)
        cur_schemas = await _schemas(fresh_db)
        assert not [s for s in cur_schemas if s.startswith("verify_")]  # refused before any shadow
        await audit.rebuild_and_swap(c)
        assert (await audit.verify(c)).ok


async def _schemas(db: str) -> list[str]:
    async with await psycopg.AsyncConnection.connect(db) as conn:
        cur = await conn.execute("SELECT nspname FROM pg_namespace")
        return [str(r[0]) for r in await cur.fetchall()]


async def test_a_rebuild_on_the_bound_stream_keeps_the_binding(nats_url: str, fresh_db: str) -> None:
    settings = make_settings(nats_url, fresh_db)
    await _used_log(settings)
    bound = await _binding(fresh_db, settings.projector_name)
    async with open_container(settings) as c:
        report = await audit.rebuild_and_swap(c, "history")
    assert not report.rebound
    assert await _binding(fresh_db, settings.projector_name) == bound


async def test_log_rebind_prints_both_and_rewrites_only_with_yes(
    nats_url: str, fresh_db: str, capsys: pytest.CaptureFixture[str]
) -> None:
    settings = make_settings(nats_url, fresh_db)
    checkpoint = await _used_log(settings)
    bound = await _binding(fresh_db, settings.projector_name)
    assert bound is not None
    assert bound[1] is not None
    await _made_again(settings, events=checkpoint)  # a restored copy: as long as the old one
    created = await _created(settings)
    assert created is not None
    assert await run_log(settings, argparse.Namespace(log_command="rebind", yes=False)) == 1
    out = capsys.readouterr().out
    assert bound[1].isoformat() in out
    assert created.isoformat() in out
    assert "not rebound" in out
    assert await _binding(fresh_db, settings.projector_name) == bound
    assert await run_log(settings, argparse.Namespace(log_command="rebind", yes=True)) == 0
    assert "rebound" in capsys.readouterr().out
    assert await _binding(fresh_db, settings.projector_name) == (settings.stream, created)
    async with running_stack(settings) as c:  # starts: the restored log is the read models' now
        await _append(c, "after", "a0", "after the rebind")


async def test_log_rebind_refuses_a_stream_shorter_than_the_read_models(
    nats_url: str, fresh_db: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """A copy restored from before the last events: bound to it, the projector would take the
    stream's next events at those sequences as applied (a backup trial saw a tenant's event skipped
    and the lost one kept). Refused, exit 2, rebuild named; the binding is unchanged."""
    settings = make_settings(nats_url, fresh_db)
    checkpoint = await _used_log(settings)
    bound = await _binding(fresh_db, settings.projector_name)
    await _made_again(settings, events=checkpoint - 1)  # one event short of the read models
    assert await run_log(settings, argparse.Namespace(log_command="rebind", yes=True)) == 2
    err = capsys.readouterr().err
    assert f"beyond the stream's last sequence {checkpoint - 1}" in err
    assert "`chronicle rebuild`" in err
    assert await _binding(fresh_db, settings.projector_name) == bound


async def test_without_a_reported_creation_time_only_the_last_sequence_is_checked(
    nats_url: str, fresh_db: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A server that reports no creation time: a warning, and the checkpoint check alone."""
    settings = make_settings(nats_url, fresh_db)
    checkpoint = await _used_log(settings)
    real = logbinding.stream_identity

    async def unreported(js: JetStreamContext, stream: str) -> LogIdentity:
        return dataclasses.replace(await real(js, stream), created=None)

    monkeypatch.setattr(logbinding, "stream_identity", unreported)
    with caplog.at_level(logging.WARNING, logger="chronicle.logbinding"):
        async with open_container(settings):
            pass
    assert any("reports no creation time" in r.getMessage() for r in caplog.records)
    await _made_again(settings)
    with pytest.raises(LogMismatch, match=f"at sequence {checkpoint}, beyond the last sequence 0"):
        async with open_container(settings):
            pass


async def test_readyz_goes_503_when_the_stream_is_made_again_under_a_running_api(nats_url: str, fresh_db: str) -> None:
    settings = make_settings(nats_url, fresh_db)
    async with running_stack(settings) as c:
        await _append(c, "s", "m0", "before")
        app = build_app(settings, c)
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://api") as client:
            before = await client.get("/readyz")
            assert before.status_code == 200, before.text
            assert before.json()["log"] is True
            bound = await _binding(fresh_db, settings.projector_name)
            await _made_again(settings)
            after = await client.get("/readyz")
    assert after.status_code == 503, after.text
    body = after.json()
    assert body["log"] is False
    assert body["stream"] is True
    [reason] = [r for r in body["reasons"] if "another log" in r]
    assert settings.stream in reason
    assert "made again" in reason
    assert await _binding(fresh_db, settings.projector_name) == bound  # readiness rebinds nothing
