"""The objects a write stores before it is decided (a claim-checked body, an over-cap original),
deleted again when the write records no event that references them.

Only a write's *own* objects are ever deleted: sealed ones (encryption on). Sealing draws a fresh
nonce, so a sealed object's bytes, and its key (their hash), are new: no other write can reference
it. A plain object's key is the hash of its session and its body: the same body stored before (the
first of two identical appends) is the very same object, which that first event references, so a
plain object is never deleted here (docs/security.md, "What erasure does not remove").

Deleted only once the write is decided: answered without a new event of its own (a replay, a
keyed retry of a request the log already holds), refused (a 4xx, a conflict exhausted, an event
the contract refuses, an id another subject holds), or failed before it published anything. A
publish whose outcome is unknown (the log unreachable, an ack lost every time) may have stored its
event: its objects stay.
"""

from __future__ import annotations

import logging
from collections.abc import Collection
from dataclasses import dataclass, field

from events.admission import Refused
from events.blobs import BlobRef, BlobStore, refs_in
from events.objects import is_sealed_object
from events.publisher import ForeignDuplicate, Publisher
from services.errors import ChronicleError, ContentionExhausted

log = logging.getLogger("chronicle.writes")


def decided(exc: BaseException) -> bool:
    """Whether a write that raised ``exc`` certainly published no event of its own: a refusal,
    never a publish whose outcome is unknown."""
    if isinstance(exc, ForeignDuplicate | Refused | ContentionExhausted):
        return True
    return isinstance(exc, ChronicleError) and exc.status < 500


@dataclass(slots=True)
class OwnObjects:
    """The sealed objects one write stored (see the module's docstring)."""

    stored: list[tuple[BlobStore, BlobRef]] = field(default_factory=list)

    def store(self, store: BlobStore) -> BlobStore:
        """``store``, recording every sealed object put through it as this write's."""
        return _Recording(store, self)

    async def put(self, store: BlobStore, data: bytes) -> BlobRef:
        ref = await store.put(data)
        if is_sealed_object(data):
            self.stored.append((store, ref))
        return ref

    async def drop(self, keep: Collection[BlobRef] = ()) -> None:
        """Delete the objects ``keep`` does not name (the references of the event the write was
        answered with). Best effort: one that cannot be deleted now is logged and left, sealed."""
        stored, self.stored = self.stored, []
        for store, ref in stored:
            if ref in keep:
                continue
            try:
                await store.delete(ref)
            except Exception:
                log.warning("an object no event references could not be deleted: %s", ref.key, exc_info=True)

    async def settle(self, publisher: Publisher, seq: int) -> None:
        """The write was answered with the event at ``seq``, not stored by it (a replay, a
        duplicate): delete the objects that event does not reference. Unreadable: none."""
        if not self.stored:
            return
        try:
            msg = await publisher.js.get_msg(publisher.layout.stream, seq)
        except Exception:
            log.warning("the event at %d could not be read back: this write's objects stay", seq, exc_info=True)
            self.stored = []
            return
        await self.drop(refs_in(msg.data or b""))


class _Recording:
    def __init__(self, inner: BlobStore, own: OwnObjects) -> None:
        self.inner, self.own, self.kind = inner, own, inner.kind

    async def put(self, data: bytes) -> BlobRef:
        return await self.own.put(self.inner, data)

    async def get(self, ref: BlobRef) -> bytes:
        return await self.inner.get(ref)

    async def delete(self, ref: BlobRef) -> None:
        await self.inner.delete(ref)
