"""The shadow schemas of ``chronicle verify`` and ``chronicle rebuild`` (``verify_<tag>``,
``rebuild_<tag>``, a rebuild's replaced tables in ``old_<tag>``): each run's own.

A tag is the run's start to the second and six random hex digits, so two runs started in the same
second get different schemas; a run claims its shadow by creating it (refused when one of that
name exists), so what it drops when it fails or is stopped is a schema it made, never another
run's."""

from __future__ import annotations

import secrets
import time

import psycopg

CLAIM_TRIES = 5
"""Tags tried before giving up (each clash is a one in 16 million draw in the same second)."""


def shadow_tag(now: float | None = None, token: str | None = None) -> str:
    """``20261206235959_1a2b3c``: the UTC second of ``now`` (default: now) and ``token`` (default:
    six random hex digits)."""
    stamp = time.strftime("%Y%m%d%H%M%S", time.gmtime(time.time() if now is None else now))
    return f"{stamp}_{token if token is not None else secrets.token_hex(3)}"


async def claim_shadow(conninfo: str, kind: str) -> str:
    """A new empty schema ``<kind>_<tag>`` made by this run (the name is returned): created without
    ``IF NOT EXISTS``, so a name another run holds is never shared; another tag is drawn then."""
    async with await psycopg.AsyncConnection.connect(conninfo, autocommit=True) as conn:
        for _ in range(CLAIM_TRIES - 1):
            name = f"{kind}_{shadow_tag()}"
            try:
                await conn.execute(f'CREATE SCHEMA "{name}"')
            except psycopg.errors.DuplicateSchema:
                continue
            return name
        name = f"{kind}_{shadow_tag()}"
        await conn.execute(f'CREATE SCHEMA "{name}"')  # a last clash is an error, not a shared schema
        return name
