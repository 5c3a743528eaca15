"""``message.appended`` v3 and ``message.updated`` v2: stored compact, read as before (issue #13).

What the inline body gives exactly (``message_id``, ``role``, ``body_sha256``) and unset optionals
are left out of the stored JSON; the model still has every field. Older versions decode to the
same values; a sealed or claim-checked event keeps what it needs explicit."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from events.admission import Refused, admit, admit_built
from events.blobs import BlobRef
from events.catalog import (
    DERIVED_FIELDS,
    NULL_OMITTED,
    MessageAppended,
    MessageBodyEvent,
    MessageUpdated,
)
from events.messages import body_hash
from events.registry import decode
from events.sealing import SEALED, StaticKeys, new_data_key, seal_event, tombstone_of
from events.subjects import SubjectLayout
from tests.integration.helpers import appended, text_message

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "events"
LAYOUT = SubjectLayout(partitions=4)
SUBJECT = LAYOUT.session_subject("tenant-a", "s-1")
DROPPED = (*DERIVED_FIELDS, "correlation_id", "causation_id", "message_ref", "original_ref")
"""What issue #13 drops from an inline, unsealed message event."""
TEXT = ("The quarterly report is due on Friday; please collect the numbers from finance. " * 3)[:200]


def fixture(name: str) -> dict[str, Any]:
    raw: dict[str, Any] = json.loads((FIXTURES / name).read_text(encoding="utf-8"))
    return raw


def stored(event: MessageBodyEvent) -> dict[str, Any]:
    raw: dict[str, Any] = json.loads(event.to_json())
    return raw


def body_event(**fields: Any) -> MessageAppended:
    """A ``message.appended`` of one tenant's session, a root unless ``parent_id`` is given."""
    return MessageAppended(**{"tenant": "tenant-a", "session": "s-1", "parent_id": None, **fields})


def ref(digest: str = "a" * 64, size: int = 4096) -> BlobRef:
    return BlobRef(store="memory", key=digest, sha256=digest, size=size)


# -- older versions decode to the same values ------------------------------------------------


@pytest.mark.parametrize(
    ("name", "added"),
    [
        ("message.appended.v2.json", {}),
        ("message.appended.v1.json", {"original_ref": None}),
        ("message.appended.v1.claimcheck.json", {"original_ref": None}),
        ("message.updated.v1.json", {}),
    ],
)
def test_an_older_version_decodes_to_every_value_it_stored(name: str, added: dict[str, Any]) -> None:
    raw = fixture(name)
    event = decode((FIXTURES / name).read_bytes())
    assert event.version == type(event).VERSION > raw["version"]
    assert event.model_dump(mode="json") == {**raw, **added, "version": event.version}


@pytest.mark.parametrize("name", ["message.appended.v2.json", "message.updated.v1.json"])
def test_an_older_version_and_its_compact_form_decode_to_equal_models(name: str) -> None:
    old = decode((FIXTURES / name).read_bytes())
    assert isinstance(old, MessageBodyEvent)
    compact = old.to_json()
    assert len(compact) < len(json.dumps(fixture(name), separators=(",", ":"), ensure_ascii=False).encode())
    assert {"message_id", "role"} <= old.left_out()
    assert decode(compact) == old


# -- the compact form --------------------------------------------------------------------------


def test_an_inline_unsealed_message_is_stored_without_what_its_body_gives() -> None:
    event = appended("tenant-a", "s-1", "m1", "m0", TEXT)
    raw = stored(event)
    assert not set(DROPPED) & set(raw)
    assert raw == {
        "id": event.id,
        "type": "message.appended",
        "version": 3,
        "tenant": "tenant-a",
        "session": "s-1",
        "occurred_at": raw["occurred_at"],
        "message": event.message,
        "parent_id": "m0",
    }


def test_the_compact_form_round_trips_to_the_same_model_with_every_field() -> None:
    event = appended("tenant-a", "s-1", "m1", None, TEXT)
    back = decode(event.to_json())
    assert back == event
    assert isinstance(back, MessageAppended)
    assert (back.message_id, back.role, back.body_sha256) == ("m1", "user", body_hash(text_message("m1", TEXT)))
    assert (back.correlation_id, back.causation_id, back.message_ref, back.original_ref) == (None,) * 4
    assert back.parent_id is None
    assert '"parent_id":null' in event.to_json().decode()  # a root is a fact, not an unset field


def test_message_updated_is_stored_compact_and_round_trips() -> None:
    body = text_message("m1", "edited", role="assistant")
    event = MessageUpdated(
        tenant="tenant-a", session="s-1", message_id="m1", role="assistant", body_sha256=body_hash(body), message=body
    )
    assert not set(DROPPED) & set(stored(event))
    assert decode(event.to_json()) == event
    assert admit(event.to_json(), SUBJECT, LAYOUT) == event


def test_set_optionals_are_kept() -> None:
    event = appended("tenant-a", "s-1", "m1", "m0").model_copy(update={"correlation_id": "req-1", "causation_id": "c"})
    raw = stored(event)
    assert (raw["correlation_id"], raw["causation_id"]) == ("req-1", "c")
    assert decode(event.to_json()) == event


def test_a_body_without_a_role_gives_the_empty_role_as_the_writer_records_it() -> None:
    body = {"id": "m1", "parts": []}
    event = body_event(
        message_id="m1",
        role="",
        body_sha256=body_hash(body),
        message=body,
    )
    assert "role" not in stored(event)
    assert decode(event.to_json()) == event


def test_the_publisher_writes_the_compact_bytes() -> None:
    event = appended("tenant-a", "s-1", "m1", None, TEXT)
    subject, data = admit_built(event, LAYOUT)
    assert (subject, data) == (SUBJECT, event.to_json())
    assert admit(data, subject, LAYOUT) == event


# -- what a sealed, claim-checked or capped event keeps ------------------------------------------


def test_a_sealed_event_keeps_its_ids_and_role_readable_and_its_hash_inside_the_seal() -> None:
    keys = StaticKeys()
    key = new_data_key("dk-1")
    keys.put("tenant-a", "s-1", key)
    event = appended("tenant-a", "s-1", "m1", "m0", TEXT)
    data = seal_event(event, event.to_json(), key)
    raw = json.loads(data)
    assert (raw["message_id"], raw["role"], raw["parent_id"]) == ("m1", "user", "m0")
    assert "message" not in raw
    assert "body_sha256" not in raw
    assert TEXT.encode() not in data
    assert not set(NULL_OMITTED) & set(raw)
    assert set(raw[SEALED]) == {"kid", "nonce", "ct"}
    opened = admit(data, SUBJECT, LAYOUT, keys)
    assert opened == event
    keys.erase("tenant-a", "s-1")
    assert tombstone_of(data)["message_id"] == "m1"


def test_an_erased_compact_event_still_shows_its_message_id() -> None:
    data = appended("tenant-a", "s-1", "m1", None).to_json()
    gone = tombstone_of(data)
    assert gone["message_id"] == "m1"
    assert "message" not in gone
    assert "role" not in gone


def test_a_claim_checked_event_keeps_its_id_role_and_hash_explicit() -> None:
    digest = body_hash(text_message("m2", "big"))
    event = body_event(
        message_id="m2",
        role="assistant",
        body_sha256=digest,
        message_ref=ref(),
        parent_id="m1",
    )
    raw = stored(event)
    assert (raw["message_id"], raw["role"], raw["body_sha256"]) == ("m2", "assistant", digest)
    assert raw["message_ref"] == ref().model_dump()
    assert "message" not in raw
    assert "original_ref" not in raw
    assert decode(event.to_json()) == event


@pytest.mark.parametrize("left_out", DERIVED_FIELDS)
def test_a_claim_checked_event_without_an_explicit_field_is_refused_as_invalid(left_out: str) -> None:
    event = body_event(
        message_id="m2",
        role="user",
        body_sha256="b" * 64,
        message_ref=ref(),
    )
    raw = {k: v for k, v in stored(event).items() if k != left_out}
    with pytest.raises(Refused) as caught:
        admit(json.dumps(raw).encode(), SUBJECT, LAYOUT)
    assert caught.value.reason == "invalid"
    assert left_out in caught.value.detail


def test_a_capped_message_keeps_its_originals_hash_explicit() -> None:
    capped = text_message("m1", "short form")
    original_hash = body_hash(text_message("m1", "the whole, much longer text"))
    event = body_event(
        message_id="m1",
        role="user",
        body_sha256=original_hash,
        message=capped,
        original_ref=ref("c" * 64),
    )
    raw = stored(event)
    assert raw["body_sha256"] == original_hash
    assert "message_id" not in raw
    assert "role" not in raw
    assert decode(event.to_json()) == event
    assert admit(event.to_json(), SUBJECT, LAYOUT) == event  # the hash is its original's: admitted
    assert admit_built(event, LAYOUT) == (SUBJECT, event.to_json())


# -- a body_sha256 the inline body does not hash to ------------------------------------------------

WRONG = "d" * 64


def wrong_hash(kind: str) -> MessageBodyEvent:
    """An inline, uncapped body event whose ``body_sha256`` is not its body's."""
    body = text_message("m1", TEXT)
    if kind == "updated":
        return MessageUpdated(
            tenant="tenant-a", session="s-1", message_id="m1", role="user", body_sha256=WRONG, message=body
        )
    return body_event(message_id="m1", role="user", body_sha256=WRONG, message=body)


def assert_wrong_hash(caught: pytest.ExceptionInfo[Refused]) -> None:
    assert caught.value.reason == "invalid"
    assert f"body_sha256 {WRONG!r} is not the SHA-256 of the inline message" in caught.value.detail
    assert body_hash(text_message("m1", TEXT)) in caught.value.detail


@pytest.mark.parametrize("kind", ["appended", "updated"])
def test_an_explicit_body_sha256_the_inline_body_does_not_hash_to_is_refused(kind: str) -> None:
    """Admitted, the read model would store the wrong hash, and the true body appended again under
    its id would be a conflict instead of a replay. The publisher refuses it as the readers do."""
    event = wrong_hash(kind)
    assert stored(event)["body_sha256"] == WRONG  # written out: it is not the body's
    with pytest.raises(Refused) as caught:
        admit(event.to_json(), SUBJECT, LAYOUT)
    assert_wrong_hash(caught)
    with pytest.raises(Refused) as built:
        admit_built(event, LAYOUT)
    assert_wrong_hash(built)


@pytest.mark.parametrize("name", ["message.appended.v1.json", "message.updated.v1.json"])
def test_an_older_version_with_a_wrong_hash_is_refused(name: str) -> None:
    """Older versions write every field: their hash is checked like an explicit v3 one."""
    raw = {**fixture(name), "body_sha256": WRONG}
    with pytest.raises(Refused) as caught:
        admit(json.dumps(raw).encode(), LAYOUT.session_subject(raw["tenant"], raw["session"]), LAYOUT)
    assert caught.value.reason == "invalid"
    assert f"body_sha256 {WRONG!r}" in caught.value.detail


def test_an_older_over_cap_message_keeps_its_originals_hash() -> None:
    """A v2 message with ``original_ref`` carries its original's hash, not its capped body's."""
    raw = {**fixture("message.appended.v2.json"), "body_sha256": WRONG}
    event = admit(json.dumps(raw).encode(), LAYOUT.session_subject(raw["tenant"], raw["session"]), LAYOUT)
    assert isinstance(event, MessageAppended)
    assert event.original_ref is not None
    assert event.body_sha256 == WRONG


def test_an_explicit_body_sha256_that_is_the_bodys_own_is_admitted() -> None:
    """A writer may write the field even when it is the body's (an older client, another language)."""
    event = appended("tenant-a", "s-1", "m1", None, TEXT)
    raw = {**stored(event), "body_sha256": event.body_sha256, "message_id": "m1", "role": "user"}
    assert admit(json.dumps(raw).encode(), SUBJECT, LAYOUT) == event


def test_a_sealed_event_is_checked_once_opened() -> None:
    """The hash of a sealed body is inside the seal, over the plaintext: checked after opening."""
    keys = StaticKeys()
    key = new_data_key("dk-1")
    keys.put("tenant-a", "s-1", key)
    event = wrong_hash("appended")
    data = seal_event(event, event.to_json(), key)
    assert WRONG.encode() not in data
    with pytest.raises(Refused) as caught:
        admit(data, SUBJECT, LAYOUT, keys)
    assert_wrong_hash(caught)
    good = appended("tenant-a", "s-1", "m1", None, TEXT)
    assert admit(seal_event(good, good.to_json(), key), SUBJECT, LAYOUT, keys) == good


def test_a_claim_checked_body_is_not_hashed_at_admission() -> None:
    """Its body is not in the event: its bytes are checked against the reference when fetched."""
    event = body_event(message_id="m2", role="user", body_sha256=WRONG, message_ref=ref())
    assert admit(event.to_json(), SUBJECT, LAYOUT) == event
    assert admit_built(event, LAYOUT) == (SUBJECT, event.to_json())


def test_a_body_naming_a_body_sha256_key_of_its_own_is_admitted_by_the_publisher() -> None:
    """The publisher hashes again only when ``"body_sha256"`` is in the JSON: a message holding
    such a key is hashed, and its (right) hash admitted."""
    body = {**text_message("m1", TEXT), "metadata": {"body_sha256": WRONG}}
    event = body_event(message_id="m1", role="user", body_sha256=body_hash(body), message=body)
    assert "body_sha256" not in stored(event)
    assert admit_built(event, LAYOUT) == (SUBJECT, event.to_json())


# -- a body that disagrees with, or cannot give, a field --------------------------------------


@pytest.mark.parametrize(("field", "value"), [("role", "assistant"), ("message_id", "m-other")])
def test_an_explicit_field_the_body_disagrees_with_is_kept_as_written(field: str, value: str) -> None:
    """As in every earlier version, a field written is the fact: it stays explicit in the stored
    JSON and is read back as written (never replaced by what the body says). Not ``body_sha256``:
    one the inline body does not hash to is refused (below), but for an over-cap message's."""
    event = appended("tenant-a", "s-1", "m1", None).model_copy(update={field: value})
    raw = stored(event)
    assert raw[field] == value
    admitted = admit(event.to_json(), SUBJECT, LAYOUT)
    assert getattr(admitted, field) == value
    assert admitted == event


def test_a_stored_v3_event_with_an_explicit_role_other_than_its_bodys_is_read_as_written() -> None:
    raw = stored(appended("tenant-a", "s-1", "m1", None))
    raw["role"] = "system"
    event = admit(json.dumps(raw).encode(), SUBJECT, LAYOUT)
    assert isinstance(event, MessageAppended)
    assert (event.role, event.message and event.message["role"]) == ("system", "user")
    assert json.loads(event.to_json())["role"] == "system"


@pytest.mark.parametrize(
    ("body", "missing"),
    [
        ({"role": "user", "parts": []}, "message_id"),
        ({"id": 7, "role": "user", "parts": []}, "message_id"),
        ({"id": "m1", "role": ["user"], "parts": []}, "role"),
    ],
)
def test_a_compact_event_whose_body_cannot_give_a_left_out_field_is_refused_as_invalid(
    body: dict[str, Any], missing: str
) -> None:
    raw = {**stored(appended("tenant-a", "s-1", "m1", None)), "message": body}
    with pytest.raises(Refused) as caught:
        admit(json.dumps(raw).encode(), SUBJECT, LAYOUT)
    assert caught.value.reason == "invalid"
    assert missing in caught.value.detail


def test_a_body_that_cannot_give_a_field_writes_it_explicitly() -> None:
    body = {"id": "m1", "role": 5, "parts": []}
    event = body_event(
        message_id="m1",
        role="5",
        body_sha256=body_hash(body),
        message=body,
    )
    raw = stored(event)
    assert raw["role"] == "5"
    assert "message_id" not in raw
    assert "body_sha256" not in raw
    assert decode(event.to_json()) == event


# -- the schema says so --------------------------------------------------------------------------


@pytest.mark.parametrize("model", [MessageAppended, MessageUpdated])
def test_the_schema_does_not_require_what_a_compact_event_leaves_out(model: type[MessageBodyEvent]) -> None:
    schema = model.model_json_schema()
    assert not set(DERIVED_FIELDS) & set(schema.get("required", []))
    assert set(DERIVED_FIELDS) <= set(schema["properties"])
    assert "Stored compact" in schema["description"]
