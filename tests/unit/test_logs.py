"""Logging from the settings: level and format (text, or one JSON object per line)."""

from __future__ import annotations

import json
import logging
import sys

import pytest

from services import logs
from services.settings import Settings


def test_json_lines_carry_time_level_logger_message_and_error() -> None:
    formatter = logs.JsonFormatter()
    try:
        raise ValueError("boom")
    except ValueError:
        record = logging.LogRecord("chronicle.x", logging.ERROR, __file__, 1, "failed %s", ("here",), sys.exc_info())
    line = json.loads(formatter.format(record))
    assert (line["level"], line["logger"], line["message"]) == ("ERROR", "chronicle.x", "failed here")
    assert "ValueError: boom" in line["error"]
    assert line["time"].endswith("+00:00")


def test_configure_sets_the_root_level_and_one_handler() -> None:
    root = logging.getLogger()
    saved = (root.level, root.handlers[:])
    try:
        logs.configure("WARNING", "json")
        assert root.level == logging.WARNING
        assert len(root.handlers) == 1
        assert isinstance(root.handlers[0].formatter, logs.JsonFormatter)
        logs.configure("DEBUG", "text")
        assert root.level == logging.DEBUG
        assert not isinstance(root.handlers[0].formatter, logs.JsonFormatter)
    finally:
        root.setLevel(saved[0])
        root.handlers[:] = saved[1]


def test_bad_logging_and_pool_settings_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in (("LOG_LEVEL", "LOUD"), ("LOG_FORMAT", "xml"), ("DB_POOL_MAX", "0")):
        monkeypatch.setenv(f"CHRONICLE_{name}", value)
        with pytest.raises(ValueError, match=name.lower()):
            Settings()
        monkeypatch.delenv(f"CHRONICLE_{name}")


def test_the_supervisor_chatter_of_a_stopping_broker_is_dropped_and_nothing_else() -> None:
    quiet = logs.QuietSupervisor()

    def record(level: int, message: str) -> logging.LogRecord:
        return logging.LogRecord("chronicle.commands.broker", level, __file__, 1, message, (), None)

    assert not quiet.filter(record(logging.INFO, "callback for Task-12 is being executed..."))
    assert quiet.filter(record(logging.WARNING, "callback for Task-12 is being executed..."))
    assert quiet.filter(record(logging.INFO, "subscriber started"))
