"""The fault suite's short form: every component killed once under load, nothing lost or duplicated."""

from __future__ import annotations

import pytest

from bench.chaos import FAULTS, ChaosOptions, run_chaos
from services.settings import Settings


@pytest.mark.slow
@pytest.mark.timeout(240)
async def test_killing_each_component_under_load_loses_and_duplicates_nothing() -> None:
    report = await run_chaos(Settings(), ChaosOptions.short(), lambda _line: None)
    print("\n".join(report.lines()))
    assert [f.fault for f in report.faults] == list(FAULTS)
    assert all(f.recovered_s is not None for f in report.faults), report.lines()
    assert report.ledger.acknowledged > 0
    assert (report.lost, report.duplicated, report.wrong_seq) == (0, 0, 0), report.lines()
    assert (report.history_lost, report.history_duplicated) == (0, 0), report.lines()
    assert (report.context_lost, report.over_budget) == (0, 0), report.lines()
    assert report.ledger.created_false_first_try == [], report.lines()
    assert report.ledger.unexpected == [], report.lines()
    assert report.verify_ok, report.verify_differences
    assert report.locks >= report.locks_expected, report.lines()
    assert all(v is not None for v in report.sigterm_s.values()), report.sigterm_s
    assert report.ok
