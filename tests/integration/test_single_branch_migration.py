"""Migration 015 on a database that already holds sessions: ``sessions.single_branch`` is computed
from their rows (one chain in append order, or not)."""

from __future__ import annotations

import psycopg

from projections.migrate import migrate
from tests.support import migrate_before

SESSIONS: dict[str, list[tuple[str, str | None]]] = {
    "chain": [("a", None), ("b", "a"), ("c", "b")],
    "branched": [("a", None), ("b", "a"), ("c", "a")],
    "rootless": [("b", "a"), ("c", "b")],  # the root was deleted
    "empty": [],
}


async def test_existing_sessions_get_their_shape(fresh_db: str) -> None:
    async with await psycopg.AsyncConnection.connect(fresh_db, autocommit=True) as conn:
        await migrate_before(conn, 15)
        seq = 0
        for sid, rows in SESSIONS.items():
            seq += 1
            await conn.execute(
                "INSERT INTO sessions (tenant, id, created_at, updated_at, created_seq, last_seq) "
                "VALUES ('t', %s, now(), now(), %s, %s)",
                (sid, seq, seq),
            )
            for mid, parent in rows:
                seq += 1
                await conn.execute(
                    "INSERT INTO messages (tenant, session_id, id, parent_id, role, content, body_sha256, "
                    "text_content, created_at, seq, updated_seq) VALUES ('t', %s, %s, %s, 'user', '{}', 'x', '', "
                    "now(), %s, %s)",
                    (sid, mid, parent, seq, seq),
                )

    assert "015_single_branch.sql" in await migrate(fresh_db)

    async with await psycopg.AsyncConnection.connect(fresh_db, autocommit=True) as conn:
        cur = await conn.execute("SELECT id, single_branch FROM sessions WHERE tenant = 't'")
        assert dict(await cur.fetchall()) == {"chain": True, "branched": False, "rootless": False, "empty": True}
