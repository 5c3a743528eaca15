"""Oversized bodies travel by claim check: the event carries a reference, reads return the body."""

from __future__ import annotations

import base64
import json
from collections.abc import AsyncIterator, Callable

import pytest

from events import log as eventlog
from events.blobs import BlobNotFound, BlobRef
from events.omitted import OMITTED
from projections import queries
from services.audit import readers as audit
from services.bootstrap import Container
from services.errors import PayloadTooLarge
from services.storage.blobs import CLAIM_CHECK_S3
from tests.conftest import make_settings, running_stack


@pytest.fixture(scope="module")
async def small_limit_stack(nats_url: str, db_url: str) -> AsyncIterator[Container]:
    settings = make_settings(nats_url, db_url, payload_limit_bytes=1024, max_message_bytes=64 * 1024)
    async with running_stack(settings) as c:
        yield c


async def test_large_body_goes_to_object_storage_and_reads_whole(
    small_limit_stack: Container, new_id: Callable[[str], str]
) -> None:
    c = small_limit_stack
    sid = new_id("big")
    text = "lorem ipsum dolor sit amet " * 400  # ~10 KB
    body = {"id": "big1", "role": "user", "parts": [{"type": "text", "text": text}], "extra": {"kept": True}}
    result = await c.commands.append("tenant-a", sid, body, OMITTED)
    again = await c.commands.append("tenant-a", sid, body, OMITTED)
    assert (again.created, again.seq) == (False, result.seq)
    stored = [e async for e in eventlog.read(c.js, c.layout, c.layout.session_subject("tenant-a", sid))]
    assert len(stored) == 1
    raw = json.loads(stored[0].data)
    assert raw.get("message") is None  # (sealed: inside the seal, as null)
    assert raw["message_ref"]["size"] > 1024
    assert len(stored[0].data) < 1024
    await c.waiter.wait_session("tenant-a", sid, result.seq)
    async with c.pool.connection() as conn:
        row = await queries.get_message(conn, "tenant-a", sid, "big1")
        hits = await queries.search(conn, "tenant-a", sid, "lorem dolor", 5)
    assert row is not None
    assert json.loads(row.content) == body
    assert [h.id for h in hits] == ["big1"]


async def test_body_over_the_hard_limit_is_refused(small_limit_stack: Container, new_id: Callable[[str], str]) -> None:
    c = small_limit_stack
    sid = new_id("huge")
    body = {"id": "h", "role": "user", "parts": [{"type": "text", "text": "x" * 70_000}]}
    with pytest.raises(PayloadTooLarge):
        await c.commands.append("tenant-a", sid, body, OMITTED)
    assert await c.publisher.last_subject_seq("tenant-a", sid) == 0


async def test_claim_checks_in_s3_read_back_with_those_written_before_to_nats_and_go_with_erasure(
    nats_url: str, fresh_db: str, s3_endpoint: str
) -> None:
    """``CHRONICLE_CLAIM_CHECK_STORE=s3``: new bodies go to S3/MinIO; one a deployment wrote to the
    JetStream object store before the switch still reads; a rebuild decides the same; erasing the
    session deletes its S3 object."""
    common = {"s3_endpoint": s3_endpoint, "payload_limit_bytes": 1024}
    before = {"id": "m1", "role": "user", "parts": [{"type": "text", "text": "before the switch " * 200}]}
    after = {"id": "m2", "role": "user", "parts": [{"type": "text", "text": "after the switch " * 200}]}
    async with running_stack(make_settings(nats_url, fresh_db, **common)) as c:
        settings = c.settings
        first = await c.commands.append("tenant-a", "s-1", before, OMITTED)
        await c.waiter.wait_all(first.seq, timeout_s=20)
    s3 = settings.model_copy(update={"claim_check_store": "s3"})
    async with running_stack(s3) as c:
        second = await c.commands.append("tenant-a", "s-1", after, OMITTED)
        await c.waiter.wait_all(second.seq, timeout_s=20)
        stored = [e async for e in eventlog.read(c.js, c.layout, c.layout.session_subject("tenant-a", "s-1"))]
        refs = [BlobRef.model_validate(json.loads(e.data)["message_ref"]) for e in stored]
        assert [r.store for r in refs] == ["jetstream-object", CLAIM_CHECK_S3]
        assert refs[1].key == f"{s3.claim_check_bucket}/blobs/{refs[1].sha256}"
        async with c.pool.connection() as conn:
            rows = [await queries.get_message(conn, "tenant-a", "s-1", mid) for mid in ("m1", "m2")]
        assert [json.loads(r.content) if r is not None else None for r in rows] == [before, after]
        report = await audit.verify(c)
        assert report.ok, report.differences

        erased = await c.eraser.erase_session("tenant-a", "s-1")
        assert erased.objects_deleted == 2  # one in each store
        for ref in refs:
            with pytest.raises(BlobNotFound):
                await c.blobs.get(ref)


async def test_reading_a_bucket_never_made_creates_nothing(nats_url: str) -> None:
    from nats.js.errors import BucketNotFoundError, NotFoundError

    from events.blobs import sha256_hex
    from events.objectstore import JetStreamBlobStore
    from tests.conftest import operator_nats

    nc = await operator_nats(nats_url)
    try:
        js = nc.jetstream()
        bucket = "never-made-" + sha256_hex(b"x")[:8]
        store = JetStreamBlobStore(js, bucket)
        ref = BlobRef(store=store.kind, key=sha256_hex(b"body"), sha256=sha256_hex(b"body"), size=4)
        with pytest.raises(BlobNotFound):
            await store.get(ref)
        await store.delete(ref)  # nothing to delete: nothing made
        with pytest.raises((BucketNotFoundError, NotFoundError)):
            await js.object_store(bucket)
        assert await store.get(await store.put(b"body")) == b"body"  # a write makes it
        await js.delete_object_store(bucket)
    finally:
        await nc.close()


async def test_what_another_publisher_stores_on_an_objects_info_subject_is_no_object_and_breaks_none(
    nats_url: str,
) -> None:
    """A reflected publish ack (docs/security.md) can land on any object's info subject, before or
    after the object is put: reads take the subject's first message, never the last, so an object
    put reads whole and one never put reads as absent (not an error retried for ever); a put or a
    delete rids the subject of what is no info first. Chunks of several messages read back whole."""
    from nats.js.object_store import OBJ_META_PRE_TEMPLATE

    from events.blobs import sha256_hex
    from events.objectstore import JetStreamBlobStore
    from tests.conftest import operator_nats

    ack = b'{"stream": "CHRONICLE", "seq": 7}'
    nc = await operator_nats(nats_url)
    try:
        js = nc.jetstream()
        bucket = "foreign-info-" + sha256_hex(b"y")[:8]
        store = JetStreamBlobStore(js, bucket)

        def info_subject(data: bytes) -> str:
            return OBJ_META_PRE_TEMPLATE.format(
                bucket=bucket, obj=base64.urlsafe_b64encode(sha256_hex(data).encode()).decode()
            )

        big = b"".join(i.to_bytes(4, "big") for i in range(100_000))  # four 128 KiB chunks
        put = await store.put(big)
        await js.publish(info_subject(big), ack)  # after the put
        assert await store.has(put)
        assert await store.get(put) == big
        assert await store.put(big) == put  # already there

        later = b"an object not put yet"
        ref = BlobRef(store=store.kind, key=sha256_hex(later), sha256=sha256_hex(later), size=len(later))
        await js.publish(info_subject(later), ack)  # before the put
        assert not await store.has(ref)
        with pytest.raises(BlobNotFound):
            await store.get(ref)
        assert await store.put(later) == ref
        await js.publish(info_subject(later), ack)
        assert await store.get(ref) == later

        await js.publish(info_subject(big), ack)
        await store.delete(put)
        assert not await store.has(put)
        with pytest.raises(BlobNotFound):
            await store.get(put)
        await js.delete_object_store(bucket)
    finally:
        await nc.close()


async def test_an_object_put_again_while_its_chunks_are_read_reads_whole(nats_url: str) -> None:
    """(A put of the same key by another writer, between a read's info and its chunks, purged the
    chunks being read: the short read failed the hash, and the projector quarantined a valid
    message for good.) The read follows the object's new info."""
    from nats.js.api import ObjectInfo

    from events.blobs import sha256_hex
    from events.objectstore import JetStreamBlobStore
    from tests.conftest import operator_nats

    nc = await operator_nats(nats_url)
    try:
        js = nc.jetstream()
        bucket = "put-again-" + sha256_hex(b"z")[:8]
        store = JetStreamBlobStore(js, bucket)
        data = b"".join(i.to_bytes(4, "big") for i in range(50_000))  # two chunks
        ref = await store.put(data)
        read = store._chunks
        replaced: list[str] = []

        async def after_another_put(info: ObjectInfo) -> bytes:
            if not replaced:  # the other writer's put lands now: new chunks, the old ones purged
                replaced.append(str((await (await js.object_store(bucket)).put(ref.key, data)).nuid))
            return await read(info)

        store._chunks = after_another_put  # type: ignore[method-assign]
        assert await store.get(ref) == data
        assert len(replaced) == 1
        await js.delete_object_store(bucket)
    finally:
        await nc.close()
