"""``chronicle log show|rebind``: which event log the read models are bound to (projections/logbinding.py)."""

from __future__ import annotations

import argparse
import sys

from projections.logbinding import (
    Binding,
    LogIdentity,
    bind,
    database_of,
    highest_checkpoint,
    read_binding,
    stream_identity,
)
from services.bootstrap import open_container
from services.settings import Settings


def _binding_line(bound: Binding | None) -> str:
    if bound is None:
        return (
            "bound to: nothing yet (the first component to start on an empty stream records it; next to a stream "
            "that holds events, `chronicle rebuild` does)"
        )
    created = bound.created.isoformat() if bound.created is not None else "(not reported)"
    return f"bound to: stream {bound.stream!r} created {created} (first seen {bound.first_seen.isoformat()})"


def _stream_line(identity: LogIdentity) -> str:
    created = identity.created.isoformat() if identity.created is not None else "(not reported)"
    return f"stream:   {identity.stream!r} created {created}, last sequence {identity.last_seq}"


async def run_log(settings: Settings, args: argparse.Namespace) -> int:
    """``show`` prints the binding and the stream; ``rebind --yes`` makes the stream the read
    models' log, after printing both (without ``--yes`` it only prints and exits 1)."""
    # the stream as it is: a missing one is an error (binding to a stream made here would be a lie)
    opened = open_container(settings, log_check=False, create_stream=False)
    async with opened as c, c.pool.connection() as conn, conn.transaction():
        name = settings.projector_name
        bound = await read_binding(conn, name, lock=True)
        furthest = await highest_checkpoint(conn, name)
        identity = await stream_identity(c.js, settings.stream)
        print(f"database: {database_of(conn)}, projector {name!r}")
        print(_binding_line(bound))
        print(_stream_line(identity))
        if furthest is not None:
            print(f"checkpoint: {furthest[0]!r} at sequence {furthest[1]}")
        if args.log_command == "show":
            return 0
        if not args.yes:
            print(
                "not rebound: rebinding tells every component that these read models were made from this stream "
                "(a deliberate restore). If they were not, rebuild them instead (`chronicle rebuild`). "
                "Run again with --yes to rebind."
            )
            return 1
        if furthest is not None and furthest[1] > identity.last_seq:
            # the read models hold events this stream lacks: bound to it, the projector would skip
            # the stream's next events at those sequences as applied (and never drop the lost ones)
            print(
                f"not rebound: checkpoint {furthest[0]!r} is at sequence {furthest[1]}, beyond the stream's last "
                f"sequence {identity.last_seq}: the read models hold events this log does not (restored from an "
                "older copy); rebuild them from it instead (`chronicle rebuild`)",
                file=sys.stderr,
            )
            return 2
        await bind(conn, name, identity)
        print(f"rebound {name!r} to stream {identity.stream!r}")
    return 0
