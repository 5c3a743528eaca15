"""Partition checkpoint names: built in one place, read back by the same rule."""

from __future__ import annotations

import pytest

from projections.runner import checkpoint_partition, partition_checkpoint


@pytest.mark.parametrize("partition", [0, 7, 42, 999, 1000])
def test_a_partition_checkpoint_name_reads_back_as_its_partition(partition: int) -> None:
    assert checkpoint_partition("projector", partition_checkpoint("projector", partition)) == partition


@pytest.mark.parametrize(
    "name",
    ["projector", "projector.p", "projector.px1", "projector.p-1", "other.p001", "compactor", "projector.p001x"],
)
def test_other_names_are_no_partition(name: str) -> None:
    assert checkpoint_partition("projector", name) is None


def test_a_projector_named_like_a_prefix_of_another_is_not_confused() -> None:
    assert checkpoint_partition("proj", "projector.p001") is None
    assert checkpoint_partition("projector.p", "projector.p.p002") == 2
