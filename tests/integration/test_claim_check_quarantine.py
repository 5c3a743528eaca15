"""Claim checks that can never resolve are quarantined; a store that cannot answer is retried.

Only Chronicle's operator writes the object store, so a tenant that publishes straight to
JetStream can reference an object that does not exist, or bytes that are not the ones it names,
or not a JSON object, or another session's object (another tenant's included). Each is
quarantined as ``body_unavailable`` while tenant A is served (one projector and partition
workers), and rebuild/verify decide the same.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Callable
from typing import Any

import nats.errors
import psycopg
import pytest

from events.blobs import BlobRef, BlobStore, MemoryBlobStore, sha256_hex
from events.catalog import MessageAppended, MessageUpdated
from events.messages import JsonObject, body_hash, stored_json
from events.objects import owned
from events.omitted import OMITTED
from events.sealing import StaticKeys, new_data_key
from projections.context import ContextProjection
from projections.history import HistoryProjection
from projections.overlays import OverlayProjection
from projections.quarantine import Quarantined
from projections.rebuild import quarantine_rows, rebuild_into
from projections.runner import ProjectorRunner, apply_batch, prepare
from services.audit import quarantine as ops
from services.audit import readers as audit
from services.bootstrap import Container
from services.storage.blobs import CLAIM_CHECK_S3
from tests.conftest import make_settings, running_stack
from tests.integration.helpers import appended, sealed_claim_check, text_message
from tests.integration.test_quarantine import projectors, quarantined


def referencing(tenant: str, session: str, mid: str, ref: BlobRef, *, update: bool = False) -> bytes:
    """A body event of ``tenant`` whose body is the claim check ``ref`` (published raw)."""
    fields: dict[str, Any] = {
        "tenant": tenant,
        "session": session,
        "message_id": mid,
        "role": "user",
        "body_sha256": ref.sha256,
        "message_ref": ref,
    }
    event = MessageUpdated(**fields) if update else MessageAppended(parent_id=None, **fields)
    return event.to_json()


async def claim_checked(c: Container, tenant: str, session: str, body: JsonObject) -> MessageAppended:
    """A root message whose body Chronicle stored by claim check, as the API would."""
    ref = await c.blobs.put(stored_json(body).encode())
    return MessageAppended(
        tenant=tenant,
        session=session,
        message_id=str(body["id"]),
        parent_id=None,
        role="user",
        body_sha256=body_hash(body),
        message_ref=ref,
    )


def ref_of(data: bytes, *, key: str | None = None, sha256: str | None = None) -> BlobRef:
    digest = sha256_hex(data)
    return BlobRef(store="jetstream-object", key=key or digest, sha256=sha256 or digest, size=len(data))


def s3_ref(data: bytes, bucket: str) -> BlobRef:
    digest = sha256_hex(data)
    return BlobRef(store=CLAIM_CHECK_S3, key=f"{bucket}/blobs/{digest}", sha256=digest, size=len(data))


async def bad_references(c: Container) -> list[tuple[bytes, str]]:
    """(event bytes on tenant B's session b-1, what the detail says) of every unresolvable claim check."""
    stored_object = stored_json({"id": "x", "role": "user", "parts": []}).encode()
    await c.blobs.put(stored_object)
    a_list = b'["not", "an", "object"]'
    await c.blobs.put(a_list)
    not_json = b"\xff\xfe definitely not json"
    await c.blobs.put(not_json)
    never_stored = f"never stored {uuid.uuid4()}".encode()
    body = stored_json({"id": "m6", "role": "user", "parts": [{"type": "text", "text": "tenant A's words"}]}).encode()
    a_s = owned(body, "tenant-a", "a-1")  # as the API stores tenant A's claim-checked body
    await c.blobs.put(a_s)
    b_2s = owned(body, "tenant-b", "b-2")  # tenant B's own, of another session
    await c.blobs.put(b_2s)
    return [
        (referencing("tenant-b", "b-1", "m1", ref_of(never_stored)), "no object"),
        (referencing("tenant-b", "b-1", "m2", ref_of(stored_object, sha256=sha256_hex(b"other"))), "do not hash"),
        (referencing("tenant-b", "b-1", "m3", ref_of(a_list)), "not an object"),
        (referencing("tenant-b", "b-1", "m4", ref_of(not_json)), "not JSON"),
        (referencing("tenant-b", "b-1", "m5", ref_of(never_stored, key="../../" + "x" * 5000)), "not a SHA-256 key"),
        (referencing("tenant-b", "b-1", "m1", ref_of(never_stored), update=True), "no object"),
        (referencing("tenant-b", "b-1", "m6", ref_of(a_s)), "no object"),  # as if none: nothing learnt
        (referencing("tenant-b", "b-1", "m7", ref_of(b_2s)), "no object"),
        # S3 claim checks: a bucket S3 refuses to name, another of Chronicle's buckets; neither is asked
        (referencing("tenant-b", "b-1", "m8", s3_ref(never_stored, "x")), "not a key this store writes"),
        (referencing("tenant-b", "b-1", "m9", s3_ref(never_stored, c.settings.originals_bucket)), "not a key"),
    ]


@pytest.mark.parametrize("shares", [[None], [[0], [1]]], ids=["one-projector", "partition-workers"])
async def test_unresolvable_claim_checks_are_quarantined_while_tenant_a_is_served(
    nats_url: str, fresh_db: str, s3_endpoint: str, shares: list[list[int] | None]
) -> None:
    settings = make_settings(nats_url, fresh_db, s3_endpoint=s3_endpoint, partitions=2, payload_limit_bytes=1024)
    async with running_stack(settings, projector=False) as c, projectors(c, settings, shares):
        subject = c.layout.session_subject("tenant-b", "b-1")
        expected: list[tuple[int, str]] = []
        details: list[str] = []
        for i, (data, detail) in enumerate(await bad_references(c)):
            text = f"before bad reference {i} " + "x" * 2000 * (i % 2)  # every other one claim-checked
            await c.commands.append("tenant-a", "a-1", text_message(f"m{i}", text), OMITTED)
            ack = await c.js.publish(subject, data, stream=settings.stream)
            expected.append((ack.seq, "body_unavailable"))
            details.append(detail)
        # tenant B's own good claim check after its bad ones is applied
        good = await claim_checked(c, "tenant-b", "b-1", text_message("good", "y" * 3000))
        await c.js.publish(subject, good.to_json(), stream=settings.stream)
        last = await c.commands.append("tenant-a", "a-1", text_message("last", "after them all"), OMITTED)
        assert last.parent_id == f"m{len(expected) - 1}"
        await c.waiter.wait_all(last.seq, timeout_s=20)

        assert await quarantined(fresh_db) == expected  # each exactly once
        async with c.pool.connection() as conn:
            cur = await conn.execute("SELECT tenant, session_id, id FROM messages ORDER BY seq")
            rows = await cur.fetchall()
            shown = [await ops.show(conn, c.layout, seq) for seq, _ in expected]
        assert rows == [("tenant-a", "a-1", f"m{i}") for i in range(len(expected))] + [
            ("tenant-b", "b-1", "good"),
            ("tenant-a", "a-1", "last"),
        ]
        for item, detail in zip(shown, details, strict=True):
            assert item is not None
            assert detail in item["detail"], item
            assert item["reason"] == "body_unavailable"
        # the same references decide the same on a rebuild, and verify is exact
        await rebuild_into(c.js, c.layout, fresh_db, "shadow", c.projections(), settings.projector_name, keys=c.keys)
        async with await psycopg.AsyncConnection.connect(fresh_db) as conn:
            assert await quarantine_rows(conn, "shadow") == await quarantine_rows(conn, "public")
        report = await audit.verify(c)
        assert report.ok, report.differences
        assert report.live["quarantine"][0] == len(expected)
        # time travel skips them as the projector does
        state = await audit.session_as_of(c, "tenant-b", "b-1", last.seq)
        assert list(state.rows) == ["good"]


class Unreachable:
    """A blob store that times out ``failures`` times, then answers (NATS down for a while)."""

    kind = "jetstream-object"

    def __init__(self, store: BlobStore, failures: int) -> None:
        self._store = store
        self.failures = failures
        self.calls = 0

    async def put(self, data: bytes) -> BlobRef:
        return await self._store.put(data)

    async def get(self, ref: BlobRef) -> bytes:
        self.calls += 1
        if self.calls <= self.failures:
            raise nats.errors.TimeoutError
        return await self._store.get(ref)

    async def delete(self, ref: BlobRef) -> None:
        await self._store.delete(ref)


async def test_a_store_that_cannot_answer_is_retried_never_quarantined(nats_url: str, fresh_db: str) -> None:
    settings = make_settings(nats_url, fresh_db)
    async with running_stack(settings, projector=False) as c:
        body: JsonObject = text_message("big", "z" * 3000)
        seq = (await c.publisher.publish(await claim_checked(c, "tenant-a", "t-1", body))).seq
        store = Unreachable(c.blobs, failures=3)
        runner = ProjectorRunner(
            js=c.js,
            pool=c.pool,
            conninfo=fresh_db,
            layout=c.layout,
            projections=[HistoryProjection(store, c.keys), ContextProjection(), OverlayProjection()],
            name=settings.projector_name,
            keys=c.keys,
            retry_base_s=0.05,
            retry_cap_s=0.1,
        )
        stop = asyncio.Event()
        task = asyncio.create_task(runner.run(stop))
        try:
            await c.waiter.wait_session("tenant-a", "t-1", seq, timeout_s=20)
        finally:
            stop.set()
            await asyncio.wait_for(task, 15)
        assert store.calls > store.failures
        assert await quarantined(fresh_db) == []
        async with c.pool.connection() as conn:
            cur = await conn.execute("SELECT content FROM messages WHERE session_id = 't-1'")
            assert [json.loads(r[0]) for r in await cur.fetchall()] == [body]


async def test_a_body_whose_key_was_destroyed_since_its_event_was_admitted_is_a_tombstone(
    stack: Container, new_id: Callable[[str], str]
) -> None:
    """A sealed claim-checked body of a session erased after its event was admitted (the process
    learned the erasure meanwhile: its ``session.erased`` screened after the batch was read, or a
    write refused): opening it meets the destroyed key. Planning leaves the projection to the
    transaction, where that event is a tombstone (applied by no projection, not quarantined, the
    checkpoint past it) and the rest of the batch is applied: the batch does not fail."""
    kept, gone = new_id("kept"), new_id("gone")
    keys, blobs = StaticKeys(), MemoryBlobStore()
    key = new_data_key("k-1")
    keys.put("tenant-a", gone, key)
    body = text_message("big", "the erased session's words")
    event = await sealed_claim_check(blobs, key, "tenant-a", gone, "big", body)
    items = [(60_000_001, appended("tenant-a", kept, "m1", None)), (60_000_002, event)]
    items.append((60_000_003, appended("tenant-a", kept, "m2", "m1")))
    projections = [HistoryProjection(blobs, keys)]
    assert (await prepare(projections, items))[HistoryProjection.name][1]  # the key is there: planned
    keys.erase("tenant-a", gone)
    prepared = await prepare(projections, items)
    assert prepared == {}  # left to the transaction
    name = "destroyed-key-" + gone
    recorded: list[Quarantined] = []
    async with stack.pool.connection() as conn:
        async with conn.transaction():
            applied = await apply_batch(
                conn, name, projections, items, notify=False, prepared=prepared, quarantined=recorded
            )
        cur = await conn.execute(
            "SELECT session_id, id FROM messages WHERE tenant = 'tenant-a' AND session_id = ANY(%s) ORDER BY id",
            ([kept, gone],),
        )
        rows = await cur.fetchall()
        cur = await conn.execute("SELECT seq FROM checkpoints WHERE name = %s", (name,))
        checkpoint = await cur.fetchone()
        cur = await conn.execute("SELECT count(*) FROM sessions WHERE tenant = 'tenant-a' AND id = %s", (gone,))
        sessions = await cur.fetchone()
    assert (applied, recorded) == (2, [])
    assert rows == [(kept, "m1"), (kept, "m2")]
    assert sessions == (0,)
    assert checkpoint == (60_000_003,)
