"""Builders shared by the integration tests."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import httpx
import psycopg
import pytest
from nats.aio.client import Client as NatsClient

from events.blobs import BlobStore
from events.catalog import CompactionRecorded, MessageAppended, MessageBodyEvent, SessionRenamed
from events.ids import derived_id
from events.messages import JsonObject, body_hash, stored_json
from events.objects import owned
from events.publisher import HDR_MSG_ID, Publisher
from events.registry import decode
from events.sealing import DataKey, seal_blob
from projections.rebuild import checksums, rebuild_into
from services.bootstrap import Container
from services.compaction.service import CompactionService
from services.settings import Settings
from services.writes.commands import Commands
from tests.conftest import tenant_nats


def other_process(stack: Container, nc: NatsClient, attempts: int = 100) -> Commands:
    """The stack's command service as another process has it: its own NATS connection (``nc``),
    chains of unapplied appends and turns; its writes race this process's through the log."""
    return Commands(
        Publisher(nc.jetstream(), stack.layout),
        stack.pool,
        stack.waiter,
        stack.blobs,
        payload_limit_bytes=stack.settings.payload_limit_bytes,
        max_message_bytes=stack.settings.max_message_bytes,
        attempts=attempts,
    )


def text_message(mid: str, text: str, role: str = "user") -> dict[str, Any]:
    return {"id": mid, "role": role, "parts": [{"type": "text", "text": text}]}


def logged_message(raw: dict[str, Any]) -> MessageBodyEvent:
    """A message event of the log as the registry reads it, from its raw JSON (``GET …/events``,
    replay): stored compact, its ``message_id``, ``role`` and ``body_sha256`` may be left out
    there, given by its body."""
    event = decode(raw)
    assert isinstance(event, MessageBodyEvent)
    return event


def appended(
    tenant: str, session: str, mid: str, parent: str | None, text: str = "hello", role: str = "user"
) -> MessageAppended:
    body = text_message(mid, text, role)
    return MessageAppended(
        tenant=tenant,
        session=session,
        message_id=mid,
        parent_id=parent,
        role=role,
        body_sha256=body_hash(body),
        message=body,
    )


def summary_recorded(
    tenant: str, session: str, first: str, last: str, summary: str = "what was said"
) -> CompactionRecorded:
    """An overlay over ``first..last`` under the id a compactor derives for it (a UUID: history
    shows it as ``compaction_<that id>``)."""
    overlay_id = derived_id("overlay", tenant, session, first, last)
    return CompactionRecorded(
        id=overlay_id,
        tenant=tenant,
        session=session,
        overlay_id=overlay_id,
        from_message_id=first,
        to_message_id=last,
        leaf_id=last,
        tokens_before=100,
        tokens_after=10,
        summarizer="test",
        model=None,
        summary=summary,
    )


async def sealed_claim_check(
    blobs: BlobStore, key: DataKey, tenant: str, session: str, mid: str, body: JsonObject
) -> MessageAppended:
    """``message.appended`` of ``body`` claim-checked: its object sealed with ``key`` and bound to
    the session, put in ``blobs``."""
    ref = await blobs.put(owned(seal_blob(stored_json(body).encode(), key, tenant, session), tenant, session))
    return MessageAppended(
        tenant=tenant,
        session=session,
        message_id=mid,
        parent_id=None,
        role=str(body.get("role", "")),
        body_sha256=body_hash(body),
        message_ref=ref,
    )


def chain(tenant: str, session: str, n: int, prefix: str = "m") -> list[MessageAppended]:
    """``n`` messages, each the child of the previous one, built client-side (bulk path)."""
    out: list[MessageAppended] = []
    parent: str | None = None
    for i in range(n):
        mid = f"{prefix}{i}"
        out.append(appended(tenant, session, mid, parent, f"message number {i} about {session}"))
        parent = mid
    return out


async def take_event_id(settings: Settings, tenant: str, event_id: str) -> int:
    """``tenant``, with its own NATS credentials, publishes one of its own events on its own
    subject under ``event_id`` (all its permissions allow), taking the id for the stream's
    duplicate window; the stream sequence it got."""
    nc = await tenant_nats(settings.nats_url, tenant)
    try:
        own = SessionRenamed(id=event_id, tenant=tenant, session=f"own-{uuid.uuid4().hex[:8]}", name="mine")
        subject = settings.layout().session_subject(tenant, own.session)
        ack = await nc.jetstream().publish(subject, own.to_json(), headers={HDR_MSG_ID: event_id})
    finally:
        await nc.close()
    assert not ack.duplicate
    return int(ack.seq)


async def assert_rebuild_equals_live(c: Container, db: str, name: str, schema: str = "shadow") -> None:
    """Replaying the log into ``schema`` of ``db`` gives the live read models' rows (whole rows)."""
    async with await psycopg.AsyncConnection.connect(db) as conn:
        live = await checksums(conn, "public")
    await rebuild_into(c.js, c.layout, db, schema, c.projections(), name, keys=c.keys)
    async with await psycopg.AsyncConnection.connect(db) as conn:
        assert await checksums(conn, schema) == live


def fault_after_overlay(
    monkeypatch: pytest.MonkeyPatch, owner: type, method: str, error: Exception | None, delay_s: float = 0.0
) -> list[int]:
    """``owner.method``, at its first call after a compaction's overlay is published (the overlay
    is then in the log), waits ``delay_s`` and raises ``error`` (None: then does its work); the
    sequences of the overlays published."""
    publish = CompactionService._publish_unless_changed
    original = getattr(owner, method)
    published: list[int] = []
    faulted: list[int] = []

    async def recording(self: CompactionService, *args: Any, **kwargs: Any) -> Any:
        done = await publish(self, *args, **kwargs)
        if done is not None:
            published.append(done.seq)
        return done

    async def faulty(self: object, *args: Any, **kwargs: Any) -> Any:
        if len(faulted) < len(published):
            faulted.append(published[-1])
            await asyncio.sleep(delay_s)
            if error is not None:
                raise error
        return await original(self, *args, **kwargs)

    monkeypatch.setattr(CompactionService, "_publish_unless_changed", recording)
    monkeypatch.setattr(owner, method, faulty)
    return published


def tenant_client(app: Any, tenant: str) -> httpx.AsyncClient:
    """An HTTP client of the API app ``app`` in this process, with ``tenant``'s key (``KEYS``)."""
    from tests.conftest import KEYS

    return httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://c", headers={"Authorization": f"Bearer {KEYS[tenant]}"}
    )


async def all_pages(
    http: httpx.AsyncClient, sid: str, route: str, key: str, params: dict[str, Any]
) -> list[dict[str, Any]]:
    """Every page of a session's list (``GET /v1/sessions/{sid}/{route}``) by its ``next_cursor``
    (each page checked: one that says another follows holds ``key`` items)."""
    pages: list[dict[str, Any]] = []
    cursor: int | None = None
    while True:
        r = await http.get(
            f"/v1/sessions/{sid}/{route}", params=params | ({"cursor": cursor} if cursor is not None else {})
        )
        assert r.status_code == 200, r.text
        pages.append(r.json())
        cursor = r.json()["next_cursor"]
        if cursor is None:
            return pages
        assert r.json()[key], "a page that says another follows holds something"
        assert len(pages) < 100
