"""``GET …/messages/{mid}?original=true`` when the over-cap original cannot be read for a reason
of the deployment's, not the caller's: its object gone from the originals bucket (S3 lost or
wiped: the log keeps only the capped form) answers the one ``404`` a reference the session may not
read gets, and the API's log names the missing object, so the operator learns of the loss
(readyz and verify do not see it); a key-encryption key the process lacks is ``500
key_unavailable``, as every other read of the session's sealed data (it was ``404``, as if the
original were gone). Real NATS, Postgres, S3 (moto), the API over HTTP."""

from __future__ import annotations

import logging
import uuid

import httpx
import pytest
from pydantic import SecretStr

from events.blobs import BlobRef
from events.omitted import OMITTED
from projections import queries
from projections.keystore import new_kek_line
from services.api.app import build_app
from services.bootstrap import open_container
from services.settings import Settings
from tests.conftest import KEYS, make_settings, running_stack
from tests.integration.test_micro_compaction import tool_message
from tests.support import served

T = "tenant-a"
AUTH = {"Authorization": f"Bearer {KEYS[T]}"}


async def capped(settings: Settings, sid: str) -> BlobRef:
    """Append a message over the row cap to ``sid``; the reference to its original."""
    async with running_stack(settings) as c:
        body = tool_message("big", {"path": "/tmp/x", "content": "line of text\n" * 3000})
        written = await c.commands.append(T, sid, body, OMITTED)
        await c.waiter.wait_all(written.seq, timeout_s=20)
        async with c.pool.connection() as conn:
            row = await queries.get_message(conn, T, sid, "big")
        assert row is not None
        assert row.original_ref is not None
        return BlobRef.model_validate(row.original_ref)


@pytest.fixture
def settings(nats_url: str, fresh_db: str, s3_endpoint: str) -> Settings:
    return make_settings(nats_url, fresh_db, s3_endpoint=s3_endpoint, row_cap_bytes=20_000, encryption=True)


async def test_an_original_gone_from_its_bucket_is_404_and_logged_for_the_operator(
    settings: Settings, caplog: pytest.LogCaptureFixture
) -> None:
    sid = f"o-{uuid.uuid4().hex[:8]}"
    ref = await capped(settings, sid)
    async with open_container(settings) as c, served(build_app(settings, c)) as url:
        await c.originals.delete(ref)  # the bucket lost
        async with httpx.AsyncClient(base_url=url, headers=AUTH, timeout=30) as http:
            with caplog.at_level(logging.WARNING, logger="chronicle.api"):
                r = await http.get(f"/v1/sessions/{sid}/messages/big", params={"original": "true"})
            assert r.status_code == 404, r.text
            assert r.json()["code"] == "not_found"
            assert "no original this session can read" in r.json()["detail"]
            assert ref.key not in r.text  # the caller learns nothing more
            plain = await http.get(f"/v1/sessions/{sid}/messages/big")
            assert plain.status_code == 200  # the capped form, from the read model
    warned = [rec.getMessage() for rec in caplog.records if rec.levelno == logging.WARNING]
    assert any(ref.key in line and sid in line and settings.originals_bucket in line for line in warned), warned


async def test_an_original_under_a_kek_the_process_lacks_is_500_key_unavailable(settings: Settings) -> None:
    sid = f"o-{uuid.uuid4().hex[:8]}"
    await capped(settings, sid)
    other = settings.model_copy(update={"kek": SecretStr(new_kek_line())})  # rotated in the wrong order
    async with (
        open_container(other) as c,
        served(build_app(other, c)) as url,
        httpx.AsyncClient(base_url=url, headers=AUTH, timeout=30) as http,
    ):
        r = await http.get(f"/v1/sessions/{sid}/messages/big", params={"original": "true"})
    assert r.status_code == 500, r.text
    assert r.headers["content-type"] == "application/problem+json"
    assert r.json()["code"] == "key_unavailable"
