"""What :class:`SkillStore` asks of object storage: a prefix's deletion sends one DeleteObjects
request per 1,000 keys or versions, and a key the store refuses fails it. The real minio client
against moto's S3 server."""

from __future__ import annotations

import io
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from minio import Minio
from minio.commonconfig import ENABLED
from minio.deleteobjects import DeleteError, DeleteObject, DeleteResult
from minio.versioningconfig import VersioningConfig

from services.errors import BucketUnusable, ObjectStorageError
from services.storage import s3 as s3_module
from services.storage.s3 import BucketMissing, SkillStore

Request = tuple[str, str | None, tuple[str, ...]]


def new_store(endpoint: str) -> SkillStore:
    return SkillStore(endpoint, "testing", "testing", secure=False, region="us-east-1")


@pytest.fixture
def client(s3_endpoint: str) -> Minio:
    return Minio(s3_endpoint, "testing", "testing", secure=False, region="us-east-1")


@pytest.fixture
def bucket(client: Minio) -> str:
    name = f"req-{uuid.uuid4().hex[:8]}"
    client.make_bucket(name)
    return name


def recorded(store: SkillStore, monkeypatch: pytest.MonkeyPatch) -> list[Request]:
    """Every request ``store`` sends from now on: (method, object key or None, query parameters)."""
    requests: list[Request] = []
    execute = store._client._execute

    def counting(method: str, bucket_name: str, object_name: str | None = None, **kw: Any) -> Any:
        requests.append((method, object_name, tuple(sorted(kw.get("query_params") or {}))))
        return execute(method, bucket_name, object_name, **kw)

    monkeypatch.setattr(store._client, "_execute", counting)
    return requests


def heads(requests: list[Request]) -> list[str]:
    """The objects HEADed (a bucket's HEAD, its existence, left out)."""
    return [key for method, key, _ in requests if method == "HEAD" and key is not None]


def upload(client: Minio, bucket: str, keys: list[str], description: str | None = None) -> None:
    meta: dict[str, str | list[str] | tuple[str]] | None = {"description": description} if description else None

    def one(key: str) -> None:
        client.put_object(bucket, key, io.BytesIO(key.encode()), len(key.encode()), metadata=meta)

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(one, keys))


async def test_deleting_2500_objects_under_a_prefix_takes_three_requests(
    s3_endpoint: str, bucket: str, client: Minio, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = new_store(s3_endpoint)
    keys = [f"tenants/t/doc-{i:04}" for i in range(2500)]
    upload(client, bucket, [*keys, "tenants/tx/other"])
    requests = recorded(store, monkeypatch)
    assert await store.delete_under(bucket, "tenants/t/", versioned=False) == 2500
    assert [r for r in requests if r[0] in ("POST", "DELETE")] == [("POST", None, ("delete",))] * 3
    assert list(client.list_objects(bucket, prefix="tenants/t/", recursive=True)) == []
    assert [o.object_name for o in client.list_objects(bucket, recursive=True)] == ["tenants/tx/other"]


async def test_a_document_put_is_one_request_and_into_a_missing_bucket_makes_no_bucket(
    s3_endpoint: str, bucket: str, client: Minio, monkeypatch: pytest.MonkeyPatch
) -> None:
    """(A put HEADed the bucket and made it when missing: a skills bucket deleted after a check was
    made again, without its owner's policy.) The PUT alone; a missing bucket is BucketMissing."""
    store = new_store(s3_endpoint)
    requests = recorded(store, monkeypatch)
    stored = await store.put(bucket, "tenants/t/skills/doc", "# doc", "a doc")
    assert [(method, key) for method, key, _ in requests] == [("PUT", "tenants/t/skills/doc")]
    assert stored.size == len("# doc")
    requests.clear()
    gone = f"gone-{uuid.uuid4().hex[:8]}"
    with pytest.raises(BucketMissing) as missing:
        await store.put(gone, "tenants/t/skills/doc", "# doc", None)
    assert missing.value.bucket == gone
    assert str(missing.value) == f"bucket {gone!r} does not exist: create it first"
    assert [(method, key) for method, key, _ in requests] == [("PUT", "tenants/t/skills/doc")]
    assert not client.bucket_exists(gone)


async def test_every_version_and_delete_marker_under_a_prefix_goes(
    s3_endpoint: str, bucket: str, client: Minio, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = new_store(s3_endpoint)
    client.set_bucket_versioning(bucket, VersioningConfig(ENABLED))
    keys = [f"tenants/t/doc-{i}" for i in range(3)]
    upload(client, bucket, keys, "v1")
    upload(client, bucket, keys, "v2")
    client.remove_object(bucket, keys[0])  # a delete marker on top of its two versions

    def versions() -> list[Any]:
        return list(client.list_objects(bucket, prefix="tenants/t/", recursive=True, include_version=True))

    assert len(versions()) == 7
    requests = recorded(store, monkeypatch)
    assert await store.delete_under(bucket, "tenants/t/", versioned=True) == 3
    assert [r for r in requests if r[0] in ("POST", "DELETE")] == [("POST", None, ("delete",))]
    assert versions() == []


async def test_a_key_the_store_refuses_fails_the_deletion_before_the_next_batch_and_a_rerun_finishes(
    s3_endpoint: str, bucket: str, client: Minio, monkeypatch: pytest.MonkeyPatch
) -> None:
    """(Each error of a batch delete is in its answer, not its status: an answer left unread
    reported every key deleted.)"""
    store = new_store(s3_endpoint)
    keys = [f"tenants/t/doc-{i}" for i in range(5)]
    upload(client, bucket, keys)
    monkeypatch.setattr(s3_module, "DELETE_BATCH", 2)
    real = Minio._delete_objects
    batches: list[list[str]] = []

    def refusing(self: Minio, bucket_name: str, batch: list[DeleteObject], **kw: Any) -> DeleteResult:
        batches.append([d.name for d in batch])
        if len(batches) != 2:
            return real(self, bucket_name, batch, **kw)
        refused = batch[0]  # the store deletes the others and reports this one
        done = real(self, bucket_name, batch[1:], **kw)
        error = DeleteError(code="AccessDenied", message="Access Denied", name=refused.name, version_id=None)
        return DeleteResult(done.object_list, [error])

    monkeypatch.setattr(Minio, "_delete_objects", refusing)
    with pytest.raises(ObjectStorageError) as failed:
        await store.delete_under(bucket, "tenants/t/", versioned=False)
    assert failed.value.detail == (
        f"AccessDenied: Access Denied: key 'tenants/t/doc-2' in bucket {bucket!r} (1 of 2 in its batch not deleted)"
    )
    assert batches == [keys[0:2], keys[2:4]]  # the third never sent
    left = sorted(o.object_name or "" for o in client.list_objects(bucket, prefix="tenants/t/", recursive=True))
    assert left == ["tenants/t/doc-2", "tenants/t/doc-4"]
    monkeypatch.setattr(Minio, "_delete_objects", real)
    assert await store.delete_under(bucket, "tenants/t/", versioned=False) == 2
    assert list(client.list_objects(bucket, prefix="tenants/t/", recursive=True)) == []


def test_the_minio_client_sends_a_batch_delete_only_as_its_errors_are_read(
    s3_endpoint: str, bucket: str, client: Minio
) -> None:
    """The client sends nothing until its errors are read (why :meth:`SkillStore.delete_under`
    reads them all): a guard on the minio client's behaviour this module relies on."""
    upload(client, bucket, ["k"])
    errors: Iterator[DeleteError] = client.remove_objects(bucket, [DeleteObject("k")])
    assert [o.object_name for o in client.list_objects(bucket)] == ["k"]
    assert list(errors) == []
    assert list(client.list_objects(bucket)) == []


@pytest.mark.parametrize("name", ["../not a bucket", "two..dots"])
async def test_a_name_the_client_refuses_as_a_bucket_is_an_object_storage_error_naming_it(
    s3_endpoint: str, name: str
) -> None:
    """(The minio client's ``ValueError: invalid bucket name`` went through uncaught: a tenant's
    erasure, its dry run and ``tenant_exists`` died with a traceback.)"""
    store = new_store(s3_endpoint)
    with pytest.raises(BucketUnusable, match=r"invalid bucket name|successive"):
        await store.survey(name, "tenants/t/")
    with pytest.raises(ObjectStorageError):
        await store.get_text(name, "tenants/t/doc")
