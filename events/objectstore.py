"""JetStream Object Store as the content-addressed blob store of the local stack."""

from __future__ import annotations

import contextlib

from nats.js import JetStreamContext
from nats.js.api import ObjectStoreConfig, StorageType
from nats.js.errors import BucketNotFoundError, NotFoundError, ObjectDeletedError, ObjectNotFoundError
from nats.js.object_store import ObjectStore

from events.blobs import SHA256_HEX, BlobNotFound, BlobRef, no_object, sha256_hex


class JetStreamBlobStore:
    """Blobs keyed by their SHA-256 in one Object Store bucket; ``put`` skips existing keys."""

    kind = "jetstream-object"

    def __init__(self, js: JetStreamContext, bucket: str = "chronicle-blobs", *, replicas: int = 1) -> None:
        self._js = js
        self._bucket = bucket
        self._replicas = replicas  # when the bucket is created (an existing one keeps its count)
        self._store: ObjectStore | None = None

    async def _made(self) -> ObjectStore | None:
        """The bucket, or None when it was never made: a read creates nothing (a tool pointed at
        the wrong server leaves it as it was)."""
        if self._store is None:
            with contextlib.suppress(BucketNotFoundError, NotFoundError):
                self._store = await self._js.object_store(self._bucket)
        return self._store

    async def _for_writing(self) -> ObjectStore:
        """The bucket, made on the first write."""
        store = await self._made()
        if store is None:
            store = self._store = await self._js.create_object_store(
                self._bucket, config=ObjectStoreConfig(storage=StorageType.FILE, replicas=self._replicas)
            )
        return store

    async def put(self, data: bytes) -> BlobRef:
        digest = sha256_hex(data)
        store = await self._for_writing()
        ref = BlobRef(store=self.kind, key=digest, sha256=digest, size=len(data))
        try:
            info = await store.get_info(digest)
            if info.size == len(data):
                return ref
        except (ObjectNotFoundError, NotFoundError):
            pass
        await store.put(digest, data)
        return ref

    async def delete(self, ref: BlobRef) -> None:
        """Remove the object (its chunks are purged from the bucket's stream)."""
        if not SHA256_HEX.fullmatch(ref.key):
            return
        store = await self._made()
        if store is None:
            return
        with contextlib.suppress(ObjectNotFoundError, NotFoundError):
            await store.delete(ref.key)

    async def has(self, ref: BlobRef) -> bool:
        """Whether the bucket holds ``ref``'s object (its key, of its size): the object's info
        only, no bytes read. A bucket never made holds nothing."""
        if not SHA256_HEX.fullmatch(ref.key):
            return False
        store = await self._made()
        if store is None:
            return False
        try:
            info = await store.get_info(ref.key)
        except (ObjectNotFoundError, ObjectDeletedError, NotFoundError):
            return False
        return info.size == ref.size

    async def get(self, ref: BlobRef) -> bytes:
        """The object's bytes; :class:`BlobNotFound` when the store answers that there is no such
        object (or none can be: every key is a SHA-256 hex digest, so a reference naming anything
        else is never sent to the server) or its bytes do not hash to ``ref.sha256``. A store
        that cannot answer raises NATS's own errors (connection, timeout)."""
        if not SHA256_HEX.fullmatch(ref.key):
            raise BlobNotFound(f"no object {ref.key[:80]!r}: not a SHA-256 key")
        store = await self._made()
        if store is None:
            raise BlobNotFound(no_object(ref.key))
        try:
            result = await store.get(ref.key)
        except (ObjectNotFoundError, NotFoundError) as exc:
            raise BlobNotFound(no_object(ref.key)) from exc
        data = result.data or b""
        if sha256_hex(data) != ref.sha256:
            raise BlobNotFound(f"object {ref.key!r}: its bytes do not hash to the reference's sha256")
        return data
