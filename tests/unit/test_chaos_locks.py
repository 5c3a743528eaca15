"""The drills' lock check (``chronicle chaos``, ``chronicle failover``): the projector holds its
advisory locks again after the faults (its own and every partition's). Other advisory locks (a
compactor's presence, a compaction's session lease) are no mismatch; a lock the projector lacks
is a failure, whatever else is held (the check counted every advisory lock: "18 (expected 17)"
beside RESULT: ok, and a missing projector lock hidden by a compaction's lease passed)."""

from __future__ import annotations

from bench.chaos import ChaosReport, Ledger


def report(projector: int, others: int, needed: int = 17) -> ChaosReport:
    done = ChaosReport(Ledger(), [], locks=projector, other_locks=others, locks_expected=needed, verify_ok=True)
    return done


def lock_line(r: ChaosReport) -> str:
    return next(line for line in r.lines() if line.startswith("advisory locks"))


def test_more_locks_than_the_projectors_are_no_mismatch() -> None:
    r = report(17, 1)
    assert r.ok
    assert lock_line(r) == (
        "advisory locks held at the end: the projector's 17 of 17 (its own and every partition's); "
        "1 other (a compactor's presence, a compaction's session lease)"
    )
    assert "expected" not in lock_line(r)


def test_a_lock_the_projector_lacks_fails_the_run_even_with_others_held() -> None:
    r = report(16, 1)
    assert not r.ok
    assert lock_line(r) == (
        "advisory locks held at the end: the projector's 16 of 17 (its own and every partition's): 1 MISSING; "
        "1 other (a compactor's presence, a compaction's session lease)"
    )
    assert r.lines()[-1] == "RESULT: FAILED"


def test_no_other_locks() -> None:
    assert lock_line(report(17, 0)) == (
        "advisory locks held at the end: the projector's 17 of 17 (its own and every partition's); 0 other"
    )
