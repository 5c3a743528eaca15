"""Rebuild read models from the log into a schema of their own, and compare two schemas.

``rebuild_into`` replays the stream from sequence 1 through the same projection code the live
projector runs, so a rebuild equals the live read model whenever projections are deterministic.
``checksums`` gives one digest per table, ordered by primary key, for row-by-row comparison.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import psycopg
from nats.js import JetStreamContext

from events import log as eventlog
from events.envelope import Event
from events.registry import decode
from events.subjects import SubjectLayout
from projections.migrate import migrate
from projections.runner import Projection, apply_batch

TABLES: dict[str, str] = {
    "sessions": "tenant, id",
    "messages": "tenant, session_id, id",
}


async def rebuild_into(
    js: JetStreamContext,
    layout: SubjectLayout,
    conninfo: str,
    schema: str,
    projections: Sequence[Projection],
    checkpoint: str,
    *,
    to_seq: int | None = None,
    batch_size: int = 2000,
    progress: Callable[[int, int], None] | None = None,
) -> int:
    """Replay the stream (up to ``to_seq``) into ``schema`` (created and migrated first).

    Returns the last sequence applied. ``progress(applied_seq, end_seq)`` is called per batch.
    """
    await migrate(conninfo, schema)
    end = await eventlog.last_seq(js, layout)
    if to_seq is not None:
        end = min(end, to_seq)
    last = 0
    async with await psycopg.AsyncConnection.connect(conninfo) as conn:
        await conn.execute(f'SET search_path TO "{schema}"')
        await conn.commit()
        batch: list[tuple[int, Event]] = []

        async def flush() -> None:
            async with conn.transaction():
                await apply_batch(conn, checkpoint, projections, batch, notify=False)
            if progress is not None:
                progress(batch[-1][0], end)
            batch.clear()

        if end > 0:
            async for stored in eventlog.read(js, layout, None, 1, end):
                batch.append((stored.seq, decode(stored.data)))
                last = stored.seq
                if len(batch) >= batch_size:
                    await flush()
            if batch:
                await flush()
    return last


async def checksums(conn: psycopg.AsyncConnection[Any], schema: str) -> dict[str, tuple[int, str]]:
    """``{table: (row count, md5 of all rows in key order)}`` for the read-model tables."""
    out: dict[str, tuple[int, str]] = {}
    for table, key in TABLES.items():
        cur = await conn.execute(
            f'SELECT count(*), coalesce(md5(string_agg(t::text, E\'\\n\' ORDER BY {key})), \'\') '
            f'FROM "{schema}"."{table}" t'
        )
        row = await cur.fetchone()
        assert row is not None
        out[table] = (int(row[0]), str(row[1]))
    return out


async def first_differences(
    conn: psycopg.AsyncConnection[Any], live: str, shadow: str, table: str, limit: int = 5
) -> list[str]:
    """Up to ``limit`` rows present on one side only, as text, prefixed with the side."""
    key = TABLES[table]
    cur = await conn.execute(
        f'(SELECT \'live\', t::text FROM (SELECT * FROM "{live}"."{table}" EXCEPT '
        f'SELECT * FROM "{shadow}"."{table}") t ORDER BY {key} LIMIT %s) UNION ALL '
        f'(SELECT \'rebuilt\', t::text FROM (SELECT * FROM "{shadow}"."{table}" EXCEPT '
        f'SELECT * FROM "{live}"."{table}") t ORDER BY {key} LIMIT %s)',
        (limit, limit),
    )
    return [f"{side}: {text}" for side, text in await cur.fetchall()]
