"""Partitioned projectors: one worker per partition; idle partitions still let readers through."""

from __future__ import annotations

import asyncio

from services.decisions import OMITTED
from tests.conftest import make_settings, running_stack
from tests.integration.helpers import text_message


async def test_partitioned_projectors_serve_reads_with_min_seq(nats_url: str, fresh_db: str, s3_endpoint: str) -> None:
    settings = make_settings(nats_url, fresh_db, s3_endpoint=s3_endpoint, partitions=4)
    async with running_stack(settings, projector=False) as c:
        stop = asyncio.Event()
        workers = []
        for p in range(4):
            c.settings = settings.model_copy(update={"projector_partitions": [p]})
            workers.append(asyncio.create_task(c.projector().run(stop)))
        try:
            last = 0
            for i in range(3):  # a few sessions: some partitions stay idle
                r = await c.commands.append(
                    "tenant-a", f"part-{i}", text_message("m0", f"partition probe {i}"), OMITTED
                )
                last = max(last, r.seq)
            await c.waiter.wait_all(last, timeout_s=10)  # every partition's checkpoint reaches it
            async with c.pool.connection() as conn:
                cur = await conn.execute(
                    "SELECT count(*) FROM checkpoints WHERE name LIKE %s", (f"{settings.projector_name}.p%",)
                )
                assert await cur.fetchone() == (4,)
                cur = await conn.execute("SELECT count(*) FROM messages WHERE session_id LIKE 'part-%%'")
                assert await cur.fetchone() == (3,)
        finally:
            stop.set()
            for w in workers:
                await asyncio.wait_for(w, 15)
