"""A three-node NATS cluster loses the stream's leader, then a follower, under load: writes pause and go
on, nothing restarts but the node, nothing is lost or duplicated, and each node catches up."""

from __future__ import annotations

import pytest

from bench.failover import FailoverOptions, longest_gap, run_failover
from services.settings import Settings


def test_longest_gap_counts_the_window_edges() -> None:
    assert longest_gap([1.0, 1.5, 4.0], 0.5, 5.0) == 2.5
    assert longest_gap([], 0.0, 3.0) == 3.0
    assert longest_gap([0.0, 9.0], 1.0, 2.0) == 1.0


@pytest.mark.slow
@pytest.mark.timeout(300)
async def test_losing_the_leader_then_a_follower_loses_nothing() -> None:
    report = await run_failover(Settings(), FailoverOptions(writers=4, settle_s=2.0), lambda _line: None)
    print("\n".join(report.lines()))
    assert report.replicas == 3
    leader, follower = report.losses
    assert (leader.led_stream, follower.led_stream) == (True, False)
    assert leader.new_leader not in (None, leader.node), report.lines()
    for loss in report.losses:
        assert loss.recovered_s is not None, report.lines()
        assert loss.caught_up_s is not None, report.lines()
        assert loss.pause_s is not None, report.lines()
        assert loss.pause_s < loss.recovered_s + 1, report.lines()
    assert report.restarted == [], "the projector, the compactor and the APIs follow without a restart"
    chaos = report.chaos
    assert chaos.ledger.acknowledged > 0
    assert (chaos.lost, chaos.duplicated, chaos.wrong_seq) == (0, 0, 0), report.lines()
    assert (chaos.history_lost, chaos.history_duplicated) == (0, 0), report.lines()
    assert (chaos.context_lost, chaos.over_budget) == (0, 0), report.lines()
    assert chaos.ledger.created_false_first_try == [], report.lines()
    assert chaos.ledger.unexpected == [], report.lines()
    assert chaos.verify_ok, chaos.verify_differences
    assert report.ok, report.lines()
