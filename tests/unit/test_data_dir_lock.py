"""One ``chronicle up`` per data dir: the lock it holds for the stack's life refuses a second
holder, naming the data dir and what the running one serves, and is free again once released."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from services.ops.datalock import LOCK_FILE, data_dir_locked
from services.settings import UnusableResource


def test_a_second_holder_is_refused_naming_the_data_dir_and_the_running_stack(tmp_path: Path) -> None:
    with data_dir_locked(tmp_path, "pid 1, API http://127.0.0.1:18280, NATS nats://127.0.0.1:14350"):
        with pytest.raises(UnusableResource) as refused, data_dir_locked(tmp_path, "pid 2"):
            pytest.fail("a second holder got the lock")
        assert (tmp_path / LOCK_FILE).read_text() == "pid 1, API http://127.0.0.1:18280, NATS nats://127.0.0.1:14350\n"
    assert str(refused.value) == (
        f"{tmp_path} is the data dir of a running `chronicle up` (pid 1, API http://127.0.0.1:18280, NATS "
        "nats://127.0.0.1:14350): stop it first, or set CHRONICLE_DATA_DIR to another data dir"
    )


def test_the_lock_is_free_once_released(tmp_path: Path) -> None:
    with data_dir_locked(tmp_path, "pid 1"):
        pass
    with data_dir_locked(tmp_path, "pid 2"):
        assert (tmp_path / LOCK_FILE).read_text() == "pid 2\n"


def test_other_data_dirs_are_locked_apart(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    with data_dir_locked(tmp_path / "a", "pid 1"), data_dir_locked(tmp_path / "b", "pid 2"):
        assert re.fullmatch(r"pid \d\n", (tmp_path / "b" / LOCK_FILE).read_text())
