"""moto's S3 server as ``chronicle up`` starts it (``python -m services.ops.moto_server -H HOST -p
PORT``): moto's own ``moto_server``, with its recorder keeping the write requests only.

moto's recorder appends every request it serves to its file, reads included. Only the writes are
ever replayed (services/ops/s3_recording.py), yet a stack left running grew its recording by a
line of headers (about 800 bytes) for each skill load, read-only source read, listing and existence
check, without bound until the next start rewrote it (a soak of 40 minutes: 0.6 MB, all reads).
"""

from __future__ import annotations

import sys
from typing import Any

from moto.moto_api import recorder
from moto.server import main as moto_main

from services.ops.s3_recording import WRITE_METHODS

_record_any = recorder._record_request


def record_writes(request: Any, body: bytes | None = None) -> None:
    """moto's recorder for the requests that change what the server holds; nothing for a read."""
    if str(request.method).upper() in WRITE_METHODS:
        _record_any(request, body)


def main(argv: list[str] | None = None) -> int:
    recorder._record_request = record_writes  # type: ignore[method-assign]  # the one instance moto records with
    moto_main(argv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
