"""Objects bound to their session (events/objects.py): the owner's header, opening for the
session that references an object, and which objects an erasure may take."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from events.admission import BodyUnavailable, admit_body
from events.blobs import BlobRef, MemoryBlobStore, sha256_hex
from events.bodies import unpack_body
from events.catalog import MessageAppended
from events.objects import (
    NOT_THIS_SESSIONS,
    OWNED_MAGIC,
    NotTheOwner,
    belongs_to,
    is_sealed_object,
    open_object,
    owned,
    owner_of,
)
from events.sealing import KeyUnavailable, SealBroken, StaticKeys, is_sealed_blob, new_data_key, seal_blob

BODY = json.dumps({"id": "m1", "role": "user", "parts": [{"type": "text", "text": "words"}]}).encode()


def ref_of(data: bytes) -> BlobRef:
    return BlobRef(store="memory", key=sha256_hex(data), sha256=sha256_hex(data), size=len(data))


def test_an_owned_object_opens_for_its_session_as_the_bytes_it_holds() -> None:
    stored = owned(BODY, "tenant-a", "s-1")
    assert stored.startswith(OWNED_MAGIC)
    assert owner_of(stored) == (("tenant-a", "s-1"), BODY)
    assert open_object(stored, None, "tenant-a", "s-1") == BODY


@pytest.mark.parametrize(("tenant", "session"), [("tenant-b", "s-1"), ("tenant-a", "s-2"), ("tenant-b", "s-2")])
def test_an_owned_object_does_not_open_for_another_session(tenant: str, session: str) -> None:
    stored = owned(BODY, "tenant-a", "s-1")
    with pytest.raises(NotTheOwner) as refused:
        open_object(stored, None, tenant, session)
    assert str(refused.value) == NOT_THIS_SESSIONS  # nothing of the owner


@given(
    tenant=st.from_regex(r"[A-Za-z0-9_-]{1,64}", fullmatch=True),
    session=st.text(st.characters(exclude_categories=["C"]), min_size=1, max_size=128),
    data=st.binary(max_size=200),
)
def test_any_owner_and_bytes_round_trip(tenant: str, session: str, data: bytes) -> None:
    assert owner_of(owned(data, tenant, session)) == ((tenant, session), data)


def test_objects_written_before_owners_open_as_they_are_for_any_session() -> None:
    assert owner_of(BODY) is None
    assert open_object(BODY, None, "tenant-b", "anything") == BODY


@pytest.mark.parametrize("cut", [len(OWNED_MAGIC), len(OWNED_MAGIC) + 1, len(OWNED_MAGIC) + 5])
def test_a_broken_header_opens_for_nobody(cut: int) -> None:
    broken = owned(BODY, "tenant-a", "s-1")[:cut]
    with pytest.raises(NotTheOwner):
        open_object(broken, None, "tenant-a", "s-1")
    assert not belongs_to(broken, "tenant-a", "s-1")
    not_utf8 = OWNED_MAGIC + b"\x00\x02\xff\xfe" + b"\x00\x01s" + BODY
    with pytest.raises(NotTheOwner):
        open_object(not_utf8, None, "tenant-a", "s")


def test_claim_check_admission_refuses_another_sessions_object_as_unavailable() -> None:
    stored = owned(BODY, "tenant-a", "s-1")
    assert admit_body(stored, ref_of(stored), None, ("tenant-a", "s-1"))["id"] == "m1"
    with pytest.raises(BodyUnavailable):
        admit_body(stored, ref_of(stored), None, ("tenant-b", "s-1"))


async def test_another_sessions_object_reads_exactly_as_a_missing_one() -> None:
    store = MemoryBlobStore()
    theirs = owned(BODY, "tenant-a", "s-1")
    await store.put(theirs)
    never = owned(BODY.replace(b"words", b"other"), "tenant-a", "s-1")  # never stored

    async def detail(data: bytes) -> str:
        ref = ref_of(data)
        event = MessageAppended(
            tenant="tenant-b",
            session="s-9",
            message_id="m1",
            parent_id=None,
            role="user",
            body_sha256="0" * 64,
            message_ref=ref,
        )
        with pytest.raises(BodyUnavailable) as refused:
            await unpack_body(event, store)
        return refused.value.detail.replace(ref.key, "<key>")

    assert await detail(theirs) == await detail(never)


def test_a_sealed_object_sits_inside_its_owners_header_and_opens_with_its_key() -> None:
    keys = StaticKeys()
    key = new_data_key("dk-1")
    keys.put("tenant-a", "s-1", key)
    stored = owned(seal_blob(BODY, key, "tenant-a", "s-1"), "tenant-a", "s-1")
    assert is_sealed_object(stored)
    assert not is_sealed_object(owned(BODY, "tenant-a", "s-1"))
    assert open_object(stored, keys, "tenant-a", "s-1") == BODY
    with pytest.raises(NotTheOwner):
        open_object(stored, keys, "tenant-a", "s-2")
    legacy = seal_blob(BODY, key, "tenant-a", "s-1")  # sealed before headers
    assert is_sealed_object(legacy)
    assert open_object(legacy, keys, "tenant-a", "s-1") == BODY
    with pytest.raises(KeyUnavailable):  # s-2 has no such key
        open_object(legacy, keys, "tenant-a", "s-2")
    keys.put("tenant-a", "s-2", key)  # nor does the same key open it for another session
    with pytest.raises(SealBroken):
        open_object(legacy, keys, "tenant-a", "s-2")


def test_an_erasure_takes_the_sessions_own_objects_only() -> None:
    key = new_data_key("dk-1")
    sealed = seal_blob(BODY, key, "tenant-a", "s-1")
    assert is_sealed_blob(sealed)
    assert belongs_to(owned(sealed, "tenant-a", "s-1"), "tenant-a", "s-1")
    assert not belongs_to(owned(sealed, "tenant-a", "s-2"), "tenant-a", "s-1")  # named into s-1 by a forged event
    assert belongs_to(owned(BODY, "tenant-a", "s-1"), "tenant-a", "s-1")
    assert not belongs_to(owned(BODY, "tenant-a", "s-2"), "tenant-a", "s-1")
    assert not belongs_to(owned(BODY, "tenant-b", "s-1"), "tenant-a", "s-1")
    assert belongs_to(sealed, "tenant-a", "s-1")  # sealed before headers: its session's, as before
    assert not belongs_to(BODY, "tenant-a", "s-1")  # plain before headers: may be another session's too
