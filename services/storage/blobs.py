"""Content-addressed blobs in S3/MinIO (originals of capped messages; claim-checked bodies when
``CHRONICLE_CLAIM_CHECK_STORE=s3``): key = SHA-256 of the bytes."""

from __future__ import annotations

from events.blobs import SHA256_HEX, BlobNotFound, BlobRef, no_object, sha256_hex
from services.storage.s3 import SkillStore

CLAIM_CHECK_S3 = "s3-claim-check"
"""The store claim-checked bodies in S3 name in their references (``CHRONICLE_CLAIM_CHECK_STORE=s3``)."""


class S3BlobStore:
    """One bucket's ``blobs/`` objects; ``kind`` is what its references name as their store (the
    originals' ``s3``, claim-checked bodies' ``s3-claim-check``). A reference is read only from
    this store's own bucket: one published straight to the log may name anything, and a bucket
    the credentials cannot read, or a name S3 refuses, would be an error every retry meets again
    (a projector stuck on it for every tenant). So the bucket settings are kept once objects
    exist (docs/architecture.md)."""

    def __init__(self, store: SkillStore, bucket: str, kind: str = "s3") -> None:
        self._store = store
        self._bucket = bucket
        self.kind = kind

    async def put(self, data: bytes) -> BlobRef:
        digest = sha256_hex(data)
        await self._store.put_bytes(self._bucket, f"blobs/{digest}", data)
        return BlobRef(store=self.kind, key=f"{self._bucket}/blobs/{digest}", sha256=digest, size=len(data))

    async def delete(self, ref: BlobRef) -> None:
        await self._store.delete(self._bucket, self._key_of(ref))

    async def get(self, ref: BlobRef) -> bytes:
        """The object's bytes; :class:`BlobNotFound` when there is none, its bytes do not hash to
        ``ref.sha256``, or the reference names another key than this store writes for it
        (``<its bucket>/blobs/<the sha256>``)."""
        data = await self._store.get_bytes(self._bucket, self._key_of(ref))
        if data is None or sha256_hex(data) != ref.sha256:
            raise BlobNotFound(no_object(ref.key))
        return data

    def _key_of(self, ref: BlobRef) -> str:
        if not SHA256_HEX.fullmatch(ref.sha256) or ref.key != f"{self._bucket}/blobs/{ref.sha256}":
            raise BlobNotFound(f"{no_object(ref.key)}: not a key this store writes")
        return f"blobs/{ref.sha256}"
