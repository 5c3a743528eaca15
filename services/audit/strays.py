"""A session's events that arrived on a subject that is not its own: the projector quarantined them
(``subject_mismatch``), and a read of the session's subject never meets them. ``chronicle replay
--session`` shows them with the session's own, in sequence order, found by what their bytes say
(the event's ``tenant`` and ``session``) in the quarantine table and read back from the stream."""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator, AsyncIterator, Iterable
from typing import Any

from nats.js.errors import NotFoundError

from events import log as eventlog
from services.bootstrap import Container

_FIND = (
    "SELECT seq, raw FROM quarantine WHERE subject <> %(own)s AND position(%(needle)s IN raw) > 0 "
    "AND seq >= %(from)s AND (%(to)s::bigint IS NULL OR seq <= %(to)s) ORDER BY seq"
)


def names_session(raw: bytes, tenant: str, session: str) -> bool:
    """Whether ``raw`` is a JSON object whose ``tenant`` and ``session`` are these."""
    try:
        found: Any = json.loads(raw)
    except ValueError:  # not JSON (or cut where the quarantine keeps only its first 64 KiB)
        return False
    return isinstance(found, dict) and found.get("tenant") == tenant and found.get("session") == session


async def strays(
    c: Container, tenant: str, session: str, from_seq: int = 1, to_seq: int | None = None
) -> list[eventlog.StoredEvent]:
    """The quarantined events naming ``tenant``/``session`` that were stored on another subject,
    as the stream holds them (one no longer in the stream is left out), in sequence order."""
    own = c.layout.session_subject(tenant, session)
    params = {"own": own, "needle": session.encode(), "from": max(from_seq, 1), "to": to_seq}
    async with c.pool.connection() as conn:
        cur = await conn.execute(_FIND, params)
        rows = await cur.fetchall()
    found = []
    for seq, raw in rows:
        if not names_session(bytes(raw), tenant, session):
            continue
        try:
            msg = await c.js.get_msg(c.layout.stream, int(seq))
        except NotFoundError:
            continue
        found.append(eventlog.StoredEvent(int(seq), str(msg.subject), msg.data or b"", msg.headers, msg.time))
    return found


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
