from __future__ import annotations

from projections import queries
from services.bootstrap import Container
from services.decisions import OMITTED


async def test_append_and_read(stack: Container) -> None:
    c = stack
    r1 = await c.commands.append(
        "tenant-a", "smoke", {"id": "m1", "role": "user", "parts": [{"type": "text", "text": "hello world"}]}, OMITTED
    )
    r2 = await c.commands.append(
        "tenant-a", "smoke", {"id": "m2", "role": "assistant", "parts": [{"type": "text", "text": "hi"}]}, OMITTED
    )
    assert r2.parent_id == "m1"
    await c.waiter.wait_session("tenant-a", "smoke", r2.seq)
    async with c.pool.connection() as conn:
        rows = await queries.history(conn, "tenant-a", "smoke", "m2")
    assert [r.id for r in rows] == ["m1", "m2"]
    assert r1.created
