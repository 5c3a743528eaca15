"""``chronicle verify`` and ``chronicle rebuild`` build a copy of the read models in a shadow
schema (``verify_<ts>``, ``rebuild_<ts>``): a failure or Ctrl-C never leaves one behind, one that
a run killed outright left is dropped by the next run (never one a running run holds), and a
rebuild that fails before its swap leaves the live read models as they were."""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import sys
import textwrap
from collections.abc import AsyncIterator, Callable
from typing import Any

import psycopg
import pytest

from events.omitted import OMITTED
from projections import rebuild
from projections.keystore import new_kek_line
from services.audit import readers as audit
from services.audit import shadows as shadows_mod
from services.bootstrap import open_container
from services.ops.cli import INTERRUPTED_EXIT, SETTINGS_EXIT
from services.settings import Settings
from tests.conftest import TEST_KEK, make_settings, running_stack
from tests.integration.helpers import text_message
from tests.support import chronicle_cli, scratch_database

T = "tenant-a"


@pytest.fixture
async def projected(nats_url: str, pg_admin: str, new_id: Callable[[str], str]) -> AsyncIterator[Settings]:
    """A sealing stack's settings whose read models hold a session of three messages, projected."""
    with scratch_database(pg_admin) as db:
        settings = make_settings(nats_url, db, encryption=True, kek=TEST_KEK)
        sid = new_id("shadow")
        async with running_stack(settings) as c:
            for i in range(3):
                r = await c.commands.append(T, sid, text_message(f"m{i}", f"words {i}"), OMITTED)
                await c.waiter.wait_session(T, sid, r.seq)
        yield settings


async def shadows(settings: Settings) -> list[str]:
    """The shadow schemas (and replaced tables' schemas) in the database."""
    async with await psycopg.AsyncConnection.connect(settings.database_url) as conn:
        cur = await conn.execute(
            "SELECT nspname FROM pg_namespace WHERE nspname LIKE 'verify\\_%' OR nspname LIKE 'rebuild\\_%' "
            "OR nspname LIKE 'old\\_%' ORDER BY 1"
        )
        return [str(row[0]) for row in await cur.fetchall()]


async def live_state(settings: Settings) -> tuple[Any, ...]:
    async with await psycopg.AsyncConnection.connect(settings.database_url) as conn:
        cur = await conn.execute(
            "SELECT (SELECT count(*) FROM messages), (SELECT array_agg(seq ORDER BY name) FROM checkpoints), "
            "(SELECT count(*) FROM log_binding)"
        )
        return tuple(await cur.fetchone() or ())


def failing(exc: BaseException) -> Callable[..., Any]:
    async def fail(*_args: object, **_kwargs: object) -> Any:
        raise exc

    return fail


@pytest.mark.parametrize("exc", [RuntimeError("injected"), asyncio.CancelledError()], ids=["error", "cancelled"])
async def test_a_verify_that_fails_after_building_its_shadow_drops_it(
    projected: Settings, monkeypatch: pytest.MonkeyPatch, exc: BaseException
) -> None:
    """(A verify that failed, or was stopped by Ctrl-C, which cancels it, left ``verify_<ts>``.)"""
    built: list[str] = []
    checksums = rebuild.checksums  # what services.audit.readers imported

    async def then_fail(conn: psycopg.AsyncConnection[Any], schema: str) -> Any:
        if schema != "public":
            built.append(schema)
            assert await shadows(projected) == [schema]  # the copy was there when it failed
            raise exc
        return await checksums(conn, schema)

    monkeypatch.setattr(audit, "checksums", then_fail)
    async with open_container(projected) as c:
        with pytest.raises(type(exc)):
            await audit.verify(c)
    assert built
    assert await shadows(projected) == []


@pytest.mark.parametrize("step", ["_catch_up", "_keep_quarantined_ahead"])
@pytest.mark.parametrize("exc", [RuntimeError("injected"), asyncio.CancelledError()], ids=["error", "cancelled"])
async def test_a_rebuild_that_fails_before_its_swap_drops_its_shadow_and_keeps_the_live_tables(
    projected: Settings, monkeypatch: pytest.MonkeyPatch, step: str, exc: BaseException
) -> None:
    """``_catch_up``: after the shadow is built, outside the lock; ``_keep_quarantined_ahead``:
    inside the swap's transaction, which rolls back."""
    before = await live_state(projected)
    monkeypatch.setattr(audit, step, failing(exc))
    async with open_container(projected) as c:
        with pytest.raises(type(exc)):
            await audit.rebuild_and_swap(c, keep_old=True)
    assert await shadows(projected) == []
    assert await live_state(projected) == before
    monkeypatch.undo()
    async with open_container(projected) as c:
        assert (await audit.verify(c)).ok
        report = await audit.rebuild_and_swap(c)  # and a rebuild after it swaps as ever
    assert report.kept_old is None
    assert await shadows(projected) == []
    assert await live_state(projected) == before


@pytest.mark.parametrize("command", ["verify", "rebuild"])
async def test_a_wrong_kek_leaves_no_shadow_schema(projected: Settings, command: str) -> None:
    """The operator trial: sealed events, another key-encryption key."""
    before = await live_state(projected)
    done = chronicle_cli(projected.model_copy(update={"kek": new_kek_line()}), command, timeout=90)
    assert done.returncode == SETTINGS_EXIT, (done.stdout, done.stderr)
    assert "Traceback" not in done.stderr
    assert await shadows(projected) == []
    assert await live_state(projected) == before


INTERRUPTED = textwrap.dedent(
    """
    import asyncio, os, signal, sys
    from services.audit import readers
    from services.ops.cli import main

    # as in a terminal: a process started in the background by a shell without job control
    # inherits SIGINT ignored (this test failed every time when the suite was run that way)
    signal.signal(signal.SIGINT, signal.default_int_handler)

    checksums = readers.checksums

    async def interrupted(conn, schema):
        if schema != "public":  # the shadow is built: Ctrl-C now
            os.kill(os.getpid(), signal.SIGINT)
            await asyncio.sleep(60)
        return await checksums(conn, schema)

    readers.checksums = interrupted
    sys.exit(main(["verify"]))
    """
)


async def test_ctrl_c_during_a_verify_is_one_line_exit_130_and_drops_its_shadow(projected: Settings) -> None:
    """(Ctrl-C printed a KeyboardInterrupt traceback and left ``verify_<ts>``.) A real SIGINT, sent
    by the process itself once its shadow schema is built."""
    from bench.support import settings_env

    done = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-c", INTERRUPTED],
        env=settings_env(projected),
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
    )
    assert done.returncode == INTERRUPTED_EXIT, (done.stdout, done.stderr)
    assert done.stderr.strip().splitlines() == ["chronicle verify: interrupted"]
    assert await shadows(projected) == []


def test_two_shadow_tags_of_the_same_second_differ() -> None:
    """(Named to the second, two runs started in the same second shared ``verify_<ts>``.)"""
    second = 1_797_000_000.0
    tags = {shadows_mod.shadow_tag(second) for _ in range(20)}
    assert len(tags) == 20
    assert {t.split("_")[0] for t in tags} == {"20261211144000"}
    assert all(len(t.split("_")[1]) == 6 for t in tags)


@pytest.mark.parametrize("command", ["verify", "rebuild"])
async def test_a_run_that_fails_drops_its_own_shadow_and_leaves_another_runs_of_the_same_second(
    projected: Settings, monkeypatch: pytest.MonkeyPatch, command: str
) -> None:
    """Another run's shadow made in the same second, with the very tag this run draws first: this
    run claims another name, and its cleanup after a failure leaves the other run's schema."""
    tag = shadows_mod.shadow_tag(token="abc123")
    draws = iter([tag, tag])
    real_tag = shadows_mod.shadow_tag
    monkeypatch.setattr(shadows_mod, "shadow_tag", lambda: next(draws, None) or real_tag())
    claimed: list[str] = []
    claim = shadows_mod.claim_shadow

    async def claiming(conn: psycopg.AsyncConnection[Any], kind: str) -> str:
        claimed.append(await claim(conn, kind))
        return claimed[-1]

    monkeypatch.setattr(shadows_mod, "claim_shadow", claiming)
    monkeypatch.setattr(audit, "checksums" if command == "verify" else "_catch_up", failing(RuntimeError("injected")))
    async with shadows_mod.held_shadow(projected.database_url, command) as other, open_container(projected) as c:
        assert other == f"{command}_{tag}"  # the other run, going on, drew the tag first
        with pytest.raises(RuntimeError, match="injected"):
            await (audit.verify(c) if command == "verify" else audit.rebuild_and_swap(c))
        assert await shadows(projected) == [other]
    assert len(claimed) == 2
    assert claimed[1] != other


KILLED = textwrap.dedent(
    """
    import os, signal, sys
    from services.audit import readers
    from services.ops.cli import main

    command, step = sys.argv[1], sys.argv[2]

    async def killed(*_args, **_kwargs):  # the shadow is built: SIGKILL now, as the OOM killer does
        os.kill(os.getpid(), signal.SIGKILL)

    setattr(readers, step, killed)
    sys.exit(main([command]))
    """
)


@pytest.mark.parametrize(("command", "step"), [("verify", "checksums"), ("rebuild", "_catch_up")])
async def test_a_shadow_left_by_a_killed_run_is_dropped_by_the_next_run(
    projected: Settings, command: str, step: str
) -> None:
    """(A verify or rebuild killed with SIGKILL, by the OOM killer, a timeout or a lost machine,
    left a whole copy of the read models, message bodies included, that nothing dropped and no
    erasure touched; each such run left one more.) A real SIGKILL, sent by the process itself
    once its shadow is built; the next run says what it dropped."""
    from bench.support import settings_env

    before = await live_state(projected)
    killed = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-c", KILLED, command, step],
        env=settings_env(projected),
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
    )
    assert killed.returncode == -9, (killed.stdout, killed.stderr)
    (left,) = await shadows(projected)
    assert left.startswith(f"{command}_")
    assert await live_state(projected) == before
    done = await asyncio.to_thread(chronicle_cli, projected, command, timeout=90)
    assert done.returncode == 0, (done.stdout, done.stderr)
    assert f"dropped shadow schema {left}" in done.stderr
    assert await shadows(projected) == []


async def test_a_runs_shadow_lock_outlives_the_servers_idle_session_timeout(projected: Settings) -> None:
    """A run's lock on its shadow is held by a connection idle for the whole run: a server (or a
    role, or a database) with ``idle_session_timeout`` ended it, the lock went with it, and the
    next run dropped the shadow of a run still going. The holder's connection turns it off."""
    async with await psycopg.AsyncConnection.connect(projected.database_url, autocommit=True) as admin:
        db = admin.info.dbname
        await admin.execute(f"ALTER DATABASE \"{db}\" SET idle_session_timeout = '1s'")
    try:
        async with shadows_mod.held_shadow(projected.database_url, "verify") as mine:
            idle = await psycopg.AsyncConnection.connect(projected.database_url, autocommit=True)
            async with asyncio.timeout(30):  # an idle connection of the same database is ended meanwhile
                while not idle.closed:
                    await asyncio.sleep(1.5)
                    with contextlib.suppress(psycopg.OperationalError):
                        await idle.execute("SELECT 1")
            async with await psycopg.AsyncConnection.connect(projected.database_url, autocommit=True) as other:
                await other.execute("SET idle_session_timeout = 0")
                assert await shadows_mod.drop_abandoned(other) == []
            assert await shadows(projected) == [mine]
    finally:
        async with await psycopg.AsyncConnection.connect(projected.database_url, autocommit=True) as admin:
            await admin.execute(f'ALTER DATABASE "{db}" RESET idle_session_timeout')
