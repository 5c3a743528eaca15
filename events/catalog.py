"""The event types of the message history (v1). Past-tense names; facts only, no behaviour.

Every event is self-sufficient: ``MessageAppended.parent_id`` is the resolved parent (never
"latest leaf"), and a message body travels inline or as a claim-check reference.
"""

from __future__ import annotations

import json
import re
from collections.abc import Collection
from contextlib import suppress
from typing import Any, ClassVar, Literal

from pydantic import ConfigDict, Field, model_validator

from events.blobs import BlobRef
from events.context import CompactionConfig, SessionConfig
from events.envelope import Event
from events.messages import body_hash
from events.validation import NO_NUL_PATTERN


class SessionCreated(Event):
    TYPE: ClassVar[str] = "session.created"
    VERSION: ClassVar[int] = 1
    type: Literal["session.created"] = "session.created"
    version: Literal[1] = 1

    name: str = ""
    parent_session_id: str | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)


class SessionRenamed(Event):
    TYPE: ClassVar[str] = "session.renamed"
    VERSION: ClassVar[int] = 1
    type: Literal["session.renamed"] = "session.renamed"
    version: Literal[1] = 1

    name: str


class SessionDeleted(Event):
    TYPE: ClassVar[str] = "session.deleted"
    VERSION: ClassVar[int] = 1
    type: Literal["session.deleted"] = "session.deleted"
    version: Literal[1] = 1


MAX_USAGE_TOKENS = 10**12
"""The most tokens one ``session.usage_added`` adds to either counter."""
MAX_USAGE_COST = 10**12
"""The most cost one ``session.usage_added`` adds."""
MAX_END_REASON = 256
"""The longest ``session.ended`` reason, in characters."""


class SessionUsageAdded(Event):
    """Token usage and cost added to the session's counters (the reference's ``addUsage``).

    Increments, never totals: the read model sums them in log order (a counter saturates at
    the largest 64-bit integer instead of overflowing). Not sealed: the counts and the cost stay
    readable after an erasure. The API and the ``session.usage`` command refuse an unknown
    session; published straight to the stream for a session that was never created, it creates
    the session's row (empty name), as any event of a session does."""

    TYPE: ClassVar[str] = "session.usage_added"
    VERSION: ClassVar[int] = 1
    type: Literal["session.usage_added"] = "session.usage_added"
    version: Literal[1] = 1

    input_tokens: int = Field(ge=0, le=MAX_USAGE_TOKENS, strict=True)
    output_tokens: int = Field(ge=0, le=MAX_USAGE_TOKENS, strict=True)
    cost: float = Field(ge=0, le=MAX_USAGE_COST, strict=True, allow_inf_nan=False)


class SessionEnded(Event):
    """The session ended, and why (the reference's ``end_reason``: ``compaction`` when
    ``compactAndSplit`` moved the conversation to a child session). It stays readable and
    writable; a later end replaces the reason. ``reason`` is sealed. The API and the
    ``session.end`` command refuse an unknown session; published straight to the stream for a
    session that was never created, it creates the session's row (empty name), as any event of a
    session does."""

    TYPE: ClassVar[str] = "session.ended"
    VERSION: ClassVar[int] = 1
    type: Literal["session.ended"] = "session.ended"
    version: Literal[1] = 1

    reason: str = Field(min_length=1, max_length=MAX_END_REASON)


MAX_ERASURE_REASON = 500
"""The longest reason an erasure may give, in characters."""
MAX_ERASURE_REQUESTER = 200
"""The longest ``requested_by`` of an erasure, in characters."""


MAX_ERASURE_PROOF = 200
"""A key-encryption key id (at most 128 characters) and a base64url MAC (43)."""
PROOF_PATTERN = r"^[^\x00:]+:[A-Za-z0-9_-]+$"


class SessionErased(Event):
    """The session's data key was destroyed (:mod:`events.sealing`): its sealed events can never
    be read again, and projections drop every row of it. Carries none of the session's content.
    With ``session == ""`` (the tenant scope): the tenant's tenant-level entries (skills) go too.

    ``requested_by`` says who asked (``tenant:<t> key:<12 hex>`` for an API key: the start of its
    SHA-256 as ``CHRONICLE_API_KEYS`` names it; ``operator (chronicle erase)`` for the CLI) and
    ``reason`` why, the caller's text as given (never sealed: it outlives the erasure, so it must
    not hold personal data). Both are the erasure's first record: a rerun repeats them. A v1
    event named neither (upcast: None).

    ``proof`` (v3) is Chronicle's own word that it erased the session: ``<key id>:<MAC>``, the
    HMAC-SHA256 of :func:`erasure_statement` under a key derived from a key-encryption key
    (:mod:`projections.keystore`). A tenant may publish a ``session.erased`` on its own subjects,
    but cannot make a proof: a proven erasure is recorded by whoever reads it, so one that the
    database lost (restored from a backup older than the erasure, or rebuilt without one) is
    recorded again and the session's data key destroyed again. None: made without a
    key-encryption key, or before v3 (upcast)."""

    TYPE: ClassVar[str] = "session.erased"
    VERSION: ClassVar[int] = 3
    type: Literal["session.erased"] = "session.erased"
    version: Literal[3] = 3

    requested_by: str | None = Field(
        default=None, min_length=1, max_length=MAX_ERASURE_REQUESTER, pattern=NO_NUL_PATTERN
    )
    reason: str | None = Field(default=None, max_length=MAX_ERASURE_REASON, pattern=NO_NUL_PATTERN)
    proof: str | None = Field(default=None, min_length=1, max_length=MAX_ERASURE_PROOF, pattern=PROOF_PATTERN)

    def statement(self) -> bytes:
        """What its ``proof`` vouches for."""
        return erasure_statement(self.tenant, self.session, self.requested_by, self.reason)


def erasure_statement(tenant: str, session: str, requested_by: str | None, reason: str | None) -> bytes:
    """The bytes an erasure's proof is a MAC of: its tenant, session and record, as one JSON
    array (a field cannot run into the next), tagged with what it is for."""
    return json.dumps(
        ["chronicle session.erased proof v1", tenant, session, requested_by, reason],
        ensure_ascii=False,
        separators=(",", ":"),
    ).encode()


DERIVED_FIELDS = ("message_id", "role", "body_sha256")
"""What a body event's inline ``message`` says itself (its ``id``, its ``role``, its
:func:`~events.messages.body_hash`): left out of the stored JSON when exactly that."""

NULL_OMITTED = ("correlation_id", "causation_id", "message", "message_ref", "original_ref")
"""Optional fields a body event's stored JSON leaves out when unset (they decode to None)."""


def derived_fields(body: dict[str, Any], wanted: Collection[str] = DERIVED_FIELDS) -> dict[str, str]:
    """The fields an inline body gives: ``message_id`` (its ``id``, when a string), ``role`` (its
    ``role`` when a string, ``""`` when it has none, as :func:`events.bodies.pack_body` records
    it) and ``body_sha256``, of those ``wanted``; a field the body cannot give exactly is not in
    the answer."""
    out: dict[str, str] = {}
    mid = body.get("id")
    if isinstance(mid, str) and "message_id" in wanted:
        out["message_id"] = mid
    role = body.get("role", "")
    if isinstance(role, str) and "role" in wanted:
        out["role"] = role
    if "body_sha256" not in wanted:
        return out
    with suppress(TypeError, ValueError, RecursionError):  # not JSON-writable: the field must be explicit
        out["body_sha256"] = body_hash(body)
    return out


def _body_event_schema(schema: dict[str, Any]) -> None:
    """The stored shape: the derived fields may be left out when ``message`` is inline."""
    schema["required"] = [n for n in schema.get("required", []) if n not in DERIVED_FIELDS]
    note = (
        "Stored compact: `message_id`, `role` and `body_sha256` are left out when `message` is inline and "
        'they are exactly its `id`, its `role` ("" when it has none) and the SHA-256 of its canonical JSON '
        "(keys sorted, no spaces, UTF-8, non-ASCII unescaped, numbers as Python's `json` writes them: a float keeps "
        "its `.0` and its exponent's zero padding, `1.0`, `1e-07`; `events.messages.canonical_json`); "
        "a reader fills them from `message`. They are always written with "
        "`message_ref` (claim check) and in a sealed event. Unset optional fields are left out, not null. "
        "A `body_sha256` written with an inline `message` must be its hash, unless `original_ref` is set (an "
        "over-cap message: the hash is its original's); any other is refused (quarantined as `invalid`)."
    )
    schema["description"] = f"{schema.get('description', '').rstrip()}\n\n{note}".lstrip()


class MessageBodyEvent(Event):
    """A message body, inline (``message``) or in object storage (``message_ref``).

    Stored compact (``message.appended`` v3, ``message.updated`` v2): :data:`DERIVED_FIELDS` are
    left out of the JSON when ``message`` is inline and they are exactly what it says
    (:func:`derived_fields`), and the :data:`NULL_OMITTED` fields when None. In memory every field
    is there as before: a field left out is filled from the body when the event is read. A field
    written explicitly is taken as written (as every earlier version was), even when the body says
    otherwise: an over-cap message's ``body_sha256`` is its original's, not its capped form's. Only
    that one: admission refuses an inline body's ``body_sha256`` that is not its hash on an event
    without ``original_ref`` (events/admission.py).
    """

    model_config = ConfigDict(json_schema_extra=_body_event_schema)

    message_id: str
    role: str
    body_sha256: str
    message: dict[str, Any] | None = None
    message_ref: BlobRef | None = None

    @model_validator(mode="before")
    @classmethod
    def _fill_from_body(cls, data: Any) -> Any:
        if isinstance(data, dict):
            missing = [n for n in DERIVED_FIELDS if n not in data]
            body = data.get("message") if missing else None
            if isinstance(body, dict):
                data = {**derived_fields(body, missing), **data}  # what is written wins
        return data

    @model_validator(mode="after")
    def _one_body(self) -> MessageBodyEvent:
        if (self.message is None) == (self.message_ref is None):
            raise ValueError("exactly one of message and message_ref must be set")
        return self

    def left_out(self, *, sealed: bool = False) -> set[str]:
        """The fields the stored JSON leaves out: unset optionals, and (unless the event is to
        be sealed: its envelope keeps its ids and role readable) the fields an inline body gives
        exactly."""
        out = {n for n in NULL_OMITTED if getattr(self, n, ...) is None}
        body = self.message
        if not sealed and body is not None:
            given = derived_fields(body)
            out.update(n for n in DERIVED_FIELDS if n in given and given[n] == getattr(self, n))
        return out


class MessageAppended(MessageBodyEvent):
    """v2 adds ``original_ref``: when the message was over the row cap, ``message`` is the
    size-capped form and the untruncated original lives in object storage (nothing is lost).
    v3 has v2's fields, stored compact: what the inline body gives, and unset optionals, are left out."""

    TYPE: ClassVar[str] = "message.appended"
    VERSION: ClassVar[int] = 3
    type: Literal["message.appended"] = "message.appended"
    version: Literal[3] = 3

    parent_id: str | None
    original_ref: BlobRef | None = None


class MessageUpdated(MessageBodyEvent):
    """v2 has v1's fields, stored compact: what the inline body gives, and unset optionals, are left out."""

    TYPE: ClassVar[str] = "message.updated"
    VERSION: ClassVar[int] = 2
    type: Literal["message.updated"] = "message.updated"
    version: Literal[2] = 2


class MessagesDeleted(Event):
    TYPE: ClassVar[str] = "messages.deleted"
    VERSION: ClassVar[int] = 1
    type: Literal["messages.deleted"] = "messages.deleted"
    version: Literal[1] = 1

    message_ids: list[str]


class MessagesCleared(Event):
    TYPE: ClassVar[str] = "messages.cleared"
    VERSION: ClassVar[int] = 1
    type: Literal["messages.cleared"] = "messages.cleared"
    version: Literal[1] = 1


class SessionConfigured(Event):
    """The whole configuration (blocks in render order, compaction); replaces the previous one."""

    TYPE: ClassVar[str] = "session.configured"
    VERSION: ClassVar[int] = 1
    type: Literal["session.configured"] = "session.configured"
    version: Literal[1] = 1

    config: SessionConfig


class ContextWritten(Event):
    """A writable block's full resulting content (not a delta) and its token count."""

    TYPE: ClassVar[str] = "context.written"
    VERSION: ClassVar[int] = 1
    type: Literal["context.written"] = "context.written"
    version: Literal[1] = 1

    label: str
    content: str
    tokens: int
    mode: Literal["replace", "append"]
    writer: Literal["tool", "api"]


class SearchEntryIndexed(Event):
    """An entry of a searchable block, keyed; the same key replaces the entry."""

    TYPE: ClassVar[str] = "search_entry.indexed"
    VERSION: ClassVar[int] = 1
    type: Literal["search_entry.indexed"] = "search_entry.indexed"
    version: Literal[1] = 1

    label: str
    key: str
    content: str


class SkillIndexed(Event):
    """A skill document stored in (or found in) a bucket; tenant-scoped (``session == ""``).
    v2 has v1's fields; a writer that seals stores ``key``, ``description`` and ``etag`` (a hash
    of the document) sealed with the tenant scope's data key (events/sealing.py): a key may be
    made from the document's title or text. v1 events are never sealed, so a release that reads
    only v1 meets a sealed one as a newer version, not as a seal it cannot open."""

    TYPE: ClassVar[str] = "skill.indexed"
    VERSION: ClassVar[int] = 2
    type: Literal["skill.indexed"] = "skill.indexed"
    version: Literal[2] = 2

    bucket: str
    key: str
    description: str | None
    etag: str
    size: int


class SkillRemoved(Event):
    """A skill document disappeared from its bucket (found by ``chronicle skills sync``).
    v2 has v1's fields; ``key`` is sealed as in ``skill.indexed`` v2."""

    TYPE: ClassVar[str] = "skill.removed"
    VERSION: ClassVar[int] = 2
    type: Literal["skill.removed"] = "skill.removed"
    version: Literal[2] = 2

    bucket: str
    key: str


class SkillLoaded(Event):
    """v2 adds ``tool_call_id``: the ``load_context`` call that loaded the skill, when the caller
    said, so an unload can reclaim that output even before its message is stored. v3 has v2's
    fields; a writer that seals stores ``key`` sealed with the session's data key (as in
    ``skill.indexed`` v2, whose key it is)."""

    TYPE: ClassVar[str] = "skill.loaded"
    VERSION: ClassVar[int] = 3
    type: Literal["skill.loaded"] = "skill.loaded"
    version: Literal[3] = 3

    label: str
    key: str
    tool_call_id: str | None = None


class SkillUnloaded(Event):
    """Unloading a skill; ``tool_call_id`` names the tool output that history reads now show as
    ``[skill unloaded: <key>]`` (the original stays in the log), in message ``message_id``, or in
    whichever message carries that call when ``message_id`` is None (not stored yet). v2 has v1's
    fields; ``key`` is sealed as in ``skill.loaded`` v3."""

    TYPE: ClassVar[str] = "skill.unloaded"
    VERSION: ClassVar[int] = 2
    type: Literal["skill.unloaded"] = "skill.unloaded"
    version: Literal[2] = 2

    label: str
    key: str
    message_id: str | None = None
    tool_call_id: str | None = None


class PromptRendered(Event):
    """The system prompt in force from this event on: the rendered text, never recomputed."""

    TYPE: ClassVar[str] = "prompt.rendered"
    VERSION: ClassVar[int] = 1
    type: Literal["prompt.rendered"] = "prompt.rendered"
    version: Literal[1] = 1

    text: str
    tokens: int
    version_no: int
    reason: Literal["freeze", "refresh", "clear", "compaction"]


COMPACTION_PREFIX = "compaction_"
"""An overlay reads as a message whose id is this prefix and the overlay's id."""

_UUID_FORM = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


def overlay_id_in(message_id: str) -> str | None:
    """The overlay id a message id names when it has the overlays' prefix (``compaction_<id>``),
    else None: the overlay history shows under that id, if the session has one."""
    return message_id[len(COMPACTION_PREFIX) :] if message_id.startswith(COMPACTION_PREFIX) else None


def overlay_shaped(message_id: str) -> bool:
    """Whether ``message_id`` has the form of the id every overlay Chronicle records reads under:
    the prefix and a UUID in its canonical form (a compactor's and a fork's overlay ids are
    derived UUIDs). A new message may not take such an id unless it is one of its session's
    overlays sent back (services/writes/decisions.py); other ids with the prefix stay a client's."""
    overlay_id = overlay_id_in(message_id)
    return overlay_id is not None and _UUID_FORM.fullmatch(overlay_id) is not None


class CompactionRecorded(Event):
    """A summary overlay over ``from_message_id..to_message_id`` of one branch; originals stay.

    Its id is derived from (tenant, session, from, to), so two compactors, or a retry, record
    it once. ``from_message_id`` keeps the first id of an earlier overlay on the same branch, so
    one overlay grows instead of stacking.
    """

    TYPE: ClassVar[str] = "compaction.recorded"
    VERSION: ClassVar[int] = 1
    type: Literal["compaction.recorded"] = "compaction.recorded"
    version: Literal[1] = 1

    overlay_id: str
    from_message_id: str
    to_message_id: str
    leaf_id: str
    tokens_before: int
    tokens_after: int
    summarizer: str
    model: str | None
    summary: str


class CompactionFailed(Event):
    """A summarizer failed: a manual compaction (``POST …/compact``) records each failure; the
    compaction work queue records each failed attempt (``attempt`` is its number in the session's
    series of attempts, the id is derived from the request's and that number, so a redelivered
    attempt records it once; a later attempt of the series may still succeed). A request JetStream
    gave up (the compactor on its last allowed delivery died or hung) is recorded as one too, by the
    compactor that hears the advisory: ``error`` says so, the id is derived from the request's and
    its work-queue stream sequence. Appends are unaffected.

    A work-queue failure also names the request's ``estimate`` (prompt included) and the session's
    compaction settings (``config``) when it was recorded: the compaction state treats it like a
    ``compaction.skipped`` at that estimate (no new request until the session has grown by a tenth
    of ``compact_after``, its settings change, or an overlay or a clear resets it). A manual
    failure has neither (None): it holds nothing; so has a v1 event (upcast: v1 named neither)."""

    TYPE: ClassVar[str] = "compaction.failed"
    VERSION: ClassVar[int] = 2
    type: Literal["compaction.failed"] = "compaction.failed"
    version: Literal[2] = 2

    leaf_id: str
    summarizer: str
    error: str
    attempt: int
    estimate: int | None = Field(default=None, ge=0)
    config: CompactionConfig | None = None


class CompactionSkipped(Event):
    """A compaction the work queue asked for recorded nothing: there was nothing to compact, or
    the summary would not have shrunk the context (``reason`` says which). ``estimate`` is the
    requested estimate (the compaction state's, prompt included) and ``config`` the session's
    compaction settings it was tried under. The compaction state requests the session again only
    once its estimate passes ``estimate`` by a tenth of ``compact_after``, its compaction settings
    change, or an overlay or a clear resets it; a manual ``POST …/compact`` always tries. The id is
    derived from the request's, so a redelivered request records it once."""

    TYPE: ClassVar[str] = "compaction.skipped"
    VERSION: ClassVar[int] = 1
    type: Literal["compaction.skipped"] = "compaction.skipped"
    version: Literal[1] = 1

    leaf_id: str | None
    estimate: int = Field(ge=0)
    reason: str = Field(max_length=500)
    config: CompactionConfig


class CompactionRequested(Event):
    """A compactor's state found the session over its ``compact_after``: summarise it.

    Not a fact of the session's history: it travels on the compaction work-queue stream
    (:meth:`~events.subjects.SubjectLayout.work_subject`, never on the event log, where admission
    refuses it as an unknown type). Its id is derived from (tenant, session, leaf, estimate), so
    the same decision taken twice (by two compactors, or again after a restart) is one request
    within the stream's duplicate window. ``seq`` is the log position the decision was made at.
    """

    TYPE: ClassVar[str] = "compaction.requested"
    VERSION: ClassVar[int] = 1
    type: Literal["compaction.requested"] = "compaction.requested"
    version: Literal[1] = 1

    leaf_id: str | None
    estimate: int
    seq: int


WORK_TYPES: tuple[type[Event], ...] = (CompactionRequested,)
"""Messages of the work-queue stream: events in shape, but never part of a session's log."""


EVENT_TYPES: tuple[type[Event], ...] = (
    SessionCreated,
    SessionRenamed,
    SessionDeleted,
    SessionErased,
    SessionUsageAdded,
    SessionEnded,
    MessageAppended,
    MessageUpdated,
    MessagesDeleted,
    MessagesCleared,
    SessionConfigured,
    ContextWritten,
    SearchEntryIndexed,
    SkillIndexed,
    SkillRemoved,
    SkillLoaded,
    SkillUnloaded,
    PromptRendered,
    CompactionRecorded,
    CompactionFailed,
    CompactionSkipped,
)
