"""The text ``chronicle rebuild`` and ``chronicle verify`` print for their reports."""

from __future__ import annotations

from services.audit.readers import RebuildReport
from services.ops.audit_text import rebuild_summary


def test_a_rebuild_at_the_streams_end_says_where_it_swapped_and_no_more() -> None:
    line = rebuild_summary("all", RebuildReport("rebuild_x", 40, 2.0, 40, stream_last_seq=40))
    assert line == "rebuilt all: 40 events in 2.0s (20 ev/s); swapped at sequence 40"


def test_a_rebuild_behind_the_streams_end_says_the_projector_applies_what_follows() -> None:
    report = RebuildReport("rebuild_x", 40, 2.0, 40, kept_old="old_x", stream_last_seq=45)
    assert rebuild_summary("history", report) == (
        "rebuilt history: 40 events in 2.0s (20 ev/s); swapped at sequence 40; "
        "the projector applies what follows sequence 40 (the stream's last is 45); old tables kept in schema old_x"
    )


def test_a_rebuild_of_no_time_gives_no_rate() -> None:
    assert "(0 ev/s)" in rebuild_summary("all", RebuildReport("rebuild_x", 0, 0.0, 0))
