"""The work queue's pure parts: what a failed attempt leads to, request ids, the consumer's bounds."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from events.subjects import SubjectLayout
from services.compaction.queue import (
    GiveUp,
    Retry,
    after_failure,
    consumer_config,
    max_deliveries,
    request_id,
    series_wait,
)
from services.compaction.service import Series


def test_a_failed_attempt_is_retried_with_its_backoff_until_the_last() -> None:
    backoff = (1.0, 5.0)
    assert after_failure(1, 4, backoff) == Retry(1.0)
    assert after_failure(2, 4, backoff) == Retry(5.0)
    assert after_failure(3, 4, backoff) == Retry(5.0)  # the last delay repeats
    assert after_failure(4, 4, backoff) == GiveUp()
    assert after_failure(5, 4, backoff) == GiveUp()
    assert after_failure(1, 1, backoff) == GiveUp()


def test_the_same_decision_has_the_same_request_id() -> None:
    assert request_id("t", "s", "m9", 700) == request_id("t", "s", "m9", 700)
    assert len({request_id("t", "s", "m9", 700), request_id("t", "s", "m9", 701), request_id("t", "s", "m8", 700)}) == 3
    assert request_id("t", "s", None, 7) != request_id("t", "s2", None, 7)


def test_the_consumer_bounds_deliveries_well_past_the_attempts() -> None:
    """A delivery is not always an attempt (a nak to wait out a series' backoff or a busy lease):
    the bound leaves room for them, and still ends redelivery."""
    layout = SubjectLayout(stream="S", prefix="p.ev")
    config = consumer_config(layout, "compaction", 3, (0.5, 1.0, 2.0, 4.0, 8.0))
    assert config.max_deliver == max_deliveries(3) == 13
    assert config.backoff == [0.5, 1.0, 2.0, 4.0, 8.0]  # the last repeats
    short = consumer_config(layout, "compaction", 1, (0.5, 1.0, 2.0, 4.0, 8.0, 9.0))
    assert short.max_deliver == 5
    assert short.backoff == [0.5, 1.0, 2.0, 4.0, 8.0]  # never longer than max_deliver (the server refuses that)
    assert config.filter_subject == "p.ev-work.compaction.>"
    assert layout.work_subject("compaction", "t", "s").startswith("p.ev-work.compaction.")
    assert not layout.work_subject("compaction", "t", "s").startswith(layout.wildcard[:-1])


def test_a_request_continuing_a_series_waits_for_the_last_failures_backoff() -> None:
    backoff = (10.0, 60.0)
    failed_at = datetime(2026, 1, 1, tzinfo=UTC)

    def after(seconds: float) -> datetime:
        return failed_at + timedelta(seconds=seconds)

    assert series_wait(Series(1, failed_at), backoff, after(4)) == 6.0  # attempt 1 failed: 10 s after it
    assert series_wait(Series(2, failed_at), backoff, after(4)) == 56.0  # attempt 2: 60 s
    assert series_wait(Series(3, failed_at), backoff, after(4)) == 56.0  # the last delay repeats
    assert series_wait(Series(1, failed_at), backoff, after(12)) == 0.0  # over: at once
    # within a tenth of the delay (two compactors' clocks): no second wait after a nak for it
    assert series_wait(Series(1, failed_at), backoff, after(9.5)) == 0.0
    assert series_wait(Series(), backoff, after(0)) == 0.0  # no series
