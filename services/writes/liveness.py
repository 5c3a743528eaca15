"""The one check that a session is live: every command and read that needs one calls it."""

from __future__ import annotations

from typing import Any

import psycopg

from projections import queries
from services.errors import ErasedSession, SessionNotFound


async def live_session(
    conn: psycopg.AsyncConnection[Any], tenant: str, session: str, *, must_exist: bool
) -> queries.SessionRow | None:
    """The session's row; ``404 session_not_found`` when it was deleted, or when it was never
    created and ``must_exist`` (else None: a session that exists implicitly, as the reference's).

    A session without a row is asked about its erasure, and an erased one is ``410
    session_erased``, its reads as its writes (what ``GET /v1/erasures`` lists anyway); the live
    sessions have a row, so their writes and reads gain no query."""
    row = await queries.get_session(conn, tenant, session)
    if row is not None and row.deleted_at is not None:
        raise SessionNotFound(f"session {session!r} was deleted", deleted=True)
    if row is None and await queries.is_erased(conn, tenant, session):
        raise ErasedSession(f"session {session!r} was erased")
    if row is None and must_exist:
        raise SessionNotFound(f"session {session!r} does not exist")
    return row
