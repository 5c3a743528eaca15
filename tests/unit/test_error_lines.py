"""An error in a retry's log line (the projector's, the read waiter's LISTEN connection): its class
and first line, never an empty message (``failed (TimeoutError: )``)."""

from __future__ import annotations

import asyncio

import pytest

from projections.runner import describe


async def _timed_out() -> BaseException:
    try:
        async with asyncio.timeout(0):
            await asyncio.sleep(1)
    except TimeoutError as exc:
        return exc
    raise AssertionError("no timeout")


@pytest.mark.parametrize(
    ("exc", "line"),
    [
        (TimeoutError(), "TimeoutError: timed out"),
        (ConnectionResetError(), "ConnectionResetError: no message"),
        (ValueError("  \n"), "ValueError: no message"),
        (ValueError("first\nsecond"), "ValueError: first"),
        (OSError("x" * 400), "OSError: " + "x" * 300),
    ],
)
def test_an_error_is_described_in_one_line_with_a_message(exc: BaseException, line: str) -> None:
    assert describe(exc) == line


async def test_asyncio_timeouts_say_they_timed_out() -> None:
    assert describe(await _timed_out()) == "TimeoutError: timed out"
