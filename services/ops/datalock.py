"""One ``chronicle up`` per data dir: an exclusive lock on ``<data dir>/up.lock``, held for the
stack's life (the kernel releases it when the process ends, however it ends). A second ``up`` on
the same data dir would start a second nats-server on the first one's JetStream store, second
workers on its database, and overwrite its ``nats.conf`` and ``stack.json``."""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path

from services.settings import UnusableResource

LOCK_FILE = "up.lock"
"""The file in the data dir that ``chronicle up`` locks; it holds what the stack holding it serves."""


@contextlib.contextmanager
def data_dir_locked(data: Path, holder: str) -> Iterator[None]:
    """``data`` locked for this process while the block runs, its lock file saying ``holder``
    (who holds it, what it serves). Another holder: an :class:`UnusableResource` naming the data
    dir and what that holder wrote, before anything of the data dir is changed."""
    path = data / LOCK_FILE
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)  # not inherited by the children (O_CLOEXEC)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            running = os.pread(fd, 4096, 0).decode(errors="replace").strip() or "starting"
            raise UnusableResource(
                f"{data} is the data dir of a running `chronicle up` ({running}): stop it first, or set "
                "CHRONICLE_DATA_DIR to another data dir"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, (holder + "\n").encode(), 0)
        yield
    finally:
        os.close(fd)  # the lock goes with the descriptor
