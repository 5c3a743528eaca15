"""`chronicle replay --format table`: each row's time is the stream's, as the JSON lines' ``stored_at``."""

from __future__ import annotations

from datetime import UTC, datetime

from events.catalog import SessionCreated
from events.log import StoredEvent
from events.subjects import SubjectLayout
from services.audit.readers import format_table_row, replay_record

LAYOUT = SubjectLayout()
STORED = datetime(2026, 3, 4, 5, 6, 7, 890000, tzinfo=UTC)


def _stored(data: bytes) -> StoredEvent:
    return StoredEvent(7, LAYOUT.session_subject("acme", "s-1"), data, None, STORED)


def test_a_rows_time_is_when_the_stream_stored_it_not_the_publishers_occurred_at() -> None:
    """A direct publisher writes any ``occurred_at`` (a log restored from its archive keeps the
    original ones, while the stream stored them anew): an auditor's table shows the server's clock."""
    event = SessionCreated(tenant="acme", session="s-1", occurred_at=datetime(2001, 1, 1, tzinfo=UTC))
    stored = _stored(event.to_json())
    row = format_table_row(stored, LAYOUT, None)
    assert replay_record(stored, LAYOUT, None)["stored_at"] == "2026-03-04T05:06:07.890000Z"
    assert row.split()[:3] == ["7", "2026-03-04T05:06:07.890000Z", "session.created"]
    assert "2001-01-01" not in row


def test_a_refused_rows_time_is_when_the_stream_stored_it() -> None:
    row = format_table_row(_stored(b"not json"), LAYOUT, None)
    assert row.split()[:3] == ["7", "2026-03-04T05:06:07.890000Z", "REFUSED"]
