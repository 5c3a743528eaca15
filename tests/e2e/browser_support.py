"""A real browser for the view tests: Debian's ``chromium`` (Playwright's own browser download is
not reachable from our machines), installed with apt when it is missing.

``python -m tests.e2e.browser_support`` installs it (``make test`` runs it before pytest, so a
fresh CI machine has it); the browser fixture calls the same function.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

CHROMIUM = Path("/usr/bin/chromium")


class NoBrowser(RuntimeError):
    """Chromium is missing and could not be installed."""


def _apt(*args: str) -> int:
    sudo = [] if os.geteuid() == 0 else ["sudo", "-n"]
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    return subprocess.run([*sudo, "apt-get", *args], env=env, check=False).returncode


def ensure_chromium() -> Path:
    """The chromium executable, installed with ``apt-get install -y chromium`` (after an
    ``apt-get update`` if the first try fails) when it is not there yet."""
    if CHROMIUM.exists():
        return CHROMIUM
    if shutil.which("apt-get") is None:
        raise NoBrowser(f"{CHROMIUM} is missing and there is no apt-get to install it")
    if _apt("install", "-y", "chromium") != 0:
        _apt("update")
        _apt("install", "-y", "chromium")
    if not CHROMIUM.exists():
        raise NoBrowser(f"{CHROMIUM} is missing and 'apt-get install -y chromium' did not install it")
    return CHROMIUM


if __name__ == "__main__":
    print(f"browser: {ensure_chromium()}")
