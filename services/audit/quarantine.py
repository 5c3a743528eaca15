"""Quarantined events for operators: list, show one, counts by reason; ``chronicle quarantine``.

Reads only Postgres (the ``quarantine`` table the projectors write), so it answers while NATS is
down. The tenant of an entry is read from its subject, the authority (``None`` when the subject
is not a session subject of this layout).
"""

from __future__ import annotations

import argparse
import base64
from dataclasses import asdict, dataclass
from datetime import datetime
from typing import Any

import psycopg

from events.ids import check_tenant, encode_token
from events.subjects import SubjectLayout
from services.settings import Settings
from services.terminal import safe_json, safe_text

DEFAULT_LIMIT = 50


@dataclass(frozen=True, slots=True)
class Entry:
    seq: int
    subject: str
    tenant: str | None
    session: str | None
    reason: str
    detail: str
    consumer: str
    recorded_at: datetime
    size: int


def raw_text(data: bytes) -> dict[str, str]:
    """Raw bytes for people: ``{"text": ...}`` when UTF-8, else ``{"base64": ...}``."""
    try:
        return {"text": data.decode("utf-8")}
    except UnicodeDecodeError:
        return {"base64": base64.b64encode(data).decode("ascii")}


def _entry(layout: SubjectLayout, row: tuple[Any, ...]) -> Entry:
    seq, subject, reason, detail, consumer, recorded_at, size = row
    tenant: str | None
    session: str | None
    try:
        tenant, session = layout.parse(subject)
    except ValueError:
        tenant = session = None
    return Entry(int(seq), subject, tenant, session, reason, detail, consumer, recorded_at, int(size))


_COLUMNS = "seq, subject, reason, detail, consumer, recorded_at, size"


async def list_quarantined(
    conn: psycopg.AsyncConnection[Any],
    layout: SubjectLayout,
    *,
    tenant: str | None = None,
    session: str | None = None,
    limit: int = DEFAULT_LIMIT,
    before: int | None = None,
) -> list[Entry]:
    """The newest ``limit`` quarantined events (``before``: of those below that sequence), newest
    first; ``tenant``: only those stored under
    that tenant's subjects; with ``session`` too, only those under a subject naming that session,
    whatever its partition token (an event refused for arriving on a wrong partition is listed
    with its session, as its entry says)."""
    head = _tenant_head(layout, tenant)
    tail = f".{encode_token(session)}" if tenant is not None and session is not None else None
    # ``<head><one token without a dot><tail>``: the session's subject under any partition token
    cur = await conn.execute(
        f"SELECT {_COLUMNS} FROM quarantine WHERE starts_with(subject, %(head)s) AND (%(tail)s::text IS NULL OR ("
        "right(subject, length(%(tail)s)) = %(tail)s AND length(subject) > length(%(head)s) + length(%(tail)s) "
        "AND strpos(substr(subject, length(%(head)s) + 1), '.') "
        "= length(subject) - length(%(head)s) - length(%(tail)s) + 1"
        ")) AND (%(before)s::bigint IS NULL OR seq < %(before)s) ORDER BY seq DESC LIMIT %(limit)s",
        {"head": head, "tail": tail, "before": before, "limit": max(0, limit)},
    )
    return [_entry(layout, row) for row in await cur.fetchall()]


async def show(conn: psycopg.AsyncConnection[Any], layout: SubjectLayout, seq: int) -> dict[str, Any] | None:
    """One quarantined event with its raw bytes (as text when UTF-8, else base64; of an event over
    64 KiB its first 64 KiB, with ``raw_kept``: the log holds the whole event at its sequence);
    None if the sequence is not quarantined."""
    cur = await conn.execute(f"SELECT {_COLUMNS}, raw FROM quarantine WHERE seq = %s", (seq,))
    row = await cur.fetchone()
    if row is None:
        return None
    out = asdict(_entry(layout, row[:-1]))
    out["recorded_at"] = out["recorded_at"].isoformat()
    raw = bytes(row[-1])
    out["raw"] = raw_text(raw)
    if len(raw) < out["size"]:  # the whole event is in the log at its sequence
        out["raw_kept"] = len(raw)
    return out


async def counts(
    conn: psycopg.AsyncConnection[Any], layout: SubjectLayout | None = None, tenant: str | None = None
) -> dict[str, int]:
    """How many events are quarantined, by reason; with ``layout`` and ``tenant``, only those
    stored under that tenant's subjects (what :func:`list_quarantined` selects for it)."""
    head = _tenant_head(layout, tenant) if layout is not None else ""
    cur = await conn.execute(
        "SELECT reason, count(*) FROM quarantine WHERE starts_with(subject, %s) GROUP BY reason ORDER BY reason",
        (head,),
    )
    return {str(reason): int(n) for reason, n in await cur.fetchall()}


async def counts_between(conn: psycopg.AsyncConnection[Any], after: int, upto: int) -> dict[str, int]:
    """How many events with a sequence in ``(after, upto]`` are quarantined, by reason."""
    cur = await conn.execute(
        "SELECT reason, count(*) FROM quarantine WHERE seq > %s AND seq <= %s GROUP BY reason", (after, upto)
    )
    return {str(reason): int(n) for reason, n in await cur.fetchall()}


def _tenant_head(layout: SubjectLayout, tenant: str | None) -> str:
    """The subject prefix of ``tenant``'s events (``""``: every subject)."""
    return f"{layout.prefix}.{encode_token(check_tenant(tenant))}." if tenant is not None else ""


def format_entry(e: Entry) -> str:
    """One line of ``chronicle quarantine list``; the session (a subject token decodes to any
    string), the subject and the detail with their control characters escaped
    (:mod:`services.terminal`)."""
    who = safe_text(f"{e.tenant}/{e.session}" if e.tenant is not None else e.subject)
    detail = safe_text(e.detail)
    return f"{e.seq:>10}  {e.recorded_at:%Y-%m-%d %H:%M:%S}  {e.reason:<16}  {who[:60]:<60}  {detail[:120]}"


async def run_quarantine(settings: Settings, args: argparse.Namespace) -> int:
    """``chronicle quarantine list [--tenant T] [--limit N]`` and ``chronicle quarantine show SEQ``
    (``args.quarantine_command``, ``args.tenant``, ``args.limit``, ``args.seq``). ``show`` of a
    sequence that is not quarantined exits 1."""
    layout = settings.layout()
    async with await psycopg.AsyncConnection.connect(settings.database_url, autocommit=True) as conn:
        if args.quarantine_command == "show":
            found = await show(conn, layout, args.seq)
            if found is None:
                print(f"sequence {args.seq} is not quarantined")
                return 1
            print(safe_json(found, indent=2, ensure_ascii=False))
            return 0
        entries = await list_quarantined(conn, layout, tenant=args.tenant, limit=args.limit)
        for e in entries:
            print(format_entry(e))
        by_reason = await counts(conn)
        total = sum(by_reason.values())
        if args.tenant is not None:  # the footer counts what the filter selects, then the whole
            selected = await counts(conn, layout, args.tenant)
            print(
                f"{sum(selected.values())} quarantined for tenant {args.tenant!r}{_by_reason(selected)}; {total} in all"
            )
        else:
            print(f"{total} quarantined in all{_by_reason(by_reason)}")
    return 0


def _by_reason(by_reason: dict[str, int]) -> str:
    summary = ", ".join(f"{r} {n}" for r, n in by_reason.items())
    return f" ({summary})" if summary else ""
