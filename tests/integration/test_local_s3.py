"""``chronicle up``'s S3: the moto server it starts itself when nothing answers at
``CHRONICLE_S3_ENDPOINT`` (not set) holds the bucket the README's skills example uses; an
S3/MinIO that answers is used as it is, no bucket made there."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from minio import Minio

from services.ops.localstack import LOCAL_S3_BUCKETS, free_port, s3_missing, start_moto
from services.settings import Settings

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
        start_moto(settings, (bucket,))
    assert not s3(settings).bucket_exists(bucket)
