"""Objects bound to their session (events/objects.py): the owner's header, opening for the
session that references an object, and which objects an erasure may take."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from events.admission import BodyUnavailable, admit_body
from events.blobs import BlobRef, sha256_hex
from events.objects import OWNED_MAGIC, NotTheOwner, belongs_to, open_object, owned, owner_of
from events.sealing import StaticKeys, new_data_key, seal_blob

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
    with pytest.raises(NotTheOwner, match="belongs to session 's-1' of tenant 'tenant-a'"):
        open_object(stored, None, tenant, session)


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
def test_a_header_cut_short_is_no_owner(cut: int) -> None:
    assert owner_of(owned(BODY, "tenant-a", "s-1")[:cut]) is None


def test_claim_check_admission_refuses_another_sessions_object_as_unavailable() -> None:
    stored = owned(BODY, "tenant-a", "s-1")
    assert admit_body(stored, ref_of(stored), None, ("tenant-a", "s-1"))["id"] == "m1"
    with pytest.raises(BodyUnavailable, match="belongs to session 's-1' of tenant 'tenant-a'"):
        admit_body(stored, ref_of(stored), None, ("tenant-b", "s-1"))


def test_an_erasure_takes_the_sessions_own_objects_only() -> None:
    key = new_data_key("dk-1")
    keys = StaticKeys()
    keys.put("tenant-a", "s-1", key)
    assert belongs_to(seal_blob(BODY, key, "tenant-a", "s-1"), "tenant-a", "s-1")
    assert belongs_to(owned(BODY, "tenant-a", "s-1"), "tenant-a", "s-1")
    assert not belongs_to(owned(BODY, "tenant-a", "s-2"), "tenant-a", "s-1")
    assert not belongs_to(owned(BODY, "tenant-b", "s-1"), "tenant-a", "s-1")
    assert not belongs_to(BODY, "tenant-a", "s-1")  # unbound: may be another session's too
