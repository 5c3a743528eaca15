"""Pages of a list: each read asks for one row more than it answers, so the last page says so
(``next_cursor`` null) even when it is exactly full."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Annotated, TypeVar

from fastapi import Query

from projections import queries
from services.api.deps import MAX_SEQ, caught_up, check_id, require_session
from services.bootstrap import Container

T = TypeVar("T")
MAX_PAGE = 1000
"""The most items one page of a session's list answers, and how many it answers by default
(``limit``'s bound): the tree, a message's children, prompt versions, compactions and
compaction failures. Each also ends a page early at :data:`projections.pages.PAGE_BYTES` of
text (message bodies, prompt texts, summaries, errors)."""
PageLimit = Annotated[int, Query(ge=1, le=MAX_PAGE)]
"""``limit`` of a session's list."""
SeqCursor = Annotated[int, Query(ge=0, le=MAX_SEQ)]
"""``cursor`` of a session's list: the page after this sequence (prompts page by version)."""


def more(limit: int) -> int:
    """How many rows to read for a page of ``limit``: one more, to learn whether another follows."""
    return limit + 1


def page(rows: list[T], limit: int) -> tuple[list[T], T | None]:
    """The page of rows read with :func:`more`, and the row the next page starts after (its
    cursor's), None when no row follows."""
    if len(rows) > limit:
        return rows[:limit], rows[limit - 1]
    return rows, None


async def session_page(
    c: Container,
    tenant: str,
    sid: str,
    min_seq: int | None,
    read: Callable[[queries.Conn], Awaitable[tuple[list[T], bool]]],
) -> tuple[list[T], bool]:
    """A page of a per-session list (``read``: its items and whether more follow): the id
    checked, read-your-writes, and ``404 session_not_found`` when the page is empty and the
    session does not exist for this tenant."""
    check_id("session", sid)
    await caught_up(c, tenant, sid, min_seq)
    async with c.pool.connection() as conn:
        found, follows = await read(conn)
    if not found:
        await require_session(c, tenant, sid)
    return found, follows
