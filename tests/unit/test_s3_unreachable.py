"""S3/MinIO that does not answer is ``503 object_storage`` (an error the callers map and the
projector retries), never an error nobody maps (urllib3's, which became a 500)."""

from __future__ import annotations

import socket

import pytest

from services.errors import ObjectStorageError
from services.storage.blobs import S3BlobStore
from services.storage.s3 import SkillStore


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])  # nothing listens once it is closed


async def test_every_call_to_an_s3_that_does_not_answer_is_object_storage_unavailable() -> None:
    store = SkillStore(f"127.0.0.1:{closed_port()}", "a", "b", secure=False, region="us-east-1")
    blobs = S3BlobStore(store, "bucket")
    with pytest.raises(ObjectStorageError):
        await blobs.put(b"a body")
    with pytest.raises(ObjectStorageError):
        await store.get_bytes("bucket", "blobs/x")
    with pytest.raises(ObjectStorageError):
        await store.list("bucket", "")
