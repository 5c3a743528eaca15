"""Sealing (events/sealing.py) and how the contract admits sealed events: pure, no I/O."""

from __future__ import annotations

import base64
import json

import pytest

from events.admission import Refused, admit, admit_body
from events.blobs import BlobRef, sha256_hex
from events.catalog import (
    ContextWritten,
    PromptRendered,
    SessionErased,
    SkillIndexed,
    SkillLoaded,
    SkillRemoved,
    SkillUnloaded,
    erasure_statement,
)
from events.envelope import Event
from events.ids import TENANT_SCOPE
from events.sealing import (
    SEALED,
    SEALED_FIELDS,
    KeyDestroyed,
    KeyUnavailable,
    StaticKeys,
    new_data_key,
    open_blob,
    seal_blob,
    seal_event,
    seal_event_json,
    sealed_size,
    tombstone_of,
)
from events.subjects import SubjectLayout
from projections.keystore import LocalKek, new_kek_line
from projections.quarantine import ErasureProofs, Quarantined, Tombstone, screen
from tests.integration.helpers import appended

LAYOUT = SubjectLayout(partitions=4)
CANARY = "canary-7f3e-sealed"


def keys_with(tenant: str, session: str) -> tuple[StaticKeys, bytes, str]:
    keys = StaticKeys()
    key = new_data_key("dk-1")
    keys.put(tenant, session, key)
    event = appended(tenant, session, "m1", None, CANARY)
    return keys, seal_event_json(event.to_json(), key), LAYOUT.session_subject(tenant, session)


def test_a_sealed_event_keeps_its_envelope_readable_and_hides_the_personal_fields() -> None:
    _, data, _ = keys_with("tenant-a", "s-1")
    raw = json.loads(data)
    assert CANARY.encode() not in data
    assert {"id", "type", "version", "tenant", "session", "message_id", "parent_id", "role"} <= set(raw)
    assert "message" not in raw
    assert "body_sha256" not in raw
    assert set(raw[SEALED]) == {"kid", "nonce", "ct"}
    assert raw[SEALED]["kid"] == "dk-1"


def test_admission_opens_a_sealed_event_into_the_same_model() -> None:
    keys, data, subject = keys_with("tenant-a", "s-1")
    event = admit(data, subject, LAYOUT, keys)
    assert event == appended("tenant-a", "s-1", "m1", None, CANARY).model_copy(
        update={"id": event.id, "occurred_at": event.occurred_at}
    )


def test_sealing_twice_gives_other_bytes_but_the_same_event_and_id() -> None:
    key = new_data_key("dk-1")
    event = appended("tenant-a", "s-1", "m1", None, CANARY)
    one, two = seal_event_json(event.to_json(), key), seal_event_json(event.to_json(), key)
    assert one != two
    keys = StaticKeys()
    keys.put("tenant-a", "s-1", key)
    subject = LAYOUT.session_subject("tenant-a", "s-1")
    assert admit(one, subject, LAYOUT, keys) == admit(two, subject, LAYOUT, keys) == event


def test_a_destroyed_key_is_an_erasure_not_a_refusal() -> None:
    keys, data, subject = keys_with("tenant-a", "s-1")
    keys.erase("tenant-a", "s-1")
    with pytest.raises(KeyDestroyed):
        admit(data, subject, LAYOUT, keys)
    assert screen(5, subject, data, LAYOUT, keys) == Tombstone(5, subject)


def test_an_erased_sessions_unsealed_events_are_tombstones_but_its_erasure_is_admitted() -> None:
    keys = StaticKeys()
    keys.erase("tenant-a", "s-1")
    subject = LAYOUT.session_subject("tenant-a", "s-1")
    plain = ContextWritten(
        tenant="tenant-a", session="s-1", label="x", content="c", tokens=1, mode="replace", writer="api"
    )
    assert screen(3, subject, plain.to_json(), LAYOUT, keys) == Tombstone(3, subject)
    erased = SessionErased(tenant="tenant-a", session="s-1")
    assert screen(4, subject, erased.to_json(), LAYOUT, keys) == (4, erased)


def test_an_erasure_the_key_store_does_not_know_is_quarantined_and_the_session_kept() -> None:
    """A tenant can publish ``session.erased`` itself; Chronicle's erasure records it first."""
    keys, data, subject = keys_with("tenant-a", "s-1")
    forged = SessionErased(tenant="tenant-a", session="s-1").to_json()
    decided = screen(2, subject, forged, LAYOUT, keys)
    assert isinstance(decided, Quarantined)
    assert (decided.reason, decided.raw) == ("unrecorded_erasure", forged)
    assert not isinstance(screen(3, subject, data, LAYOUT, keys), Tombstone)  # still readable
    keys.erase("tenant-a", "s-1")  # the real erasure: recorded, then published
    assert isinstance(screen(4, subject, forged, LAYOUT, keys), tuple)
    assert screen(5, subject, data, LAYOUT, keys) == Tombstone(5, subject)


class Witness(ErasureProofs):
    """What the key store does with proofs (projections/keystore.py), without a database."""

    def __init__(self, kek: LocalKek, keys: StaticKeys) -> None:
        self.kek, self.keys, self.learned = kek, keys, list[tuple[int, SessionErased]]()

    def proven(self, event: SessionErased) -> bool:
        return event.proof is not None and self.kek.proves(event.proof, event.statement())

    def learn(self, seq: int, event: SessionErased) -> None:
        self.learned.append((seq, event))
        self.keys.erase(event.tenant, event.session)


def proven_erasure(kek: LocalKek, tenant: str, session: str, reason: str | None = "GDPR-1") -> SessionErased:
    proof = kek.prove(erasure_statement(tenant, session, "operator", reason))
    return SessionErased(tenant=tenant, session=session, requested_by="operator", reason=reason, proof=proof)


def test_a_proven_erasure_the_key_store_lost_is_admitted_learned_and_erases_the_session() -> None:
    """A database restored from a backup older than the erasure holds the session's key and no
    record: Chronicle's own ``session.erased`` (its proof holds) is recorded again, not quarantined."""
    keys, data, subject = keys_with("tenant-a", "s-1")
    witness = Witness(LocalKek.parse(new_kek_line()), keys)
    erased = proven_erasure(witness.kek, "tenant-a", "s-1")
    assert screen(2, subject, erased.to_json(), LAYOUT, keys, witness) == (2, erased)
    assert witness.learned == [(2, erased)]
    assert screen(3, subject, data, LAYOUT, keys, witness) == Tombstone(3, subject)
    assert screen(4, subject, erased.to_json(), LAYOUT, keys, witness) == (4, erased)  # again: known, not relearned
    assert len(witness.learned) == 1


@pytest.mark.parametrize(
    "tamper",
    [
        {"proof": None},  # a tenant's own, or one made without a key-encryption key
        {"reason": "another reason"},  # the record is what the proof vouches for
        {"requested_by": "tenant:tenant-a key:000000000000"},
        {"session": "s-2"},  # a proof of one session does not erase another
    ],
    ids=["no-proof", "reason-changed", "requester-changed", "other-session"],
)
def test_an_erasure_whose_proof_does_not_hold_is_quarantined_and_erases_nothing(tamper: dict[str, str | None]) -> None:
    keys, _data, _ = keys_with("tenant-a", "s-1")
    keys.put("tenant-a", "s-2", new_data_key("dk-2"))
    witness = Witness(LocalKek.parse(new_kek_line()), keys)
    forged = proven_erasure(witness.kek, "tenant-a", "s-1").model_copy(update=tamper)
    subject = LAYOUT.session_subject("tenant-a", forged.session)
    decided = screen(2, subject, forged.to_json(), LAYOUT, keys, witness)
    assert isinstance(decided, Quarantined)
    assert decided.reason == "unrecorded_erasure"
    assert witness.learned == []
    assert not keys.erased("tenant-a", "s-1")
    assert not keys.erased("tenant-a", "s-2")


def test_a_proof_made_under_another_key_encryption_key_does_not_hold() -> None:
    keys, _, subject = keys_with("tenant-a", "s-1")
    witness = Witness(LocalKek.parse(new_kek_line()), keys)
    elsewhere = proven_erasure(LocalKek.parse(new_kek_line()), "tenant-a", "s-1")  # another stack's, or a guess
    decided = screen(2, subject, elsewhere.to_json(), LAYOUT, keys, witness)
    assert isinstance(decided, Quarantined)
    assert decided.reason == "unrecorded_erasure"


def test_local_kek_proofs_hold_for_their_statement_and_across_a_rotation() -> None:
    old_line = new_kek_line()
    old = LocalKek.parse(old_line)
    statement = erasure_statement("t", "s", "operator", "why")
    proof = old.prove(statement)
    kek_id, _, mac = proof.partition(":")
    assert kek_id == old.current
    assert len(mac) == 43
    assert old.proves(proof, statement)
    assert not old.proves(proof, erasure_statement("t", "s", "operator", "why not"))
    assert not old.proves(f"{kek_id}:{mac[:-1]}A" if mac[-1] != "A" else f"{kek_id}:{mac[:-1]}B", statement)
    assert not old.proves(f"unknown:{mac}", statement)
    rotated = LocalKek.parse(f"{new_kek_line()},{old_line}")
    assert rotated.proves(proof, statement)  # kept old keys still vouch for what they proved
    assert rotated.prove(statement) != proof  # new proofs are made with the current key


def test_an_erasure_statement_keeps_its_fields_apart() -> None:
    """No choice of fields makes two erasures' statements equal (a JSON array, not a join)."""
    assert erasure_statement("a", "b:c", None, None) != erasure_statement("a:b", "c", None, None)
    assert erasure_statement("t", "s", None, "") != erasure_statement("t", "s", "", None)


def test_a_tampered_seal_or_an_unknown_key_id_is_quarantined_as_invalid() -> None:
    keys, data, subject = keys_with("tenant-a", "s-1")
    raw = json.loads(data)
    raw[SEALED]["ct"] = raw[SEALED]["ct"][:-8] + "AAAAAAA="
    decided = screen(1, subject, json.dumps(raw).encode(), LAYOUT, keys)
    assert isinstance(decided, Quarantined)
    assert decided.reason == "invalid"
    assert "sealed" in decided.detail
    raw = json.loads(data)
    raw[SEALED]["kid"] = "dk-other"
    decided = screen(2, subject, json.dumps(raw).encode(), LAYOUT, keys)
    assert isinstance(decided, Quarantined)
    assert decided.reason == "invalid"


def test_a_seal_moved_to_another_session_does_not_open() -> None:
    keys, data, _ = keys_with("tenant-a", "s-1")
    keys.put("tenant-a", "s-2", keys.key("tenant-a", "s-1", "dk-1"))
    moved = data.replace(b'"session":"s-1"', b'"session":"s-2"')
    with pytest.raises(Refused) as info:
        admit(moved, LAYOUT.session_subject("tenant-a", "s-2"), LAYOUT, keys)
    assert info.value.reason == "invalid"


def test_a_sealed_event_on_another_sessions_subject_is_a_subject_mismatch() -> None:
    keys, data, _ = keys_with("tenant-a", "s-1")
    with pytest.raises(Refused) as info:
        admit(data, LAYOUT.session_subject("tenant-b", "s-1"), LAYOUT, keys)
    assert info.value.reason == "subject_mismatch"


def test_a_sealed_event_without_any_keys_is_a_configuration_error_not_a_refusal() -> None:
    _, data, subject = keys_with("tenant-a", "s-1")
    with pytest.raises(KeyUnavailable):
        admit(data, subject, LAYOUT, None)


def test_sealed_objects_open_with_the_sessions_key_only() -> None:
    keys = StaticKeys()
    key = new_data_key("dk-1")
    keys.put("tenant-a", "s-1", key)
    body = json.dumps({"id": "m1", "role": "user", "parts": [{"type": "text", "text": CANARY}]}).encode()
    sealed = seal_blob(body, key, "tenant-a", "s-1")
    assert CANARY.encode() not in sealed
    assert open_blob(sealed, keys, "tenant-a", "s-1") == body
    ref = BlobRef(store="memory", key=sha256_hex(sealed), sha256=sha256_hex(sealed), size=len(sealed))
    assert admit_body(sealed, ref, keys, ("tenant-a", "s-1"))["parts"][0]["text"] == CANARY
    keys.erase("tenant-a", "s-1")
    with pytest.raises(KeyDestroyed):
        admit_body(sealed, ref, keys, ("tenant-a", "s-1"))


def test_a_tombstone_shows_the_envelope_and_ids_only() -> None:
    _, data, _ = keys_with("tenant-a", "s-1")
    gone = tombstone_of(data)
    assert gone["erased"] is True
    assert gone["message_id"] == "m1"
    assert gone["size"] == len(data)
    assert SEALED not in gone
    assert "role" not in gone


SLUG = f"skills/{CANARY}-alpha"
ETAG = "9b2cf535f27731c974343645a3985328"
SKILL_EVENTS: list[Event] = [
    SkillIndexed(
        tenant="tenant-a",
        session=TENANT_SCOPE,
        bucket="skills",
        key=SLUG,
        description=f"about {CANARY}",
        etag=ETAG,
        size=9,
    ),
    SkillRemoved(tenant="tenant-a", session=TENANT_SCOPE, bucket="skills", key=SLUG),
    SkillLoaded(tenant="tenant-a", session="s-1", label="skills", key=SLUG, tool_call_id="call-1"),
    SkillUnloaded(tenant="tenant-a", session="s-1", label="skills", key=SLUG, message_id="m1", tool_call_id="call-1"),
]


@pytest.mark.parametrize("event", SKILL_EVENTS, ids=lambda e: e.type)
def test_a_skill_event_seals_its_key_description_and_etag_with_its_scopes_key(event: Event) -> None:
    """A skill's key may be made from its title or text, and its etag hashes the document: sealed
    (a tenant-level event with the tenant scope's key), opened back into the same event, and a
    tombstone once that key is destroyed (a tenant's erasure destroys the tenant scope's)."""
    keys = StaticKeys()
    key = new_data_key("dk-1")
    keys.put(event.tenant, event.session, key)
    data = seal_event(event, event.to_json(), key)
    raw = json.loads(data)
    assert CANARY.encode() not in data
    assert ETAG.encode() not in data
    assert not {"key", "description", "etag"} & set(raw)
    assert raw["version"] == type(event).VERSION
    subject = LAYOUT.session_subject(event.tenant, event.session)
    assert admit(data, subject, LAYOUT, keys) == event
    assert len(data) == sealed_size(event, key)
    keys.erase(event.tenant, event.session)
    assert screen(7, subject, data, LAYOUT, keys) == Tombstone(7, subject)
    assert CANARY not in json.dumps(tombstone_of(data))


def test_every_sealed_field_is_a_field_of_its_event_type() -> None:
    from events.registry import CURRENT

    for kind, names in SEALED_FIELDS.items():
        assert set(names) <= set(CURRENT[kind].model_fields), kind


def test_local_kek_wraps_for_its_session_and_rotates() -> None:
    old_line = new_kek_line()
    old = LocalKek.parse(old_line)
    secret = b"k" * 32
    kek_id, wrapped = old.wrap(secret, b"ctx")
    assert old.unwrap(kek_id, wrapped, b"ctx") == secret
    with pytest.raises(KeyUnavailable):
        old.unwrap(kek_id, wrapped, b"other session")
    line = new_kek_line()
    rotated = LocalKek.parse(f"{line},{old_line}")
    assert rotated.current == line.split(":")[0]
    assert rotated.unwrap(kek_id, wrapped, b"ctx") == secret
    with pytest.raises(ValueError, match="32 bytes"):
        LocalKek.parse("k1:" + base64.b64encode(b"short").decode())
    key = base64.b64encode(b"k" * 32).decode()
    for bad in ("k" * 65, "my kek", "kek/1", "kék"):  # an erasure's proof must be able to name it
        with pytest.raises(ValueError, match="key-encryption key id"):
            LocalKek.parse(f"{bad}:{key}")
    assert LocalKek.parse(f"{'k' * 64}:{key}").current == "k" * 64


def test_seal_event_writes_what_seal_event_json_writes_without_parsing_back() -> None:
    keys = StaticKeys()
    key = new_data_key("dk-1")
    keys.put("tenant-a", "s-1", key)
    event = appended("tenant-a", "s-1", "m1", None, CANARY)
    data = seal_event(event, event.to_json(), key)
    raw = json.loads(data)
    assert CANARY.encode() not in data
    assert set(raw) == set(json.loads(seal_event_json(event.to_json(), key)))
    assert admit(data, LAYOUT.session_subject("tenant-a", "s-1"), LAYOUT, keys) == event


def test_a_nul_inside_the_sealed_fields_is_refused_as_in_plain_events() -> None:
    keys = StaticKeys()
    key = new_data_key("dk-1")
    keys.put("tenant-a", "s-1", key)
    event = appended("tenant-a", "s-1", "m1", None, "bad \x00 text")
    with pytest.raises(Refused) as info:
        admit(seal_event_json(event.to_json(), key), LAYOUT.session_subject("tenant-a", "s-1"), LAYOUT, keys)
    assert info.value.reason == "invalid"


def test_an_erased_session_is_the_same_problem_over_http_and_nats_commands() -> None:
    from services.requests.problems import problem_of

    found = problem_of(KeyDestroyed("tenant-a", "s-1"))
    assert found is not None
    assert (found["status"], found["code"]) == (410, "session_erased")


@pytest.mark.parametrize("text", ["", "a", "ab", "abc", "word " * 1000, '\u2550 quotes " and \\ \n\t\x01 ' * 300])
def test_sealed_size_is_the_length_seal_event_makes_without_sealing(text: str) -> None:
    key = new_data_key("dk-measured")
    events = [
        appended("tenant-a", "s-1", "m1", None, text),
        ContextWritten(
            tenant="tenant-a", session="s-1", label="a", content=text, tokens=1, mode="replace", writer="tool"
        ),
        PromptRendered(tenant="tenant-a", session="s-1", text=text, tokens=1, version_no=3, reason="refresh"),
    ]
    for event in events:
        assert sealed_size(event, key) == len(seal_event(event, event.to_json(), key))
