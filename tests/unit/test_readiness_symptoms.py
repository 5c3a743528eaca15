"""Readiness from symptoms: a compactor that holds its presence but takes no work, and a commands
service that does not answer (services/api/metrics.py; the processes: tests/e2e/test_readiness.py)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import nats.errors

from services.api.metrics import WorkQueue, commands_reasons, compaction_wait_reasons, first_live_seq, oldest_wait

NOW = datetime(2026, 12, 7, 12, 0, tzinfo=UTC)


def queue(stored_s_ago: float | None, active_s_ago: float | None = None, *, pulls: int = 0) -> WorkQueue:
    oldest = None if stored_s_ago is None else NOW - timedelta(seconds=stored_s_ago)
    active = None if active_s_ago is None else NOW - timedelta(seconds=active_s_ago)
    return WorkQueue(1 if oldest else 0, 0, pulls, oldest, active)


def test_a_request_waiting_past_the_bound_with_no_compactor_working_is_a_reason() -> None:
    (reason,) = compaction_wait_reasons(queue(400, 3600), NOW, bound_s=300)
    assert reason.startswith("the oldest compaction request has waited 400s")
    assert "for 400s (past 300s)" in reason
    assert "hung or overloaded" in reason
    assert oldest_wait(queue(400), NOW) == 400


def test_a_delivery_or_ack_since_keeps_it_ready_a_backlog_being_worked_on() -> None:
    assert compaction_wait_reasons(queue(3600, 30), NOW, bound_s=300) == []
    (reason,) = compaction_wait_reasons(queue(3600, 301), NOW, bound_s=300)
    assert "waited 3600s" in reason
    assert "for 301s" in reason


def test_an_idle_compactor_asking_for_work_keeps_it_ready() -> None:
    """A request waiting out a failed summary's backoff (naked with a delay) waits on purpose: an
    idle compactor holds a pull request open meanwhile; a hung one holds none."""
    assert compaction_wait_reasons(queue(900, 900, pulls=1), NOW, bound_s=300) == []


def test_nothing_waiting_or_a_bound_of_zero_is_never_a_reason() -> None:
    assert compaction_wait_reasons(queue(None), NOW, bound_s=300) == []
    assert compaction_wait_reasons(queue(9999), NOW, bound_s=0) == []
    assert compaction_wait_reasons(queue(299), NOW, bound_s=300) == []
    assert oldest_wait(queue(None), NOW) == 0


def test_the_commands_service_reasons_say_which_failure() -> None:
    assert commands_reasons(None) == []  # not asked
    assert commands_reasons(True) == []  # answered
    (none,) = commands_reasons(nats.errors.NoRespondersError())
    assert none.startswith("no commands service is running")
    assert "CHRONICLE_READINESS_COMMANDS=false" in none
    (hung,) = commands_reasons(TimeoutError())
    assert hung.startswith("the commands service does not answer (hung or overloaded)")
    (other,) = commands_reasons(ConnectionError("NATS is not connected"))
    assert "NATS is not connected" in other


def test_the_oldest_wait_is_measured_on_the_nats_servers_clock_not_the_api_hosts() -> None:
    """The request's store time is the NATS server's; so is the time it answered (``at``). An API
    host an hour ahead (or behind) reports the wait the server sees: 400 s, not 4000 s (nor 0)."""
    server_now = NOW
    stored = server_now - timedelta(seconds=400)
    for skew in (3600.0, -3600.0):
        host_now = server_now + timedelta(seconds=skew)
        q = WorkQueue(1, 0, 0, stored, server_now - timedelta(seconds=400), at=server_now)
        assert oldest_wait(q, host_now) == 400
        (reason,) = compaction_wait_reasons(q, host_now, bound_s=300)
        assert "waited 400s" in reason
        assert "for 400s" in reason
        assert compaction_wait_reasons(q, host_now, bound_s=500) == []


def test_without_the_servers_time_the_hosts_clock_is_used() -> None:
    """A server that does not report its time (``at`` None): this host's clock, as before."""
    assert oldest_wait(queue(400), NOW) == 400


def test_a_request_whose_deliveries_ran_out_is_not_looked_for() -> None:
    """JetStream delivers a request no more once ``max_deliver`` deliveries went unacknowledged;
    it stays on the work-queue stream, no longer pending nor waiting for an ack. With none waiting
    for an ack, every delivered request still on the stream is such a one: the oldest request that
    waits is looked for after the last delivered; else after the ack floor (a request in progress
    may be as old as that)."""
    assert first_live_seq(delivered_seq=7, ack_floor_seq=3, ack_pending=0) == 8
    assert first_live_seq(delivered_seq=7, ack_floor_seq=3, ack_pending=2) == 4
    assert first_live_seq(delivered_seq=0, ack_floor_seq=0, ack_pending=0) == 1
