"""What a log mismatch tells the operator to do: rebuild or rebind when the stream holds events
(another log, or a restore), point CHRONICLE_NATS_URL at the stack's when it holds none (a server
that never held the log)."""

from __future__ import annotations

from datetime import UTC, datetime

from projections.logbinding import EMPTY_REMEDY, REMEDY, Binding, LogAbsent, LogIdentity, LogMismatch

THEN = datetime(2026, 1, 1, tzinfo=UTC)
NOW = datetime(2026, 2, 1, tzinfo=UTC)


def mismatch(last_seq: int, bound_stream: str = "CHRONICLE") -> LogMismatch:
    bound = Binding("projector", bound_stream, THEN, THEN)
    identity = LogIdentity("CHRONICLE", NOW, last_seq)
    return LogMismatch("differs", database="'db' on h:5432", identity=identity, bound=bound)


def test_a_stream_with_events_is_answered_with_rebuild_or_rebind() -> None:
    refused = mismatch(last_seq=7)
    assert refused.remedy == REMEDY
    assert str(refused) == f"differs. {REMEDY}"
    assert "chronicle log rebind --yes" in str(refused)


def test_an_empty_stream_is_answered_with_the_nats_url() -> None:
    refused = mismatch(last_seq=0)
    assert str(refused) == f"differs. {EMPTY_REMEDY}"
    assert "rebind" not in str(refused)
    assert "set CHRONICLE_NATS_URL (and CHRONICLE_NATS_NKEY_SEED)" in str(refused)
    assert refused.restated("nothing to verify against").remedy == EMPTY_REMEDY


def test_an_empty_stream_of_another_name_is_answered_with_the_settings_that_name_it() -> None:
    """(The binding names another stream: CHRONICLE_STREAM is among what REMEDY says to check.)"""
    assert mismatch(last_seq=0, bound_stream="OTHER").remedy == REMEDY


def test_a_missing_log_says_what_the_database_was_made_from() -> None:
    bound = Binding("projector", "CHRONICLE", THEN, THEN)
    absent = LogAbsent("CHRONICLE", database="'db' on h:5432", bound=bound, checkpoint=("projector.p000", 9))
    assert str(absent) == (
        f"no stream 'CHRONICLE' here; the read models in database 'db' on h:5432 were made from stream 'CHRONICLE' "
        f"created {THEN.isoformat()}"
    )
    unbound = LogAbsent("CHRONICLE", database="'db' on h:5432", bound=None, checkpoint=("projector.p000", 9))
    assert str(unbound).endswith("were made from a stream 'CHRONICLE' (checkpoint 'projector.p000' at sequence 9)")
