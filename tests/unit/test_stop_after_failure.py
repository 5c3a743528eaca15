"""A process stopping for a failure (the API's NATS connection closed for good: uvicorn stopped
without a signal) keeps a failure's exit status, whatever ends its close: a close cut short at its
limit was a quiet cancellation and a forced exit was status 0, so a supervisor restarting on
failure (systemd ``Restart=on-failure``) never restarted it. A stop asked for by a signal still
ends quietly, status 0. The last-resort exit comes even when nothing can be written to stderr."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import pytest

from services.ops import processes


async def _closing_that_hangs(failed: bool) -> None:
    async with processes.stoppable() as stopping:
        stopping.closing(0.1, failed=failed)
        await asyncio.Event().wait()  # a close on a server that no longer answers


async def test_a_close_after_a_failure_cut_short_is_still_a_failure(monkeypatch: pytest.MonkeyPatch) -> None:
    forced: list[int] = []
    monkeypatch.setattr(processes, "_exit_after", lambda _s, status=0: forced.append(status))
    with pytest.raises(processes.StoppedAfterFailure):
        await asyncio.wait_for(_closing_that_hangs(failed=True), timeout=10)
    assert forced == [processes.FORCED_AFTER_FAILURE_EXIT]


async def test_a_close_after_a_stop_asked_for_cut_short_ends_quietly(monkeypatch: pytest.MonkeyPatch) -> None:
    forced: list[int] = []
    monkeypatch.setattr(processes, "_exit_after", lambda _s, status=0: forced.append(status))
    await asyncio.wait_for(_closing_that_hangs(failed=False), timeout=10)
    assert forced == [0]


_ROOT = Path(__file__).resolve().parents[2]
_EXIT_WITH_STDERR_FULL = """
import fcntl, os
from services.ops import processes
read_end, write_end = os.pipe()  # a stderr whose reader reads nothing: full, every write blocks
fcntl.fcntl(write_end, fcntl.F_SETFL, os.O_NONBLOCK)
try:
    while True:
        os.write(write_end, b"x" * 4096)
except BlockingIOError:
    pass
fcntl.fcntl(write_end, fcntl.F_SETFL, 0)
os.dup2(write_end, 2)
processes._exit_now(3)
"""


def test_the_last_resort_exit_happens_with_stderr_full() -> None:
    """The last-resort exit comes even when its line cannot be written (stderr a full pipe: a
    write to it, as the stuck main thread's log line, blocks for good), with the status it was given."""
    done = subprocess.run([sys.executable, "-c", _EXIT_WITH_STDERR_FULL], cwd=_ROOT, timeout=60, check=False)
    assert done.returncode == 3
