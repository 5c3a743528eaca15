"""An object's bytes as Chronicle stores them (claim-checked bodies, over-cap originals): bound
to the session they belong to, so that no other session's event can be given them.

* Sealed (encryption on): :func:`events.sealing.seal_blob`; the session is the ciphertext's
  associated data, and its data key opens nothing else.
* Owned (encryption off): the bytes behind a header naming the tenant and session
  (:func:`owned`). Keys are content hashes: without the header, a tenant that publishes straight
  to JetStream and guesses the exact bytes of another tenant's body could reference its object
  and learn, from whether its event is projected, that the guess was right; with it, the object
  is another session's and the reference is refused.
* Objects written before objects were bound to their owner are neither, and open as they are
  for any session that references them (docs/security.md).

:func:`open_object` is the one way to read a stored object for a session.
"""

from __future__ import annotations

from events.sealing import KeyLookup, is_sealed_blob, open_blob

OWNED_MAGIC = b"CHROWN1"


class NotTheOwner(ValueError):
    """The object belongs to another session than the one that references it."""


def owned(data: bytes, tenant: str, session: str) -> bytes:
    """``data`` behind its owner's header: magic, then tenant and session, each length-prefixed
    (two bytes, big-endian) UTF-8."""
    return OWNED_MAGIC + _field(tenant) + _field(session) + data


def owner_of(data: bytes) -> tuple[tuple[str, str], bytes] | None:
    """The owner (tenant, session) and the bytes of an owned object; None for any other bytes
    (a sealed object, one written before owners, a header cut short)."""
    if not data.startswith(OWNED_MAGIC):
        return None
    at = len(OWNED_MAGIC)
    fields: list[str] = []
    for _ in range(2):
        if len(data) < at + 2:
            return None
        n = int.from_bytes(data[at : at + 2], "big")
        if len(data) < at + 2 + n:
            return None
        try:
            fields.append(data[at + 2 : at + 2 + n].decode("utf-8"))
        except UnicodeDecodeError:
            return None
        at += 2 + n
    return (fields[0], fields[1]), data[at:]


def open_object(data: bytes, keys: KeyLookup | None, tenant: str, session: str) -> bytes:
    """The plaintext of a stored object for the session ``(tenant, session)`` that references it.

    Sealed: opened with the session's key (errors as :func:`events.sealing.open_blob`). Owned:
    :class:`NotTheOwner` unless it is this session's. Anything else: the bytes as they are."""
    if is_sealed_blob(data):
        return open_blob(data, keys, tenant, session)
    found = owner_of(data)
    if found is None:
        return data
    owner, plain = found
    if owner != (tenant, session):
        raise NotTheOwner(f"the object belongs to session {owner[1][:64]!r} of tenant {owner[0]!r}")
    return plain


def belongs_to(data: bytes, tenant: str, session: str) -> bool:
    """True when the stored object is the session's alone (sealed ones are: only its key opens
    them, and their keys are unguessable; owned ones name it)."""
    if is_sealed_blob(data):
        return True
    found = owner_of(data)
    return found is not None and found[0] == (tenant, session)


def _field(value: str) -> bytes:
    raw = value.encode("utf-8")
    return len(raw).to_bytes(2, "big") + raw
