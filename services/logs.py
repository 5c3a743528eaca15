"""Process logging from the settings: level, and plain text or one JSON object per line."""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime

TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class JsonFormatter(logging.Formatter):
    """``{"time", "level", "logger", "message"[, "error"]}`` per line, for log shippers."""

    def format(self, record: logging.LogRecord) -> str:
        out = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            out["error"] = self.formatException(record.exc_info)
        return json.dumps(out, ensure_ascii=False)


class QuietSupervisor(logging.Filter):
    """Drops FastStream's subscriber supervisor line, logged at INFO for every subscriber task as a
    broker stops ("callback for Task-12 is being executed..."): dozens of lines a shutdown, none
    saying anything an operator acts on."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno > logging.INFO or not record.getMessage().endswith("is being executed...")


def configure(level: str, fmt: str) -> None:
    handler = logging.StreamHandler()
    handler.addFilter(QuietSupervisor())
    handler.setFormatter(JsonFormatter() if fmt == "json" else logging.Formatter(TEXT_FORMAT))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
