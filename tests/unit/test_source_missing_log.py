"""A missing read-only source is logged once in a while per object and session, not per request."""

from __future__ import annotations

import logging
import time

import pytest

from events.context import ObjectSource, ReadonlyBlock
from services.context import blocks
from services.errors import SourceMissing


def block(key: str) -> ReadonlyBlock:
    return ReadonlyBlock(label="policy", source=ObjectSource(bucket="docs", key=key))


def test_a_missing_source_is_logged_once_per_object_and_session_however_often_it_is_read(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(blocks, "_missing_logged", {})
    clock = [1000.0]
    monkeypatch.setattr(time, "monotonic", lambda: clock[0])
    with caplog.at_level(logging.WARNING, logger="chronicle.context"):
        errors = [blocks.source_missing("t", "s", block("a.md")) for _ in range(5)]
        blocks.source_missing("t", "s", block("b.md"))
        blocks.source_missing("t", "other", block("a.md"))
        clock[0] += blocks.MISSING_LOG_EVERY_S
        blocks.source_missing("t", "s", block("a.md"))
    assert all(isinstance(e, SourceMissing) for e in errors)
    logged = [r.getMessage() for r in caplog.records]
    assert len(logged) == 4, logged
    assert sum("t/s:" in m and "'a.md'" in m for m in logged) == 2
