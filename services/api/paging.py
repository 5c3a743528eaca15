"""Pages of a list: each read asks for one row more than it answers, so the last page says so
(``next_cursor`` null) even when it is exactly full."""

from __future__ import annotations

from typing import TypeVar

T = TypeVar("T")


def more(limit: int) -> int:
    """How many rows to read for a page of ``limit``: one more, to learn whether another follows."""
    return limit + 1


def page(rows: list[T], limit: int) -> tuple[list[T], T | None]:
    """The page of rows read with :func:`more`, and the row the next page starts after (its
    cursor's), None when no row follows."""
    if len(rows) > limit:
        return rows[:limit], rows[limit - 1]
    return rows, None
