"""Content-addressed blobs in S3/MinIO (originals of capped messages; claim-checked bodies when
``CHRONICLE_CLAIM_CHECK_STORE=s3``): key = SHA-256 of the bytes."""

from __future__ import annotations

from events.blobs import SHA256_HEX, BlobNotFound, BlobRef, no_object, sha256_hex
from services.storage.s3 import SkillStore

CLAIM_CHECK_S3 = "s3-claim-check"
"""The store claim-checked bodies in S3 name in their references (``CHRONICLE_CLAIM_CHECK_STORE=s3``)."""


def _written(ref: BlobRef) -> tuple[str, str]:
    """The bucket and key of a reference this store could have written; else :class:`BlobNotFound`."""
    bucket, _, key = ref.key.partition("/")
    if key != f"blobs/{ref.sha256}" or not SHA256_HEX.fullmatch(ref.sha256):
        raise BlobNotFound(f"{no_object(ref.key)}: not a key this store writes")
    return bucket, key


class S3BlobStore:
    """One bucket's ``blobs/`` objects; ``kind`` is what its references name as their store (the
    originals' ``s3``, claim-checked bodies' ``s3-claim-check``: a reference of one is never
    looked up in the other)."""

    def __init__(self, store: SkillStore, bucket: str, kind: str = "s3") -> None:
        self._store = store
        self._bucket = bucket
        self.kind = kind

    async def put(self, data: bytes) -> BlobRef:
        digest = sha256_hex(data)
        await self._store.put_bytes(self._bucket, f"blobs/{digest}", data)
        return BlobRef(store=self.kind, key=f"{self._bucket}/blobs/{digest}", sha256=digest, size=len(data))

    async def delete(self, ref: BlobRef) -> None:
        bucket, key = _written(ref)
        await self._store.delete(bucket, key)

    async def get(self, ref: BlobRef) -> bytes:
        """The object's bytes; :class:`BlobNotFound` when there is none, its bytes do not hash to
        ``ref.sha256``, or the reference names a key of another shape than the ones this store
        writes (``<bucket>/blobs/<its sha256>``, the bucket the one set when it was written): a
        reference published straight to the log could name any object the credentials reach, a
        skill document included."""
        bucket, key = _written(ref)
        data = await self._store.get_bytes(bucket, key)
        if data is None or sha256_hex(data) != ref.sha256:
            raise BlobNotFound(no_object(ref.key))
        return data
