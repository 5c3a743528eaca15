"""Content-addressed blobs in S3/MinIO (originals of capped messages): key = SHA-256 of the bytes."""

from __future__ import annotations

from events.blobs import BlobNotFound, BlobRef, sha256_hex
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
        bucket, _, key = ref.key.partition("/")
        data = await self._store.get_bytes(bucket, key)
        if data is None or sha256_hex(data) != ref.sha256:
            raise BlobNotFound(ref.key)
        return data
