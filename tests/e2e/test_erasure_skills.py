"""Skills on a sealing stack: a skill's key (made from its title), description and etag (a hash of
its text) are sealed in every skill event, the skills index and the tools work from them, and
after ``chronicle erase --tenant`` none is in JetStream's files, the archive or the database,
while readers show the tenant's skill events, older unsealed ones included, as tombstones.
The sealing stack of tests/e2e/test_erasure.py, a module's own (this one erases tenant-b)."""

from __future__ import annotations

import hashlib
import json
import uuid
from pathlib import Path
from typing import Any

import httpx

from events.catalog import SkillIndexed
from events.ids import TENANT_SCOPE, derived_id
from services.audit import readers as audit
from services.bootstrap import open_container
from services.settings import Settings
from tests.conftest import KEYS, operator_nats
from tests.e2e.context_support import configure, events, listed, minio, new_bucket, tenant_key, tool
from tests.e2e.test_context_skills import skills_block
from tests.e2e.test_erasure import (  # noqa: F401 - client and sealed: this module's sealing stack
    client,
    files_holding,
    objects_holding,
    sealed,
    tables_holding,
)
from tests.support import chronicle_cli as cli


async def publish_unsealed_v1(settings: Settings, tenant: str, bucket: str, key: str, description: str) -> None:
    """A ``skill.indexed`` as a release before sealing stored it: v1, its fields in plaintext."""
    raw = json.loads(
        SkillIndexed(
            tenant=tenant, session=TENANT_SCOPE, bucket=bucket, key=key, description=description, etag="e1", size=3
        ).to_json()
    )
    nc = await operator_nats(settings.nats_url)
    try:
        js = nc.jetstream()
        subject = settings.layout().session_subject(tenant, TENANT_SCOPE)
        await js.publish(subject, json.dumps({**raw, "version": 1}).encode(), headers={"Nats-Msg-Id": raw["id"]})
    finally:
        await nc.close()


async def tenant_scope_records(settings: Settings, tenant: str) -> list[dict[str, Any]]:
    """``chronicle replay``'s records of the tenant's tenant-level events (its CLI names sessions only)."""
    async with open_container(settings, create_stream=False) as c:
        return [
            audit.replay_record(stored, c.layout, c.keys)
            async for stored in audit.session_events(c, tenant, TENANT_SCOPE)
        ]


async def test_skill_keys_descriptions_and_etags_are_sealed_and_gone_after_the_tenants_erasure(
    client: httpx.AsyncClient,  # noqa: F811 - the imported fixtures
    sealed: tuple[Settings, Path],  # noqa: F811
    tmp_path: Path,
) -> None:
    settings, store = sealed
    mark = uuid.uuid4().hex[:12]
    title, about, text = f"secret pii {mark} alpha", f"describes pii{mark}desc", f"the body {mark}"
    slug = f"secret-pii-{mark}-alpha"  # set_context's key of the title (services/context/entry_keys.py)
    etag = hashlib.md5(text.encode(), usedforsecurity=False).hexdigest()
    legacy = f"legacy-{uuid.uuid4().hex[:12]}"
    bucket, s = new_bucket(settings), f"skills-{uuid.uuid4().hex[:8]}"  # ids are not sealed
    headers = {"Authorization": f"Bearer {KEYS['tenant-b']}"}
    async with httpx.AsyncClient(base_url=str(client.base_url), headers=headers, timeout=30) as b:
        await configure(b, s, {"blocks": [skills_block(bucket, prefix="skills/")]})
        res, _ = await tool(b, s, "set_context", {"label": "skills", "content": text, "metadata": {"title": title}})
        assert res == f'Indexed "{slug}" in skills.'
        res, _ = await tool(
            b,
            s,
            "set_context",
            {"label": "skills", "content": "second", "metadata": {"title": "gone", "description": about}},
        )
        assert res == 'Indexed "gone" in skills.'
        doc = tmp_path / "skill.md"
        doc.write_text("from the cli")
        put = cli(
            settings,
            "skills",
            "put",
            str(doc),
            "--bucket",
            bucket,
            "--key",
            f"skills/cli-{mark}",
            "--tenant",
            "tenant-b",
        )
        assert put.returncode == 0, put.stderr
        minio(settings).remove_object(bucket, tenant_key("skills/gone", "tenant-b"))
        sync = cli(settings, "skills", "sync", "--bucket", bucket, "--tenant", "tenant-b")
        assert sync.returncode == 0, sync.stderr
        assert "removed 1" in sync.stdout, sync.stdout  # skill.removed, its key sealed
        await publish_unsealed_v1(settings, "tenant-b", bucket, f"skills/{legacy}", "as stored before sealing")

        # the index and the tools read the sealed events (and the unsealed older one)
        await listed(b, s, "skills", f"- cli-{mark}\n- {legacy}: as stored before sealing\n- {slug}: {title}")
        res, _ = await tool(b, s, "load_context", {"label": "skills", "key": slug})
        assert res == text
        res, _ = await tool(b, s, "unload_context", {"label": "skills", "key": slug})
        assert res == f'Unloaded "{slug}" from skills. Context reclaimed.'
        kinds = [(e["event"]["type"], e["event"].get("key")) for e in await events(b, s)]  # opened for the tenant
        assert [k for k in kinds if k[0].startswith("skill.")] == [("skill.loaded", slug), ("skill.unloaded", slug)]

    for needle in (mark, f"pii{mark}desc", etag):
        assert not files_holding(store, needle.encode()), f"{needle} reached JetStream's files"
    assert files_holding(store, legacy.encode())  # the unsealed event is on disk: the search sees the log
    assert tables_holding(settings.database_url, slug)  # materialised: the checks below can fail
    verify = cli(settings, "verify")  # a rebuild from the sealed events equals the live read models
    assert verify.returncode == 0, verify.stdout + verify.stderr
    archived = cli(settings, "archive")
    assert archived.returncode == 0, archived.stderr
    assert objects_holding(settings, mark.encode())[0] == [f"{bucket}/{tenant_key(f'skills/{slug}', 'tenant-b')}"]

    erase = cli(settings, "erase", "--tenant", "tenant-b", "--yes")
    assert erase.returncode == 0, erase.stderr
    for needle in (mark, f"pii{mark}desc", etag):
        assert not files_holding(store, needle.encode())
        assert tables_holding(settings.database_url, needle) == []
        assert objects_holding(settings, needle.encode())[0] == []  # the archive's segments too
    records = await tenant_scope_records(settings, "tenant-b")
    assert records
    assert all("erased" in r for r in records[:-1]), records  # the unsealed v1 one too
    assert records[-1]["event"]["type"] == "session.erased"
    assert legacy not in json.dumps(records)
    # nor does an id confirm a guess: a sealed skill's is keyed with the tenant scope's data key
    assert derived_id("skill", "tenant-b", bucket, f"skills/{slug}", etag, title) not in json.dumps(records)
    rebuild = cli(settings, "rebuild")
    assert rebuild.returncode == 0, rebuild.stdout + rebuild.stderr
    assert tables_holding(settings.database_url, legacy) == []
