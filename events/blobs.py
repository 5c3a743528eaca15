"""Claim check: bodies larger than the payload limit live in object storage by content hash."""

from __future__ import annotations

import hashlib
import json
import re
from typing import Protocol

from pydantic import BaseModel, ConfigDict


class BlobRef(BaseModel):
    """Where a body lives: the store kind, its key (the SHA-256 of the bytes) and its size."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    store: str
    key: str
    sha256: str
    size: int


class BlobNotFound(LookupError):
    """A referenced blob is missing from object storage."""


class BlobStore(Protocol):
    """Content-addressed object storage; ``put`` is idempotent for equal bytes."""

    kind: str

    async def put(self, data: bytes) -> BlobRef: ...

    async def get(self, ref: BlobRef) -> bytes: ...

    async def delete(self, ref: BlobRef) -> None:
        """Remove the object (erasure); none there: nothing to do."""
        ...


SHA256_HEX = re.compile(r"[0-9a-f]{64}")
"""A SHA-256 hex digest as stores write it: the keys of the objects they write are made of it."""


def no_object(key: str) -> str:
    """What a store says of a key it has no object at (and admission of another session's object:
    the same words, so that a reference learns nothing more from either)."""
    return f"no object {key[:80]!r}"


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


class MemoryBlobStore:
    """In-process store for unit tests and tools that never publish large bodies."""

    kind = "memory"

    def __init__(self) -> None:
        self._data: dict[str, bytes] = {}

    async def put(self, data: bytes) -> BlobRef:
        digest = sha256_hex(data)
        self._data[digest] = data
        return BlobRef(store=self.kind, key=digest, sha256=digest, size=len(data))

    async def delete(self, ref: BlobRef) -> None:
        self._data.pop(ref.key, None)

    async def get(self, ref: BlobRef) -> bytes:
        try:
            return self._data[ref.key]
        except KeyError as exc:
            raise BlobNotFound(no_object(ref.key)) from exc


class RoutedBlobStores:
    """Several stores as one: ``put`` writes to the first (the one configured for new objects);
    ``get`` and ``delete`` go to the store a reference names (``ref.store``), so objects written
    while another store was configured still read. A reference naming no store here is no object."""

    def __init__(self, writer: BlobStore, *others: BlobStore) -> None:
        self.members = (writer, *others)
        self.kind = writer.kind
        self._writer = writer
        self._by_kind = {s.kind: s for s in self.members}

    async def put(self, data: bytes) -> BlobRef:
        return await self._writer.put(data)

    async def get(self, ref: BlobRef) -> bytes:
        store = self._by_kind.get(ref.store)
        if store is None:
            raise BlobNotFound(no_object(ref.key))
        return await store.get(ref)

    async def delete(self, ref: BlobRef) -> None:
        store = self._by_kind.get(ref.store)
        if store is not None:
            await store.delete(ref)


def refs_in(data: bytes) -> list[BlobRef]:
    """The object references a stored event names (``message_ref``, ``original_ref``: readable
    fields, nothing needs opening)."""
    if b'"message_ref"' not in data and b'"original_ref"' not in data:
        return []
    try:
        raw = json.loads(data)
    except ValueError:
        return []
    out: list[BlobRef] = []
    for name in ("message_ref", "original_ref"):
        value = raw.get(name) if isinstance(raw, dict) else None
        if isinstance(value, dict):
            try:
                out.append(BlobRef.model_validate(value))
            except ValueError:
                continue
    return out
