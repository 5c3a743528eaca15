"""A process stopping for a failure (the API's NATS connection closed for good: uvicorn stopped
without a signal) keeps a failure's exit status, whatever ends its close: a close cut short at its
limit was a quiet cancellation and a forced exit was status 0, so a supervisor restarting on
failure (systemd ``Restart=on-failure``) never restarted it. A stop asked for by a signal still
ends quietly, status 0."""

from __future__ import annotations

import asyncio

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
