"""Tenants share S3 credentials on the server, so each is confined to its own key space."""

from __future__ import annotations

import uuid

import httpx
import pytest

from services.settings import Settings
from tests.e2e.context_support import new_bucket, put_object


async def test_a_tenant_cannot_read_or_overwrite_another_tenants_objects(
    client: httpx.AsyncClient, client_b: httpx.AsyncClient, api_settings: Settings
) -> None:
    bucket = new_bucket(api_settings)
    put_object(api_settings, bucket, "secret.md", "TENANT A SECRET", tenant="tenant-a")
    s = "iso-" + uuid.uuid4().hex[:8]
    config = {
        "blocks": [
            {"label": "soul", "kind": "readonly", "source": {"bucket": bucket, "key": "secret.md"}},
            {"label": "skills", "kind": "skills", "bucket": bucket, "prefix": ""},
        ]
    }
    put_a = await client.put(f"/v1/sessions/{s}/config", json=config)
    put_b = await client_b.put(f"/v1/sessions/{s}/config", json=config)
    assert (put_a.status_code, put_b.status_code) == (200, 200)
    # each read waits for its own tenant's write (min_seq): without it a read may come first
    read_a = await client.get(f"/v1/sessions/{s}/context", params={"min_seq": put_a.json()["seq"]})
    read_b = await client_b.get(f"/v1/sessions/{s}/context", params={"min_seq": put_b.json()["seq"]})
    assert read_a.json()["blocks"][0]["content"] == "TENANT A SECRET"
    # tenant-b's key names its own (empty) space: the object is missing there, not tenant-a's
    assert (read_b.status_code, read_b.json()["code"]) == (409, "source_missing"), read_b.text
    assert "TENANT A SECRET" not in read_b.text
    loaded = await client_b.post(f"/v1/sessions/{s}/tools/load_context", json={"label": "skills", "key": "secret.md"})
    assert loaded.json()["result"] == "Not found: secret.md"
    await client_b.post(
        f"/v1/sessions/{s}/tools/set_context",
        json={"label": "skills", "content": "overwritten", "metadata": {"title": "secret.md"}},
    )
    a_again = (await client.get(f"/v1/sessions/{s}/context")).json()["blocks"][0]["content"]
    assert a_again == "TENANT A SECRET"


@pytest.mark.parametrize("bucket", ["originals_bucket", "claim_check_bucket", "archive_bucket"])
async def test_chronicles_own_buckets_cannot_be_configured(
    client: httpx.AsyncClient, api_settings: Settings, bucket: str
) -> None:
    s = "iso-" + uuid.uuid4().hex[:8]
    own = getattr(api_settings, bucket)
    config = {"blocks": [{"label": "x", "kind": "readonly", "source": {"bucket": own, "key": "k"}}]}
    r = await client.put(f"/v1/sessions/{s}/config", json=config)
    assert (r.status_code, r.json()["code"]) == (422, "invalid_config")
    assert "reserved" in r.json()["detail"]


@pytest.mark.parametrize("bucket", ["two..dots", "10.0.0.1", "team-s3alias"])
async def test_a_bucket_name_object_storage_refuses_cannot_be_configured(
    client: httpx.AsyncClient, bucket: str
) -> None:
    """The contract admits these (as it always did: a stored config stays admitted); the config
    route refuses them, where a put or a read answered 503 once the client refused the name."""
    s = "iso-" + uuid.uuid4().hex[:8]
    for block in (
        {"label": "x", "kind": "readonly", "source": {"bucket": bucket, "key": "k"}},
        {"label": "x", "kind": "skills", "bucket": bucket},
    ):
        r = await client.put(f"/v1/sessions/{s}/config", json={"blocks": [block]})
        assert (r.status_code, r.json()["code"]) == (422, "invalid_config"), r.text
        assert f"invalid bucket name {bucket!r}" in r.json()["detail"]
    assert (await client.get(f"/v1/sessions/{s}/context")).status_code == 404  # nothing stored
