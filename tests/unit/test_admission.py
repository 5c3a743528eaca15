"""The contract's one validation: every reason, the escape fast path, determinism, publishers."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, cast

import pytest
from nats.js import JetStreamContext
from pydantic import ValidationError

from events import admission
from events.admission import (
    MAX_DEPTH,
    MAX_EVENT_BYTES,
    REASONS,
    Refused,
    admit,
    admit_built,
    has_bad_chars,
    scrub,
    too_deep,
)
from events.catalog import (
    MessageAppended,
    MessagesDeleted,
    SessionCreated,
    SessionRenamed,
    SkillIndexed,
    SkillLoaded,
    SkillRemoved,
    SkillUnloaded,
)
from events.commands import RenameSession, RunTool
from events.context import is_bucket_name
from events.envelope import Event
from events.ids import TENANT_SCOPE
from events.limits import MAX_ROLE, MAX_SESSION_NAME, MAX_TOOL_CALL_ID
from events.messages import UIMessage, body_hash
from events.publisher import Publisher
from events.subjects import SubjectLayout, partition_of
from services.api.bodies import CreateSessionBody
from tests.integration.helpers import appended

LAYOUT = SubjectLayout(partitions=4)
FIXTURES = Path(__file__).parents[1] / "fixtures" / "events"


def good(session: str = "s-1") -> tuple[bytes, str]:
    event = appended("tenant-a", session, "m1", "m0", "hello")
    return event.to_json(), LAYOUT.session_subject("tenant-a", session)


def raw_of(data: bytes) -> dict[str, Any]:
    out: dict[str, Any] = json.loads(data)
    return out


def edited(**fields: Any) -> bytes:
    data, _ = good()
    return json.dumps({**raw_of(data), **fields}).encode()


def reason(data: bytes, subject: str | None = None) -> str:
    with pytest.raises(Refused) as caught:
        admit(data, subject or good()[1], LAYOUT)
    assert caught.value.reason in REASONS
    assert caught.value.detail
    return caught.value.reason


def test_a_good_event_is_admitted_as_its_model() -> None:
    data, subject = good()
    event = admit(data, subject, LAYOUT)
    assert event.to_json() == data


@pytest.mark.parametrize("path", sorted(FIXTURES.glob("*.json")), ids=lambda p: p.name)
def test_every_stored_fixture_is_admitted_under_its_own_subject(path: Path) -> None:
    raw = raw_of(path.read_bytes())
    event = admit(path.read_bytes(), LAYOUT.session_subject(raw["tenant"], raw["session"]), LAYOUT)
    assert event.id == raw["id"]


def test_too_large() -> None:
    data = edited(correlation_id="x" * MAX_EVENT_BYTES)
    assert reason(data) == "too_large"


@pytest.mark.parametrize(
    "data",
    [b"not json", b"\xff\xfe{}", b"[1, 2]", b'"a string"', b"{", b'{"a": NaN}', b'{"a": -Infinity}', b"[" * 100_000],
)
def test_not_json(data: bytes) -> None:
    assert reason(data) == "not_json"


def test_utf16_json_is_not_admitted_although_json_loads_would_read_it() -> None:
    data, _ = good()
    assert reason(json.dumps(raw_of(data)).encode("utf-16")) == "not_json"


@pytest.mark.parametrize(
    "ack",
    [{"stream": LAYOUT.stream, "seq": 7}, {"stream": LAYOUT.stream, "seq": 7, "domain": "d", "duplicate": True}],
)
def test_a_publish_ack_of_this_stream_reflected_onto_a_subject_is_named_so(ack: dict[str, Any]) -> None:
    with pytest.raises(Refused) as refused:
        admit(json.dumps(ack).encode(), good()[1], LAYOUT)
    assert refused.value.reason == "reflected_ack"
    assert "sequence 7 of this stream" in refused.value.detail


def test_a_publish_error_answer_reflected_onto_a_subject_is_named_a_reflected_ack() -> None:
    """JetStream answers a refused publish at the reply subject too: a tenant naming another's
    event subject as the reply had it stored there, and it was quarantined as that tenant's
    ``unknown_type 'None'``."""
    answer = {"error": {"code": 400, "err_code": 10071, "description": "wrong last sequence: 5"}}
    for body in (answer, {**answer, "stream": LAYOUT.stream}):
        with pytest.raises(Refused) as refused:
            admit(json.dumps(body).encode(), good()[1], LAYOUT)
        assert refused.value.reason == "reflected_ack"
        assert "refusing a publish (wrong last sequence: 5)" in refused.value.detail
    for other in ({"error": "x"}, {"error": {"code": "400", "description": "d"}}, {**answer, "type": "x"}):
        assert reason(json.dumps(other).encode()) != "reflected_ack"


@pytest.mark.parametrize(
    "body",
    [
        {"stream": "another-stream", "seq": 7},  # not this stream's ack
        {"stream": LAYOUT.stream, "seq": 0},
        {"stream": LAYOUT.stream, "seq": True},
        {"stream": LAYOUT.stream, "seq": "7"},
        {"stream": LAYOUT.stream, "seq": 7, "type": "session.renamed"},  # something else besides
    ],
)
def test_what_is_not_exactly_a_publish_ack_of_this_stream_is_not_called_one(body: dict[str, Any]) -> None:
    assert reason(json.dumps(body).encode()) != "reflected_ack"


def test_unknown_type() -> None:
    assert reason(edited(type="evil.happened")) == "unknown_type"


def test_newer_version() -> None:
    assert reason(edited(version=4)) == "newer_version"


@pytest.mark.parametrize("version", [None, True, 0, "2"])
def test_a_version_that_is_no_version_is_invalid(version: object) -> None:
    assert reason(edited(version=version)) == "invalid"


def test_a_model_violation_is_invalid_with_a_short_detail() -> None:
    with pytest.raises(Refused) as caught:
        admit(edited(message=None, unexpected="x" * 10_000), good()[1], LAYOUT)
    assert caught.value.reason == "invalid"
    assert len(caught.value.detail) < 300


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("session", "a\u0000b"),
        ("message_id", "m\u00001"),
        ("role", "us\u0000er"),
        ("message", {"id": "m1", "role": "user", "parts": [{"type": "text", "text": "a\u0000b"}]}),
        ("message", {"id": "m1", "role": "user", "parts": [], "k\u0000": 1}),
        ("role", "\ud800"),
        ("message", {"id": "m1", "role": "user", "parts": [{"type": "text", "text": "lone \udfff"}]}),
    ],
)
def test_nul_or_lone_surrogate_anywhere_is_invalid(field: str, value: object) -> None:
    assert reason(edited(**{field: value})) == "invalid"


def test_escaped_surrogate_pairs_are_fine() -> None:
    data = edited(role="smile \U0001f600")  # json.dumps escapes it as a surrogate pair
    assert b"\\ud83d\\ude00" in data
    assert admit(data, good()[1], LAYOUT).model_dump()["role"] == "smile \U0001f600"


def test_an_escaped_backslash_before_u0000_is_text_not_nul() -> None:
    data = edited(role="a\\u0000b")
    assert b"\\\\u0000" in data
    assert admit(data, good()[1], LAYOUT).model_dump()["role"] == "a\\u0000b"


def test_has_bad_chars_walks_keys_values_and_deep_nesting() -> None:
    deep: object = "x\u0000"
    for _ in range(5000):
        deep = [deep]
    assert has_bad_chars(deep)
    assert has_bad_chars({"k": [1, {"\ud800": 2}]})
    assert not has_bad_chars({"k": [1, {"a": "\U0001f600"}], "n": None})


def test_the_walk_runs_only_when_an_escape_could_hide_a_bad_character(monkeypatch: pytest.MonkeyPatch) -> None:
    walked: list[object] = []

    def spy(value: object) -> bool:
        walked.append(value)
        return False

    monkeypatch.setattr(admission, "has_bad_chars", spy)
    data, subject = good()
    admit(data, subject, LAYOUT)
    admit(edited(role="\\u0041 is text"), subject, LAYOUT)
    assert walked == []
    admit(edited(role="smile \U0001f600"), subject, LAYOUT)
    assert len(walked) == 1


def deep_message(levels: int) -> dict[str, Any]:
    """A message whose one data part holds ``levels`` nested arrays: in an event (the message at
    level 2, its parts at 3, the part at 4) its deepest array is at level 4 + ``levels``."""
    inner: Any = "bottom"
    for _ in range(levels):
        inner = [inner]
    return {"id": "m1", "role": "user", "parts": [{"type": "data-x", "data": inner}]}


@pytest.mark.parametrize("levels", [MAX_DEPTH - 3, MAX_DEPTH - 4 + 100, 900])
def test_an_event_nested_deeper_than_a_request_may_be_is_invalid(levels: int) -> None:
    """What strict_json refuses in a request body (deeper than 64) the contract refuses in an
    event, published however: before, a message ~960 deep was admitted and made its readers raise."""
    with pytest.raises(Refused) as caught:
        admit(edited(message=deep_message(levels)), good()[1], LAYOUT)
    assert (caught.value.reason, caught.value.detail) == (
        "invalid",
        f"arrays and objects nested deeper than {MAX_DEPTH} levels (the event itself is 1)",
    )
    event = appended("tenant-a", "s-1", "m1", "m0", "hello").model_copy(update={"message": deep_message(levels)})
    with pytest.raises(Refused) as caught:
        admit_built(event, LAYOUT)  # the publisher decides the same
    assert caught.value.reason == "invalid"  # (900 deep, the model's serializer refuses it first)


def test_an_event_exactly_as_deep_as_a_request_may_be_is_admitted() -> None:
    data = edited(message=deep_message(MAX_DEPTH - 4))
    assert not too_deep(raw_of(data), MAX_DEPTH)
    assert too_deep(raw_of(data), MAX_DEPTH - 1)
    admitted = admit(data, good()[1], LAYOUT)
    assert isinstance(admitted, MessageAppended)
    assert admitted.message == deep_message(MAX_DEPTH - 4)
    deep = deep_message(MAX_DEPTH - 4)
    event = appended("tenant-a", "s-1", "m1", "m0", "hello").model_copy(
        update={"message": deep, "body_sha256": body_hash(deep)}
    )
    assert admit_built(event, LAYOUT)[1] == event.to_json()


def test_the_depth_walk_runs_only_when_the_brackets_could_nest_that_deep(monkeypatch: pytest.MonkeyPatch) -> None:
    """The per-event cost of the limit is two ``bytes.count``: an event with at most 64 brackets
    (nearly every one) is never walked, in the projector or the publisher."""
    walked: list[object] = []

    def spy(value: object, limit: int) -> bool:
        walked.append(value)
        return False

    monkeypatch.setattr(admission, "too_deep", spy)
    data, subject = good()
    admit(data, subject, LAYOUT)
    admit_built(appended("tenant-a", "s-1", "m1", "m0", "hello"), LAYOUT)
    assert walked == []
    many = {"id": "m1", "role": "user", "parts": [{"type": "text", "text": "[{"}] * 40}
    admit(edited(message=many), subject, LAYOUT)
    assert len(walked) == 1


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("tenant", "tenant a"),
        ("session", " padded"),
        ("session", "s" * 129),
        ("message_id", ""),
        ("parent_id", "p\u0007"),
    ],
)
def test_ids_are_checked_as_the_api_checks_them(field: str, value: str) -> None:
    assert reason(edited(**{field: value})) == "invalid"


def test_every_message_id_an_event_names_is_checked() -> None:
    ok = MessagesDeleted(tenant="tenant-a", session="s-1", message_ids=["m1", "m2"])
    subject = LAYOUT.session_subject("tenant-a", "s-1")
    admit(ok.to_json(), subject, LAYOUT)
    bad = json.dumps({**raw_of(ok.to_json()), "message_ids": ["m1", "m2 "]}).encode()
    assert reason(bad, subject) == "invalid"


def test_tenant_scope_events_are_admitted_under_the_tenant_scope_subject() -> None:
    event = SkillIndexed(
        tenant="tenant-a", session=TENANT_SCOPE, bucket="skills", key="k", description=None, etag="e", size=1
    )
    admit(event.to_json(), LAYOUT.session_subject("tenant-a", TENANT_SCOPE), LAYOUT)


def test_a_tenant_other_than_the_subjects_is_a_mismatch() -> None:
    data, _ = good()
    with pytest.raises(Refused) as caught:
        admit(data, LAYOUT.session_subject("tenant-b", "s-1"), LAYOUT)
    assert (caught.value.reason, "tenant" in caught.value.detail) == ("subject_mismatch", True)


def test_a_session_other_than_the_subjects_is_a_mismatch() -> None:
    data, _ = good("s-1")
    assert reason(data, LAYOUT.session_subject("tenant-a", "s-2")) == "subject_mismatch"


def test_a_wrong_partition_token_is_a_mismatch() -> None:
    data, subject = good()
    part = partition_of("tenant-a", "s-1", LAYOUT.partitions)
    wrong = subject.replace(f".p{part:03d}.", f".p{(part + 1) % LAYOUT.partitions:03d}.")
    with pytest.raises(Refused) as caught:
        admit(data, wrong, LAYOUT)
    assert (caught.value.reason, "partition" in caught.value.detail) == ("subject_mismatch", True)


@pytest.mark.parametrize(
    "subject",
    ["elsewhere.tenant-a.p000.s-1", "chronicle.ev.tenant-a.s-1", "chronicle.ev.tenant-a.p000.~!!", "chronicle.ev.~"],
)
def test_a_subject_that_is_not_a_session_subject_is_a_mismatch(subject: str) -> None:
    assert reason(good()[0], subject) == "subject_mismatch"


def test_the_same_bytes_and_subject_always_get_the_same_decision() -> None:
    cases = [good(), (edited(type="x"), good()[1]), (b"{", "a.b"), (good()[0], "chronicle.ev.tenant-b.p000.s-1")]
    for data, subject in cases:
        outcomes = set()
        for _ in range(3):
            try:
                outcomes.add(("admitted", admit(data, subject, LAYOUT).to_json()))
            except Refused as exc:
                outcomes.add((exc.reason, exc.detail.encode()))
        assert len(outcomes) == 1


@pytest.mark.parametrize("path", sorted(FIXTURES.glob("*.json")), ids=lambda p: p.name)
def test_a_built_event_is_published_as_admit_would_read_it(path: Path) -> None:
    """The publisher's check (no parse back) gives the bytes and subject that admit admits as the
    same event."""
    raw = raw_of(path.read_bytes())
    event = admit(path.read_bytes(), LAYOUT.session_subject(raw["tenant"], raw["session"]), LAYOUT)
    subject, data = admit_built(event, LAYOUT)
    assert admit(data, subject, LAYOUT) == event


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("session", "a\u0000b"),
        ("message_id", "m\u00001"),
        ("role", "\ud800"),
        ("message", {"id": "m1", "role": "user", "parts": [{"type": "text", "text": "lone \udfff"}]}),
        ("message", {"id": "m1", "role": "user", "parts": [], "k\u0000": 1}),
        ("tenant", "tenant a"),
        ("session", " padded"),
        ("session", "s" * 129),
        ("parent_id", "p\u0007"),
    ],
)
def test_a_built_event_is_refused_for_the_reason_its_bytes_would_be(field: str, value: object) -> None:
    expected = reason(edited(**{field: value}))
    built = appended("tenant-a", "s-1", "m1", "m0", "hello")  # every field: the body below may give none
    event = MessageAppended.model_validate({**built.model_dump(), field: value})
    with pytest.raises(Refused) as caught:
        admit_built(event, LAYOUT)
    assert caught.value.reason == expected


class RecordingJs:
    def __init__(self) -> None:
        self.published: list[str] = []

    async def publish_async(self, subject: str, payload: bytes, **_: object) -> object:
        self.published.append(subject)
        raise AssertionError("nothing should be published")


async def test_the_publisher_refuses_what_a_projector_would_refuse_and_publishes_nothing() -> None:
    js = RecordingJs()
    publisher = Publisher(cast(JetStreamContext, js), LAYOUT)
    fine = appended("tenant-a", "s-1", "m1", None)
    bad = appended("tenant-a", "s-1", "m2", "m1", "a\u0000b")
    with pytest.raises(Refused) as caught:
        await publisher.publish_many([fine, bad])
    assert caught.value.reason == "invalid"
    with pytest.raises(Refused):
        await publisher.publish(bad)
    assert js.published == []


def test_scrub_makes_free_text_admissible() -> None:
    assert scrub("a\u0000b\ud800c\U0001f600") == "a\ufffdb\ufffdc\U0001f600"
    assert not has_bad_chars(scrub("x\u0000"))


def _limited_events(extra: int) -> list[tuple[str, Event]]:
    """(field, event) for each text field the API bounds, ``extra`` characters past its limit."""
    role, call = "r" * (MAX_ROLE + extra), "t" * (MAX_TOOL_CALL_ID + extra)
    return [
        ("name", SessionCreated(tenant="tenant-a", session="s-1", name="n" * (MAX_SESSION_NAME + extra))),
        ("name", SessionRenamed(tenant="tenant-a", session="s-1", name="n" * (MAX_SESSION_NAME + extra))),
        ("role", appended("tenant-a", "s-1", "m1", None, role=role)),
        (  # a role written in the event wins there, not in its body, which history serves
            "message.role",
            appended("tenant-a", "s-1", "m1", None, role=role).model_copy(update={"role": "user"}),
        ),
        (
            "tool_call_id",
            SkillLoaded(tenant="tenant-a", session="s-1", label="sk", key="k", tool_call_id=call),
        ),
        (
            "tool_call_id",
            SkillUnloaded(tenant="tenant-a", session="s-1", label="sk", key="k", tool_call_id=call),
        ),
    ]


@pytest.mark.parametrize(("field", "event"), _limited_events(1), ids=lambda v: v if isinstance(v, str) else v.type)
def test_a_field_longer_than_the_api_takes_is_too_long_for_readers_and_publishers(field: str, event: Event) -> None:
    """A direct publisher cannot store what a request could not: each reader refuses it as
    ``too_long``, naming the field, and so does a publisher built on the contract."""
    subject = LAYOUT.session_subject(event.tenant, event.session)
    with pytest.raises(Refused) as caught:
        admit(event.to_json(), subject, LAYOUT)
    assert caught.value.reason == "too_long"
    assert caught.value.detail.startswith(f"{field}: ")
    with pytest.raises(Refused) as built:
        admit_built(event, LAYOUT)
    assert (built.value.reason, built.value.detail) == ("too_long", caught.value.detail)


@pytest.mark.parametrize(("field", "event"), _limited_events(0), ids=lambda v: v if isinstance(v, str) else v.type)
def test_a_field_as_long_as_the_api_takes_is_admitted(field: str, event: Event) -> None:
    subject = LAYOUT.session_subject(event.tenant, event.session)
    assert admit(event.to_json(), subject, LAYOUT) == event
    assert admit_built(event, LAYOUT)[0] == subject


def test_the_api_takes_exactly_what_admission_takes() -> None:
    """The request models bound the same fields with the same numbers (events/limits.py)."""
    with pytest.raises(ValidationError):
        CreateSessionBody(name="n" * (MAX_SESSION_NAME + 1))
    assert CreateSessionBody(name="n" * MAX_SESSION_NAME).name
    with pytest.raises(ValidationError):
        RenameSession(session_id="s", name="n" * (MAX_SESSION_NAME + 1))
    with pytest.raises(ValidationError):
        UIMessage.model_validate({"id": "m1", "role": "r" * (MAX_ROLE + 1), "parts": []})
    assert UIMessage.model_validate({"id": "m1", "role": "r" * MAX_ROLE, "parts": []}).role
    with pytest.raises(ValidationError):
        RunTool(session_id="s", name="x", tool_call_id="t" * (MAX_TOOL_CALL_ID + 1))


def test_another_partitions_subject_is_a_subject_mismatch_before_the_version_is_read() -> None:
    """(An event of a newer version on a wrong partition token was quarantined newer_version: an
    upgrade would not have made it right.)"""
    _, own = good()
    part = LAYOUT.partition_token(own)
    assert part is not None
    wrong = own.replace(f".p{part:03d}.", f".p{(part + 1) % 4:03d}.")
    assert reason(edited(version=99), wrong) == "subject_mismatch"
    assert reason(edited(type="evil.happened"), wrong) == "subject_mismatch"
    assert reason(edited(version=99), own) == "newer_version"  # on its own subject, the version decides
    assert reason(edited(tenant="tenant a"), wrong) == "invalid"  # an id the API refuses is invalid first


def test_an_event_without_a_type_is_an_unknown_type_saying_it_has_none() -> None:
    data, subject = good()
    raw = raw_of(data)
    del raw["type"]
    with pytest.raises(Refused) as refused:
        admit(json.dumps(raw).encode(), subject, LAYOUT)
    assert (refused.value.reason, refused.value.detail) == ("unknown_type", "the event has no type field")


def skill_event(kind: type[SkillIndexed | SkillRemoved], bucket: str) -> SkillIndexed | SkillRemoved:
    fields: dict[str, Any] = {"tenant": "acme", "session": TENANT_SCOPE, "bucket": bucket, "key": "k"}
    if kind is SkillIndexed:
        fields |= {"description": None, "etag": "e", "size": 1}
    return kind.model_validate(fields)


@pytest.mark.parametrize("kind", [SkillIndexed, SkillRemoved])
@pytest.mark.parametrize("bucket", ["../not a bucket", "Upper", "ab", "under_score", ""])
def test_a_skill_event_whose_bucket_is_no_bucket_name_is_invalid(
    kind: type[SkillIndexed | SkillRemoved], bucket: str
) -> None:
    """(Admitted, its skills-index row made every ``chronicle erase --tenant`` of the tenant die
    on the minio client's ``ValueError: invalid bucket name``, and a rebuild restored it.)"""
    event = skill_event(kind, bucket)
    subject = LAYOUT.session_subject("acme", TENANT_SCOPE)
    with pytest.raises(Refused) as read:
        admit(event.to_json(), subject, LAYOUT)
    assert (read.value.reason, read.value.detail) == ("invalid", f"bucket: {bucket!r} is not an S3 bucket name")
    with pytest.raises(Refused) as built:
        admit_built(event, LAYOUT)
    assert (built.value.reason, built.value.detail) == (read.value.reason, read.value.detail)


@pytest.mark.parametrize("kind", [SkillIndexed, SkillRemoved])
def test_a_skill_event_in_a_bucket_is_admitted(kind: type[SkillIndexed | SkillRemoved]) -> None:
    event = skill_event(kind, "skills.docs-1")
    assert admit(event.to_json(), LAYOUT.session_subject("acme", TENANT_SCOPE), LAYOUT) == event


@pytest.mark.parametrize(
    "block",
    [
        {"kind": "skills", "label": "s", "bucket": "two..dots"},
        {"kind": "readonly", "label": "r", "source": {"bucket": "10.0.0.1", "key": "k"}},
    ],
)
def test_a_session_config_naming_what_only_s3_refuses_as_a_bucket_is_admitted_as_before(
    block: dict[str, Any],
) -> None:
    """The contract's bucket rule is the pattern it always had: a config admitted before the
    services' fuller rule (services/context/blocks.py) stays admitted, so a rebuild of a log that
    holds one equals the live model; the services refuse such a bucket where they use it."""
    raw = {
        "id": "e-1",
        "type": "session.configured",
        "version": 1,
        "tenant": "acme",
        "session": "s-1",
        "occurred_at": "2026-01-01T00:00:00+00:00",
        "config": {"blocks": [block]},
    }
    admitted = admit(json.dumps(raw).encode(), LAYOUT.session_subject("acme", "s-1"), LAYOUT)
    assert admitted.type == "session.configured"


@pytest.mark.parametrize("kind", [SkillIndexed, SkillRemoved])
@pytest.mark.parametrize("bucket", ["two..dots", "10.0.0.1", "team-s3alias"])
def test_a_skill_event_whose_bucket_only_s3_refuses_is_admitted_as_a_config_is(
    kind: type[SkillIndexed | SkillRemoved], bucket: str
) -> None:
    event = skill_event(kind, bucket)
    assert admit(event.to_json(), LAYOUT.session_subject("acme", TENANT_SCOPE), LAYOUT) == event
    assert not is_bucket_name(bucket)  # the services' rule: an erasure leaves it out, a put refuses it


@pytest.mark.parametrize(
    "occurred_at",
    ["0001-01-01T00:00:00+14:00", "9999-12-31T23:59:59-14:00", "0001-01-01T00:59:00+01:00"],
)
def test_a_time_that_is_no_instant_in_utc_is_refused(occurred_at: str) -> None:
    """An ``occurred_at`` within the datetime range as written but outside it in UTC (year 0 or
    10000): Postgres stored it, and every read of its row then failed (`500`, `timestamp too
    small`): published straight to the stream, it broke its tenant's session list, search and
    compaction."""
    with pytest.raises(Refused) as caught:
        admit(edited(occurred_at=occurred_at), good()[1], LAYOUT)
    assert caught.value.reason == "invalid"
    assert caught.value.detail.startswith("occurred_at: ")
    assert "in UTC" in caught.value.detail


@pytest.mark.parametrize("occurred_at", ["0001-01-01T00:00:00-14:00", "9999-12-31T23:59:59+14:00"])
def test_a_time_at_the_range_edges_that_is_an_instant_in_utc_is_admitted(occurred_at: str) -> None:
    assert admit(edited(occurred_at=occurred_at), good()[1], LAYOUT).occurred_at.year in (1, 9999)
