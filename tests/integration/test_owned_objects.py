"""Objects bound to their session (events/objects.py) on a stack that does not seal: the API
stores a claim-checked body behind its owner's header, its session reads it back, another
session's reference to it is quarantined, and erasing the session deletes it while the objects it
merely references (another session's, one written before owners) stay; an over-cap original is
served to its session only, whatever a reference published straight to the log names. Real NATS
(JetStream object store), Postgres, S3 (moto), the projector, the API over HTTP."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from events.blobs import BlobNotFound, BlobRef, sha256_hex
from events.messages import stored_json
from events.objects import owned, owner_of
from events.omitted import OMITTED
from projections import queries
from services.api.app import build_app
from services.audit import readers as audit
from services.settings import Settings
from tests.conftest import KEYS, make_settings, running_stack
from tests.integration.helpers import appended, text_message
from tests.integration.test_claim_check_quarantine import referencing
from tests.integration.test_micro_compaction import tool_message
from tests.integration.test_quarantine import quarantined
from tests.support import served

LIMIT = 1024


def ref_of(data: bytes) -> BlobRef:
    digest = sha256_hex(data)
    return BlobRef(store="jetstream-object", key=digest, sha256=digest, size=len(data))


def big(mid: str, words: str) -> dict[str, Any]:
    return text_message(mid, words + " " + "x" * (2 * LIMIT))  # over the payload limit: claim-checked


@pytest.fixture
def settings(nats_url: str, fresh_db: str, s3_endpoint: str) -> Settings:
    return make_settings(nats_url, fresh_db, s3_endpoint=s3_endpoint, payload_limit_bytes=LIMIT, encryption=False)


async def test_an_unsealed_claim_check_is_its_sessions_alone_and_goes_with_its_erasure(
    settings: Settings, fresh_db: str
) -> None:
    async with running_stack(settings) as c:
        mine, theirs = big("m1", "x-1's words"), big("m1", "y-1's words")
        await c.commands.append("tenant-a", "x-1", mine, OMITTED)
        other = await c.commands.append("tenant-a", "y-1", theirs, OMITTED)
        own_object = owned(stored_json(mine).encode(), "tenant-a", "x-1")
        their_object = owned(stored_json(theirs).encode(), "tenant-a", "y-1")
        assert owner_of(await c.blobs.get(ref_of(own_object))) == (("tenant-a", "x-1"), stored_json(mine).encode())

        legacy = stored_json(text_message("m3", "written before owners")).encode()  # no header
        await c.blobs.put(legacy)
        subject = c.layout.session_subject("tenant-a", "x-1")
        forged = await c.js.publish(subject, referencing("tenant-a", "x-1", "m2", ref_of(their_object)))
        await c.js.publish(subject, referencing("tenant-a", "x-1", "m3", ref_of(legacy)))
        last = await c.commands.append("tenant-a", "x-1", text_message("m4", "the last"), OMITTED)
        await c.waiter.wait_all(max(last.seq, other.seq), timeout_s=20)

        assert await quarantined(fresh_db) == [(forged.seq, "body_unavailable")]  # y-1's object, named by x-1
        async with c.pool.connection() as conn:
            cur = await conn.execute(
                "SELECT session_id, id, content FROM messages WHERE tenant = 'tenant-a' ORDER BY seq"
            )
            rows = {(s, i): content for s, i, content in await cur.fetchall()}
        assert set(rows) == {("x-1", "m1"), ("y-1", "m1"), ("x-1", "m3"), ("x-1", "m4")}
        assert "x-1's words" in rows[("x-1", "m1")]  # read back without its header
        assert "y-1's words" in rows[("y-1", "m1")]

        erased = await c.eraser.erase_session("tenant-a", "x-1")
        assert erased.objects_deleted == 1
        with pytest.raises(BlobNotFound):
            await c.blobs.get(ref_of(own_object))
        assert await c.blobs.get(ref_of(their_object)) == their_object  # referenced, not x-1's
        assert await c.blobs.get(ref_of(legacy)) == legacy  # unbound: may be anybody's
        await c.waiter.wait_all(erased.seq, timeout_s=20)
        report = await audit.verify(c)  # a rebuild, its object gone, decides as the live models did
        assert report.ok, report.differences


@pytest.mark.parametrize("sealing", [False, True], ids=["plain", "sealed"])
async def test_an_original_is_read_by_its_session_only_whatever_a_published_reference_names(
    nats_url: str, fresh_db: str, s3_endpoint: str, sealing: bool
) -> None:
    settings = make_settings(nats_url, fresh_db, s3_endpoint=s3_endpoint, row_cap_bytes=20_000, encryption=sealing)
    async with running_stack(settings) as c, served(build_app(settings, c)) as url:
        body = tool_message("big", {"path": "/tmp/x", "content": "line of text\n" * 3000})
        capped = await c.commands.append("tenant-a", "x-1", body, OMITTED)
        await c.waiter.wait_all(capped.seq, timeout_s=20)
        async with c.pool.connection() as conn:
            row = await queries.get_message(conn, "tenant-a", "x-1", "big")
        assert row is not None
        assert row.original_ref is not None
        a_original = BlobRef.model_validate(row.original_ref)
        elsewhere = BlobRef(store="s3", key="skills-bucket/notes.md", sha256=a_original.sha256, size=10)
        subject = c.layout.session_subject("tenant-b", "y-1")
        await c.commands.create_session("tenant-b", "y-1", "", None, {})
        for mid, ref in (("m1", a_original), ("m2", elsewhere)):  # published straight to the log
            event = appended("tenant-b", "y-1", mid, None, "small").model_copy(update={"original_ref": ref})
            last = await c.js.publish(subject, event.to_json())
        await c.waiter.wait_all(last.seq, timeout_s=20)

        async with httpx.AsyncClient(base_url=url, timeout=30) as http:
            a = {"Authorization": f"Bearer {KEYS['tenant-a']}"}
            own = await http.get("/v1/sessions/x-1/messages/big", params={"original": "true"}, headers=a)
            assert own.status_code == 200
            assert own.json() == body
            b = {"Authorization": f"Bearer {KEYS['tenant-b']}"}
            for mid in ("m1", "m2"):
                forged = await http.get(f"/v1/sessions/y-1/messages/{mid}", params={"original": "true"}, headers=b)
                assert forged.status_code == 404, forged.text
                assert forged.json()["code"] == "not_found"
                assert "no original this session can read" in forged.json()["detail"]
            plain = await http.get("/v1/sessions/y-1/messages/m1", headers=b)
            assert plain.json() == text_message("m1", "small")  # the message itself reads as published
            # A fork copies each message as history shows it; an original this session cannot read
            # (another session's object, or none) is not carried, as reading it answers 404 (before:
            # the fork answered 500 NotTheOwner). The fork reads as the source branch does.
            for mid in ("m1", "m2"):
                r = await http.post("/v1/sessions/y-1/fork", json={"at_message_id": mid}, headers=b)
                assert r.status_code == 201, r.text
                fork = r.json()["id"]
                await c.waiter.wait_all(r.json()["seq"], timeout_s=20)
                copied = await http.get(f"/v1/sessions/{fork}/messages/{mid}", headers=b)
                assert copied.json() == text_message(mid, "small")
                original = await http.get(f"/v1/sessions/{fork}/messages/{mid}", params={"original": "true"}, headers=b)
                assert original.json() == text_message(mid, "small")  # a message the fork holds uncapped
            # tenant-a's own capped message still forks with its original
            r = await http.post("/v1/sessions/x-1/fork", json={"at_message_id": "big"}, headers=a)
            assert r.status_code == 201, r.text
            await c.waiter.wait_all(r.json()["seq"], timeout_s=20)
            fork = r.json()["id"]
            own = await http.get(f"/v1/sessions/{fork}/messages/big", params={"original": "true"}, headers=a)
            assert own.json() == body
