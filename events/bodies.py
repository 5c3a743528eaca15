"""Packing message bodies into events: inline below the limit, claim check above it."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from events.admission import BodyUnavailable, admit_body
from events.blobs import BlobNotFound, BlobRef, BlobStore
from events.catalog import MessageBodyEvent
from events.messages import JsonObject, body_hash, stored_json
from events.objects import is_sealed_object
from events.sealing import KeyLookup, KeyReader

Sealer = Callable[[bytes], Awaitable[bytes]]
"""How an object's bytes are stored: sealed with the session's data key, or as they are."""


async def pack_body(
    body: JsonObject,
    store: BlobStore | None,
    limit_bytes: int,
    *,
    data: bytes | None = None,
    digest: str | None = None,
    seal: Sealer | None = None,
) -> dict[str, Any]:
    """Event fields for a body: ``message`` inline, or ``message_ref`` when over ``limit_bytes``.

    ``data`` (its :func:`stored_json` bytes) and ``digest`` (its :func:`body_hash`) may be
    passed when the caller has them already; ``seal`` seals a claim-checked object's bytes."""
    data = stored_json(body).encode() if data is None else data
    fields: dict[str, Any] = {"body_sha256": digest or body_hash(body), "role": str(body.get("role", ""))}
    if len(data) <= limit_bytes or store is None:
        if len(data) > limit_bytes:
            raise ValueError(f"message body is {len(data)} bytes and no object store is configured")
        fields["message"] = body
    else:
        fields["message_ref"] = await store.put(await seal(data) if seal is not None else data)
    return fields


async def unpack_body(event: MessageBodyEvent, store: BlobStore | None, keys: KeyLookup | None = None) -> JsonObject:
    """The full body of a message event, fetched from object storage when referenced.

    A reference that can never resolve (the store has no such object, its bytes are not the
    referenced ones or not a JSON object) raises :class:`~events.admission.BodyUnavailable`, a
    decision as stable as the log (objects are immutable, never deleted); a store that cannot
    answer raises its own error, to be retried. A sealed object is opened with the session's key,
    asked for again when ``keys`` loads keys and no longer holds it (a bounded key cache may have
    evicted it since the event was screened: the body is not unavailable for that)."""
    if event.message is not None:
        return event.message
    ref: BlobRef | None = event.message_ref
    assert ref is not None
    if store is None:
        raise LookupError(f"event {event.id} references blob {ref.key} but no store is configured")
    try:
        data = await store.get(ref)
    except BlobNotFound as exc:
        raise BodyUnavailable(f"claim check: {str(exc)[:300]}") from None
    if isinstance(keys, KeyReader) and is_sealed_object(data):
        await keys.load([(event.tenant, event.session, None)])  # a no-op when the key is held
    return admit_body(data, ref, keys, (event.tenant, event.session))
