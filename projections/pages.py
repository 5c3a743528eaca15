"""Pages of a session's lists whose rows hold large texts (messages, prompt versions, overlay
summaries, summarizer errors): a page ends after ``limit`` rows or once its texts reach
:data:`PAGE_BYTES`, whichever comes first, so one read never holds a session's every text at once."""

from __future__ import annotations

from typing import Any

PAGE_BYTES = 4 * 2**20
"""The text bytes (as stored) after which a page ends early: its rows before the last hold less,
and the last may take it past by at most one text (the most one row stores: about 1 MiB of an
event's text, a message's body up to the row cap)."""


def page_sql(columns: str, text: str, table: str, key: str, where: str = "") -> str:
    """One page of ``table``'s rows of a session (``%(t)s``, ``%(s)s``) after ``%(after)s`` in
    ``key`` order (``where``: a further condition on the rows, else none): ``columns``, then the
    large ``text`` column, read (else NULL) only while the texts before its row hold under
    ``%(budget)s`` bytes. At most ``%(count)s`` rows (read one more than the page, to learn
    whether another follows). ``octet_length`` reads a stored text's size without its bytes, so
    the rows past the budget are never loaded."""
    also = f" AND {where}" if where else ""
    return (
        f"SELECT {columns}, CASE WHEN coalesce(sum(octet_length({text})) OVER before, 0) < %(budget)s "
        f"THEN {text} END FROM (SELECT {columns}, {text} FROM {table} WHERE tenant = %(t)s AND session_id = %(s)s"
        f"{also} AND {key} > %(after)s ORDER BY {key} LIMIT %(count)s) p "
        f"WINDOW before AS (ORDER BY {key} ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) ORDER BY {key}"
    )


def page_params(tenant: str, session: str, after: int, limit: int) -> dict[str, Any]:
    """The parameters of :func:`page_sql` for a page of at most ``limit`` rows after ``after``."""
    return {"t": tenant, "s": session, "after": after, "count": limit + 1, "budget": PAGE_BYTES}


def cut(rows: list[tuple[Any, ...]], limit: int) -> tuple[list[tuple[Any, ...]], bool]:
    """The page of the rows :func:`page_sql` read (their text last, None past the budget): the
    leading rows with their text, at most ``limit``, and whether another row follows. The first
    row always has its text, so a page is never empty while rows follow."""
    n = 0
    while n < min(limit, len(rows)) and rows[n][-1] is not None:
        n += 1
    return rows[:n], len(rows) > n
