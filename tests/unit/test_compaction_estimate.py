"""The compactor's estimate steps, pure: appends that extend or switch the branch, re-sums, due."""

from __future__ import annotations

from services.compaction.estimate import (
    Append,
    Branch,
    compacted_sum,
    fold_appends,
    is_due,
    path_from_leaf,
    skip_margin,
)


def test_appends_on_the_active_leaf_add_their_count_and_a_switch_asks_for_a_resum() -> None:
    branches = {("t", "a"): Branch(None, 0), ("t", "b"): Branch("b1", 40)}
    out, switched = fold_appends(
        branches,
        [
            Append("t", "a", "a1", None, 10),  # the first message of an empty session extends it
            Append("t", "a", "a2", "a1", 5),
            Append("t", "b", "x1", "b0", 7),  # under another message: a branch switch
            Append("t", "b", "x2", "x1", 3),  # after a switch the session is re-summed anyway
        ],
    )
    assert out == {("t", "a"): Branch("a2", 15), ("t", "b"): Branch("x2", 40)}
    assert switched == {("t", "b")}
    assert branches[("t", "a")] == Branch(None, 0)  # the input is left as it was


def test_a_root_message_of_a_non_empty_session_is_a_switch() -> None:
    _, switched = fold_appends({("t", "a"): Branch("a1", 10)}, [Append("t", "a", "r2", None, 4)])
    assert switched == {("t", "a")}


def test_a_path_is_summed_under_its_overlays_in_force_and_a_cycle_ends_it() -> None:
    walked = [("m3", 3), ("m2", 2), ("m1", 1), ("m0", 10), ("m2", 2)]  # leaf first, then a cycle
    path = path_from_leaf(walked)
    assert path == [("m0", 10), ("m1", 1), ("m2", 2), ("m3", 3)]
    assert compacted_sum(path, []) == 16
    assert compacted_sum(path, [("m1", "m2", 1)]) == 10 + 1 + 3
    assert compacted_sum(path, [("m1", "m2", 1), ("m1", "m3", 2)]) == 10 + 2  # the widest one that fits
    assert compacted_sum(path, [("m1", "m3", 2), ("m1", "m2", 1)]) == 10 + 2  # even when older (a sibling's)
    assert compacted_sum(path, [("m1", "m3", 2), ("m1", "m3", 5)]) == 10 + 5  # ties: the newest
    assert compacted_sum(path, [("m1", "gone", 1)]) == 16  # an overlay beyond the path does not apply


def test_due_is_strictly_over_the_threshold_with_the_prompt() -> None:
    assert not is_due(90, 10, 100)
    assert is_due(91, 10, 100)
    assert not is_due(10**9, 0, None)


def test_after_a_skip_due_again_only_past_it_by_a_tenth_of_compact_after() -> None:
    assert skip_margin(1000) == 100
    assert skip_margin(1001) == 101  # rounded up: never zero
    assert skip_margin(1) == 1
    # skipped at 1150 (prompt included) under compact_after 1000: due again above 1250
    assert not is_due(1150, 0, 1000, skipped=1150)
    assert not is_due(1200, 50, 1000, skipped=1150)
    assert is_due(1201, 50, 1000, skipped=1150)
    assert not is_due(900, 0, 1000, skipped=None)  # a skip never makes a session due under its threshold
    assert is_due(1001, 0, 1000, skipped=None)
