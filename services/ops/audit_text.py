"""What ``chronicle rebuild`` and ``chronicle verify`` print for their reports: pure text, no I/O."""

from __future__ import annotations

from services.audit.readers import RebuildReport


def rebuild_summary(projection: str, report: RebuildReport) -> str:
    """The line a rebuild ends with: what it did, the sequence it swapped at and, when the stream
    holds events past it, that the projector applies them (a rebuild stops at the live checkpoints)."""
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
    return line
