"""The ``chronicle`` command's entry point: before anything heavy is imported, a SIGHUP to
``chronicle api`` is recorded instead of ending the process.

SIGHUP reloads the API's keys, but the API installs its handler only once its imports and settings
are done (a second or more): ``chronicle up`` forwarding a reload to an API process still starting
(``--api-processes 2`` on a busy machine), or a ``systemctl reload`` during a restart, ended it,
and ``up`` stopped the whole stack. What came before the handler is acted on once it is installed
(:func:`sighup_before_serving`). Other commands keep SIGHUP's default (a hangup ends them)."""

from __future__ import annotations

import signal
import sys
from types import FrameType

_early: list[int] = []


def _record(signum: int, frame: FrameType | None) -> None:
    _early.append(signum)


def sighup_before_serving() -> bool:
    """Whether a SIGHUP came before the API installed its own handler (then reload once)."""
    return bool(_early)


def main() -> int:
    """Run the CLI and return its exit status (the console script exits with it)."""
    if sys.argv[1:2] == ["api"]:
        signal.signal(signal.SIGHUP, _record)
    from services.ops.cli import main as run

    return run()


if __name__ == "__main__":  # `python -m services.ops.entry`: the module processes.py asks is this one's import
    from services.ops import entry

    sys.exit(entry.main())
