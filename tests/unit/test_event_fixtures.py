"""Stored-JSON fixtures: every event type (and every shipped version) still decodes.

A fixture at the current version must also re-encode to exactly the stored JSON, so a change of
field names, defaults or datetime format in a shipped event is caught here.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from events.catalog import EVENT_TYPES, CompactionFailed, MessageAppended, MessageBodyEvent, SessionErased, SkillLoaded
from events.messages import body_hash
from events.registry import CURRENT, decode

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "events"
NAME = re.compile(r"(?P<type>[a-z_.]+)\.v(?P<version>\d+)(?:\.[a-z0-9_-]+)?\.json")
ENVELOPE = ("id", "type", "version", "tenant", "session", "occurred_at", "correlation_id", "causation_id")

FIXTURE_FILES = sorted(FIXTURES.glob("*.json"))


def load(path: Path) -> dict[str, Any]:
    raw: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    return raw


def test_fixture_folder_is_not_empty() -> None:
    assert FIXTURE_FILES, f"no fixtures in {FIXTURES}"


@pytest.mark.parametrize("event_type", EVENT_TYPES, ids=lambda cls: f"{cls.TYPE}.v{cls.VERSION}")
def test_every_event_type_has_a_fixture(event_type: type[Any]) -> None:
    path = FIXTURES / f"{event_type.TYPE}.v{event_type.VERSION}.json"
    assert path.is_file(), f"missing stored-JSON fixture {path.name} for {event_type.__name__}"


@pytest.mark.parametrize("path", FIXTURE_FILES, ids=lambda p: p.name)
def test_fixture_decodes(path: Path) -> None:
    raw = load(path)
    match = NAME.fullmatch(path.name)
    assert match, f"fixture name {path.name} is not <type>.v<version>[.<variant>].json"
    assert (raw["type"], raw["version"]) == (match["type"], int(match["version"]))
    for field in ENVELOPE:
        assert raw.get(field) is not None, f"{path.name}: envelope field {field} is not filled"

    event = decode(path.read_bytes())

    current = CURRENT[raw["type"]]
    assert type(event) is current
    assert event.type == raw["type"]
    assert event.version == current.VERSION
    if raw["version"] == current.VERSION:
        assert json.loads(event.to_json()) == raw
        dumped = event.model_dump(mode="json")  # a compact event's model has what its JSON leaves out too
        assert {k: v for k, v in dumped.items() if k in raw} == raw
        assert set(dumped) - set(raw) == event.left_out()


def test_fixture_body_hashes_match_their_bodies() -> None:
    events = [decode(path.read_bytes()) for path in FIXTURE_FILES]
    bodies = [event for event in events if isinstance(event, MessageBodyEvent)]
    assert bodies
    for event in bodies:
        if event.message is not None and isinstance(event, MessageAppended) and event.original_ref is not None:
            assert event.role == event.message["role"]  # a capped body: its hash is the original's
        elif event.message is not None:
            assert event.body_sha256 == body_hash(event.message)
            assert event.role == event.message["role"]
        else:
            assert event.message_ref is not None
            assert event.message_ref.key == event.message_ref.sha256 == event.body_sha256


def test_claim_check_fixture_exists() -> None:
    raw = load(FIXTURES / "message.appended.v1.claimcheck.json")
    assert raw["message"] is None
    assert raw["message_ref"] is not None


def test_skill_loaded_v1_is_lifted_to_v3_without_a_tool_call() -> None:
    event = decode((FIXTURES / "skill.loaded.v1.json").read_bytes())
    assert isinstance(event, SkillLoaded)
    assert (event.version, event.tool_call_id, event.key) == (3, None, "tax")


@pytest.mark.parametrize("old", ["skill.indexed.v1", "skill.removed.v1", "skill.loaded.v2", "skill.unloaded.v1"])
def test_an_unsealed_skill_event_of_before_sealing_keeps_its_fields(old: str) -> None:
    """The skill events' versions that sealing added have their predecessors' fields: an event
    stored before (plaintext, never sealed) reads as it was, its key included."""
    raw = load(FIXTURES / f"{old}.json")
    event = decode(json.dumps(raw))
    assert event.version == CURRENT[raw["type"]].VERSION == raw["version"] + 1
    assert json.loads(event.to_json()) == {**raw, "version": event.version}


def test_session_erased_v1_is_lifted_to_v3_naming_no_requester_or_reason_and_proving_nothing() -> None:
    event = decode((FIXTURES / "session.erased.v1.json").read_bytes())
    assert isinstance(event, SessionErased)
    assert (event.version, event.requested_by, event.reason, event.proof) == (3, None, None, None)


def test_session_erased_v2_is_lifted_to_v3_keeping_its_record_and_proving_nothing() -> None:
    event = decode((FIXTURES / "session.erased.v2.json").read_bytes())
    assert isinstance(event, SessionErased)
    assert (event.version, event.requested_by, event.reason, event.proof) == (
        3,
        "tenant:acme key:3f5a9c0d1e2b",
        "ticket GDPR-1234",
        None,
    )


def test_session_erased_refuses_a_proof_that_is_not_key_id_colon_mac() -> None:
    for proof in ("", "no-colon", "kek:has space", "kek:" + "A" * 200, "\x00:abc"):
        with pytest.raises(ValueError, match="proof"):
            SessionErased(tenant="acme", session="s", proof=proof)


def test_session_erased_refuses_a_reason_over_500_characters_or_with_nul() -> None:
    for reason in ("x" * 501, "a\x00b"):
        with pytest.raises(ValueError, match="reason"):
            SessionErased(tenant="acme", session="s", reason=reason)


def test_compaction_failed_v1_is_lifted_to_v2_holding_nothing() -> None:
    """A v1 failure named no estimate or settings: the compaction state lets it hold nothing."""
    event = decode((FIXTURES / "compaction.failed.v1.json").read_bytes())
    assert isinstance(event, CompactionFailed)
    assert (event.version, event.estimate, event.config, event.attempt) == (2, None, None, 2)
