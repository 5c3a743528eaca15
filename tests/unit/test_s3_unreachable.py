"""S3/MinIO that does not answer is ``503 object_storage`` (an error the callers map and the
projector retries), never an error nobody maps (urllib3's, which became a 500)."""

from __future__ import annotations

import asyncio
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


async def test_a_store_that_accepts_and_never_answers_is_asked_once_a_call() -> None:
    """A stalled store (it takes the connection and sends nothing) fails the call after one read
    timeout: the request is not sent again (urllib3 retried a timed-out read twice, tripling the
    time a stalled store held every call)."""
    requests = 0
    held: list[asyncio.StreamWriter] = []

    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal requests
        held.append(writer)
        while line := await reader.readline():
            if line.split(b" ", 1)[0] in (b"GET", b"PUT", b"HEAD", b"POST", b"DELETE"):
                requests += 1

    server = await asyncio.start_server(silent, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    store = SkillStore(f"127.0.0.1:{port}", "a", "b", secure=False, region="us-east-1", read_timeout_s=0.3)
    try:
        with pytest.raises(ObjectStorageError):
            await store.get_bytes("bucket", "blobs/x")
        assert requests == 1
    finally:
        for writer in held:
            writer.close()
        server.close()
        await server.wait_closed()
