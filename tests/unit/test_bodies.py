"""Claim check: bodies inline below the limit, in the blob store above it, and back again."""

from __future__ import annotations

from typing import Any

import pytest

from events.admission import MAX_DEPTH, REASONS, BodyUnavailable, admit_body
from events.blobs import BlobRef, MemoryBlobStore, sha256_hex
from events.bodies import pack_body, unpack_body
from events.catalog import MessageAppended, MessageUpdated
from events.limits import MAX_ROLE
from events.messages import body_hash, canonical_json, stored_json
from projections.history import InsertMessage, plan, store_json

SMALL: dict[str, Any] = {"id": "m1", "role": "user", "parts": [{"type": "text", "text": "héllo"}]}
LARGE: dict[str, Any] = {
    "role": "assistant",
    "id": "m2",
    "parts": [{"type": "text", "text": "long answer " * 50, "extra": {"kept": True}}],
    "metadata": {"model": "m", "言語": "日本語"},
}
LIMIT = 256


def appended(fields: dict[str, Any], message_id: str) -> MessageAppended:
    return MessageAppended(tenant="acme", session="chat-1", message_id=message_id, parent_id=None, **fields)


def test_sample_sizes() -> None:
    assert len(canonical_json(SMALL)) <= LIMIT < len(canonical_json(LARGE))


async def test_small_body_goes_inline() -> None:
    store = MemoryBlobStore()
    fields = await pack_body(SMALL, store, LIMIT)
    assert fields == {"body_sha256": body_hash(SMALL), "role": "user", "message": SMALL}
    assert store._data == {}


async def test_small_body_without_store_goes_inline() -> None:
    fields = await pack_body(SMALL, None, LIMIT)
    assert fields["message"] == SMALL
    assert "message_ref" not in fields


async def test_body_exactly_at_the_limit_goes_inline() -> None:
    size = len(canonical_json(SMALL))
    fields = await pack_body(SMALL, MemoryBlobStore(), size)
    assert "message" in fields
    fields = await pack_body(SMALL, MemoryBlobStore(), size - 1)
    assert "message_ref" in fields


async def test_large_body_goes_to_the_store() -> None:
    store = MemoryBlobStore()
    fields = await pack_body(LARGE, store, LIMIT)

    data = stored_json(LARGE).encode()
    ref = fields["message_ref"]
    assert set(fields) == {"body_sha256", "role", "message_ref"}
    assert fields["role"] == "assistant"
    assert fields["body_sha256"] == body_hash(LARGE)
    assert isinstance(ref, BlobRef)
    assert ref == BlobRef(store="memory", key=sha256_hex(data), sha256=sha256_hex(data), size=len(data))
    assert await store.get(ref) == data


async def test_equal_large_bodies_share_one_blob() -> None:
    store = MemoryBlobStore()
    first = await pack_body(LARGE, store, LIMIT)
    second = await pack_body(dict(LARGE), store, LIMIT)
    reordered = await pack_body(dict(reversed(list(LARGE.items()))), store, LIMIT)
    assert first["message_ref"] == second["message_ref"]
    # the client's key order is part of what is stored, but the body hash ignores it
    assert reordered["message_ref"] != first["message_ref"]
    assert reordered["body_sha256"] == first["body_sha256"]
    assert len(store._data) == 2


async def test_role_defaults_to_empty() -> None:
    fields = await pack_body({"parts": []}, None, LIMIT)
    assert fields["role"] == ""


async def test_large_body_without_store_is_refused() -> None:
    with pytest.raises(ValueError, match="no object store"):
        await pack_body(LARGE, None, LIMIT)


@pytest.mark.parametrize("body", [SMALL, LARGE], ids=["inline", "claim-check"])
async def test_unpack_returns_the_same_body(body: dict[str, Any]) -> None:
    store = MemoryBlobStore()
    event = appended(await pack_body(body, store, LIMIT), str(body["id"]))
    assert (event.message is None) == (body is LARGE)
    assert await unpack_body(event, store) == body


async def test_unpack_survives_the_json_round_trip_of_the_event() -> None:
    store = MemoryBlobStore()
    event = appended(await pack_body(LARGE, store, LIMIT), "m2")
    back = MessageAppended.model_validate_json(event.to_json())
    assert await unpack_body(back, store) == LARGE


async def test_unpack_works_for_updates() -> None:
    store = MemoryBlobStore()
    event = MessageUpdated(tenant="acme", session="chat-1", message_id="m2", **await pack_body(LARGE, store, LIMIT))
    assert await unpack_body(event, store) == LARGE


async def test_unpack_inline_needs_no_store() -> None:
    event = appended(await pack_body(SMALL, None, LIMIT), "m1")
    assert await unpack_body(event, None) == SMALL


async def test_unpack_reference_without_store_is_a_lookup_error() -> None:
    event = appended(await pack_body(LARGE, MemoryBlobStore(), LIMIT), "m2")
    with pytest.raises(LookupError, match="no store is configured"):
        await unpack_body(event, None)


async def test_unpack_missing_blob_is_a_body_that_can_never_be_had() -> None:
    event = appended(await pack_body(LARGE, MemoryBlobStore(), LIMIT), "m2")
    with pytest.raises(BodyUnavailable, match="no object") as caught:
        await unpack_body(event, MemoryBlobStore())
    assert caught.value.reason == "body_unavailable"
    assert caught.value.reason in REASONS


class Tampered(MemoryBlobStore):
    """A store whose object under a key holds other bytes (what no real store returns)."""

    def __init__(self, data: bytes) -> None:
        super().__init__()
        self.data = data

    async def get(self, ref: BlobRef) -> bytes:
        return self.data


@pytest.mark.parametrize(
    ("data", "why"),
    [
        (b'{"role": "user", "parts": []}', "do not hash"),
        (b"\xff\xfe not json", "not JSON"),
        (b'["a", "list"]', "a JSON list, not an object"),
        (b'"text"', "a JSON str, not an object"),
        (b"[" * 100_000, "not JSON"),
    ],
)
async def test_unpack_refuses_bytes_that_are_not_the_referenced_json_object(data: bytes, why: str) -> None:
    event = appended(await pack_body(LARGE, MemoryBlobStore(), LIMIT), "m2")
    assert event.message_ref is not None
    ref = event.message_ref
    if why != "do not hash":  # the reference names these very bytes: only their content is wrong
        ref = BlobRef(store="memory", key=sha256_hex(data), sha256=sha256_hex(data), size=len(data))
    event = event.model_copy(update={"message_ref": ref})
    with pytest.raises(BodyUnavailable, match=why):
        await unpack_body(event, Tampered(data))
    with pytest.raises(BodyUnavailable, match=why):
        admit_body(data, ref)  # the pure decision, the same every time


def test_admit_body_returns_the_referenced_object() -> None:
    data = stored_json(LARGE).encode()
    ref = BlobRef(store="memory", key=sha256_hex(data), sha256=sha256_hex(data), size=len(data))
    assert admit_body(data, ref) == LARGE


async def test_claim_checked_body_keeps_the_clients_key_order() -> None:
    store = MemoryBlobStore()
    inline = appended(await pack_body(LARGE, store, 10**9), "m2")
    checked = appended(await pack_body(LARGE, store, LIMIT), "m2")
    assert checked.message_ref is not None

    unpacked = await unpack_body(checked, store)

    assert list(unpacked) == list(LARGE)
    inserts = [plan(e, 1, await unpack_body(e, store))[1] for e in (inline, checked)]
    assert all(isinstance(op, InsertMessage) for op in inserts)
    assert [op.content for op in inserts if isinstance(op, InsertMessage)] == [store_json(LARGE)] * 2
    assert store_json(unpacked) == store_json(LARGE)


def test_a_claim_checked_body_nested_deeper_than_an_inline_one_may_be_is_unavailable() -> None:
    """A body in object storage stands where an inline one would (one level below the event): it
    may nest 63 levels, as the event 64; deeper, it is refused as the inline body is."""

    def body(levels: int) -> bytes:
        return ('{"id": "m1", "role": "user", "parts": ' + "[" * levels + "]" * levels + "}").encode()

    for levels, ok in ((MAX_DEPTH - 2, True), (MAX_DEPTH - 1, False), (900, False)):
        data = body(levels)
        ref = BlobRef(store="memory", key=sha256_hex(data), sha256=sha256_hex(data), size=len(data))
        if ok:
            assert admit_body(data, ref)["id"] == "m1"
        else:
            with pytest.raises(BodyUnavailable, match=f"nested deeper than {MAX_DEPTH - 1} levels"):
                admit_body(data, ref)


def test_a_claim_checked_body_whose_role_is_longer_than_the_api_takes_is_unavailable() -> None:
    """A direct publisher's claim-checked body is held to the API's role limit as an inline one is
    (events/limits.py); at the limit it is taken."""
    for role, taken in (("r" * MAX_ROLE, True), ("r" * (MAX_ROLE + 1), False)):
        data = stored_json({**LARGE, "role": role}).encode()
        ref = BlobRef(store="memory", key=sha256_hex(data), sha256=sha256_hex(data), size=len(data))
        if taken:
            assert admit_body(data, ref)["role"] == role
        else:
            with pytest.raises(BodyUnavailable, match=f"role: {MAX_ROLE + 1} characters"):
                admit_body(data, ref)
