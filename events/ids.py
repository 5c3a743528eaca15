"""Identifier rules and NATS subject-token encoding.

Tenant and session ids become subject tokens. Ids made only of ``[A-Za-z0-9_-]`` are used as
they are; any other id is encoded as ``~`` + unpadded base64url of its UTF-8 bytes. ``~`` is not
in the plain alphabet, so the two forms never collide and no id can inject ``.``, ``*``, ``>``
or whitespace into a subject.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import re
import unicodedata
import uuid
from typing import Any

MAX_TENANT_LEN = 64
MAX_SESSION_LEN = 128
MAX_MESSAGE_ID_LEN = 256

_PLAIN = re.compile(r"[A-Za-z0-9_-]+")

_CONTROLS = r"\x00-\x1f\x7f-\x9f"
UNREACHABLE_SESSION_IDS = frozenset({".", ".."})
"""Session ids the contract admits (events stored with them stay valid) but the API and the
commands refuse for new writes (services/requests/checks.py): as a URL path segment they are
dot segments, which clients and proxies remove, so no request could name the session."""
UNREACHABLE_MESSAGE_IDS = UNREACHABLE_SESSION_IDS
"""Message ids refused as the id of a new message for the same reason (``/messages/{mid}``);
messages stored with one stay valid and keep their id (a fork copies it). A new message's id
may not hold a ``/`` either (:func:`check_new_message_id`)."""
_S_END = rf"[^\s/{_CONTROLS}]"  # first or last character of an id that is one URL path segment
_S_END_NO_DOT = rf"[^\s/.{_CONTROLS}]"
_SEGMENT_ID_PATTERN = (
    rf"^(?:{_S_END_NO_DOT}|\.{_S_END_NO_DOT}|{_S_END_NO_DOT}{_S_END}|{_S_END}[^/{_CONTROLS}]+{_S_END})$"
)
SESSION_ID_PATTERN = _SEGMENT_ID_PATTERN
MESSAGE_ID_PATTERN = rf"^[^\s{_CONTROLS}](?:[^{_CONTROLS}]*[^\s{_CONTROLS}])?$"
NEW_MESSAGE_ID_PATTERN = _SEGMENT_ID_PATTERN
_LISTED = rf"[^\s,{_CONTROLS}](?:[^,{_CONTROLS}]*[^\s,{_CONTROLS}])?"
MESSAGE_ID_LIST_PATTERN = rf"^{_LISTED}(?:,{_LISTED})*$"
"""The id rules as regular expressions for JSON Schema: no control characters, no surrounding
whitespace (no ``/`` in a session id or a new message's id, nor ``.`` or ``..`` alone: each is one
URL path segment; the list is message ids without ',' joined with ','). A
regex cannot name every Unicode category-C code point (format, private-use, unassigned), so the
schemas below also carry a ``format`` that says so."""

TENANT_ID_SCHEMA: dict[str, Any] = {
    "type": "string",
    "minLength": 1,
    "maxLength": MAX_TENANT_LEN,
    "pattern": "^[A-Za-z0-9_-]+$",
}
SESSION_ID_SCHEMA: dict[str, Any] = {
    "type": "string",
    "minLength": 1,
    "maxLength": MAX_SESSION_LEN,
    "pattern": SESSION_ID_PATTERN,
    "format": "chronicle-session-id",
    "description": "1-128 characters, none of Unicode category C (control, format, private-use, "
    "unassigned), no '/', no leading or trailing whitespace, not '.' or '..'",
}
MESSAGE_ID_SCHEMA: dict[str, Any] = {
    "type": "string",
    "minLength": 1,
    "maxLength": MAX_MESSAGE_ID_LEN,
    "pattern": MESSAGE_ID_PATTERN,
    "format": "chronicle-message-id",
    "description": "1-256 characters, none of Unicode category C (control, format, private-use, "
    "unassigned), no leading or trailing whitespace",
}
NEW_MESSAGE_ID_SCHEMA: dict[str, Any] = {
    **MESSAGE_ID_SCHEMA,
    "pattern": NEW_MESSAGE_ID_PATTERN,
    "format": "chronicle-new-message-id",
    "description": "1-256 characters, none of Unicode category C (control, format, private-use, "
    "unassigned), no '/', no leading or trailing whitespace, not '.' or '..' (a message's id is "
    "one segment of its URL paths; ids stored earlier with a '/' stay readable)",
}
"""JSON Schemas of the ids :func:`check_tenant`, :func:`check_session` and
:func:`check_message_id` admit (the OpenAPI document uses them); the session id's is what the
API and the commands take: :data:`UNREACHABLE_SESSION_IDS` left out; the new message id's (a
message's own ``id``) is what :func:`check_new_message_id` admits."""


class InvalidId(ValueError):
    """An id is empty, too long, or holds characters we refuse."""


_REFUSED_CATEGORIES = {
    "Cc": "a control",
    "Cf": "a format",
    "Co": "a private-use",
    "Cs": "a surrogate",
    "Cn": "an unassigned",
}
"""Unicode's category C, which no id may hold, by what a refusal calls each (a zero-width joiner
in an emoji sequence is a format character, neither control nor unassigned)."""


def _check(kind: str, value: str, max_len: int) -> str:
    if not value:
        raise InvalidId(f"{kind} must not be empty")
    if len(value) > max_len:
        raise InvalidId(f"{kind} is longer than {max_len} characters")
    if _PLAIN.fullmatch(value):  # the common case: nothing below can refuse it
        return value
    for ch in value:
        if (kind_of := _REFUSED_CATEGORIES.get(unicodedata.category(ch))) is not None:
            raise InvalidId(
                f"{kind} must not contain U+{ord(ch):04X}, {kind_of} character "
                "(no control, format, private-use, surrogate or unassigned characters)"
            )
    if value != value.strip():
        raise InvalidId(f"{kind} must not start or end with whitespace")
    return value


def check_tenant(value: str) -> str:
    """A tenant id: 1-64 characters of ``[A-Za-z0-9_-]``."""
    _check("tenant id", value, MAX_TENANT_LEN)
    if not _PLAIN.fullmatch(value):
        raise InvalidId("tenant id may only contain letters, digits, '_' and '-'")
    return value


def check_session(value: str) -> str:
    """A session id: 1-128 printable characters, no surrounding whitespace, no ``/`` (a session's
    id is one segment of its URL paths: ``%2F`` reaches the server as ``/``, so a session whose id
    holds one could never be named again)."""
    _check("session id", value, MAX_SESSION_LEN)
    if "/" in value:
        raise InvalidId("session id must not contain '/'")
    return value


def check_message_id(value: str) -> str:
    """A message id: 1-256 printable characters, no surrounding whitespace. Stored messages may
    hold any such id (events published before :func:`check_new_message_id` existed, their fork
    copies), so this is the rule for reading and naming one."""
    return _check("message id", value, MAX_MESSAGE_ID_LEN)


def check_new_message_id(value: str) -> str:
    """The id of a new message (an append): :func:`check_message_id`, and one URL path segment
    (``/messages/{mid}``) can name it: no ``/`` (``%2F`` reaches the server as ``/``, so the route
    would not match), not ``.`` or ``..`` (:data:`UNREACHABLE_MESSAGE_IDS`: dot segments, which
    clients and proxies remove). The API, the NATS commands and the SDK refuse the rest before
    anything is written; the event contract does not, so messages stored with one stay valid."""
    check_message_id(value)
    if value in UNREACHABLE_MESSAGE_IDS:
        raise InvalidId(f"message id must not be {value!r}: as a URL path segment it names no message")
    if "/" in value:
        raise InvalidId("message id must not contain '/': no URL path segment could name the message")
    return value


TENANT_SCOPE = ""
TENANT_SCOPE_TOKEN = "="  # noqa: S105 - a NATS subject token, not a credential
"""The session id of tenant-level events (e.g. the skills index); its token is ``=``, which no
session id can produce (``=`` is neither plain nor in the base64url alphabet)."""


def encode_token(value: str) -> str:
    """Encode an id as one NATS subject token (reversible, collision-free)."""
    if value == TENANT_SCOPE:
        return TENANT_SCOPE_TOKEN
    if _PLAIN.fullmatch(value):
        return value
    raw = base64.urlsafe_b64encode(value.encode("utf-8")).rstrip(b"=").decode("ascii")
    return "~" + raw


def decode_token(token: str) -> str:
    """Inverse of :func:`encode_token`."""
    if token == TENANT_SCOPE_TOKEN:
        return TENANT_SCOPE
    if not token.startswith("~"):
        return token
    body = token[1:]
    padded = body + "=" * (-len(body) % 4)
    value = base64.urlsafe_b64decode(padded.encode("ascii")).decode("utf-8")
    if encode_token(value) != token:
        raise InvalidId(f"subject token {token!r} is not in canonical form")
    return value


def derived_id(kind: str, *parts: object) -> str:
    """A deterministic event id: the same ``kind`` and parts always give the same id, so a retry
    or a second worker publishing the same fact is deduplicated by the stream (``Nats-Msg-Id``).
    The parts are joined with ``:`` under ``chronicle:<kind>:``, each with its ``\\`` and ``:``
    escaped by a ``\\``: parts that hold neither give the ids recorded before escaping was added,
    and no two lists of parts give one name (``s``, ``x:k`` against ``s:x``, ``k`` did: a session id
    and an ``Idempotency-Key`` may both hold a ``:``)."""
    escaped = (str(p).replace("\\", "\\\\").replace(":", "\\:") for p in parts)
    return str(uuid.uuid5(uuid.NAMESPACE_URL, ":".join(["chronicle", kind, *escaped])))


def keyed_digest(secret: str, digest: str) -> str:
    """``digest`` (a body's hash, say) under an HMAC keyed by ``secret``: what an id derived
    outside the server holds in its place, so that only a holder of ``secret`` can derive the id.
    Any publisher can learn the stream's newest event id (a publish with a wrong
    ``Nats-Expected-Last-Msg-Id`` is refused naming it: docs/security.md), and an id derived from
    a body's plain hash would confirm a guess of the body."""
    return hmac.new(
        hashlib.sha256(b"chronicle-event-id\n" + secret.encode()).digest(), digest.encode(), "sha256"
    ).hexdigest()
