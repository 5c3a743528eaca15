"""A tenant's erasure deletes every object under its prefix (``tenants/<t>/``) in the buckets
Chronicle knows hold its objects (those its skills index and its sessions' configs name), whether
its skills index lists the object or not; a bucket nothing of the tenant names keeps its
``tenants/<t>/`` objects (another deployment's, in a shared account); another tenant's objects
stay, however alike its name. The buckets are looked at before any session is erased (object
storage that cannot be used: nothing erased; a bucket the store refuses: named, the rest erased),
not at all when none is known; plain deletes in an unversioned bucket, every version in a
versioned one; an erasure that fails part-way is finished by running it again. Real NATS,
Postgres, the minio client against moto's S3 server."""

from __future__ import annotations

import io
import json
import re
import uuid
from collections.abc import AsyncIterator, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from minio import Minio
from minio.commonconfig import ENABLED
from minio.deleteobjects import DeleteError, DeleteObject, DeleteResult
from minio.versioningconfig import VersioningConfig

from events.context import ObjectSource, ReadonlyBlock, SessionConfig
from events.omitted import OMITTED
from projections import queries
from services.bootstrap import Container, open_container
from services.errors import ObjectStorageError
from services.ops.localstack import free_port
from services.storage.s3 import NotCleaned
from tests.conftest import make_settings, running_stack
from tests.integration.helpers import text_message
from tests.support import chronicle_cli


def s3(c: Container) -> Minio:
    s = c.settings
    return Minio(s.s3_endpoint, s.s3_access_key, s.s3_secret_key, secure=False, region=s.s3_region)


def listed(c: Container, bucket: str, prefix: str) -> list[str]:
    return sorted(o.object_name or "" for o in s3(c).list_objects(bucket, prefix=prefix, recursive=True))


def unique(what: str) -> str:
    return f"{what}-{uuid.uuid4().hex[:8]}"


async def tenant_with_objects(c: Container) -> tuple[str, str, str, str]:
    """A tenant with a session whose config reads a source, an indexed skill document and an
    unrecorded one in the indexed bucket; a tenant whose name starts with its name, with an object
    of its own; and a bucket nothing of the tenant names holding an object under its prefix."""
    tenant = f"t-{uuid.uuid4().hex[:10]}"
    skills, sources, foreign = unique("skills"), unique("sources"), unique("foreign")
    store = c.context.skills
    assert store is not None
    for bucket in (skills, sources, foreign):
        s3(c).make_bucket(bucket)  # a put makes no bucket
    await store.put(sources, f"tenants/{tenant}/notes/source.md", "read-only text", None)
    await store.put(foreign, f"tenants/{tenant}/staging/doc", "another deployment's", None)
    done = await c.commands.append(tenant, "s1", text_message("m1", "hello"), OMITTED)
    config = SessionConfig(
        blocks=[ReadonlyBlock(label="notes", source=ObjectSource(bucket=sources, key="notes/source.md"))]
    )
    configured = await c.context.configure(tenant, "s1", config)
    await c.waiter.wait_all(max(done.seq, configured), timeout_s=20)
    await c.context.put_skill(tenant, skills, "skills/indexed", "# indexed", "recorded")
    await store.put(skills, f"tenants/{tenant}/skills/never-synced", "# not in the index", None)
    await store.put(skills, f"tenants/{tenant}x/skills/other", "another tenant's", None)
    assert listed(c, skills, f"tenants/{tenant}/") == [
        f"tenants/{tenant}/skills/indexed",
        f"tenants/{tenant}/skills/never-synced",
    ]
    return tenant, skills, sources, foreign


async def test_the_log_line_of_a_tenants_erasure_counts_the_objects_its_json_line_counts(
    stack: Container, caplog: pytest.LogCaptureFixture
) -> None:
    """The tenant scope's line said ``0 objects deleted`` while ``chronicle erase`` printed
    ``objects_deleted: 3``: its documents are deleted before its own erasure, and were left out."""
    tenant, *_ = await tenant_with_objects(stack)
    with caplog.at_level("WARNING", logger="chronicle.erasure"):
        done = await stack.eraser.erase_tenant(tenant)
    scope = done[-1]
    assert scope.objects_deleted == 3
    said = f"erased tenant-level entries of tenant {tenant!r} (event {scope.seq}, 3 objects deleted)"
    assert said in caplog.messages


async def test_erasing_a_tenant_deletes_its_objects_in_the_buckets_it_is_known_to_use_and_no_other(
    stack: Container,
) -> None:
    c = stack
    tenant, skills, sources, foreign = await tenant_with_objects(c)
    done = await c.eraser.erase_tenant(tenant)
    assert done[-1].session == ""
    assert done[-1].objects_deleted == 3  # the tenant scope's: the indexed, the unsynced, the config's source
    assert listed(c, skills, f"tenants/{tenant}/") == []
    assert listed(c, sources, f"tenants/{tenant}/") == []  # named by the session's config alone
    assert listed(c, foreign, f"tenants/{tenant}/") == [f"tenants/{tenant}/staging/doc"]  # named by nothing
    assert listed(c, skills, f"tenants/{tenant}x/") == [f"tenants/{tenant}x/skills/other"]  # not its prefix
    again = await c.eraser.erase_tenant(tenant)
    assert again[-1].objects_deleted == 0


async def test_an_erasure_that_fails_part_way_through_the_objects_is_finished_by_a_rerun(
    stack: Container, monkeypatch: pytest.MonkeyPatch
) -> None:
    c = stack
    tenant, skills, sources, _ = await tenant_with_objects(c)
    remove = Minio.remove_objects
    calls: list[str] = []

    def failing_second(self: Minio, bucket: str, batch: list[DeleteObject], **kw: Any) -> Iterator[DeleteError]:
        calls.append(bucket)
        if len(calls) == 2:
            raise ConnectionResetError("the object store went away")
        return remove(self, bucket, batch, **kw)

    monkeypatch.setattr(Minio, "remove_objects", failing_second)
    with pytest.raises(ObjectStorageError, match="went away"):
        await c.eraser.erase_tenant(tenant)
    # the buckets go in name order: the skills bucket's batch deleted, the crash on the sources'
    assert listed(c, skills, f"tenants/{tenant}/") == []
    assert listed(c, sources, f"tenants/{tenant}/") == [f"tenants/{tenant}/notes/source.md"]
    monkeypatch.setattr(Minio, "remove_objects", remove)
    done = await c.eraser.erase_tenant(tenant)  # the sessions are erased: the source's bucket was noted first
    assert done[-1].objects_deleted == 1
    assert listed(c, skills, f"tenants/{tenant}/") == listed(c, sources, f"tenants/{tenant}/") == []


async def test_a_bucket_the_operator_names_is_cleaned_and_makes_a_tenant_with_only_an_object_there_exist(
    stack: Container,
) -> None:
    c = stack
    tenant, bucket = f"t-{uuid.uuid4().hex[:10]}", unique("skills")
    store = c.context.skills
    assert store is not None
    s3(c).make_bucket(bucket)  # a put makes no bucket
    await store.put(bucket, f"tenants/{tenant}/skills/copied-in", "# never synced", None)
    assert not await c.eraser.tenant_exists(tenant)  # nothing of it names the bucket
    assert await c.eraser.tenant_exists(tenant, [bucket])
    done = await c.eraser.erase_tenant(tenant, buckets=[bucket])
    assert [(e.session, e.objects_deleted) for e in done] == [("", 1)]
    assert listed(c, bucket, f"tenants/{tenant}/") == []


async def test_an_unversioned_bucket_gets_plain_deletes(stack: Container, monkeypatch: pytest.MonkeyPatch) -> None:
    """(Every delete named a version: credentials without s3:ListBucketVersions and
    s3:DeleteObjectVersion could not erase anything.)"""
    c = stack
    tenant, bucket = f"t-{uuid.uuid4().hex[:10]}", unique("plain")
    s3(c).make_bucket(bucket)  # a put makes no bucket
    await c.context.put_skill(tenant, bucket, "skills/a", "# a", None)
    await c.context.put_skill(tenant, bucket, "skills/b", "# b", None)
    lists, removes = Minio.list_objects, Minio.remove_objects
    listed_versions: list[bool] = []
    removed: list[str | None] = []

    def list_objects(self: Minio, bucket: str, **kw: Any) -> Any:
        listed_versions.append(bool(kw.get("include_version")))
        return lists(self, bucket, **kw)

    def remove_objects(self: Minio, bucket: str, batch: list[DeleteObject], **kw: Any) -> Iterator[DeleteError]:
        removed.extend(d.version_id for d in batch)
        return removes(self, bucket, batch, **kw)

    monkeypatch.setattr(Minio, "list_objects", list_objects)
    monkeypatch.setattr(Minio, "remove_objects", remove_objects)
    done = await c.eraser.erase_tenant(tenant)
    assert done[-1].objects_deleted == 2
    assert removed == [None, None]
    assert listed_versions
    assert not any(listed_versions)
    assert listed(c, bucket, f"tenants/{tenant}/") == []


async def test_every_version_of_a_tenants_object_in_a_versioned_bucket_goes(stack: Container) -> None:
    c = stack
    tenant, bucket = f"t-{uuid.uuid4().hex[:10]}", unique("versioned")
    client = s3(c)
    client.make_bucket(bucket)
    client.set_bucket_versioning(bucket, VersioningConfig(ENABLED))
    await c.context.put_skill(tenant, bucket, "skills/doc", "# first", None)
    await c.context.put_skill(tenant, bucket, "skills/doc", "# second", None)

    def versions() -> list[str | None]:
        found = client.list_objects(bucket, prefix=f"tenants/{tenant}/", recursive=True, include_version=True)
        return [o.version_id for o in found]

    assert len(versions()) == 2
    done = await c.eraser.erase_tenant(tenant)
    assert done[-1].objects_deleted == 1  # one key, both its versions
    assert versions() == []


@pytest.fixture
async def no_object_storage(nats_url: str, db_url: str) -> AsyncIterator[Container]:
    """A stack whose CHRONICLE_S3_ENDPOINT is a port nothing listens on."""
    async with running_stack(make_settings(nats_url, db_url, s3_endpoint=f"127.0.0.1:{free_port()}")) as c:
        yield c


async def test_a_tenant_with_no_bucket_known_is_erased_without_object_storage(no_object_storage: Container) -> None:
    """(Every tenant erasure listed every bucket: one with no object failed where S3 was not there.)"""
    c = no_object_storage
    tenant = f"t-{uuid.uuid4().hex[:10]}"
    done = await c.commands.append(tenant, "s1", text_message("m1", "hello"), OMITTED)
    await c.waiter.wait_all(done.seq, timeout_s=20)
    assert await c.eraser.tenant_exists(tenant)
    erased = await c.eraser.erase_tenant(tenant)
    assert [(e.session, e.newly_erased, e.objects_deleted) for e in erased] == [("s1", True, 0), ("", True, 0)]


async def test_object_storage_that_cannot_be_used_fails_the_erasure_before_any_session_is_erased(
    stack: Container,
) -> None:
    """(The buckets were cleaned after every session was erased: a misconfigured object store
    failed late, and every rerun failed the same way.)"""
    tenant, skills, sources, _ = await tenant_with_objects(stack)
    broken = stack.settings.model_copy(update={"s3_endpoint": f"127.0.0.1:{free_port()}"})
    async with open_container(broken) as c:
        own = re.escape(stack.settings.originals_bucket)  # asked first: whether the store can be used at all
        with pytest.raises(ObjectStorageError, match=rf"^bucket '({own}|(skills|sources)-[0-9a-f]{{8}})': "):
            await c.eraser.erase_tenant(tenant)
    async with stack.pool.connection() as conn:
        assert not await queries.is_erased(conn, tenant, "s1")
        assert not await queries.is_erased(conn, tenant, "")
    assert await stack.keys.sessions_of(tenant)
    assert len(listed(stack, skills, f"tenants/{tenant}/") + listed(stack, sources, f"tenants/{tenant}/")) == 3


async def test_chronicle_erase_lists_each_bucket_with_its_objects_and_fails_on_storage_in_one_line(
    stack: Container,
) -> None:
    tenant, skills, sources, foreign = await tenant_with_objects(stack)
    dry = chronicle_cli(stack.settings, "erase", "--tenant", tenant)
    assert dry.returncode == 1, dry.stderr
    lines = dry.stdout.splitlines()
    assert f"would delete: 2 objects under tenants/{tenant}/ in bucket {skills!r}" in lines
    assert f"would delete: 1 objects under tenants/{tenant}/ in bucket {sources!r}" in lines
    assert not any(foreign in line for line in lines)
    assert sorted(lines[:2]) == ["would erase: 's1'", "would erase: the tenant-level entries"]
    assert lines[-1] == (  # one session: the tenant-level entries are no session (they were counted as one)
        f"not erased: erasing tenant {tenant!r} destroys every session listed (1), its tenant-level entries and "
        "the objects listed for good. Run again with --yes to erase."
    )
    named = chronicle_cli(stack.settings, "erase", "--tenant", tenant, "--bucket", foreign)
    assert f"would delete: 1 objects under tenants/{tenant}/ in bucket {foreign!r}" in named.stdout.splitlines()
    broken = stack.settings.model_copy(update={"s3_endpoint": f"127.0.0.1:{free_port()}"})
    failed = chronicle_cli(broken, "erase", "--tenant", tenant, "--yes")
    assert failed.returncode == 4, (failed.stdout, failed.stderr)
    assert failed.stdout == ""
    [line] = failed.stderr.strip().splitlines()
    assert line.startswith(f"chronicle erase: object storage at CHRONICLE_S3_ENDPOINT ({broken.s3_endpoint}) ")
    assert "bucket '" in line
    assert await stack.keys.sessions_of(tenant)  # nothing erased
    reserved = chronicle_cli(stack.settings, "erase", "--tenant", tenant, "--bucket", stack.settings.archive_bucket)
    assert reserved.returncode == 2
    assert reserved.stderr.strip() == (
        f"chronicle erase: --bucket {stack.settings.archive_bucket!r} is Chronicle's own, no tenant's"
    )


async def test_a_key_the_store_refuses_to_delete_is_named_the_rest_erased_and_a_rerun_counts_it(
    stack: Container, monkeypatch: pytest.MonkeyPatch
) -> None:
    """(A batch delete answers 200 with its failed keys in the body: the erasure must read them,
    not count every key as deleted. A bucket the store refuses stops nothing else: the tenant
    chose it; it is named in the tenant scope's result.)"""
    c = stack
    tenant, skills, sources, _ = await tenant_with_objects(c)
    real = Minio._delete_objects

    def refusing(self: Minio, bucket: str, batch: list[DeleteObject], **kw: Any) -> DeleteResult:
        if bucket != skills:
            return real(self, bucket, batch, **kw)
        done = real(self, bucket, batch[1:], **kw)
        error = DeleteError(code="AccessDenied", message="Access Denied", name=batch[0].name, version_id=None)
        return DeleteResult(done.object_list, [error])

    monkeypatch.setattr(Minio, "_delete_objects", refusing)
    first = await c.eraser.erase_tenant(tenant)
    refused = f"tenants/{tenant}/skills/indexed"
    reason = f"AccessDenied: Access Denied: key {refused!r} in bucket {skills!r} (1 of 2 in its batch not deleted)"
    assert first[-1].buckets_not_cleaned == (NotCleaned(skills, reason),)
    assert first[-1].objects_deleted == 1  # the sources bucket's: the refused bucket's batch counts none
    assert listed(c, skills, f"tenants/{tenant}/") == [refused]
    assert listed(c, sources, f"tenants/{tenant}/") == []
    monkeypatch.setattr(Minio, "_delete_objects", real)
    done = await c.eraser.erase_tenant(tenant)
    assert (done[-1].objects_deleted, done[-1].buckets_not_cleaned) == (1, ())  # the refused key
    assert listed(c, skills, f"tenants/{tenant}/") == []


async def test_chronicle_erase_counts_every_key_of_batches_and_versions(stack: Container) -> None:
    """Over a thousand keys (two DeleteObjects requests) in one bucket, keys with several versions
    and a delete marker in a versioned one: the dry run and the erasure count keys alike."""
    c = stack
    tenant, plain, versioned = f"t-{uuid.uuid4().hex[:10]}", unique("plain"), unique("versioned")
    client = s3(c)
    client.make_bucket(plain)
    client.make_bucket(versioned)
    client.set_bucket_versioning(versioned, VersioningConfig(ENABLED))

    def put(bucket: str, key: str) -> None:
        client.put_object(bucket, f"tenants/{tenant}/{key}", io.BytesIO(b"doc"), 3)

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda i: put(plain, f"docs/{i:04}"), range(1001)))
    for key in ("a", "a", "b"):
        put(versioned, key)
    client.remove_object(versioned, f"tenants/{tenant}/b")  # a delete marker over its version
    named = ["--bucket", plain, "--bucket", versioned]
    dry = chronicle_cli(c.settings, "erase", "--tenant", tenant, *named)
    assert dry.returncode == 1, dry.stderr
    assert f"would delete: 1001 objects under tenants/{tenant}/ in bucket {plain!r}" in dry.stdout.splitlines()
    assert f"would delete: 2 objects under tenants/{tenant}/ in bucket {versioned!r}" in dry.stdout.splitlines()
    done = chronicle_cli(c.settings, "erase", "--tenant", tenant, *named, "--yes")
    assert done.returncode == 0, done.stderr
    [line] = [json.loads(line) for line in done.stdout.splitlines()]
    assert (line["session"], line["newly_erased"], line["objects_deleted"]) == ("", True, 1003)
    assert listed(c, plain, f"tenants/{tenant}/") == []
    found = client.list_objects(versioned, prefix=f"tenants/{tenant}/", recursive=True, include_version=True)
    assert list(found) == []
