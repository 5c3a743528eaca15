"""Buckets a tenant chooses (a skill event's, a session config's, published straight to JetStream
or not) cannot stop its erasure nor put its documents in Chronicle's own buckets: a skill event
naming no bucket is quarantined; a skills-index row naming none (stored before the contract
refused it) is left out of the erasure; a bucket the store refuses is named in the erasure's
result while everything else is erased, and a rerun cleans it; a config naming a reserved bucket
reads and writes nothing there. Real NATS, Postgres, the minio client against moto's S3 server."""

from __future__ import annotations

import argparse
import json
import uuid
from typing import Any

import pytest
from minio import Minio
from minio.error import S3Error

from events.catalog import SessionConfigured, SkillIndexed
from events.context import ObjectSource, ReadonlyBlock, SessionConfig, SkillsBlock
from events.ids import TENANT_SCOPE
from projections import queries
from projections.context import plan
from services.bootstrap import Container
from services.errors import InvalidConfig
from services.ops.erase_cli import run_erase
from services.storage.s3 import NotCleaned
from tests.integration.test_tenant_erasure_objects import listed, s3, tenant_with_objects
from tests.support import chronicle_cli

NO_BUCKETS = ("../not a bucket", "two..dots", "team-s3alias")


async def test_a_skill_event_published_straight_to_jetstream_naming_no_bucket_is_quarantined(stack: Container) -> None:
    """(It was admitted: its skills-index row made every erasure of the tenant die on the minio
    client's ``ValueError: invalid bucket name``, and a rebuild stored it again.)"""
    c, tenant = stack, f"t-{uuid.uuid4().hex[:10]}"
    event = SkillIndexed(
        tenant=tenant, session=TENANT_SCOPE, bucket="../not a bucket", key="k", description=None, etag="e", size=1
    )
    ack = await c.js.publish(c.layout.session_subject(tenant, TENANT_SCOPE), event.to_json(), stream=c.layout.stream)
    await c.waiter.wait_all(ack.seq, timeout_s=20)
    async with c.pool.connection() as conn:
        cur = await conn.execute("SELECT reason, detail FROM quarantine WHERE seq = %s", (ack.seq,))
        assert await cur.fetchone() == ("invalid", "bucket: '../not a bucket' is not an S3 bucket name")
        cur = await conn.execute("SELECT count(*) FROM skills_index WHERE tenant = %s", (tenant,))
        assert await cur.fetchone() == (0,)
    assert await c.eraser.tenant_exists(tenant)
    done = await c.eraser.erase_tenant(tenant)
    assert [(e.session, e.buckets_not_cleaned) for e in done] == [("", ())]


async def index_rows_naming_no_bucket(c: Container, tenant: str) -> None:
    """What the context projection stored for such events before the contract refused them."""
    async with c.pool.connection() as conn:
        for bucket in NO_BUCKETS:
            event = SkillIndexed(
                tenant=tenant, session=TENANT_SCOPE, bucket=bucket, key="k", description=None, etag="e", size=1
            )
            for sql, params in plan(event, 1):
                await conn.execute(sql, params)


async def test_an_index_row_naming_no_bucket_is_left_out_of_the_tenants_erasure(stack: Container) -> None:
    c = stack
    tenant, skills, sources, _ = await tenant_with_objects(c)
    await index_rows_naming_no_bucket(c, tenant)
    assert await c.eraser.tenant_exists(tenant)
    dry = chronicle_cli(c.settings, "erase", "--tenant", tenant)
    assert dry.returncode == 1, dry.stderr
    assert f"would delete: 2 objects under tenants/{tenant}/ in bucket {skills!r}" in dry.stdout.splitlines()
    assert not any(bucket in dry.stdout for bucket in NO_BUCKETS)
    done = await c.eraser.erase_tenant(tenant)
    assert (done[-1].session, done[-1].objects_deleted, done[-1].buckets_not_cleaned) == ("", 3, ())
    assert listed(c, skills, f"tenants/{tenant}/") == listed(c, sources, f"tenants/{tenant}/") == []


def refusing_bucket(refused: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The store answers ``AccessDenied`` for every request about ``refused`` (a bucket of another
    account, named in a tenant's config)."""
    real_exists, real_versioning = Minio.bucket_exists, Minio.get_bucket_versioning

    def refuse(bucket: str) -> None:
        if bucket == refused:
            raise S3Error(
                response=None,  # type: ignore[arg-type]
                code="AccessDenied",
                message="Access Denied",
                resource=f"/{bucket}",
                request_id="r",
                host_id="h",
                bucket_name=bucket,
            )

    def bucket_exists(self: Minio, bucket: str) -> bool:
        refuse(bucket)
        return bool(real_exists(self, bucket))

    def get_bucket_versioning(self: Minio, bucket: str) -> Any:
        refuse(bucket)
        return real_versioning(self, bucket)

    monkeypatch.setattr(Minio, "bucket_exists", bucket_exists)
    monkeypatch.setattr(Minio, "get_bucket_versioning", get_bucket_versioning)


async def test_a_bucket_the_store_refuses_is_named_while_everything_else_is_erased_and_a_rerun_cleans_it(
    stack: Container, monkeypatch: pytest.MonkeyPatch
) -> None:
    """(Any bucket that could not be used failed the erasure before anything was erased: a tenant
    naming a bucket Chronicle's credentials may not use, in a config published straight to
    JetStream, kept itself from ever being erased.)"""
    c = stack
    tenant, skills, sources, _ = await tenant_with_objects(c)
    refusing_bucket(sources, monkeypatch)
    done = await c.eraser.erase_tenant(tenant)
    assert [e.session for e in done] == ["s1", ""]
    assert done[-1].objects_deleted == 2
    assert done[-1].buckets_not_cleaned == (NotCleaned(sources, "AccessDenied: Access Denied"),)
    async with c.pool.connection() as conn:
        assert await queries.is_erased(conn, tenant, "s1")
        assert await queries.is_erased(conn, tenant, "")
    assert listed(c, skills, f"tenants/{tenant}/") == []
    assert listed(c, sources, f"tenants/{tenant}/") == [f"tenants/{tenant}/notes/source.md"]
    monkeypatch.undo()
    again = await c.eraser.erase_tenant(tenant)  # the bucket was noted: its config is gone
    assert (again[-1].objects_deleted, again[-1].buckets_not_cleaned) == (1, ())
    assert listed(c, sources, f"tenants/{tenant}/") == []


async def test_chronicle_erase_names_a_bucket_it_could_not_clean_and_exits_4(
    stack: Container, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    c = stack
    tenant, skills, sources, _ = await tenant_with_objects(c)
    refusing_bucket(sources, monkeypatch)
    args = argparse.Namespace(tenant=tenant, session=None, yes=False, bucket=[], reason=None)
    assert await run_erase(c.settings, args) == 1
    dry = capsys.readouterr().out.splitlines()
    assert f"would delete: 2 objects under tenants/{tenant}/ in bucket {skills!r}" in dry
    assert (
        f"cannot delete: objects under tenants/{tenant}/ in bucket {sources!r}: the store refuses it "
        "(AccessDenied: Access Denied)"
    ) in dry
    args.yes = True
    assert await run_erase(c.settings, args) == 4
    out, err = capsys.readouterr()
    scope = json.loads(out.splitlines()[-1])
    assert scope["session"] == ""
    assert scope["buckets_not_cleaned"] == [{"bucket": sources, "reason": "AccessDenied: Access Denied"}]
    assert [line for line in err.splitlines() if line.startswith("chronicle erase:")] == [  # logs aside
        f"chronicle erase: not deleted: objects under tenants/{tenant}/ in bucket {sources!r}: "
        "AccessDenied: Access Denied",
        f"chronicle erase: tenant {tenant!r} is erased but for the buckets above: its erasure is not complete until "
        "they are cleaned; run it again once the credentials can list and delete there",
    ]
    monkeypatch.undo()
    assert await run_erase(c.settings, args) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [(line["session"], line["newly_erased"]) for line in lines] == [("s1", False), ("", False)]
    assert (lines[-1]["objects_deleted"], "buckets_not_cleaned" in lines[-1]) == (1, False)


async def test_a_config_published_straight_to_jetstream_naming_a_reserved_bucket_reads_and_writes_nothing_there(
    stack: Container,
) -> None:
    """(Only the config route refused Chronicle's own buckets: a ``session.configured`` published
    straight to JetStream naming the originals bucket had ``set_context`` store the tenant's skill
    document there, where its erasure never looks.)"""
    c, tenant, session = stack, "tenant-a", f"s-{uuid.uuid4().hex[:10]}"
    reserved = c.settings.originals_bucket
    client: Any = s3(c)
    if not client.bucket_exists(reserved):
        client.make_bucket(reserved)
    config = SessionConfig(
        blocks=[
            SkillsBlock(label="skills", bucket=reserved),
            ReadonlyBlock(label="notes", source=ObjectSource(bucket=reserved, key="notes.md")),
        ]
    )
    published = await c.publisher.publish(SessionConfigured(tenant=tenant, session=session, config=config))
    await c.waiter.wait_all(published.seq, timeout_s=20)
    refusal = f"Error: bucket {reserved!r} is reserved for Chronicle's own data"
    args = {"label": "skills", "content": "# doc", "metadata": {"title": "doc"}}
    assert await c.context.execute(tenant, session, "set_context", args) == refusal
    assert await c.context.execute(tenant, session, "load_context", {"label": "skills", "key": "doc"}) == refusal
    with pytest.raises(InvalidConfig, match="reserved for Chronicle's own data"):
        await c.context.put_skill(tenant, reserved, "doc", "# doc", None)
    with pytest.raises(InvalidConfig, match="reserved for Chronicle's own data"):
        await c.context.sources(tenant, session)
    assert listed(c, reserved, f"tenants/{tenant}/") == []
    async with c.pool.connection() as conn:
        cur = await conn.execute(
            "SELECT count(*) FROM skills_index WHERE tenant = %s AND bucket = %s", (tenant, reserved)
        )
        assert await cur.fetchone() == (0,)
