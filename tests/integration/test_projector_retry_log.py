"""A projector's retry is one warning line, never a traceback, and says what failed even when the
error's text is empty: an SRE trial saw the first retry after a fault (the projector stopped and
continued, a Postgres restart) log ~25 lines of traceback under ``failed (TimeoutError: )``, where
docs/reliability.md promises one line per retry. The traceback stays at DEBUG."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import psycopg
import pytest

from events.envelope import Event
from tests.conftest import make_settings, running_stack
from tests.integration.test_delivery_gap import Recording
from tests.integration.test_projector_stall import published, run_until, runner_of


class Failing(Recording):
    """Raises each of ``errors`` in turn, one per batch, then applies."""

    def __init__(self, *errors: Exception) -> None:
        super().__init__()
        self.errors = list(errors)

    async def apply(self, conn: psycopg.AsyncConnection[Any], items: Sequence[tuple[int, Event]]) -> None:
        if self.errors:
            raise self.errors.pop(0)
        await super().apply(conn, items)


async def test_each_retry_is_one_line_naming_an_error_without_text(
    nats_url: str, fresh_db: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="chronicle.projector")
    async with running_stack(make_settings(nats_url, fresh_db), projector=False) as c:
        seqs = await published(c, "retries", 3)
        failing = Failing(TimeoutError(), ValueError("boom"), ConnectionResetError())
        runner = runner_of(c, failing, "retries")
        runner.retry_base_s = 0.01
        await run_until(c, runner, seqs[-1])
    assert sorted(set(failing.applied)) == seqs
    warned = [r for r in caplog.records if r.levelno == logging.WARNING and " failed (" in r.getMessage()]
    assert [r.getMessage().split("; retry")[0] for r in warned] == [
        "projector retries failed (TimeoutError: timed out)",
        "projector retries failed (ValueError: boom)",
        "projector retries failed (ConnectionResetError: no message)",
    ]
    assert [r.exc_info for r in warned] == [None, None, None]
    debug = [r for r in caplog.records if r.levelno == logging.DEBUG and r.getMessage() == "projector retries failure"]
    assert [bool(r.exc_info) for r in debug] == [True, True, True]  # the tracebacks, for whoever asks
