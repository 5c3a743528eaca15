"""The installed ``chronicle`` command (``services.ops.entry:main``, as ``[project.scripts]`` names
it) exits with the status the CLI returns, as ``python -m services.ops.cli`` does: the exit codes the
README documents (1, 2, 3, 4) are the console script's too. Its entry point dropped the status, so
every failure the CLI reported by returning exited 0."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from services.ops import entry
from services.ops.cli import SETTINGS_EXIT


def _bare_env(tmp: Path) -> dict[str, str]:
    """The environment without any Chronicle setting (no operator seed), run from an empty dir."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CHRONICLE_")}
    env["CHRONICLE_DATA_DIR"] = str(tmp / "data")
    return env


def test_entry_main_returns_the_cli_status(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [k for k in os.environ if k.startswith("CHRONICLE_")]:
        monkeypatch.delenv(name)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("CHRONICLE_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setattr(sys, "argv", ["chronicle", "nats-config"])  # no operator seed: a setting refused
    assert entry.main() == SETTINGS_EXIT


def test_the_entry_module_run_as_a_process_exits_with_the_cli_status(tmp_path: Path) -> None:
    """``python -m services.ops.entry``: the entry module run as a program, as the README's
    Upgrading section names it (the console script calls its ``main``; ``chronicle up`` runs
    ``python -m services.ops.cli``)."""
    done = subprocess.run(
        [sys.executable, "-m", "services.ops.entry", "nats-config"],
        env=_bare_env(tmp_path),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == SETTINGS_EXIT, done.stderr
    assert "CHRONICLE_NATS_NKEY_SEED is not set" in done.stderr
