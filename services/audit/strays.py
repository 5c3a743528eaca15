"""A session's events that arrived on a subject that is not its own: the projector quarantined them
(``subject_mismatch``), and a read of the session's subject never meets them. ``chronicle replay
--session`` shows them with the session's own, in sequence order, found by what their bytes say
(the event's ``tenant`` and ``session``, recorded with the quarantine row when the ``tenant`` is its
subject's: :func:`projections.quarantine.strays`) and read back from the stream."""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator, Iterable

from events import log as eventlog
from projections import quarantine
from services.bootstrap import Container


async def strays(
    c: Container, tenant: str, session: str, from_seq: int = 1, to_seq: int | None = None
) -> list[eventlog.StoredEvent]:
    """The quarantined events naming ``tenant``/``session`` that were stored on another subject of
    the tenant, and those stored on its ids under another partition's token, as the stream holds
    them (one no longer in the stream is left out), in sequence order
    (:func:`projections.quarantine.strays` and :func:`~projections.quarantine.owned`, the lookups
    an erasure deletes by too)."""
    own = c.layout.session_subject(tenant, session)
    async with c.pool.connection() as conn:
        seqs = set(await quarantine.strays(conn, [(tenant, session)], [own], from_seq, to_seq))
        # and those stored on its ids under another partition's token: the session's too, as its
        # erasure decides them (projections.quarantine.subject_owner)
        seqs.update(
            seq
            for seq in await quarantine.owned(conn, c.layout, tenant, session)
            if from_seq <= seq and (to_seq is None or seq <= to_seq)
        )
    found = [await eventlog.stored_at(c.js, c.layout, seq) for seq in sorted(seqs)]
    return [stored for stored in found if stored is not None and stored.subject != own]


async def merged(
    own: AsyncIterator[eventlog.StoredEvent], others: Iterable[eventlog.StoredEvent]
) -> AsyncGenerator[eventlog.StoredEvent, None]:
    """``own`` and ``others`` (each in sequence order) as one sequence-ordered stream."""
    rest = sorted(others, key=lambda e: e.seq)
    i = 0
    async for stored in own:
        while i < len(rest) and rest[i].seq < stored.seq:
            yield rest[i]
            i += 1
        yield stored
    for stored in rest[i:]:
        yield stored
