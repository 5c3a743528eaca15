"""How :class:`SkillStore` tells refused credentials from a bucket refused alone, against a stub
S3 that answers as S3 and MinIO do: a refused ``HEAD`` is ``403`` with no body (the minio client
then reads ``AccessDenied`` whatever the cause), a ``GET`` names its error code in XML.

A tenant's erasure leaves a bucket the store refuses (the tenant named it) and erases the rest, but
stops before destroying anything when the store cannot be used at all (credentials refused, a
skewed clock). With the survey's first request a ``HEAD``, refused credentials read as
``AccessDenied`` on every bucket, and the erasure destroyed every data key while every object
stayed (a review found it)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from services.errors import BucketUnusable, ObjectStorageError
from services.storage.s3 import SkillStore


def stub(code: str) -> type[BaseHTTPRequestHandler]:
    class Refusing(BaseHTTPRequestHandler):
        def do_HEAD(self) -> None:
            self.send_response(403)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def do_GET(self) -> None:
            body = (
                f"<?xml version='1.0' encoding='UTF-8'?><Error><Code>{code}</Code>"
                f"<Message>refused by the stub</Message><RequestId>r</RequestId></Error>"
            ).encode()
            self.send_response(403)
            self.send_header("Content-Type", "application/xml")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    return Refusing


@pytest.fixture
def refusing() -> Iterator[dict[str, str]]:
    """``code`` → the endpoint of a stub answering every GET with that S3 error code."""
    servers = {
        code: ThreadingHTTPServer(("127.0.0.1", 0), stub(code)) for code in ("InvalidAccessKeyId", "AccessDenied")
    }
    for server in servers.values():
        threading.Thread(target=server.serve_forever, daemon=True).start()
    yield {code: f"127.0.0.1:{server.server_address[1]}" for code, server in servers.items()}
    for server in servers.values():
        server.shutdown()
        server.server_close()


def store(endpoint: str) -> SkillStore:
    return SkillStore(endpoint, "testing", "wrong secret", secure=False, region="us-east-1")


async def test_refused_credentials_in_a_survey_are_the_stores_not_one_buckets(refusing: dict[str, str]) -> None:
    with pytest.raises(ObjectStorageError) as caught:
        await store(refusing["InvalidAccessKeyId"]).survey("skills", "tenants/t/")
    assert not isinstance(caught.value, BucketUnusable)
    assert "InvalidAccessKeyId" in caught.value.detail


async def test_a_bucket_refused_alone_in_a_survey_is_that_buckets(refusing: dict[str, str]) -> None:
    with pytest.raises(BucketUnusable) as caught:
        await store(refusing["AccessDenied"]).survey("skills", "tenants/t/")
    assert "AccessDenied" in caught.value.detail


async def test_chronicles_own_bucket_refused_means_the_store_cannot_be_used(refusing: dict[str, str]) -> None:
    with pytest.raises(ObjectStorageError) as caught:
        await store(refusing["AccessDenied"]).check_usable("chronicle-originals")
    assert not isinstance(caught.value, BucketUnusable)
    assert caught.value.detail == "AccessDenied: refused by the stub (one of Chronicle's own buckets)"


async def test_chronicles_own_bucket_absent_is_usable(s3_endpoint: str) -> None:
    await SkillStore(s3_endpoint, "testing", "testing", secure=False, region="us-east-1").check_usable(
        "no-such-bucket-here"
    )
