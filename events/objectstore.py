"""JetStream Object Store as the content-addressed blob store of the local stack.

An object's info is a message on its metadata subject (``$O.<bucket>.M.<name>``), which
nats-py's object store reads as the subject's *last* message. JetStream sends a publish ack to
whatever reply subject its publisher names, as the server, so NATS permissions do not stop a
tenant allowed to publish anything at all from having an ack stored there (docs/security.md,
"Reflected publish acks"): nats-py then fails on every read of that object, and a projector
reading a body under that name retried for ever, every tenant's projections halted. So this
store reads an object's info as the subject's *first* message, never as its last: the writers
of an object's info (``put``, ``delete``) publish it with a subject rollup, which removes every
message before it on the subject, so the first message is the newest info whenever there is one,
and anything else first means there is none. It reads the chunks itself, by the info's ``nuid``
(random, never shown to a tenant). Before it writes or deletes an object through nats-py, it
deletes what is on the subject and is no object's info (the ack's bytes are kept in no other
way: the publish they answered is in the log).
"""

from __future__ import annotations

import base64
import contextlib
import json
import re

from nats.js import JetStreamContext
from nats.js.api import ObjectInfo, ObjectStoreConfig, RawStreamMsg, StorageType
from nats.js.errors import (
    BadObjectMetaError,
    BucketNotFoundError,
    NotFoundError,
    ObjectNotFoundError,
)
from nats.js.object_store import OBJ_CHUNKS_PRE_TEMPLATE, OBJ_META_PRE_TEMPLATE, OBJ_STREAM_TEMPLATE, ObjectStore

from events.blobs import SHA256_HEX, BlobNotFound, BlobRef, no_object, sha256_hex

OBJECT_STORE_RE = re.compile(r"[A-Za-z0-9_-]{1,251}")
"""A bucket name the object store takes, matched whole: the characters nats-py's
``VALID_BUCKET_RE`` allows, at most 251 of them, as its stream ``OBJ_<bucket>`` may have at most
255 (the server's limit) (``CHRONICLE_BLOB_BUCKET``, checked at start)."""

READ_ATTEMPTS = 3
"""How many times a read follows an object put again while it read the chunks (each put of the
same key replaces the chunks of the one before)."""
WRITE_ATTEMPTS = 5
"""How many times a write or delete rids the metadata subject of what is no info and tries again,
when something lands there between the two (one attempt is all it takes unless a tenant is
publishing there at that moment)."""


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

    @property
    def _stream(self) -> str:
        return str(OBJ_STREAM_TEMPLATE.format(bucket=self._bucket))

    def _meta_subject(self, key: str) -> str:
        return str(
            OBJ_META_PRE_TEMPLATE.format(bucket=self._bucket, obj=base64.urlsafe_b64encode(key.encode()).decode())
        )

    async def _first(self, subject: str, after: int = 0) -> tuple[int, bytes] | None:
        """The sequence and bytes of the first message on ``subject`` past sequence ``after``
        (None: none)."""
        try:
            msg: RawStreamMsg = await self._js.get_msg(self._stream, seq=after + 1, subject=subject, next=True)
        except NotFoundError:
            return None
        return int(msg.seq or 0), msg.data or b""

    def _info_in(self, msg: tuple[int, bytes] | None, key: str) -> ObjectInfo | None:
        """``msg`` as ``key``'s info in this bucket; None when it is not one (anything else a
        publisher had stored on the subject)."""
        if msg is None or not msg[1]:
            return None
        try:
            found = json.loads(msg[1])
            info: ObjectInfo | None = ObjectInfo.from_response(found) if isinstance(found, dict) else None
        except (ValueError, TypeError, KeyError, AttributeError):
            return None
        if info is None or info.name != key or info.bucket != self._bucket:
            return None
        if not info.deleted and (not isinstance(info.nuid, str) or not info.nuid or not isinstance(info.size, int)):
            return None
        return info

    async def _info(self, key: str) -> ObjectInfo | None:
        """``key``'s info, None when there is no such object (never put, deleted, or nothing but
        what another publisher stored on its subject): the subject's first message (the module's
        docstring says why)."""
        info = self._info_in(await self._first(self._meta_subject(key)), key)
        return None if info is None or info.deleted else info

    async def _rid_of_foreign(self, key: str) -> None:
        """Delete every message on ``key``'s metadata subject that is not its info."""
        subject, after = self._meta_subject(key), 0
        while (msg := await self._first(subject, after)) is not None:
            after = msg[0]
            if self._info_in(msg, key) is None:
                with contextlib.suppress(NotFoundError):  # deleted meanwhile (by a rollup, another writer)
                    await self._js.delete_msg(self._stream, after)

    async def put(self, data: bytes) -> BlobRef:
        digest = sha256_hex(data)
        store = await self._for_writing()
        ref = BlobRef(store=self.kind, key=digest, sha256=digest, size=len(data))
        info = await self._info(digest)
        if info is not None and info.size == len(data):
            return ref
        for attempt in range(WRITE_ATTEMPTS):
            await self._rid_of_foreign(digest)
            try:
                await store.put(digest, data)
                return ref
            except BadObjectMetaError:  # something landed on the subject meanwhile
                if attempt == WRITE_ATTEMPTS - 1:
                    raise
        raise AssertionError("unreachable")

    async def delete(self, ref: BlobRef) -> None:
        """Remove the object (its chunks are purged from the bucket's stream)."""
        if not SHA256_HEX.fullmatch(ref.key):
            return
        store = await self._made()
        if store is None:
            return
        for attempt in range(WRITE_ATTEMPTS):
            await self._rid_of_foreign(ref.key)
            try:
                with contextlib.suppress(ObjectNotFoundError, NotFoundError):
                    await store.delete(ref.key)
                return
            except BadObjectMetaError:
                if attempt == WRITE_ATTEMPTS - 1:
                    raise

    async def has(self, ref: BlobRef) -> bool:
        """Whether the bucket holds ``ref``'s object (its key, of its size): the object's info
        only, no bytes read. A bucket never made holds nothing."""
        if not SHA256_HEX.fullmatch(ref.key):
            return False
        if await self._made() is None:
            return False
        info = await self._info(ref.key)
        return info is not None and info.size == ref.size

    async def get(self, ref: BlobRef) -> bytes:
        """The object's bytes; :class:`BlobNotFound` when the store answers that there is no such
        object (or none can be: every key is a SHA-256 hex digest, so a reference naming anything
        else is never sent to the server) or its bytes do not hash to ``ref.sha256``. A store
        that cannot answer raises NATS's own errors (connection, timeout)."""
        if not SHA256_HEX.fullmatch(ref.key):
            raise BlobNotFound(f"no object {ref.key[:80]!r}: not a SHA-256 key")
        if await self._made() is None:
            raise BlobNotFound(no_object(ref.key))
        info = await self._info(ref.key)
        for _ in range(READ_ATTEMPTS):
            if info is None:
                raise BlobNotFound(no_object(ref.key))
            data = await self._chunks(info)
            if len(data) == info.size:
                break
            # Short: its chunks were purged while read. A put of the same key meanwhile (another
            # writer, the same bytes under a new nuid) purges the old ones once its info is
            # published: read that one. The same info again (a delete, or chunks lost): what it
            # holds is all there is, and the hash decides.
            again = await self._info(ref.key)
            if again is None or again.nuid == info.nuid:
                break
            info = again
        if sha256_hex(data) != ref.sha256:
            raise BlobNotFound(f"object {ref.key!r}: its bytes do not hash to the reference's sha256")
        return data

    async def _chunks(self, info: ObjectInfo) -> bytes:
        """The object's bytes: its chunks, in order, on the subject of its ``nuid``."""
        subject = str(OBJ_CHUNKS_PRE_TEMPLATE.format(bucket=self._bucket, obj=info.nuid))
        parts: list[bytes] = []
        size, after, total = 0, 0, int(info.size or 0)
        while size < total and (msg := await self._first(subject, after)) is not None:
            after, data = msg
            parts.append(data)
            size += len(data)
        return b"".join(parts)
