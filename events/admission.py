"""The contract's one validation: which stored bytes are an event, and under which subject.

:func:`admit` is a pure function of ``(bytes, subject, layout)``: the same bytes under the same
subject always get the same decision, in every release that shares this contract. Publishers run
it before publishing (nothing they send is refused later); projectors, rebuild, verify, time
travel and replay run it on what they read, and record what it refuses (quarantine) instead of
applying it. Checks, in this order (the first failure decides the reason):

1. ``too_large``: more than :data:`MAX_EVENT_BYTES`.
2. ``not_json``: not UTF-8, not JSON (``NaN``/``Infinity`` included), or not a JSON object.
3. ``invalid``: a NUL or a lone surrogate in any string (keys included); arrays and objects
   nested deeper than :data:`MAX_DEPTH` (what the HTTP API refuses in a request body).
4. ``subject_mismatch``: the event names its ``tenant`` and ``session`` as valid ids (as the API
   checks them), and the subject is not that one (prefix, tenant, partition token of this
   layout, session): decided before the type and version, because a subject that is not the
   event's own is the publisher's mistake whatever the release (an event of a newer version on
   another partition's subject is ``subject_mismatch``, not ``newer_version``: upgrading would
   not make it right).
5. ``unknown_type`` / ``newer_version`` / ``invalid``: the type and version (see the registry).
6. ``invalid``: the model's validation; the ids as the API checks them (tenant, session unless
   tenant-scoped, every message id the event names); a skill event's ``bucket`` that is not an
   S3 bucket name (as a session config's buckets are validated); a ``message.appended``/``message.updated``
   whose inline ``message`` (opened, when sealed) does not hash to the ``body_sha256`` it writes
   out, unless it has an ``original_ref`` (an over-cap message: the hash is its original's). A
   compact event that leaves ``body_sha256`` out has it from its body, always right. A claim-checked
   body (``message_ref``) is not here to hash: its bytes are checked against the reference when
   they are fetched (below), not its hash against ``body_sha256``.
7. ``too_long``: a text field longer than the API takes (events/limits.py: a session's name, a
   message's role in the event and in its inline body, a tool call id), so that what a direct
   publisher stores is what a request could (a claim-checked body's role: :func:`admit_body`).
8. ``subject_mismatch``: the subject is not exactly the event's session subject (prefix, tenant,
   partition token of this layout, session), as validated and upcast: the subject is the authority.

A claim check (a body event's ``message_ref``) is decided when the body is fetched
(:func:`events.bodies.unpack_body`, with :func:`admit_body`): ``body_unavailable`` when the object
store answers that no such object exists, or its bytes do not hash to the reference's SHA-256, or
they are bound to another session than the event's (events/objects.py), or are not a JSON
object, or are nested deeper than the event's :data:`MAX_DEPTH` would allow where the body
stands (one level below the event). Objects are immutable and never deleted (but with their
session's erasure), so the same reference decides the same on a rebuild; a store that cannot
answer (connection, timeout) decides nothing (retried).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any, Literal, get_args

from pydantic import ValidationError
from pydantic_core import PydanticSerializationError

from events.blobs import BlobRef, no_object, sha256_hex
from events.catalog import (
    CompactionFailed,
    CompactionRecorded,
    CompactionSkipped,
    MessageAppended,
    MessageBodyEvent,
    MessagesDeleted,
    SessionCreated,
    SessionRenamed,
    SkillIndexed,
    SkillLoaded,
    SkillRemoved,
    SkillUnloaded,
)
from events.context import BUCKET_RE
from events.envelope import Event
from events.ids import TENANT_SCOPE, InvalidId, check_message_id, check_session, check_tenant
from events.limits import MAX_ROLE, MAX_SESSION_NAME, MAX_TOOL_CALL_ID
from events.messages import body_hash
from events.objects import NotTheOwner, open_object
from events.registry import CURRENT, UnknownEvent, upcast
from events.sealing import (
    SEALED,
    SEALED_FIELDS,
    KeyLookup,
    KeyUnavailable,
    SealBroken,
    open_fields,
)
from events.subjects import SubjectLayout, partition_of

MAX_EVENT_BYTES = 1024 * 1024
"""NATS's default ``max_payload``: the largest stored event the contract admits."""
HEADER_ROOM = 1024
"""What a writer's headers may take of one NATS message: ``Nats-Msg-Id`` (an event id, at most
128 characters) and ``Nats-Expected-Last-Subject-Sequence`` take ~200 bytes. The server's
``max_payload`` bounds headers and payload together, and a message over it is a protocol error
that closes the connection it came on (nats-py checks the payload alone, so it sends it): every
later publish of that process fails until it is restarted."""
MAX_WRITTEN_BYTES = MAX_EVENT_BYTES - HEADER_ROOM
"""The largest event Chronicle's writers publish (its headers fit beside it under ``max_payload``)."""

MAX_DEPTH = 64
"""The deepest nesting of arrays and objects an event may have (the event object itself is 1),
and a request body (services/requests/strict_json.py). A message sits at the same depth in its
request (``{"message": …}``) and in its event, so the contract refuses exactly the bodies HTTP
refuses. Without it an event published straight to JetStream could carry a message nested ~960
deep (as deep as the parser goes): admitted and stored, it made every reader that parses it again
(compaction, fork) raise RecursionError."""

Reason = Literal[
    "too_large",
    "not_json",
    "unknown_type",
    "newer_version",
    "invalid",
    "subject_mismatch",
    "too_long",
    "body_unavailable",
    "data_error",
    "reflected_ack",
    "unrecorded_erasure",
]
REASONS: tuple[Reason, ...] = get_args(Reason)
"""Every reason code, stable: operators, metrics and the quarantine table use them.
``body_unavailable`` is an admitted event whose claim-checked body cannot be had (no such object,
not the referenced bytes, not a JSON object: :func:`admit_body`); ``data_error`` is the
projector's: an admitted event a projection's database refused; ``reflected_ack`` is a JetStream
publish ack of this stream stored under this subject because the publisher of the sequence it
names asked for its ack here (:func:`reflected_ack`): the subject's tenant did not write it;
``too_long`` is a text field longer than the API takes (events/limits.py);
``unrecorded_erasure`` is the projector's too: a ``session.erased`` whose erasure Chronicle never
recorded (projections/quarantine.py)."""


class Refused(ValueError):
    """Bytes the contract does not admit as an event; ``reason`` is one of :data:`REASONS`."""

    def __init__(self, reason: Reason, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason: Reason = reason
        self.detail = detail


class BodyUnavailable(Refused):
    """An admitted event's claim-checked body that can never be had: reason ``body_unavailable``."""

    def __init__(self, detail: str) -> None:
        super().__init__("body_unavailable", detail)


# Only a ``\\u`` escape can put NUL or a surrogate into a parsed string: raw control characters are
# not JSON, and surrogates are not UTF-8. Most events have no such escape, so the walk is skipped.
_SUSPECT_ESCAPE = re.compile(rb"\\u(?:0000|[dD][89a-fA-F][0-9a-fA-F]{2})")
_BAD_CHAR = re.compile("[\x00\ud800-\udfff]")


def admit(data: bytes, subject: str, layout: SubjectLayout, keys: KeyLookup | None = None) -> Event:
    """The event ``data`` holds, if the contract admits it under ``subject``; else :class:`Refused`.

    A sealed event (:mod:`events.sealing`) is opened with ``keys`` first: its session's destroyed
    key raises :class:`~events.sealing.KeyDestroyed` (a tombstone, not a refusal); no ``keys`` at
    all raises :class:`~events.sealing.KeyUnavailable` (a configuration to fix, retried); a seal
    that does not open, or names a key the session does not have, is ``invalid``."""
    if len(data) > MAX_EVENT_BYTES:
        raise Refused("too_large", f"{len(data)} bytes, more than the {MAX_EVENT_BYTES} an event may have")
    raw = _parse(data)
    if (acked := reflected_ack(raw, layout)) is not None:
        raise Refused(
            "reflected_ack",
            f"a JetStream publish ack for sequence {acked} of this stream: whoever published sequence "
            f"{acked} named this subject as its reply subject; this subject's tenant did not write it",
        )
    if (refusal := reflected_error(raw)) is not None:
        raise Refused(
            "reflected_ack",
            f"a JetStream answer refusing a publish ({refusal[:120]}): whoever published it named this subject "
            "as its reply subject; this subject's tenant did not write it",
        )
    if b"\\u" in data and _SUSPECT_ESCAPE.search(data) and has_bad_chars(raw):
        raise Refused("invalid", "a string holds a NUL character or a lone surrogate")
    _check_depth(_brackets(data), raw)
    _check_subject(raw, subject, layout)
    if SEALED in raw:
        raw = _unseal(raw, subject, layout, keys)
    try:
        raw = upcast(raw)
    except UnknownEvent as exc:
        raise Refused(exc.reason, exc.detail) from None
    except (KeyError, TypeError) as exc:  # an upcaster step met a field of the wrong shape
        raise Refused("invalid", f"cannot upcast: {type(exc).__name__}") from None
    try:
        event = CURRENT[raw["type"]].model_validate(raw)
    except ValidationError as exc:
        raise Refused("invalid", _first_error(exc)) from None
    _check_ids(event)
    _check_buckets(event)
    _check_lengths(event)
    if isinstance(event, MessageBodyEvent) and "body_sha256" in raw:  # left out, it is the body's own
        _check_body_hash(event)
    if layout.session_subject(event.tenant, event.session) != subject:
        raise Refused("subject_mismatch", _mismatch(event.tenant, event.session, subject, layout))
    return event


def _check_subject(raw: dict[str, Any], subject: str, layout: SubjectLayout) -> None:
    """``subject_mismatch`` when the event's own ``tenant`` and ``session`` (valid ids, as the API
    checks them) are not the subject's; an envelope that names none, or invalid ones, is left to
    the checks after it."""
    tenant, session = raw.get("tenant"), raw.get("session")
    if not isinstance(tenant, str) or not isinstance(session, str):
        return
    try:
        check_tenant(tenant)
        if session != TENANT_SCOPE:
            check_session(session)
        own = layout.session_subject(tenant, session)
    except (InvalidId, ValueError):  # ids the API would not take are ``invalid``, decided after
        return
    if own != subject:
        raise Refused("subject_mismatch", _mismatch(tenant, session, subject, layout))


def _unseal(raw: dict[str, Any], subject: str, layout: SubjectLayout, keys: KeyLookup | None) -> dict[str, Any]:
    tenant, session = raw.get("tenant"), raw.get("session")
    if not isinstance(tenant, str) or not isinstance(session, str):
        raise Refused("invalid", "a sealed event's tenant and session must be strings")
    try:
        own = layout.session_subject(tenant, session)
    except ValueError:
        raise Refused("invalid", "a sealed event's tenant or session is not a subject token") from None
    if own != subject:  # checked before opening: a key is only ever looked up for the subject's session
        raise Refused("subject_mismatch", "the subject is not the sealed event's session subject")
    if keys is None:
        raise KeyUnavailable("a sealed event and no data keys are configured")
    try:
        opened, plain = open_fields(raw, keys)
    except (SealBroken, KeyUnavailable) as exc:
        raise Refused("invalid", f"sealed: {str(exc)[:200]}") from None
    names = SEALED_FIELDS.get(str(raw.get("type")), ())
    if b"\\u" in plain and _SUSPECT_ESCAPE.search(plain) and has_bad_chars({n: opened.get(n) for n in names}):
        raise Refused("invalid", "a string holds a NUL character or a lone surrogate")
    _check_depth(_brackets(plain) + 1, opened)  # the fields are values of the event: one level down
    return opened


def admit_built(event: Event, layout: SubjectLayout) -> tuple[str, bytes]:
    """The subject and bytes of ``event``, a model built (and so validated) in this process, if
    :func:`admit` would admit them; else :class:`Refused`. For publishers: it decides as
    :func:`admit` does without parsing back what the model just wrote (the model's own
    validation ran when it was built); the subject is the event's own session subject."""
    cls = CURRENT.get(event.type)
    if cls is None or type(event) is not cls:
        raise Refused("unknown_type", f"{type(event).__name__} is not the current model of {event.type!r}")
    if event.version != cls.VERSION:
        raise Refused("newer_version" if event.version > cls.VERSION else "invalid", f"{event.type} v{event.version}")
    try:
        data = event.to_json()
    except PydanticSerializationError:  # a lone surrogate cannot be written as UTF-8
        raise Refused("invalid", "a string holds a lone surrogate") from None
    if len(data) > MAX_WRITTEN_BYTES:
        raise Refused("too_large", f"{len(data)} bytes, more than the {MAX_WRITTEN_BYTES} an event may have")
    if b"\\u" in data and _SUSPECT_ESCAPE.search(data) and has_bad_chars(_parse(data)):
        raise Refused("invalid", "a string holds a NUL character or a lone surrogate")
    if (bound := _brackets(data)) > MAX_DEPTH:  # rare: parsed back only then
        _check_depth(bound, _parse(data))
    _check_ids(event)
    _check_buckets(event)
    _check_lengths(event)
    # the compact JSON leaves body_sha256 out when it is the inline body's own (MessageBodyEvent.left_out)
    if isinstance(event, MessageBodyEvent) and b'"body_sha256"' in data:
        _check_body_hash(event)
    return layout.session_subject(event.tenant, event.session), data


def admit_body(
    data: bytes, ref: BlobRef, keys: KeyLookup | None = None, owner: tuple[str, str] = ("", "")
) -> dict[str, Any]:
    """The body a claim check's object holds, when ``data`` are the referenced bytes and a JSON
    object; else :class:`BodyUnavailable`. (Parsed as the projector always did: what a projection
    cannot store is its database's data error.) A sealed object is opened with ``keys`` as the
    session ``owner``'s (:func:`events.sealing.open_blob`); an object bound to another session
    than ``owner`` is unavailable to it (:func:`events.objects.open_object`)."""
    if sha256_hex(data) != ref.sha256:
        raise BodyUnavailable(f"claim check: object {ref.key[:80]!r}: its bytes do not hash to the reference's sha256")
    try:
        data = open_object(data, keys, *owner)
    except NotTheOwner:  # as if there were none (events/objects.py)
        raise BodyUnavailable(f"claim check: {no_object(ref.key)}") from None
    except (SealBroken, KeyUnavailable) as exc:
        if keys is None:
            raise
        raise BodyUnavailable(f"claim check: object {ref.key[:80]!r}: {str(exc)[:120]}") from None
    try:
        body = json.loads(data)
    except (ValueError, RecursionError) as exc:  # UnicodeDecodeError is a ValueError
        raise BodyUnavailable(f"claim check: object {ref.key[:80]!r}: not JSON: {str(exc)[:120]}") from None
    if not isinstance(body, dict):
        raise BodyUnavailable(f"claim check: object {ref.key[:80]!r}: a JSON {type(body).__name__}, not an object")
    if isinstance(role := body.get("role"), str) and len(role) > MAX_ROLE:  # as an inline body's (too_long)
        raise BodyUnavailable(
            f"claim check: object {ref.key[:80]!r}: role: {len(role)} characters, "
            f"more than the {MAX_ROLE} the API takes"
        )
    if _brackets(data) > MAX_DEPTH - 1 and too_deep(body, MAX_DEPTH - 1):  # the body is the event's message
        raise BodyUnavailable(
            f"claim check: object {ref.key[:80]!r}: arrays and objects nested deeper than {MAX_DEPTH - 1} levels "
            f"(the message of an event, which may nest {MAX_DEPTH})"
        )
    return body


def _brackets(data: bytes) -> int:
    """A bound on the nesting depth of the JSON ``data``: each level opens a bracket (those inside
    strings only make the bound looser). Two ``count`` passes in C, ~0.1 µs per KB: an event
    under the limit, nearly every one, is never walked."""
    return data.count(b"{") + data.count(b"[")


def _check_depth(bound: int, value: Any) -> None:
    """:class:`Refused` ``invalid`` when ``value`` (whose bytes' :func:`_brackets` is ``bound``)
    nests deeper than :data:`MAX_DEPTH`."""
    if bound > MAX_DEPTH and too_deep(value, MAX_DEPTH):
        raise Refused("invalid", f"arrays and objects nested deeper than {MAX_DEPTH} levels (the event itself is 1)")


def too_deep(value: Any, limit: int) -> bool:
    """True when ``value`` (a parsed JSON value) nests arrays/objects deeper than ``limit``, the
    value itself being 1. Iterative (a value nested as deep as the parser allows does not exhaust
    the stack), it visits only arrays and objects, and stops at the first too deep."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else None
        if children is None:
            continue
        if depth > limit:
            return True
        stack.extend((child, depth + 1) for child in children if isinstance(child, dict | list))
    return False


def has_bad_chars(value: Any) -> bool:
    """True when any string in ``value`` (a parsed JSON value, keys included) holds NUL or a lone
    surrogate: Postgres cannot store either, and no id or text of the contract may carry them.
    Iterative: JSON nested as deep as the parser allows does not exhaust the stack."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            if _BAD_CHAR.search(item) is not None:
                return True
        elif isinstance(item, dict):
            stack.extend(item)
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return False


def scrub(text: str) -> str:
    """``text`` with every NUL and lone surrogate replaced by U+FFFD: for free text from outside
    the contract (a summarizer's output, an error message) before it goes into an event."""
    return _BAD_CHAR.sub("\ufffd", text)


def _reject_constant(name: str) -> None:
    raise ValueError(f"{name} is not JSON")


_DECODER = json.JSONDecoder(parse_constant=_reject_constant)  # one decoder: json.loads(**kw) makes one a call


_ACK_FIELDS = frozenset({"stream", "seq", "domain", "duplicate"})


def reflected_ack(raw: dict[str, Any], layout: SubjectLayout) -> int | None:
    """The sequence a JetStream publish ack of ``layout``'s stream names, if ``raw`` is one and
    nothing else (``{"stream": …, "seq": N}``, maybe ``domain`` and ``duplicate``), else None.

    JetStream sends the ack to the publisher's reply subject, whatever it is: a tenant that
    publishes its own event naming another tenant's event subject as the reply has the ack stored
    there. Only separate NATS accounts per tenant prevent it (docs/security.md)."""
    seq = raw.get("seq")
    if raw.keys() <= _ACK_FIELDS and raw.get("stream") == layout.stream and type(seq) is int and seq > 0:
        return seq
    return None


_ERROR_FIELDS = frozenset({"code", "err_code", "description"})


def reflected_error(raw: dict[str, Any]) -> str | None:
    """The description of a JetStream publish error answer, if ``raw`` is one and nothing else
    (``{"error": {"code": …, "err_code": …, "description": …}}``, maybe with ``stream``), else None:
    sent to the publisher's reply subject as an ack is (:func:`reflected_ack`)."""
    error = raw.get("error")
    if not (isinstance(error, dict) and raw.keys() <= {"error", "stream"} and error.keys() <= _ERROR_FIELDS):
        return None
    code, description = error.get("code"), error.get("description")
    if type(code) is not int or not isinstance(description, str):
        return None
    return description


def _parse(data: bytes) -> dict[str, Any]:
    try:
        raw = _DECODER.decode(data.decode("utf-8"))
    except UnicodeDecodeError:
        raise Refused("not_json", "not UTF-8") from None
    except (ValueError, RecursionError) as exc:
        raise Refused("not_json", f"not JSON: {str(exc)[:120]}") from None
    if not isinstance(raw, dict):
        raise Refused("not_json", f"a JSON {type(raw).__name__}, not an object")
    return raw


def _first_error(exc: ValidationError) -> str:
    errors = exc.errors(include_url=False, include_input=False, include_context=False)
    first = errors[0]
    where = ".".join(str(p) for p in first["loc"]) or "event"
    more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
    return f"{where}: {first['msg']}"[:200] + more


def message_ids(event: Event) -> Iterator[str]:
    """Every message id ``event`` names (its own, parents, ranges, deletions)."""
    if isinstance(event, MessageBodyEvent):
        yield event.message_id
    if isinstance(event, MessageAppended) and event.parent_id is not None:
        yield event.parent_id
    if isinstance(event, MessagesDeleted):
        yield from event.message_ids
    if isinstance(event, SkillUnloaded) and event.message_id is not None:
        yield event.message_id
    if isinstance(event, CompactionRecorded):
        yield from (event.from_message_id, event.to_message_id, event.leaf_id)
    if isinstance(event, CompactionFailed):
        yield event.leaf_id
    if isinstance(event, CompactionSkipped) and event.leaf_id is not None:
        yield event.leaf_id


def _check_body_hash(event: MessageBodyEvent) -> None:
    """:class:`Refused` ``invalid`` when ``event``'s inline message does not hash to its
    ``body_sha256``. Only an over-cap message (``original_ref``: the hash is its untruncated
    original's) may carry another; a claim-checked body is not inline. Admitted, a wrong hash
    would be stored as the message's (projections/history.py ``row_hash``), and the true body
    appended again under its id would answer ``message_conflict`` instead of replaying. The
    history projection relies on this check: it does not hash an admitted inline body again
    (``hash_is_own``)."""
    if event.message is None or getattr(event, "original_ref", None) is not None:
        return
    try:
        own = body_hash(event.message)
    except (TypeError, ValueError, RecursionError):  # not JSON-writable (admit refused what it knows of)
        raise Refused("invalid", "message: its canonical JSON cannot be written to hash it") from None
    if own != event.body_sha256:
        raise Refused(
            "invalid",
            f"body_sha256 {event.body_sha256[:64]!r} is not the SHA-256 of the inline message's canonical JSON "
            f"({own}); only an over-cap message, with original_ref, carries its original's",
        )


def _check_ids(event: Event) -> None:
    try:
        check_tenant(event.tenant)
        if event.session != TENANT_SCOPE:
            check_session(event.session)
        if isinstance(event, SessionCreated) and event.parent_session_id is not None:
            check_session(event.parent_session_id)
        for mid in message_ids(event):
            check_message_id(mid)
    except InvalidId as exc:
        raise Refused("invalid", str(exc)) from None


def _check_buckets(event: Event) -> None:
    """:class:`Refused` ``invalid`` when a skill event's ``bucket`` does not match
    :data:`events.context.BUCKET_RE`, the rule a session config's buckets are validated with (so
    ``session.configured`` needs no check here). Admitted, its skills-index row named a bucket
    such as ``../x``, and a tenant's erasure, which cleans every bucket the index names, failed
    on it every time (a rebuild restored the row). The fuller rule (``..``, an IPv4 address:
    :func:`events.context.is_bucket_name`) is the services', not the contract's, so that no
    config admitted before it is refused on a rebuild; the erasure leaves such names out (they
    hold nothing). Whether a bucket is one of Chronicle's own is a deployment's setting: the
    services refuse those where they read or write (services/context/blocks.py)."""
    if isinstance(event, SkillIndexed | SkillRemoved) and not BUCKET_RE.fullmatch(event.bucket):
        raise Refused("invalid", f"bucket: {event.bucket[:100]!r} is not an S3 bucket name")


def _check_lengths(event: Event) -> None:
    """:class:`Refused` ``too_long`` when a text field of ``event`` is longer than the API takes
    (events/limits.py): length checks of a few fields, nothing parsed or walked."""
    for field, value, limit in _limited_fields(event):
        if value is not None and len(value) > limit:
            raise Refused("too_long", f"{field}: {len(value)} characters, more than the {limit} the API takes")


def _limited_fields(event: Event) -> Iterator[tuple[str, str | None, int]]:
    if isinstance(event, SessionCreated | SessionRenamed):
        yield "name", event.name, MAX_SESSION_NAME
    if isinstance(event, MessageBodyEvent):
        yield "role", event.role, MAX_ROLE
        if event.message is not None and isinstance(inline := event.message.get("role"), str):
            yield "message.role", inline, MAX_ROLE  # a written role wins in the event, not in its body
    if isinstance(event, SkillLoaded | SkillUnloaded):
        yield "tool_call_id", event.tool_call_id, MAX_TOOL_CALL_ID


def _mismatch(own_tenant: str, own_session: str, subject: str, layout: SubjectLayout) -> str:
    """Why ``subject`` is not the session subject of the event's tenant and session (only
    computed for a refusal)."""
    try:
        tenant, session = layout.parse(subject)
    except ValueError:
        return "the subject is not a session subject of this stream"
    if tenant != own_tenant:
        return f"the event's tenant {own_tenant[:64]!r} is not the subject's {tenant[:64]!r}"
    if session != own_session:
        return f"the event's session {own_session[:64]!r} is not the subject's {session[:64]!r}"
    part = partition_of(tenant, session, layout.partitions)
    return f"the subject's partition token is not p{part:03d}"
