"""A one-line progress bar on stderr (only on a terminal): done/total, rate and ETA."""

from __future__ import annotations

import sys
import time


class Progress:
    def __init__(self, label: str, *, enabled: bool | None = None) -> None:
        self._label = label
        self._start = time.monotonic()
        self._last_draw = 0.0
        self._enabled = sys.stderr.isatty() if enabled is None else enabled
        self._first: int | None = None

    def __call__(self, done: int, total: int) -> None:
        if not self._enabled:
            return
        now = time.monotonic()
        if self._first is None:
            self._first = done
        if now - self._last_draw < 0.1 and done < total:
            return
        self._last_draw = now
        elapsed = max(now - self._start, 1e-9)
        rate = (done - (self._first or 0)) / elapsed
        eta = (total - done) / rate if rate > 0 else 0.0
        width = 30
        filled = int(width * done / total) if total else width
        bar = "#" * filled + "-" * (width - filled)
        sys.stderr.write(f"\r{self._label} [{bar}] {done}/{total} {rate:,.0f} ev/s ETA {eta:,.0f}s ")
        sys.stderr.flush()

    def close(self) -> None:
        if self._enabled:
            sys.stderr.write("\n")
            sys.stderr.flush()
