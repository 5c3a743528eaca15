"""A message row stores its body's hash only when it is not the stored body's own (migration
019): an append of an existing id, decided from the read model by a writer that never saw it,
still tells the same message (a replay) from a different one (a conflict), for a plain message
and for an over-cap one whose hash is its original's."""

from __future__ import annotations

import pytest

from events.messages import body_hash
from events.omitted import OMITTED
from services.audit import readers as audit
from services.errors import MessageConflict
from tests.conftest import make_settings, running_stack
from tests.integration.helpers import text_message
from tests.integration.test_micro_compaction import tool_message


async def test_an_existing_id_is_told_apart_by_a_writer_that_never_saw_it(
    nats_url: str, fresh_db: str, s3_endpoint: str
) -> None:
    settings = make_settings(nats_url, fresh_db, s3_endpoint=s3_endpoint, row_cap_bytes=20_000)
    plain = text_message("m1", "a plain message")
    big = tool_message("big", {"path": "/tmp/x", "content": "line of text\n" * 3000})  # over the row cap
    async with running_stack(settings) as c:
        await c.commands.append("tenant-a", "s-1", plain, OMITTED)
        last = await c.commands.append("tenant-a", "s-1", big, OMITTED)
        await c.waiter.wait_all(last.seq, timeout_s=20)
        async with c.pool.connection() as conn:
            cur = await conn.execute("SELECT id, body_sha256 FROM messages WHERE tenant = 'tenant-a' ORDER BY seq")
            stored = dict(await cur.fetchall())
    assert stored == {"m1": None, "big": body_hash(big)}  # the capped row keeps its original's

    async with running_stack(settings) as c:  # a new writer: it decides from the read model
        again = await c.commands.append("tenant-a", "s-1", plain, OMITTED)
        assert again.created is False
        big_again = await c.commands.append("tenant-a", "s-1", big, OMITTED)
        assert big_again.created is False
        with pytest.raises(MessageConflict):
            await c.commands.append("tenant-a", "s-1", text_message("m1", "another text"), OMITTED)
        with pytest.raises(MessageConflict):
            await c.commands.append("tenant-a", "s-1", tool_message("big", {"other": True}), OMITTED)


async def test_verify_takes_a_kept_hash_of_the_body_for_none_and_finds_a_wrong_one(
    nats_url: str, fresh_db: str, s3_endpoint: str
) -> None:
    settings = make_settings(nats_url, fresh_db, s3_endpoint=s3_endpoint, row_cap_bytes=20_000)
    plain = text_message("m1", "a plain message")
    big = tool_message("big", {"path": "/tmp/x", "content": "line of text\n" * 3000})
    async with running_stack(settings) as c:
        await c.commands.append("tenant-a", "s-1", plain, OMITTED)
        last = await c.commands.append("tenant-a", "s-1", big, OMITTED)
        await c.waiter.wait_all(last.seq, timeout_s=20)
        async with c.pool.connection() as conn:  # m1 as a row written before migration 019 keeps it
            await conn.execute("UPDATE messages SET body_sha256 = %s WHERE id = 'm1'", (body_hash(plain),))
        report = await audit.verify(c)
        assert report.ok, report.differences
        async with c.pool.connection() as conn:
            await conn.execute("UPDATE messages SET body_sha256 = %s WHERE id = 'm1'", ("0" * 64,))
        wrong = await audit.verify(c)
        async with c.pool.connection() as conn:  # and an over-cap row that lost its original's hash
            await conn.execute("UPDATE messages SET body_sha256 = %s WHERE id = 'm1'", (body_hash(plain),))
            await conn.execute("UPDATE messages SET body_sha256 = NULL WHERE id = 'big'")
        lost = await audit.verify(c)
    assert not wrong.ok
    assert list(wrong.differences) == ["message hashes"]
    assert wrong.differences["message hashes"] == [f"live:    ('(tenant-a,s-1,m1)', '{'0' * 64}')"]
    assert not lost.ok
    assert lost.differences["message hashes"] == [f"rebuilt: ('(tenant-a,s-1,big)', '{body_hash(big)}')"]
