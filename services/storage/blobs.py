"""Content-addressed blobs in S3/MinIO (originals of capped messages): key = SHA-256 of the bytes."""

from __future__ import annotations

from events.blobs import SHA256_HEX, BlobNotFound, BlobRef, sha256_hex
from services.storage.s3 import SkillStore


class S3BlobStore:
    kind = "s3"

    def __init__(self, store: SkillStore, bucket: str) -> None:
        self._store = store
        self._bucket = bucket

    async def put(self, data: bytes) -> BlobRef:
        digest = sha256_hex(data)
        await self._store.put_bytes(self._bucket, f"blobs/{digest}", data)
        return BlobRef(store=self.kind, key=f"{self._bucket}/blobs/{digest}", sha256=digest, size=len(data))

    async def delete(self, ref: BlobRef) -> None:
        bucket, _, key = ref.key.partition("/")
        await self._store.delete(bucket, key)

    async def get(self, ref: BlobRef) -> bytes:
        """The object's bytes; :class:`BlobNotFound` when there is none, its bytes do not hash to
        ``ref.sha256``, or the reference names a key this store never writes (``<bucket>/blobs/
        <its sha256>``: a reference published straight to the log could name any object the
        credentials reach, a skill document included)."""
        bucket, _, key = ref.key.partition("/")
        if key != f"blobs/{ref.sha256}" or not SHA256_HEX.fullmatch(ref.sha256):
            raise BlobNotFound(f"no object {ref.key[:80]!r}: not a key this store writes")
        data = await self._store.get_bytes(bucket, key)
        if data is None or sha256_hex(data) != ref.sha256:
            raise BlobNotFound(ref.key)
        return data
