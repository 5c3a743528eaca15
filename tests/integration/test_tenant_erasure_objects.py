"""A tenant's erasure deletes every object under its prefix (``tenants/<t>/``) in every bucket,
whether its skills index lists it or not: a skill document uploaded and never recorded (a put that
stopped before its event, a file copied in and never synced) and a read-only source it uploaded
go too; another tenant's objects stay, however alike its name; an erasure that fails part-way is
finished by running it again. Real NATS, Postgres, the minio client against moto's S3 server."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from minio import Minio
from minio.commonconfig import ENABLED
from minio.versioningconfig import VersioningConfig

from events.omitted import OMITTED
from services.bootstrap import Container
from services.errors import ObjectStorageError
from tests.integration.helpers import text_message


def s3(c: Container) -> Minio:
    s = c.settings
    return Minio(s.s3_endpoint, s.s3_access_key, s.s3_secret_key, secure=False, region=s.s3_region)


def listed(c: Container, bucket: str, prefix: str) -> list[str]:
    return sorted(o.object_name or "" for o in s3(c).list_objects(bucket, prefix=prefix, recursive=True))


async def tenant_with_objects(c: Container) -> tuple[str, str, str]:
    """A tenant with a session, an indexed skill document, an unrecorded one and a read-only source
    in two buckets; and a tenant whose name starts with its name, with an object of its own."""
    tenant = f"t-{uuid.uuid4().hex[:10]}"
    skills, sources = f"skills-{uuid.uuid4().hex[:8]}", f"sources-{uuid.uuid4().hex[:8]}"
    done = await c.commands.append(tenant, "s1", text_message("m1", "hello"), OMITTED)
    await c.waiter.wait_all(done.seq, timeout_s=20)
    await c.context.put_skill(tenant, skills, "skills/indexed", "# indexed", "recorded")
    store = c.context.skills
    assert store is not None
    await store.put(skills, f"tenants/{tenant}/skills/never-synced", "# not in the index", None)
    await store.put(sources, f"tenants/{tenant}/notes/source.md", "read-only text", None)
    await store.put(skills, f"tenants/{tenant}x/skills/other", "another tenant's", None)
    assert listed(c, skills, f"tenants/{tenant}/") == [
        f"tenants/{tenant}/skills/indexed",
        f"tenants/{tenant}/skills/never-synced",
    ]
    return tenant, skills, sources


async def test_erasing_a_tenant_deletes_every_object_under_its_prefix_indexed_or_not(stack: Container) -> None:
    c = stack
    tenant, skills, sources = await tenant_with_objects(c)
    done = await c.eraser.erase_tenant(tenant)
    assert done[-1].session == ""
    assert done[-1].objects_deleted == 3  # the tenant scope's: the indexed, the unsynced, the source
    assert listed(c, skills, f"tenants/{tenant}/") == []
    assert listed(c, sources, f"tenants/{tenant}/") == []
    assert listed(c, skills, f"tenants/{tenant}x/") == [f"tenants/{tenant}x/skills/other"]  # not its prefix
    again = await c.eraser.erase_tenant(tenant)
    assert again[-1].objects_deleted == 0


async def test_an_erasure_that_fails_part_way_through_the_objects_is_finished_by_a_rerun(
    stack: Container, monkeypatch: pytest.MonkeyPatch
) -> None:
    c = stack
    tenant, skills, sources = await tenant_with_objects(c)
    remove = Minio.remove_object
    calls: list[str] = []

    def failing_second(self: Minio, bucket: str, name: str, **kw: Any) -> None:
        calls.append(name)
        if len(calls) == 2:
            raise ConnectionResetError("the object store went away")
        remove(self, bucket, name, **kw)

    monkeypatch.setattr(Minio, "remove_object", failing_second)
    with pytest.raises(ObjectStorageError, match="went away"):
        await c.eraser.erase_tenant(tenant)
    left = listed(c, skills, f"tenants/{tenant}/") + listed(c, sources, f"tenants/{tenant}/")
    assert len(left) == 2  # one deleted, the crash, one never reached
    monkeypatch.setattr(Minio, "remove_object", remove)
    done = await c.eraser.erase_tenant(tenant)
    assert done[-1].objects_deleted == 2
    assert listed(c, skills, f"tenants/{tenant}/") == listed(c, sources, f"tenants/{tenant}/") == []


async def test_a_tenant_with_only_an_unrecorded_object_exists_and_its_erasure_deletes_it(stack: Container) -> None:
    """(``chronicle erase --tenant`` answered "no tenant" and left the object.)"""
    c = stack
    tenant, bucket = f"t-{uuid.uuid4().hex[:10]}", f"skills-{uuid.uuid4().hex[:8]}"
    assert not await c.eraser.tenant_exists(tenant)
    store = c.context.skills
    assert store is not None
    await store.put(bucket, f"tenants/{tenant}/skills/copied-in", "# never synced", None)
    assert await c.eraser.tenant_exists(tenant)
    done = await c.eraser.erase_tenant(tenant)
    assert [(e.session, e.objects_deleted) for e in done] == [("", 1)]
    assert listed(c, bucket, f"tenants/{tenant}/") == []


async def test_every_version_of_a_tenants_object_in_a_versioned_bucket_goes(stack: Container) -> None:
    c = stack
    tenant, bucket = f"t-{uuid.uuid4().hex[:10]}", f"versioned-{uuid.uuid4().hex[:8]}"
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
