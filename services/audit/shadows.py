"""The shadow schemas of ``chronicle verify`` and ``chronicle rebuild`` (``verify_<tag>``,
``rebuild_<tag>``, a rebuild's replaced tables in ``old_<tag>``): each run's own.

A tag is the run's start to the second and six random hex digits, so two runs started in the same
second get different schemas; a run claims its shadow by creating it (refused when one of that
name exists), so what it drops when it fails or is stopped is a schema it made, never another
run's.

A run holds its shadow's advisory lock (:data:`TRY_HOLD`) from before it creates the schema until it
ends, on a connection of its own (:func:`held_shadow`), so a run that ended without dropping its
shadow (killed with SIGKILL, by the OOM killer, its machine lost) is known by a lock nobody holds:
the next run drops such a shadow before it claims its own (:func:`drop_abandoned`). Before, each
left a whole copy of the read models for good, message bodies included, which no erasure
touched. A rebuild's ``old_<tag>`` is never dropped so: ``--keep-old`` keeps it on purpose."""

from __future__ import annotations

import contextlib
import logging
import re
import secrets
import time
from collections.abc import AsyncIterator
from typing import Any

import psycopg

log = logging.getLogger("chronicle.shadows")

TRY_HOLD = "SELECT pg_try_advisory_lock(hashtext('chronicle-shadow'), hashtext(%s))"
RELEASE = "SELECT pg_advisory_unlock(hashtext('chronicle-shadow'), hashtext(%s))"
SHADOW = re.compile(r"(verify|rebuild)_[0-9]{14}(_[0-9a-f]{6})?")
"""A run's shadow (an earlier release's named to the second only), never ``old_<tag>``."""

CLAIM_TRIES = 5
"""Tags tried before giving up (each clash is a one in 16 million draw in the same second)."""


def shadow_tag(now: float | None = None, token: str | None = None) -> str:
    """``20261206235959_1a2b3c``: the UTC second of ``now`` (default: now) and ``token`` (default:
    six random hex digits)."""
    stamp = time.strftime("%Y%m%d%H%M%S", time.gmtime(time.time() if now is None else now))
    return f"{stamp}_{token if token is not None else secrets.token_hex(3)}"


async def claim_shadow(conn: psycopg.AsyncConnection[Any], kind: str) -> str:
    """A new empty schema ``<kind>_<tag>`` made by this run (the name is returned), its lock held
    on ``conn`` (autocommit) from before it exists: created without ``IF NOT EXISTS``, so a name
    another run holds is never shared; another tag is drawn then."""
    for attempt in range(CLAIM_TRIES):
        name = f"{kind}_{shadow_tag()}"
        held = await conn.execute(TRY_HOLD, (name,))
        if (await held.fetchone() or (False,))[0]:
            try:
                await conn.execute(f'CREATE SCHEMA "{name}"')
                return name
            except psycopg.errors.DuplicateSchema:
                await conn.execute(RELEASE, (name,))
                if attempt == CLAIM_TRIES - 1:
                    raise  # a last clash is an error, not a shared schema
        elif attempt == CLAIM_TRIES - 1:
            raise RuntimeError(f"shadow schema {name} is another run's")
    raise AssertionError("unreachable")


async def drop_abandoned(conn: psycopg.AsyncConnection[Any]) -> list[str]:
    """Drop every shadow whose run ended without dropping it (its lock held by no session) and
    return their names, each logged as a warning; ``conn`` is autocommit."""
    cur = await conn.execute("SELECT nspname FROM pg_namespace ORDER BY nspname")
    dropped: list[str] = []
    for (name,) in await cur.fetchall():
        if not SHADOW.fullmatch(str(name)):
            continue
        held = await conn.execute(TRY_HOLD, (name,))
        if not (await held.fetchone() or (False,))[0]:
            continue  # its run goes on
        try:
            await conn.execute(f'DROP SCHEMA IF EXISTS "{name}" CASCADE')
        finally:
            await conn.execute(RELEASE, (name,))
        log.warning("dropped shadow schema %s, left by a verify or rebuild that ended without dropping it", name)
        dropped.append(str(name))
    return dropped


@contextlib.asynccontextmanager
async def held_shadow(conninfo: str, kind: str) -> AsyncIterator[str]:
    """This run's shadow (:func:`claim_shadow`), its lock held until the block ends, after the
    shadows abandoned by earlier runs are dropped (:func:`drop_abandoned`). The caller drops its
    shadow; a run killed before it does leaves it to the next run."""
    async with await psycopg.AsyncConnection.connect(conninfo, autocommit=True) as conn:
        # idle for the whole run: a server's (role's, database's) idle_session_timeout would end
        # it, and the lock with it, and the next run would drop the shadow of a run going on
        await conn.execute("SET idle_session_timeout = 0")
        await drop_abandoned(conn)
        yield await claim_shadow(conn, kind)
