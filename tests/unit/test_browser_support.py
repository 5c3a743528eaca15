"""The browser tests' setup: chromium is installed with apt-get when missing, after an update if
the first try fails, and a machine that cannot install it is told so."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.e2e import browser_support
from tests.e2e.browser_support import NoBrowser, ensure_chromium


def test_an_installed_chromium_is_used_as_it_is(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    exe = tmp_path / "chromium"
    exe.write_text("")
    monkeypatch.setattr(browser_support, "CHROMIUM", exe)
    monkeypatch.setattr(browser_support, "_apt", lambda *args: pytest.fail(f"apt-get {args} was run"))
    assert ensure_chromium() == exe


def test_a_missing_chromium_is_installed_updating_the_lists_when_needed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    exe = tmp_path / "chromium"
    calls: list[tuple[str, ...]] = []

    def apt(*args: str) -> int:
        calls.append(args)
        if args[0] == "install" and ("update",) in calls:
            exe.write_text("")
            return 0
        return 0 if args[0] == "update" else 100  # stale lists: the first install fails

    monkeypatch.setattr(browser_support, "CHROMIUM", exe)
    monkeypatch.setattr(shutil, "which", lambda name: f"/usr/bin/{name}")
    monkeypatch.setattr(browser_support, "_apt", apt)
    assert ensure_chromium() == exe
    assert calls == [("install", "-y", "chromium"), ("update",), ("install", "-y", "chromium")]


def test_a_machine_that_cannot_install_chromium_says_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(browser_support, "CHROMIUM", tmp_path / "chromium")
    monkeypatch.setattr(browser_support, "_apt", lambda *args: 100)
    monkeypatch.setattr(shutil, "which", lambda name: f"/usr/bin/{name}")
    with pytest.raises(NoBrowser, match="did not install it"):
        ensure_chromium()
    monkeypatch.setattr(shutil, "which", lambda name: None)
    with pytest.raises(NoBrowser, match="no apt-get"):
        ensure_chromium()
