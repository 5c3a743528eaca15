"""Event models and the registry: round trips, immutability, strictness, versions and upcasting."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta, timezone
from typing import Any, ClassVar, Literal

import pytest
from pydantic import ValidationError

from events import registry
from events.blobs import BlobRef
from events.catalog import (
    EVENT_TYPES,
    CompactionFailed,
    CompactionRecorded,
    CompactionSkipped,
    ContextWritten,
    MessageAppended,
    MessageBodyEvent,
    MessagesCleared,
    MessagesDeleted,
    MessageUpdated,
    PromptRendered,
    SearchEntryIndexed,
    SessionConfigured,
    SessionCreated,
    SessionDeleted,
    SessionEnded,
    SessionErased,
    SessionRenamed,
    SessionUsageAdded,
    SkillIndexed,
    SkillLoaded,
    SkillRemoved,
    SkillUnloaded,
)
from events.context import CompactionConfig, SessionConfig
from events.envelope import Event
from events.messages import body_hash
from events.registry import UnknownEvent, decode, upcast

AT = datetime(2025, 3, 1, 12, 0, 0, 250_000, tzinfo=UTC)
BODY: dict[str, Any] = {"id": "m1", "role": "user", "parts": [{"type": "text", "text": "héllo"}]}
REF = BlobRef(store="memory", key="ab" * 32, sha256="ab" * 32, size=4096)
ENV: dict[str, Any] = {
    "tenant": "acme",
    "session": "chat-1",
    "occurred_at": AT,
    "correlation_id": "req-1",
    "causation_id": "cmd-1",
}


def sample(event_type: type[Event]) -> Event:
    """One fully filled event of each type."""
    fields: dict[type[Event], dict[str, Any]] = {
        SessionCreated: {"name": "Chat", "parent_session_id": "chat-0", "metadata": {"k": [1, "二"]}},
        SessionRenamed: {"name": "Renamed"},
        SessionDeleted: {},
        SessionErased: {},
        SessionUsageAdded: {"input_tokens": 1200, "output_tokens": 350, "cost": 0.0042},
        SessionEnded: {"reason": "compaction"},
        MessageAppended: {
            "message_id": "m1",
            "role": "user",
            "body_sha256": body_hash(BODY),
            "message": BODY,
            "parent_id": "m0",
        },
        MessageUpdated: {"message_id": "m1", "role": "user", "body_sha256": body_hash(BODY), "message": BODY},
        MessagesDeleted: {"message_ids": ["m1", "m2"]},
        MessagesCleared: {},
        SessionConfigured: {
            "config": SessionConfig.model_validate(
                {
                    "blocks": [
                        {"kind": "readonly", "label": "soul", "content": "Be kind."},
                        {"kind": "writable", "label": "memory", "max_tokens": 100},
                        {"kind": "searchable", "label": "knowledge"},
                        {"kind": "skills", "label": "skills", "bucket": "skills-bucket", "keys": ["tax"]},
                    ],
                    "searchable_history": "history",
                }
            )
        },
        ContextWritten: {"label": "memory", "content": "fact 一", "tokens": 3, "mode": "append", "writer": "api"},
        SearchEntryIndexed: {"label": "knowledge", "key": "deploy", "content": "Deploys on Friday"},
        SkillIndexed: {"bucket": "skills-bucket", "key": "tax", "description": None, "etag": "e1", "size": 10},
        SkillRemoved: {"bucket": "skills-bucket", "key": "tax"},
        SkillLoaded: {"label": "skills", "key": "tax"},
        SkillUnloaded: {"label": "skills", "key": "tax", "message_id": "m1", "tool_call_id": "c1"},
        PromptRendered: {"text": "═══\nMEMORY [writable]", "tokens": 5, "version_no": 1, "reason": "refresh"},
        CompactionRecorded: {
            "overlay_id": "o1",
            "from_message_id": "m1",
            "to_message_id": "m9",
            "leaf_id": "m11",
            "tokens_before": 900,
            "tokens_after": 200,
            "summarizer": "offline",
            "model": None,
            "summary": "## Topic",
        },
        CompactionFailed: {
            "leaf_id": "m11",
            "summarizer": "openai-compatible",
            "error": "HTTP 503",
            "attempt": 4,
            "estimate": 1200,
            "config": CompactionConfig(compact_after=1000),
        },
        CompactionSkipped: {
            "leaf_id": "m11",
            "estimate": 1200,
            "reason": "nothing new to summarise",
            "config": CompactionConfig(compact_after=1000),
        },
    }
    return event_type(**ENV, **fields[event_type])


def type_id(cls: type[Event]) -> str:
    return cls.TYPE


def test_sample_covers_every_event_type() -> None:
    for cls in EVENT_TYPES:
        assert isinstance(sample(cls), cls)


@pytest.mark.parametrize("event_type", EVENT_TYPES, ids=type_id)
def test_round_trip_through_json(event_type: type[Event]) -> None:
    event = sample(event_type)
    assert event.type == event_type.TYPE
    assert event.version == event_type.VERSION

    assert decode(event.to_json()) == event
    assert decode(event.to_json().decode()) == event
    assert decode(json.loads(event.to_json())) == event
    assert type(decode(event.to_json())) is event_type


def test_round_trip_keeps_the_timezone_offset() -> None:
    tokyo = timezone(timedelta(hours=9))
    event = SessionRenamed(**{**ENV, "occurred_at": datetime(2025, 3, 1, 21, 0, tzinfo=tokyo)}, name="n")
    back = decode(event.to_json())
    assert back.occurred_at == event.occurred_at
    assert back.occurred_at.utcoffset() == timedelta(hours=9)


def test_claim_checked_message_round_trips() -> None:
    event = MessageAppended(
        **ENV, message_id="m1", role="user", body_sha256=REF.sha256, message_ref=REF, parent_id=None
    )
    back = decode(event.to_json())
    assert back == event
    assert isinstance(back, MessageAppended)
    assert back.message_ref == REF
    assert back.message is None


def test_defaults_fill_id_and_time() -> None:
    a = SessionDeleted(tenant="acme", session="s")
    b = SessionDeleted(tenant="acme", session="s")
    assert a.id != b.id
    assert a.occurred_at.tzinfo is not None
    assert a.correlation_id is None
    assert a.causation_id is None


@pytest.mark.parametrize("event_type", EVENT_TYPES, ids=type_id)
def test_events_are_frozen(event_type: type[Event]) -> None:
    event = sample(event_type)
    with pytest.raises(ValidationError):
        event.tenant = "other"  # type: ignore[misc]
    with pytest.raises(ValidationError):
        event.id = "other"  # type: ignore[misc]


@pytest.mark.parametrize("event_type", EVENT_TYPES, ids=type_id)
def test_extra_fields_are_rejected(event_type: type[Event]) -> None:
    raw = json.loads(sample(event_type).to_json())
    raw["unexpected"] = 1
    with pytest.raises(ValidationError, match="unexpected"):
        event_type.model_validate(raw)
    with pytest.raises(ValidationError, match="unexpected"):
        decode(raw)


def test_naive_datetime_is_rejected() -> None:
    with pytest.raises(ValidationError):
        SessionDeleted(tenant="acme", session="s", occurred_at=datetime(2025, 3, 1, 12, 0))
    raw = json.loads(sample(SessionDeleted).to_json())
    raw["occurred_at"] = "2025-03-01T12:00:00"
    with pytest.raises(ValidationError):
        decode(raw)


@pytest.mark.parametrize("wrong", [{"type": "session.renamed"}, {"version": 2}])
def test_type_and_version_are_fixed_per_model(wrong: dict[str, Any]) -> None:
    raw = {**json.loads(sample(SessionDeleted).to_json()), **wrong}
    with pytest.raises(ValidationError):
        SessionDeleted.model_validate(raw)


@pytest.mark.parametrize("event_type", [MessageAppended, MessageUpdated], ids=type_id)
def test_message_events_need_exactly_one_body(event_type: type[MessageBodyEvent]) -> None:
    common: dict[str, Any] = {**ENV, "message_id": "m1", "role": "user", "body_sha256": body_hash(BODY)}
    if event_type is MessageAppended:
        common["parent_id"] = None
    with pytest.raises(ValidationError, match="exactly one of message and message_ref"):
        event_type(**common)
    with pytest.raises(ValidationError, match="exactly one of message and message_ref"):
        event_type(**common, message=BODY, message_ref=REF)
    assert event_type(**common, message=BODY)
    assert event_type(**common, message_ref=REF)


def test_message_appended_requires_parent_id_to_be_explicit() -> None:
    with pytest.raises(ValidationError, match="parent_id"):
        MessageAppended(**ENV, message_id="m1", role="user", body_sha256=body_hash(BODY), message=BODY)


@pytest.mark.parametrize("event_id", ["", "x" * 129])
def test_event_id_length_is_bounded(event_id: str) -> None:
    with pytest.raises(ValidationError):
        SessionDeleted(id=event_id, tenant="acme", session="s")


# -- registry -----------------------------------------------------------------------------------


def test_registry_knows_every_event_type() -> None:
    assert {cls.TYPE: cls for cls in EVENT_TYPES} == registry.CURRENT
    assert len(registry.CURRENT) == len(EVENT_TYPES)


def test_unknown_type_is_rejected() -> None:
    raw = {**json.loads(sample(SessionDeleted).to_json()), "type": "session.exploded"}
    with pytest.raises(UnknownEvent, match=r"unknown event type 'session\.exploded'") as refused:
        decode(raw)
    assert refused.value.reason == "unknown_type"


@pytest.mark.parametrize(
    ("kind", "said"),
    [("", "the event's type is empty"), (None, "the event's type is null"), (3, "the event's type is not a string: 3")],
)
def test_a_type_that_names_none_is_rejected_saying_so(kind: object, said: str) -> None:
    """A type that is no type at all is an unknown type, its detail says what it is (it said
    ``unknown event type 'None'`` for null, as if a type were named "None")."""
    raw = {**json.loads(sample(SessionDeleted).to_json()), "type": kind}
    with pytest.raises(UnknownEvent) as refused:
        decode(raw)
    assert (refused.value.reason, refused.value.detail) == ("unknown_type", said)


def test_missing_type_is_rejected_saying_it_has_none() -> None:
    raw = json.loads(sample(SessionDeleted).to_json())
    del raw["type"]
    with pytest.raises(UnknownEvent) as refused:
        decode(raw)
    assert (refused.value.reason, refused.value.detail) == ("unknown_type", "the event has no type field")


def test_newer_version_is_rejected() -> None:
    raw = {**json.loads(sample(SessionRenamed).to_json()), "version": 2}
    with pytest.raises(UnknownEvent, match="newer than this release"):
        decode(raw)


@pytest.mark.parametrize("version", [None, "1", 1.0])
def test_non_integer_version_is_rejected(version: object) -> None:
    raw = {**json.loads(sample(SessionRenamed).to_json()), "version": version}
    with pytest.raises(UnknownEvent, match="no integer version"):
        decode(raw)


def test_older_version_without_upcaster_is_rejected() -> None:
    raw = {**json.loads(sample(SessionRenamed).to_json()), "version": 0}
    with pytest.raises(UnknownEvent, match="no upcaster"):
        decode(raw)


def test_current_version_passes_upcast_unchanged() -> None:
    raw = json.loads(sample(SessionRenamed).to_json())
    assert upcast(dict(raw)) == raw


class SessionRenamedV3(Event):
    """A fake future shape: v2 renamed ``name`` to ``title``, v3 added ``reason``."""

    TYPE: ClassVar[str] = "session.renamed"
    VERSION: ClassVar[int] = 3
    type: Literal["session.renamed"] = "session.renamed"
    version: Literal[3] = 3

    title: str
    reason: str


def v1_to_v2(raw: dict[str, Any]) -> dict[str, Any]:
    out = {k: v for k, v in raw.items() if k != "name"}
    return {**out, "title": raw["name"], "version": 2}


def v2_to_v3(raw: dict[str, Any]) -> dict[str, Any]:
    return {**raw, "reason": "", "version": 3}


def test_upcaster_chain_lifts_v1_to_current(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(registry.CURRENT, "session.renamed", SessionRenamedV3)
    monkeypatch.setattr(registry, "UPCASTERS", {("session.renamed", 1): v1_to_v2, ("session.renamed", 2): v2_to_v3})
    stored = sample(SessionRenamed).to_json()
    original = json.loads(stored)

    event = decode(stored)

    assert isinstance(event, SessionRenamedV3)
    assert event.version == 3
    assert event.title == "Renamed"
    assert event.reason == ""
    assert (event.id, event.tenant, event.session, event.occurred_at) == (
        original["id"],
        original["tenant"],
        original["session"],
        AT,
    )
    # a v2 record needs only the second step
    v2 = v1_to_v2(original)
    assert decode(v2) == event
    # the caller's dict is left alone
    assert v2["version"] == 2
    assert "reason" not in v2


def test_upcaster_chain_with_a_gap_is_rejected(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(registry.CURRENT, "session.renamed", SessionRenamedV3)
    monkeypatch.setattr(registry, "UPCASTERS", {("session.renamed", 1): v1_to_v2})
    with pytest.raises(UnknownEvent, match=r"no upcaster for session\.renamed v2"):
        decode(sample(SessionRenamed).to_json())


def test_monkeypatched_registry_is_restored() -> None:
    assert registry.CURRENT["session.renamed"] is SessionRenamed
    assert v1_to_v2 not in registry.UPCASTERS.values()
    assert v2_to_v3 not in registry.UPCASTERS.values()
