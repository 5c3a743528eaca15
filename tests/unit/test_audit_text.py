"""The text ``chronicle rebuild`` and ``chronicle verify`` print for their reports."""

from __future__ import annotations

from services.audit.readers import RebuildReport, VerifyReport
from services.ops.audit_text import EMPTY, rebuild_summary, verify_table


def test_a_rebuild_at_the_streams_end_says_where_it_swapped_and_no_more() -> None:
    line = rebuild_summary("all", RebuildReport("rebuild_x", 40, 2.0, 40, stream_last_seq=40))
    assert line == "rebuilt all: 40 events in 2.0s (20 ev/s); swapped at sequence 40"


def test_a_rebuild_behind_the_streams_end_says_the_projector_applies_what_follows() -> None:
    report = RebuildReport("rebuild_x", 40, 2.0, 40, kept_old="old_x", stream_last_seq=45)
    assert rebuild_summary("history", report) == (
        "rebuilt history: 40 events in 2.0s (20 ev/s); swapped at sequence 40; "
        "the projector applies what follows sequence 40 (the stream's last is 45); old tables kept in schema old_x"
    )


def test_a_rebuild_that_quarantined_events_says_how_many_and_why() -> None:
    # an SRE trial rebuilt into a new database without the data keys: every one of 11,912 sealed
    # events was quarantined, and the rebuild said only "rebuilt all: 11912 events", exit 0
    report = RebuildReport("rebuild_x", 40, 2.0, 40, stream_last_seq=40, quarantined={"invalid": 38, "too_long": 1})
    assert rebuild_summary("all", report) == (
        "rebuilt all: 40 events in 2.0s (20 ev/s); swapped at sequence 40; "
        "39 events quarantined (invalid 38, too_long 1: chronicle quarantine list)"
    )


def test_a_rebuild_of_no_time_gives_no_rate() -> None:
    assert "(0 ev/s)" in rebuild_summary("all", RebuildReport("rebuild_x", 0, 0.0, 0))


SUM = "0123456789abcdef0123456789abcdef"


def _report(**tables: tuple[tuple[int, str], tuple[int, str]]) -> VerifyReport:
    named = {name.replace("_", " "): sides for name, sides in tables.items()}
    return VerifyReport(
        7, {t: live for t, (live, _) in named.items()}, {t: rebuilt for t, (_, rebuilt) in named.items()}
    )


def test_the_verify_tables_columns_line_up_whatever_the_length_of_a_tables_name() -> None:
    lines = verify_table(_report(sessions=((3, SUM), (3, SUM)), message_hashes=((1, SUM), (1, SUM))))
    assert lines == [
        f"sessions        live         3 rows {SUM}  rebuilt         3 rows {SUM}  ok",
        f"message hashes  live         1 rows {SUM}  rebuilt         1 rows {SUM}  ok",
    ]
    assert len({line.index(" live ") for line in lines}) == 1
    assert len({line.index(" rebuilt ") for line in lines}) == 1


def test_every_empty_table_shows_empty_whatever_its_rows_sum_to() -> None:
    """A read-model table sums no rows to ``""``, and the quarantine (before it did too) to the
    checksum of an empty list: both show the same."""
    lines = verify_table(
        _report(messages=((0, ""), (0, "")), quarantine=((0, SUM), (0, SUM)), sessions=((2, SUM), (2, SUM)))
    )
    assert lines[0] == lines[1].replace("quarantine", "messages  ")
    assert lines[0] == f"messages    live         0 rows {EMPTY:<32}  rebuilt         0 rows {EMPTY:<32}  ok"
    assert len({line.index(" rebuilt ") for line in lines}) == 1


def test_a_table_that_differs_is_marked_different_and_stays_aligned() -> None:
    lines = verify_table(_report(quarantine=((0, ""), (1, SUM)), sessions=((2, SUM), (2, SUM[::-1]))))
    assert [line.rsplit("  ", 1)[1] for line in lines] == ["DIFFERENT", "DIFFERENT"]
    assert lines[0] == f"quarantine  live         0 rows {EMPTY:<32}  rebuilt         1 rows {SUM}  DIFFERENT"
    assert len({line.index(" rebuilt ") for line in lines}) == 1


def test_a_verify_of_nothing_prints_no_table() -> None:
    assert verify_table(VerifyReport(0, {}, {})) == []
