"""Sealing: what is personal in an event is stored encrypted with its session's data key.

The one place where the contract says what is sealed and how. An event's readable envelope (id,
type, version, tenant, session, message ids, parents, roles, sizes, claim-check references) stays
as it is; the fields of :data:`SEALED_FIELDS` leave the JSON and travel in one ``sealed`` field::

    "sealed": {"kid": "<data key id>", "nonce": "<base64, 12 bytes>", "ct": "<base64>"}

``ct`` is AES-256-GCM of the sealed fields' canonical JSON under the session's data key, with the
envelope (id, type, version, tenant, session) as associated data: a ciphertext moved onto
another event or session does not open. A tenant-level event (the skills index: session ``""``,
:data:`events.ids.TENANT_SCOPE`) is sealed with the tenant scope's data key, which a tenant's
erasure destroys after its sessions'. Nonces are random (96 bits): sealing the same event twice
gives different bytes, which changes nothing, since the event id (``Nats-Msg-Id``) is what
JetStream deduplicates on and a message's ``body_sha256`` (inside the seal) is computed over the
plaintext, so "the same message again" is still recognised by the writers, which hold it.
Deterministic nonces would let anyone reading the log see which events carry equal text.

Claim-check objects and over-cap originals are sealed as bytes (:func:`seal_blob`): a header
(magic, key id, nonce) then the ciphertext, the tenant and session as associated data.

A destroyed key makes :func:`unseal` raise :class:`KeyDestroyed`: the event is a tombstone, an
outcome of its own (never a quarantine), and every reader shows or skips it as such.
"""

from __future__ import annotations

import base64
import binascii
import json
import os
import re
from base64 import b64encode
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from events.catalog import DERIVED_FIELDS, derived_fields
from events.envelope import Event

if TYPE_CHECKING:  # cryptography is imported where a seal is made or opened: the SDK's HTTP path needs none
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

SEALED = "sealed"
"""The envelope field that holds the sealed fields of an event."""

_KID = re.compile(rb'"sealed"\s*:\s*\{\s*"kid"\s*:\s*"([^"\\]{1,128})"')


def kid_in(data: bytes) -> str | None:
    """The key id a stored event names, found without parsing it (as this contract writes it:
    ``kid`` first); None when not found (a reader then asks only when it knows no key)."""
    found = _KID.search(data) if b'"sealed"' in data else None
    return found.group(1).decode("utf-8", "replace") if found else None


SEALED_FIELDS: dict[str, tuple[str, ...]] = {
    "message.appended": ("message", "body_sha256"),
    "message.updated": ("message", "body_sha256"),
    "context.written": ("content",),
    "search_entry.indexed": ("key", "content"),  # a key may be derived from the content
    "prompt.rendered": ("text",),
    "compaction.recorded": ("summary",),
    "compaction.failed": ("error",),
    "session.created": ("name", "metadata"),
    "session.renamed": ("name",),
    "session.ended": ("reason",),
    "session.configured": ("config",),
    # a skill's key may be made from its title or text (``set_context``), and its etag is a hash
    # of the document: sealed with the tenant scope's data key (its session is ``""``), which a
    # tenant's erasure destroys; a session's loads and unloads name the key too
    "skill.indexed": ("key", "description", "etag"),
    "skill.removed": ("key",),
    "skill.loaded": ("key",),
    "skill.unloaded": ("key",),
}
"""Per event type, the fields that are personal data (message bodies and their hashes, context
and search entry contents, rendered prompts, summaries, a summarizer's error, session names and
metadata, the reason a session ended, a configuration, whose readonly blocks may hold text, a
skill's key, description and document hash). A skill's output reaches the log as a tool result
inside a message body. Token counts and costs (``session.usage_added``) are not. A type added
here gets a new version (its earlier versions were never sealed): a release that does not know
it seals that type refuses its sealed events as ``newer_version``, not as a seal it cannot open."""

NONCE_BYTES = 12
KEY_BYTES = 32
BLOB_MAGIC = b"CHRSEAL1"


class KeyDestroyed(Exception):
    """The session's data key is destroyed: what was sealed with it can never be read again."""

    def __init__(self, tenant: str, session: str) -> None:
        super().__init__(f"session {session!r} of tenant {tenant!r} is erased")
        self.tenant = tenant
        self.session = session


class KeyUnavailable(LookupError):
    """No data key with that id is known for the session (not loaded, or never created)."""


class SealBroken(ValueError):
    """A sealed field or object that does not open with its (existing) key: tampered or malformed."""


@dataclass(frozen=True)
class DataKey:
    """One session's data key: its id and the secret (32 bytes for AES-256-GCM)."""

    kid: str
    secret: bytes

    def kid_json(self) -> bytes:
        """The key id as a JSON string (made once)."""
        cached: bytes | None = self.__dict__.get("_kid_json")
        if cached is None:
            cached = json.dumps(self.kid).encode()
            object.__setattr__(self, "_kid_json", cached)
        return cached

    def aead(self) -> AESGCM:
        """The cipher, made once per key (each new one costs a key schedule)."""
        cached: AESGCM | None = self.__dict__.get("_aead")
        if cached is None:
            from cryptography.hazmat.primitives.ciphers.aead import AESGCM

            cached = AESGCM(self.secret)
            object.__setattr__(self, "_aead", cached)
        return cached


def new_data_key(kid: str) -> DataKey:
    return DataKey(kid, os.urandom(KEY_BYTES))


class KeyLookup(Protocol):
    """Data keys for reading, already loaded (admission is synchronous): the key of
    ``(tenant, session, kid)``, :class:`KeyDestroyed` when destroyed, :class:`KeyUnavailable` when
    not known."""

    def key(self, tenant: str, session: str, kid: str) -> DataKey: ...

    def erased(self, tenant: str, session: str) -> bool: ...


@runtime_checkable
class KeyReader(KeyLookup, Protocol):
    """A :class:`KeyLookup` that loads what a batch of events needs before it is admitted."""

    async def load(self, wanted: Iterable[tuple[str, str, str | None]]) -> None:
        """Make :meth:`key` and :meth:`erased` answer for ``(tenant, session, key id or None)``."""
        ...

    def forget(self, tenant: str, session: str) -> None:
        """The session is erased (its ``session.erased`` event was read): never read its key again."""
        ...


class KeySource(Protocol):
    """Data keys for writing: the session's current key (made on first use), or None when this
    writer does not seal; :class:`KeyDestroyed` when the session is erased."""

    async def for_writing(self, tenant: str, session: str) -> DataKey | None: ...


class DataKeys(KeyReader, KeySource, Protocol):
    """Keys for reading and for writing (a publisher that also reads the log back)."""


TOMBSTONE_FIELDS = (
    "id",
    "type",
    "version",
    "tenant",
    "session",
    "occurred_at",
    "correlation_id",
    "causation_id",
    "message_id",
    "parent_id",
    "message_ids",
)


def tombstone_of(data: bytes) -> dict[str, Any]:
    """What an erased session's stored event still shows: its envelope and ids, its size, and
    ``"erased": true``; nothing else, sealed or not."""
    try:
        raw = json.loads(data)
    except ValueError:
        raw = {}
    kept = {k: raw[k] for k in TOMBSTONE_FIELDS if isinstance(raw, dict) and k in raw}
    body = raw.get("message") if isinstance(raw, dict) else None
    if "message_id" not in kept and isinstance(body, dict) and isinstance(body.get("id"), str):
        kept["message_id"] = body["id"]  # a compact body event's id is its body's
    return {**kept, "size": len(data), "erased": True}


def _aad(raw: dict[str, Any]) -> bytes:
    """The envelope a seal is bound to; written as :func:`seal_event` writes it."""
    g = raw.get
    return f"{g('id', '')}\n{g('type', '')}\n{g('version', '')}\n{g('tenant', '')}\n{g('session', '')}".encode()


def _canonical(value: Any) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def seal_fields(raw: dict[str, Any], key: DataKey) -> dict[str, Any]:
    """``raw`` (an event's JSON object) with its personal fields sealed (unchanged when its type
    has none)."""
    names = SEALED_FIELDS.get(str(raw.get("type")), ())
    if not names:
        return raw
    if isinstance(raw.get("message"), dict) and not all(n in raw for n in DERIVED_FIELDS):
        raw = {**derived_fields(raw["message"]), **raw}  # sealed, a body event writes them (as seal_event)
    secret = {n: raw[n] for n in names if n in raw}
    nonce = os.urandom(NONCE_BYTES)
    ct = key.aead().encrypt(nonce, _canonical(secret), _aad(raw))
    out = {k: v for k, v in raw.items() if k not in secret}
    out[SEALED] = {"kid": key.kid, "nonce": _b64(nonce), "ct": _b64(ct)}
    return out


def seal_event(event: Event, data: bytes, key: DataKey) -> bytes:
    """``event`` (whose JSON is ``data``) with its personal fields sealed: the same fields as
    :func:`seal_event_json` writes, without parsing ``data`` back (pydantic writes both parts)."""
    names = _NAME_SETS.get(event.type)
    if names is None:
        return data
    secret = event.model_dump_json(include=names).encode()
    nonce = os.urandom(NONCE_BYTES)
    aad = f"{event.id}\n{event.type}\n{event.version}\n{event.tenant}\n{event.session}".encode()
    ct = key.aead().encrypt(nonce, secret, aad)
    rest = event.model_dump_json(exclude=names | event.left_out(sealed=True)).encode()
    return b"".join(
        (
            rest[:-1],
            b',"sealed":{"kid":',
            key.kid_json(),
            b',"nonce":"',
            b64encode(nonce),
            b'","ct":"',
            b64encode(ct),
            b'"}}',
        )
    )


_NAME_SETS = {kind: set(names) for kind, names in SEALED_FIELDS.items()}


TAG_BYTES = 16
"""What AES-GCM adds to the sealed fields' JSON (its authentication tag)."""


def sealed_size(event: Event, key: DataKey) -> int:
    """How many bytes :func:`seal_event` makes of ``event`` with ``key``, without sealing it: the
    sealed fields' JSON and its tag, base64 (a third larger), beside the rest. A writer measures
    an event with it before deciding to publish it (a refusal can then say by how much)."""
    names = _NAME_SETS.get(event.type)
    if names is None:
        return len(event.to_json())
    secret = len(event.model_dump_json(include=names).encode())
    rest = len(event.model_dump_json(exclude=names | event.left_out(sealed=True)).encode())
    frame = len(b',"sealed":{"kid":') + len(key.kid_json()) + len(b',"nonce":"') + len(b'","ct":"') + len(b'"}}')
    return rest - 1 + frame + _b64_size(NONCE_BYTES) + _b64_size(secret + TAG_BYTES)


def _b64_size(n: int) -> int:
    return 4 * ((n + 2) // 3)


def seal_event_json(data: bytes, key: DataKey) -> bytes:
    """An event's JSON bytes with its personal fields sealed."""
    raw = json.loads(data)
    if str(raw.get("type")) not in SEALED_FIELDS:
        return data
    return json.dumps(seal_fields(raw, key), ensure_ascii=False, separators=(",", ":")).encode()


def sealed_kid(raw: dict[str, Any]) -> str | None:
    """The data key id a parsed event is sealed with (None: not sealed)."""
    sealed = raw.get(SEALED)
    if isinstance(sealed, dict) and isinstance(sealed.get("kid"), str):
        return str(sealed["kid"])
    return None


def unseal_fields(raw: dict[str, Any], keys: KeyLookup | None) -> dict[str, Any]:
    """``raw`` with its sealed fields opened; :class:`KeyDestroyed` when the key is destroyed,
    :class:`KeyUnavailable` when no key is at hand, :class:`SealBroken` when malformed or tampered."""
    return open_fields(raw, keys)[0]


def open_fields(raw: dict[str, Any], keys: KeyLookup | None) -> tuple[dict[str, Any], bytes]:
    """:func:`unseal_fields`, and the opened fields' JSON as it was sealed."""
    sealed = raw.get(SEALED)
    if not isinstance(sealed, dict) or set(sealed) != {"kid", "nonce", "ct"}:
        raise SealBroken("'sealed' must be an object of kid, nonce and ct")
    kid, nonce, ct = sealed["kid"], sealed["nonce"], sealed["ct"]
    if not (isinstance(kid, str) and isinstance(nonce, str) and isinstance(ct, str)):
        raise SealBroken("'sealed' holds a field that is not a string")
    if keys is None:
        raise KeyUnavailable(f"event sealed with key {kid[:64]!r} and no data keys are configured")
    names = SEALED_FIELDS.get(str(raw.get("type")), ())
    if not names:
        raise SealBroken(f"events of type {str(raw.get('type'))[:64]!r} have no sealed fields")
    tenant, session = str(raw.get("tenant", "")), str(raw.get("session", ""))
    key = keys.key(tenant, session, kid)
    try:
        plain = key.aead().decrypt(_unb64(nonce), _unb64(ct), _aad(raw))
    except (_invalid_tag(), ValueError) as exc:
        raise SealBroken(f"sealed fields do not open with key {kid[:64]!r}: {type(exc).__name__}") from None
    try:
        secret = json.loads(plain)
    except ValueError:
        raise SealBroken("sealed fields are not JSON") from None
    if not isinstance(secret, dict) or not set(secret) <= set(names):
        raise SealBroken("sealed fields are not this type's personal fields")
    out = {k: v for k, v in raw.items() if k != SEALED}
    out.update(secret)
    return out, plain


def seal_blob(data: bytes, key: DataKey, tenant: str, session: str) -> bytes:
    """An object's bytes sealed with the session's key: magic, key id (length-prefixed), nonce, ciphertext."""
    kid = key.kid.encode()
    nonce = os.urandom(NONCE_BYTES)
    ct = key.aead().encrypt(nonce, data, _blob_aad(tenant, session))
    return BLOB_MAGIC + len(kid).to_bytes(1, "big") + kid + nonce + ct


def is_sealed_blob(data: bytes) -> bool:
    return data.startswith(BLOB_MAGIC)


def open_blob(data: bytes, keys: KeyLookup | None, tenant: str, session: str) -> bytes:
    """The plaintext of a sealed object (see :func:`seal_blob`); errors as :func:`unseal_fields`."""
    at = len(BLOB_MAGIC)
    if len(data) < at + 1:
        raise SealBroken("sealed object too short")
    n = data[at]
    kid = data[at + 1 : at + 1 + n].decode("utf-8", "replace")
    nonce = data[at + 1 + n : at + 1 + n + NONCE_BYTES]
    ct = data[at + 1 + n + NONCE_BYTES :]
    if keys is None:
        raise KeyUnavailable(f"object sealed with key {kid[:64]!r} and no data keys are configured")
    key = keys.key(tenant, session, kid)
    try:
        return key.aead().decrypt(nonce, ct, _blob_aad(tenant, session))
    except (_invalid_tag(), ValueError) as exc:
        raise SealBroken(f"sealed object does not open with key {kid[:64]!r}: {type(exc).__name__}") from None


def _invalid_tag() -> type[Exception]:
    from cryptography.exceptions import InvalidTag

    return InvalidTag


def _blob_aad(tenant: str, session: str) -> bytes:
    return f"blob\n{tenant}\n{session}".encode()


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _unb64(text: str) -> bytes:
    """Strict base64 (anything else is a broken seal: ``binascii.Error`` is a ``ValueError``)."""
    return binascii.a2b_base64(text, strict_mode=True)


class StaticKeys:
    """Keys held in memory (tests, tools, the direct path's cache): ``(tenant, session)`` -> key,
    or erased."""

    def __init__(self) -> None:
        self._keys: dict[tuple[str, str], dict[str, DataKey]] = {}
        self._erased: set[tuple[str, str]] = set()

    def put(self, tenant: str, session: str, key: DataKey) -> None:
        self._keys.setdefault((tenant, session), {})[key.kid] = key

    def forget(self, tenant: str, session: str) -> None:
        self.erase(tenant, session)

    def erase(self, tenant: str, session: str) -> None:
        self._keys.pop((tenant, session), None)
        self._erased.add((tenant, session))

    def key(self, tenant: str, session: str, kid: str) -> DataKey:
        if (tenant, session) in self._erased:
            raise KeyDestroyed(tenant, session)
        found = self._keys.get((tenant, session), {}).get(kid)
        if found is None:
            raise KeyUnavailable(f"no data key {kid[:64]!r} for session {session[:64]!r}")
        return found

    def erased(self, tenant: str, session: str) -> bool:
        return (tenant, session) in self._erased

    async def load(self, wanted: Iterable[tuple[str, str, str | None]]) -> None:
        return None

    async def for_writing(self, tenant: str, session: str) -> DataKey | None:
        if (tenant, session) in self._erased:
            raise KeyDestroyed(tenant, session)
        keys = self._keys.get((tenant, session))
        if not keys:
            key = new_data_key(f"k-{len(self._keys) + 1}")
            self.put(tenant, session, key)
            return key
        return next(iter(keys.values()))
