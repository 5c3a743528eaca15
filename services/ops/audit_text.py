"""What ``chronicle rebuild`` and ``chronicle verify`` print for their reports: pure text, no I/O."""

from __future__ import annotations

from services.audit.readers import RebuildReport, VerifyReport

EMPTY = "(empty)"
"""The checksum column of a table without rows (whichever way its rows are summed)."""


def rebuild_summary(projection: str, report: RebuildReport) -> str:
    """The line a rebuild ends with: what it did, the sequence it swapped at and, when the stream
    holds events past it, that the projector applies them (a rebuild stops at the live checkpoints),
    and how many events the quarantine holds after it, by reason (an SRE trial's rebuild into a new
    database without the data keys quarantined every sealed event and said nothing of it)."""
    rate = report.events / report.seconds if report.seconds else 0.0
    at = report.swapped_at_seq
    line = (
        f"rebuilt {projection}: {report.events} events in {report.seconds:.1f}s ({rate:,.0f} ev/s); "
        f"swapped at sequence {at}"
    )
    if report.stream_last_seq > at:
        line += f"; the projector applies what follows sequence {at} (the stream's last is {report.stream_last_seq})"
    if report.kept_old:
        line += f"; old tables kept in schema {report.kept_old}"
    if report.quarantined:  # a new database without its data keys quarantines every sealed event
        reasons = ", ".join(f"{reason} {n}" for reason, n in sorted(report.quarantined.items()))
        line += f"; {sum(report.quarantined.values())} events quarantined ({reasons}: chronicle quarantine list)"
    return line


def _checksum(rows: int, checksum: str) -> str:
    return EMPTY if rows == 0 else checksum


def verify_table(report: VerifyReport) -> list[str]:
    """One line per compared table, live beside rebuilt and ``ok`` or ``DIFFERENT``, columns aligned
    to the longest table name and checksum; a table without rows shows :data:`EMPTY` as its checksum."""
    tables = list(report.live)
    name_w = max((len(t) for t in tables), default=0)
    sum_w = max((len(_checksum(*side[t])) for side in (report.live, report.rebuilt) for t in tables), default=0)
    lines = []
    for table in tables:
        live, rebuilt = report.live[table], report.rebuilt[table]
        mark = "ok" if live == rebuilt else "DIFFERENT"
        lines.append(
            f"{table:<{name_w}}  live {live[0]:>9} rows {_checksum(*live):<{sum_w}}  "
            f"rebuilt {rebuilt[0]:>9} rows {_checksum(*rebuilt):<{sum_w}}  {mark}"
        )
    return lines
