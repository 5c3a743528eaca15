"""How far a rebuild may go, and what a catch-up reads: each partition at its live checkpoint."""

from __future__ import annotations

from events.subjects import SubjectLayout
from projections.rebuild import catch_up_from, horizon_of, partition_horizons

P = "projector"


def test_one_projector_gives_every_partition_its_checkpoint() -> None:
    assert partition_horizons(P, 3, {P: 40, "compactor": 99, "other.p000": 7}) == {None: 40, 0: 40, 1: 40, 2: 40}


def test_partitions_have_their_own_and_an_unreported_one_the_single_projectors() -> None:
    found = partition_horizons(P, 3, {P: 5, f"{P}.p000": 30, f"{P}.p002": 20, f"{P}.p007": 90})
    assert found == {None: 5, 0: 30, 1: 5, 2: 20}  # p007 is no partition of this layout


def test_a_projector_that_never_ran_is_at_zero() -> None:
    assert partition_horizons(P, 2, {f"{P}.p000": 30, f"{P}.p001": 20}) == {None: 0, 0: 30, 1: 20}
    assert partition_horizons(P, 1, {}) == {None: 0, 0: 0}


def test_a_subjects_horizon_is_its_partitions_and_a_stray_subjects_the_single_projectors() -> None:
    layout = SubjectLayout(prefix="t.ev", partitions=2)
    horizon = horizon_of(layout, {None: 3, 0: 30, 1: 20})
    assert horizon("t.ev.dGVuYW50.p000.c2Vzcw") == 30
    assert horizon("t.ev.dGVuYW50.p001.c2Vzcw") == 20
    assert horizon("t.ev.dGVuYW50.p002.c2Vzcw") == 3  # no partition's filter matches it
    assert horizon("t.ev.dGVuYW50.c2Vzcw") == 3


def test_a_catch_up_reads_from_past_the_lowest_horizon_that_moved() -> None:
    held = {None: 0, 0: 30, 1: 20}
    assert catch_up_from(held, {None: 0, 0: 35, 1: 20}) == 31
    assert catch_up_from(held, {None: 0, 0: 35, 1: 25}) == 21


def test_a_horizon_that_did_not_move_costs_nothing_however_far_behind() -> None:
    """The single projector's checkpoint at 0 while partitioned projectors run: nothing read for it."""
    held = {None: 0, 0: 30, 1: 20}
    assert catch_up_from(held, dict(held)) is None
    assert catch_up_from(held, {None: 0, 0: 31, 1: 20}) == 31


def test_a_horizon_that_went_back_is_not_read_again() -> None:
    """Partitioned projectors replaced by one (it starts at their lowest checkpoint): what the
    schema holds past it is not applied a second time."""
    held = {None: 20, 0: 30, 1: 20}  # the partitions started where the single projector was
    assert catch_up_from(held, {None: 20, 0: 20, 1: 20}) is None
    assert catch_up_from(held, {None: 25, 0: 25, 1: 25}) == 21  # partition 0 is still past it
