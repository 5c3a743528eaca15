"""``chronicle up``'s S3: the moto server it starts itself when nothing answers at
``CHRONICLE_S3_ENDPOINT`` (not set) holds the bucket the README's skills example uses; an
S3/MinIO that answers is used as it is, no bucket made there."""

from __future__ import annotations

import asyncio
import base64
import os
import uuid
from pathlib import Path

import pytest
from minio import Minio

from services.ops import s3_recording
from services.ops.localstack import LOCAL_S3_BUCKETS, free_port, s3_missing, start_moto
from services.settings import Settings
from services.storage.s3 import SkillStore

README = Path(__file__).resolve().parents[2] / "README.md"


def s3(settings: Settings) -> Minio:
    return Minio(settings.s3_endpoint, settings.s3_access_key, settings.s3_secret_key, secure=False, region="us-east-1")


def test_the_s3_up_starts_itself_holds_the_bucket_the_readme_uses(capsys: pytest.CaptureFixture[str]) -> None:
    """(It held none: ``chronicle skills put``, which refuses a missing bucket, could not be run
    as the README has it without an S3 client.)"""
    settings = Settings(s3_endpoint=f"127.0.0.1:{free_port()}")
    proc = start_moto(settings)
    assert proc is not None
    try:
        assert [b.name for b in s3(settings).list_buckets()] == sorted(LOCAL_S3_BUCKETS)
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    assert "chronicle up: made the bucket(s) skills on it" in capsys.readouterr().out
    readme = README.read_text(encoding="utf-8")
    assert all(f"--bucket {bucket}" in readme and f'"bucket": "{bucket}"' in readme for bucket in LOCAL_S3_BUCKETS)


def test_an_s3_that_answers_is_used_as_it_is_and_gets_no_bucket(s3_endpoint: str) -> None:
    """``up`` uses it (:func:`s3_missing` is False, so it starts no moto), and a moto start that
    finds it answering all the same refuses before making anything there."""
    settings = Settings(s3_endpoint=s3_endpoint)
    bucket = f"up-{uuid.uuid4().hex[:12]}"
    assert s3_missing(settings) is False
    with pytest.raises(RuntimeError, match="something listens at"):
        start_moto(settings, buckets=(bucket,))
    assert not s3(settings).bucket_exists(bucket)


def test_the_s3_up_starts_keeps_its_objects_across_a_restart(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """moto holds objects in memory: a restarted ``up`` lost every skill, claim-checked body and
    archive segment its stack had put (the skill index in Postgres still listed them). With its
    recording, a server stopped without a snapshot (``up`` killed) comes back with what it held:
    a document with its description and etag, a body put in parts (multipart, over 5 MiB), not
    an object deleted meanwhile, whose bytes leave the recording at that start."""
    settings = Settings(s3_endpoint=f"127.0.0.1:{free_port()}")
    recording = tmp_path / "s3-recording.jsonl"
    store = SkillStore(
        settings.s3_endpoint, settings.s3_access_key, settings.s3_secret_key, secure=False, region=settings.s3_region
    )
    big = os.urandom(6 * 1024 * 1024 + 5)
    secret = b"ZEBRA-PASSPORT-4471 " * 4

    async def write() -> str:
        doc = await store.put("skills", "t/tax.md", "# Tax\nfile by April", "how to file, é")
        await store.put_bytes("chronicle-originals", "big", big)
        await store.put_bytes("chronicle-originals", "gone", secret)
        await store.delete("chronicle-originals", "gone")
        return doc.etag

    proc = start_moto(settings, recording)
    assert proc is not None
    try:
        etag = asyncio.run(write())
    finally:
        proc.kill()
        proc.wait(timeout=10)
    assert base64.b64encode(secret).decode() in recording.read_text()  # recorded as served
    capsys.readouterr()

    proc = start_moto(settings, recording)
    assert proc is not None
    try:

        async def read() -> tuple[list[tuple[str, str | None, str]], bytes | None, bytes | None]:
            docs = [(o.key, o.description, o.etag) for o in await store.list("skills", "")]
            originals = [await store.get_bytes("chronicle-originals", key) for key in ("big", "gone")]
            return docs, originals[0], originals[1]

        docs, got_big, got_gone = asyncio.run(read())
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    assert docs == [("t/tax.md", "how to file, é", etag)]
    assert got_big == big
    assert got_gone is None
    assert base64.b64encode(secret).decode() not in recording.read_text()
    assert f"chronicle up: restored 2 object(s) into it from {recording}" in capsys.readouterr().out
    assert recording.stat().st_mode & 0o777 == 0o600  # every object's bytes: its owner's alone

    proc = start_moto(settings, recording)  # the rewritten file (a put of each object) replays too
    assert proc is not None
    try:
        docs, got_big, got_gone = asyncio.run(read())
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    assert docs == [("t/tax.md", "how to file, é", etag)]
    assert (got_big, got_gone) == (big, None)


def test_a_recording_that_does_not_parse_is_kept_aside_not_rewritten_away(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The file is rewritten as the objects stand at each start: one moto could not read (cut,
    damaged) was replaced by an empty server's snapshot, its bytes gone for good."""
    settings = Settings(s3_endpoint=f"127.0.0.1:{free_port()}")
    recording = tmp_path / "s3-recording.jsonl"
    damaged = b'{"method": "PUT", "url": "http://h:1/skills/a.md", "body": "ZG9j", "body_enc'
    recording.write_bytes(damaged)
    proc = start_moto(settings, recording)
    assert proc is not None
    proc.terminate()
    proc.wait(timeout=10)
    kept = tmp_path / "s3-recording.jsonl.torn"
    assert kept.read_bytes() == damaged
    assert kept.stat().st_mode & 0o777 == 0o600
    assert f"1 unreadable fragment(s) left out, the file kept as {kept}" in capsys.readouterr().out


def test_reads_served_by_the_s3_up_starts_never_grow_its_recording(tmp_path: Path) -> None:
    """moto's recorder appended every request it served, reads included: on a stack left running
    (a soak of 40 minutes: skill loads, context renders) the recording grew by a line of headers
    (~800 bytes) for each GET and HEAD, without bound until the next start rewrote it, though only
    its writes are ever replayed. Now only the writes are recorded, and the objects still come back."""
    settings = Settings(s3_endpoint=f"127.0.0.1:{free_port()}")
    recording = tmp_path / "s3-recording.jsonl"
    store = SkillStore(
        settings.s3_endpoint, settings.s3_access_key, settings.s3_secret_key, secure=False, region=settings.s3_region
    )

    async def write_then_read() -> None:
        await store.put("skills", "t/tax.md", "# Tax\nfile by April", "how to file")
        for _ in range(50):
            assert await store.get_text("skills", "t/tax.md") == "# Tax\nfile by April"
            assert await store.bucket_exists("skills")
            assert [o.key for o in await store.list("skills", "t/")] == ["t/tax.md"]

    proc = start_moto(settings, recording)
    assert proc is not None
    try:
        after_start = recording.stat().st_size
        asyncio.run(write_then_read())
        values, torn = s3_recording.entries(recording.read_text().splitlines())
    finally:
        proc.kill()  # no snapshot at a clean stop: the file as moto left it
        proc.wait(timeout=10)
    assert torn == 0
    methods = [v["method"] for v in values]
    assert "GET" not in methods, methods
    assert "HEAD" not in methods, methods
    assert len(s3_recording.writes(values)) == len(values)
    assert recording.stat().st_size - after_start < 4_000  # the one put, not 150 reads

    proc = start_moto(settings, recording)
    assert proc is not None
    try:
        assert asyncio.run(store.get_text("skills", "t/tax.md")) == "# Tax\nfile by April"
    finally:
        proc.terminate()
        proc.wait(timeout=10)
