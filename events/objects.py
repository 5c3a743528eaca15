"""An object's bytes as Chronicle stores them (claim-checked bodies, over-cap originals): behind a
header naming the session they belong to, so that no other session's event can be given them.

Object keys are content hashes. Without the header, a tenant that publishes straight to JetStream
and guesses the exact bytes of another tenant's unsealed body could reference its object and learn,
from whether its event is projected, that the guess was right; and a reference to another
session's sealed object, published into a session that is then erased, would make the erasure
delete it. With the header, a reference from any other session reads as if there were no such
object (:data:`NOT_THIS_SESSIONS` is all it says), and an erasure deletes its session's objects only.

Inside the header the bytes are sealed (encryption on: :func:`events.sealing.seal_blob`, the
session also bound as the ciphertext's associated data) or plain. Objects written before the
header existed have none: a sealed one opens for its session only (its key), a plain one opens for
any session that references it (docs/security.md).

:func:`open_object` is the one way to read a stored object for a session.
"""

from __future__ import annotations

from events.sealing import KeyLookup, is_sealed_blob, open_blob

OWNED_MAGIC = b"CHROWN1"
NOT_THIS_SESSIONS = "no such object for this session"
"""What a reference to another session's object learns: no more than about a missing one."""


class NotTheOwner(ValueError):
    """The object is another session's (or its owner header is broken): not to be read here."""

    def __init__(self) -> None:
        super().__init__(NOT_THIS_SESSIONS)


def owned(data: bytes, tenant: str, session: str) -> bytes:
    """``data`` (sealed or plain) behind its owner's header: magic, then tenant and session,
    each length-prefixed (two bytes, big-endian) UTF-8."""
    return OWNED_MAGIC + _field(tenant) + _field(session) + data


def owner_of(data: bytes) -> tuple[tuple[str, str], bytes] | None:
    """The owner (tenant, session) and the bytes inside the header; None for bytes without one
    (written before owners). :class:`NotTheOwner` for a header cut short or not UTF-8: broken
    bytes are nobody's, so they open for no session."""
    if not data.startswith(OWNED_MAGIC):
        return None
    at = len(OWNED_MAGIC)
    fields: list[str] = []
    for _ in range(2):
        if len(data) < at + 2:
            raise NotTheOwner
        n = int.from_bytes(data[at : at + 2], "big")
        if len(data) < at + 2 + n:
            raise NotTheOwner
        try:
            fields.append(data[at + 2 : at + 2 + n].decode("utf-8"))
        except UnicodeDecodeError:
            raise NotTheOwner from None
        at += 2 + n
    return (fields[0], fields[1]), data[at:]


def inner(data: bytes, tenant: str, session: str) -> bytes:
    """The bytes inside the header when ``(tenant, session)`` owns them (still sealed when sealed);
    :class:`NotTheOwner` when another session does."""
    found = owner_of(data)
    if found is None:
        return data
    owner, rest = found
    if owner != (tenant, session):
        raise NotTheOwner
    return rest


def open_object(data: bytes, keys: KeyLookup | None, tenant: str, session: str) -> bytes:
    """The plaintext of a stored object for the session ``(tenant, session)`` that references it:
    :class:`NotTheOwner` when it is another session's; a sealed one opened with the session's key
    (errors as :func:`events.sealing.open_blob`)."""
    data = inner(data, tenant, session)
    return open_blob(data, keys, tenant, session) if is_sealed_blob(data) else data


def is_sealed_object(data: bytes) -> bool:
    """Whether the object's bytes (inside any header) are sealed: reading them needs a data key."""
    try:
        found = owner_of(data)
    except NotTheOwner:
        return False
    return is_sealed_blob(found[1] if found is not None else data)


def belongs_to(data: bytes, tenant: str, session: str) -> bool:
    """True when the stored object is the session's alone, so its erasure may delete it: its
    header names the session, or (written before headers) it is sealed, which only this
    session's events were meant to reference."""
    try:
        found = owner_of(data)
    except NotTheOwner:
        return False
    return found[0] == (tenant, session) if found is not None else is_sealed_blob(data)


def _field(value: str) -> bytes:
    raw = value.encode("utf-8")
    return len(raw).to_bytes(2, "big") + raw
