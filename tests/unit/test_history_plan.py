"""The history projection's pure core: event -> row operations, text extraction, merged touches."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any, ClassVar, Literal

import pytest

from events.admission import admit
from events.blobs import BlobRef
from events.catalog import (
    CompactionRecorded,
    MessageAppended,
    MessageBodyEvent,
    MessagesCleared,
    MessagesDeleted,
    MessageUpdated,
    SessionCreated,
    SessionDeleted,
    SessionEnded,
    SessionRenamed,
    SessionUsageAdded,
)
from events.envelope import Event
from events.messages import body_hash, text_of
from events.sealing import StaticKeys, new_data_key, seal_event
from events.subjects import SubjectLayout
from projections.history import (
    AddUsage,
    ClearMessages,
    CreateSession,
    DeleteMessages,
    DeleteSession,
    EndSession,
    HistoryProjection,
    InsertMessage,
    LeaveOutSummary,
    Op,
    RenameSession,
    TouchSession,
    UpdateMessage,
    merge_touches,
    plan,
    store_json,
    summaries_in,
)
from tests.integration.helpers import summary_recorded

T, S = "acme", "chat-1"
AT = datetime(2025, 3, 1, 12, 0, tzinfo=UTC)
ENV: dict[str, Any] = {"tenant": T, "session": S, "occurred_at": AT}
BODY: dict[str, Any] = {
    "id": "m2",
    "role": "assistant",
    "parts": [
        {"type": "reasoning", "text": "let me think"},
        {"type": "text", "text": "première ligne"},
        {"type": "tool-search", "toolCallId": "c1", "input": {"q": "x"}, "output": "text"},
        {"type": "text", "text": "second line"},
    ],
    "metadata": {"model": "m"},
}
CONTENT = (
    '{"id":"m2","role":"assistant","parts":[{"type":"reasoning","text":"let me think"},'
    '{"type":"text","text":"première ligne"},'
    '{"type":"tool-search","toolCallId":"c1","input":{"q":"x"},"output":"text"},'
    '{"type":"text","text":"second line"}],"metadata":{"model":"m"}}'
)
TOUCH = TouchSession(T, S, AT, 17, AT, 17)


def test_store_json_of_the_sample_body() -> None:
    assert store_json(BODY) == CONTENT


def test_session_created() -> None:
    event = SessionCreated(**ENV, name="Chat", parent_session_id="chat-0", metadata={"k": "v"})
    assert plan(event, 17) == [TOUCH, CreateSession(T, S, "Chat", "chat-0", {"k": "v"})]


def test_session_created_copies_metadata() -> None:
    event = SessionCreated(**ENV, metadata={"k": "v"})
    ops = plan(event, 17)
    create = ops[1]
    assert isinstance(create, CreateSession)
    assert create.metadata == {"k": "v"}
    assert create.metadata is not event.metadata
    assert (create.name, create.parent_session_id) == ("", None)


def test_session_renamed() -> None:
    assert plan(SessionRenamed(**ENV, name="New"), 17) == [TOUCH, RenameSession(T, S, "New")]


def test_session_usage_added() -> None:
    event = SessionUsageAdded(**ENV, input_tokens=12, output_tokens=3, cost=0.5)
    assert plan(event, 17) == [TOUCH, AddUsage(T, S, 12, 3, 0.5, event.id, 17)]


def test_session_ended() -> None:
    assert plan(SessionEnded(**ENV, reason="compaction"), 17) == [TOUCH, EndSession(T, S, "compaction")]


def test_session_deleted() -> None:
    assert plan(SessionDeleted(**ENV), 17) == [TOUCH, DeleteSession(T, S, AT)]


def test_message_appended() -> None:
    event = MessageAppended(
        **ENV, message_id="m2", role="assistant", body_sha256=body_hash(BODY), message=BODY, parent_id="m1"
    )
    assert plan(event, 17, BODY) == [
        TOUCH,
        InsertMessage(T, S, "m2", "m1", "assistant", CONTENT, None, "première ligne\nsecond line", AT, 17),
    ]  # the hash is the body's own: the row stores none (derived where needed)


def test_a_hash_that_is_not_the_bodys_own_is_stored() -> None:
    original = "9" * 64  # an over-cap message: the hash of its original, not of its capped body
    event = MessageAppended(
        **ENV, message_id="m2", role="assistant", body_sha256=original, message=BODY, parent_id=None
    )
    insert = plan(event, 17, BODY)[1]
    assert isinstance(insert, InsertMessage)
    assert insert.body_sha256 == original
    updated = MessageUpdated(**ENV, message_id="m2", role="assistant", body_sha256=original, message=BODY)
    update = plan(updated, 18, BODY)[1]
    assert isinstance(update, UpdateMessage)
    assert update.body_sha256 == original


def test_message_appended_as_root() -> None:
    event = MessageAppended(
        **ENV, message_id="m2", role="assistant", body_sha256=body_hash(BODY), message=BODY, parent_id=None
    )
    insert = plan(event, 17, BODY)[1]
    assert isinstance(insert, InsertMessage)
    assert insert.parent_id is None


def test_message_appended_by_claim_check_uses_the_resolved_body() -> None:
    digest = body_hash(BODY)
    ref = BlobRef(store="memory", key=digest, sha256=digest, size=999)
    event = MessageAppended(
        **ENV, message_id="m2", role="assistant", body_sha256=digest, message_ref=ref, parent_id="m1"
    )
    insert = plan(event, 17, BODY)[1]
    assert isinstance(insert, InsertMessage)
    assert (insert.content, insert.text) == (CONTENT, "première ligne\nsecond line")


def test_message_updated() -> None:
    event = MessageUpdated(**ENV, message_id="m2", role="assistant", body_sha256=body_hash(BODY), message=BODY)
    assert plan(event, 17, BODY) == [
        TOUCH,
        UpdateMessage(T, S, "m2", "assistant", CONTENT, None, "première ligne\nsecond line", 17),
    ]


def test_messages_deleted() -> None:
    event = MessagesDeleted(**ENV, message_ids=["m1", "m2"])
    assert plan(event, 17) == [TOUCH, DeleteMessages(T, S, ("m1", "m2"))]


def test_messages_cleared() -> None:
    assert plan(MessagesCleared(**ENV), 17) == [TOUCH, ClearMessages(T, S)]


class SomethingNew(Event):
    TYPE: ClassVar[str] = "something.new"
    VERSION: ClassVar[int] = 1
    type: Literal["something.new"] = "something.new"
    version: Literal[1] = 1


def test_other_events_only_touch_the_session() -> None:
    assert plan(SomethingNew(**ENV), 17) == [TOUCH]


def test_plan_is_deterministic() -> None:
    event = MessageAppended(
        **ENV, message_id="m2", role="assistant", body_sha256=body_hash(BODY), message=BODY, parent_id="m1"
    )
    assert plan(event, 17, json.loads(json.dumps(BODY))) == plan(event, 17, BODY)


# -- the row's hash: not hashed again where admission did it ------------------------------------

LAYOUT = SubjectLayout(partitions=4)
SUBJECT = LAYOUT.session_subject(T, S)
ORIGINAL = "9" * 64  # an over-cap message's: the hash of its original, not of its capped body


def body_event(kind: type[MessageBodyEvent], **fields: Any) -> MessageBodyEvent:
    """A ``kind`` event of message m2 (an append's parent is m1)."""
    parent = {"parent_id": "m1"} if kind is MessageAppended else {}
    return kind(**ENV, message_id="m2", role="assistant", **parent, **fields)


def admitted(event: MessageBodyEvent, *, sealed: bool = False) -> MessageBodyEvent:
    """``event`` as a projector has it: its stored bytes (sealed, when asked) admitted."""
    keys = StaticKeys()
    key = new_data_key("dk-1")
    keys.put(T, S, key)
    data = seal_event(event, event.to_json(), key) if sealed else event.to_json()
    out = admit(data, SUBJECT, LAYOUT, keys)
    assert isinstance(out, MessageBodyEvent)
    return out


def planned_hash(
    event: MessageBodyEvent, body: dict[str, Any], monkeypatch: pytest.MonkeyPatch, *, admitted: bool
) -> tuple[str | None, int]:
    """The hash the event's insert or update stores, and how many bodies planning it hashed."""
    hashed: list[object] = []

    def counted(value: dict[str, Any]) -> str:
        hashed.append(value)
        return body_hash(value)

    with monkeypatch.context() as patched:
        patched.setattr("projections.history.body_hash", counted)
        op = plan(event, 17, body, admitted=admitted)[1]
    assert isinstance(op, InsertMessage | UpdateMessage)
    return op.body_sha256, len(hashed)


def row_hashes(event: MessageBodyEvent, body: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> tuple[Any, ...]:
    """The hash the row stores, planned as unadmitted and as admitted; what hashing the body
    says it must be; and how many bodies the admitted plan hashed."""
    unadmitted, _ = planned_hash(event, body, monkeypatch, admitted=False)
    stored, hashed = planned_hash(event, body, monkeypatch, admitted=True)
    expected = None if event.body_sha256 == body_hash(body) else event.body_sha256
    return unadmitted, stored, expected, hashed


@pytest.mark.parametrize("kind", [MessageAppended, MessageUpdated])
def test_a_derived_hash_is_the_bodys_own_without_hashing_it_again(
    kind: type[MessageBodyEvent], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Stored compact, the event leaves its hash out: admission derived it from the body."""
    built = body_event(kind, body_sha256=body_hash(BODY), message=BODY)
    assert "body_sha256" not in json.loads(built.to_json())
    event = admitted(built)
    assert row_hashes(event, event.message or {}, monkeypatch) == (None, None, None, 0)


@pytest.mark.parametrize("kind", [MessageAppended, MessageUpdated])
def test_a_verified_hash_is_the_bodys_own_without_hashing_it_again(
    kind: type[MessageBodyEvent], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Sealed, the event writes its hash out (inside the seal): admission checked the body against it."""
    built = body_event(kind, body_sha256=body_hash(BODY), message=BODY)
    event = admitted(built, sealed=True)
    assert row_hashes(event, event.message or {}, monkeypatch) == (None, None, None, 0)


def test_an_over_cap_message_keeps_its_originals_hash(monkeypatch: pytest.MonkeyPatch) -> None:
    ref = BlobRef(store="memory", key="c" * 64, sha256="c" * 64, size=99_999)
    built = body_event(MessageAppended, body_sha256=ORIGINAL, message=BODY, original_ref=ref)
    for event in (admitted(built), admitted(built, sealed=True)):
        assert row_hashes(event, event.message or {}, monkeypatch) == (ORIGINAL, ORIGINAL, ORIGINAL, 1)


def test_a_claim_checked_body_is_hashed(monkeypatch: pytest.MonkeyPatch) -> None:
    """Admission checks a claim check's bytes against its reference, not its hash against the body."""
    ref = BlobRef(store="memory", key="c" * 64, sha256="c" * 64, size=99_999)
    for digest, expected in ((body_hash(BODY), None), (ORIGINAL, ORIGINAL)):
        event = admitted(body_event(MessageAppended, body_sha256=digest, message_ref=ref), sealed=True)
        assert row_hashes(event, BODY, monkeypatch) == (expected, expected, expected, 1)


def test_an_event_nobody_admitted_is_hashed(monkeypatch: pytest.MonkeyPatch) -> None:
    """A plan not told the event was admitted hashes its body (a hash not its own is kept)."""
    for digest, expected in ((body_hash(BODY), None), (ORIGINAL, ORIGINAL)):
        event = body_event(MessageAppended, body_sha256=digest, message=BODY)
        assert planned_hash(event, BODY, monkeypatch, admitted=False) == (expected, 1)


def test_a_body_other_than_the_inline_one_is_hashed(monkeypatch: pytest.MonkeyPatch) -> None:
    """Only the event's own inline body is the one admission hashed."""
    event = admitted(body_event(MessageAppended, body_sha256=body_hash(BODY), message=BODY))
    other = {**BODY, "metadata": {"model": "other"}}
    assert row_hashes(event, other, monkeypatch) == (event.body_sha256, event.body_sha256, event.body_sha256, 1)


# -- text_of and store_json ---------------------------------------------------------------------


# Also the cases of chronicle_search.message_text(), the SQL that derives a stored body's text
# where search shows it (tests/integration/test_search_migration.py).
TEXT_CASES: list[tuple[dict[str, Any], str]] = [
    (BODY, "première ligne\nsecond line"),
    ({"parts": [{"type": "text", "text": "only"}]}, "only"),
    (
        {"parts": [{"type": "text", "text": "a"}, {"type": "text", "text": ""}, {"type": "text", "text": "b"}]},
        "a\n\nb",
    ),
    ({"parts": [{"type": "reasoning", "text": "hidden"}, {"type": "dynamic-tool", "output": "x"}]}, ""),
    ({"parts": [{"type": "text", "text": 3}, {"type": "text"}, "text", None, {"text": "no type"}]}, ""),
    ({"parts": "not a list"}, ""),
    ({}, ""),
    ({"parts": [{"type": "Text", "text": "case matters"}, {"type": ["text"], "text": "x"}]}, ""),
    (
        {"parts": [{"text": 'quote " back \\ nl \n tab \t \u2028 é 🙂', "type": "text", "extra": {"text": "no"}}]},
        'quote " back \\ nl \n tab \t \u2028 é 🙂',
    ),
]


@pytest.mark.parametrize(("body", "text"), TEXT_CASES)
def test_text_of_indexes_only_text_parts(body: dict[str, Any], text: str) -> None:
    assert text_of(body) == text


def test_store_json_keeps_key_order_and_unicode() -> None:
    body = {"role": "user", "id": "m1", "parts": [{"text": "こんにちは 🙂", "type": "text"}], "z": {"b": 1, "a": 2}}
    stored = store_json(body)
    assert stored == '{"role":"user","id":"m1","parts":[{"text":"こんにちは 🙂","type":"text"}],"z":{"b":1,"a":2}}'
    assert json.loads(stored) == body
    assert list(json.loads(stored)) == list(body)


# -- merge_touches ------------------------------------------------------------------------------


def touch(tenant: str, session: str, minute: int, seq: int) -> TouchSession:
    at = AT + timedelta(minutes=minute)
    return TouchSession(tenant, session, at, seq, at, seq)


def test_merge_touches_keeps_first_creation_and_last_position() -> None:
    ops: list[Op] = [
        touch(T, "a", 0, 10),
        ClearMessages(T, "a"),
        touch(T, "b", 1, 11),
        touch(T, "a", 2, 12),
        RenameSession(T, "b", "x"),
        touch(T, "a", 3, 13),
        touch(T, "b", 4, 14),
    ]
    assert merge_touches(ops) == [
        TouchSession(T, "a", AT + timedelta(minutes=3), 13, AT, 10),
        TouchSession(T, "b", AT + timedelta(minutes=4), 14, AT + timedelta(minutes=1), 11),
    ]


def test_merge_touches_keeps_tenants_apart() -> None:
    ops: list[Op] = [touch("t1", "s", 0, 1), touch("t2", "s", 1, 2), touch("t1", "s", 2, 3)]
    assert merge_touches(ops) == [
        TouchSession("t1", "s", AT + timedelta(minutes=2), 3, AT, 1),
        TouchSession("t2", "s", AT + timedelta(minutes=1), 2, AT + timedelta(minutes=1), 2),
    ]


def test_merge_touches_of_a_single_touch_is_that_touch() -> None:
    assert merge_touches([touch(T, S, 0, 5)]) == [touch(T, S, 0, 5)]


def test_merge_touches_without_touches_is_empty() -> None:
    assert merge_touches([]) == []
    assert merge_touches([ClearMessages(T, S), DeleteMessages(T, S, ("m",))]) == []


def test_merge_touches_of_planned_batch() -> None:
    events: list[Event] = [
        SessionCreated(tenant=T, session=S, occurred_at=AT, name="c"),
        SessionRenamed(tenant=T, session=S, occurred_at=AT + timedelta(seconds=5), name="r"),
        MessagesCleared(tenant=T, session=S, occurred_at=AT + timedelta(seconds=9)),
    ]
    ops = [op for seq, event in enumerate(events, start=100) for op in plan(event, seq)]
    assert merge_touches(ops) == [TouchSession(T, S, AT + timedelta(seconds=9), 102, AT, 100)]


def test_batches_applied_in_pipeline_mode_never_copy() -> None:
    """``COPY`` is impossible in pipeline mode: the runner pipelines only batches below it."""
    from projections.history import COPY_MIN_ROWS
    from projections.runner import PIPELINE_MAX_ITEMS

    assert PIPELINE_MAX_ITEMS < COPY_MIN_ROWS


# -- appends under a compaction summary's id --------------------------------------------------------


def _summary_append(overlay_id: str, seq_text: str = "a summary") -> MessageAppended:
    body = {"id": f"compaction_{overlay_id}", "role": "assistant", "parts": [{"type": "text", "text": seq_text}]}
    return MessageAppended(
        **ENV, message_id=body["id"], parent_id="m7", role="assistant", body_sha256=body_hash(body), message=body
    )


def _recorded(overlay_id: str) -> CompactionRecorded:
    return summary_recorded(T, S, "m1", "m6", "a summary").model_copy(update={"overlay_id": overlay_id})


def test_an_append_of_an_overlays_message_id_recorded_before_it_is_not_stored() -> None:
    items: list[tuple[int, Event]] = [(1, _recorded("ov")), (2, _summary_append("ov"))]
    assert summaries_in(items) == {2: True}
    ops = plan(items[1][1], 2, BODY, summary=True)
    assert not any(isinstance(op, InsertMessage) for op in ops)
    # the parent it was appended under is kept, for the messages appended under it
    assert [op for op in ops if isinstance(op, LeaveOutSummary)] == [LeaveOutSummary(T, S, "compaction_ov", "m7", 2)]


def test_an_overlay_recorded_after_the_append_or_cleared_before_it_leaves_it_a_message() -> None:
    later: list[tuple[int, Event]] = [(1, _summary_append("ov")), (2, _recorded("ov"))]
    assert summaries_in(later) == {}  # the overlays table decides: it holds no overlay before seq 1
    cleared: list[tuple[int, Event]] = [(1, _recorded("ov")), (2, MessagesCleared(**ENV)), (3, _summary_append("ov"))]
    assert summaries_in(cleared) == {3: False}  # the table's overlays are older than the clear
    again: list[tuple[int, Event]] = [*cleared[:2], (3, _recorded("ov")), (4, _summary_append("ov"))]
    assert summaries_in(again) == {4: True}


def test_an_append_left_to_the_overlays_table_asks_it_and_other_ids_never_do() -> None:
    ops = plan(_summary_append("ov"), 5, _summary_append("ov").message)
    assert [op.summary_check for op in ops if isinstance(op, InsertMessage)] == [True]
    decided = plan(_summary_append("ov"), 5, _summary_append("ov").message, summary=False)
    assert [op.summary_check for op in decided if isinstance(op, InsertMessage)] == [False]
    plain = plan(
        MessageAppended(**ENV, message_id="m2", parent_id=None, role="user", body_sha256=body_hash(BODY), message=BODY),
        5,
        BODY,
    )
    assert [op.summary_check for op in plain if isinstance(op, InsertMessage)] == [False]


async def test_a_slice_of_a_batch_decides_a_summarys_id_over_the_whole_batch_as_a_rebuild_does() -> None:
    """(The live projector prepares a batch in slices of 100; each slice decided over itself, so an
    overlay in one slice left an append of its id in the next to the overlays table, which holds
    none of the batch's overlays before it commits: the append was stored, where a rebuild, which
    prepares its batch whole, left it out.) Items out of stream order decide as in it."""
    fillers: list[tuple[int, Event]] = [
        (
            seq,
            MessageAppended(
                **ENV, message_id=f"f{seq}", parent_id=None, role="user", body_sha256=body_hash(BODY), message=BODY
            ),
        )
        for seq in range(2, 102)
    ]
    batch: list[tuple[int, Event]] = [(1, _recorded("ov")), *fillers, (102, _summary_append("ov"))]
    history = HistoryProjection()
    whole = await history.prepare(batch)
    sliced = [*await history.prepare(batch[:100], batch), *await history.prepare(batch[100:], batch)]
    assert sliced == whole
    assert not any(isinstance(op, InsertMessage) for op in whole[-1])  # not stored: the overlay stands
    shuffled = [batch[-1], *batch[:-1]]  # a redelivery fetched before the events it follows
    assert (await history.prepare(shuffled))[0] == whole[-1]
