"""``chronicle stream-replicas N``: move the event stream and the blob bucket to N replicas.

nats-server changes a stream's replica count in place: it picks new peers, copies the log to them
while the stream keeps taking writes, and moves the consumers that inherit the stream's count
along. This command asks for that and waits until every copy is current, showing progress. Run it
before raising ``CHRONICLE_STREAM_REPLICAS`` on the processes (they refuse a stream with fewer
replicas than they are set to).
"""

from __future__ import annotations

import asyncio
import sys
import time
from typing import NamedTuple

from nats.js import JetStreamContext
from nats.js.api import StreamInfo
from nats.js.errors import NotFoundError

from events.stream import ReplicasUnavailable, set_replicas
from services.bootstrap import connect_nats
from services.settings import Settings


def blob_stream(bucket: str) -> str:
    """The stream behind a JetStream Object Store bucket."""
    return f"OBJ_{bucket}"


class Copies(NamedTuple):
    """Where a stream's copies stand: ``current`` (the leader's included), the largest ``lag``
    (operations) a copy reported (None: none did), and how many copies are ``catching_up`` without
    a lag to show (not listed yet: nats-server lists a new peer once it answers; or not current and
    no lag given, which its answer leaves out when 0)."""

    current: int
    lag: int | None
    catching_up: int


def copies_current(info: StreamInfo, replicas: int) -> Copies:
    """Where the stream's ``replicas`` copies stand (:class:`Copies`)."""
    cluster = info.cluster
    if replicas == 1 or cluster is None:
        return Copies(1, 0, 0)
    peers = cluster.replicas or []
    current = (1 if cluster.leader else 0) + sum(1 for p in peers if p.current)
    lags = [p.lag for p in peers if p.lag]
    unknown = sum(1 for p in peers if not p.current and not p.lag) + max(0, replicas - 1 - len(peers))
    return Copies(current, max(lags, default=None if unknown else 0), unknown)


def progress_line(stream: str, copies: Copies, replicas: int) -> str:
    """``stream``'s progress: its current copies, the largest lag reported and the copies still
    catching up without one (a copy that has not reported is never said to be at lag 0)."""
    line = f"{stream}: {copies.current}/{replicas} copies current"
    if copies.current >= replicas:
        return line
    if copies.lag:
        line += f", largest lag {copies.lag}"
    if copies.catching_up:
        more = " more" if copies.lag else ""
        line += f"; {copies.catching_up}{more} catching up (lag not reported yet)"
    return line


async def wait_current(js: JetStreamContext, stream: str, replicas: int, timeout_s: float) -> bool:
    """Until every copy of ``stream`` is current (True), or ``timeout_s`` passes (False)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        copies = copies_current(await js.stream_info(stream), replicas)
        print(f"  {progress_line(stream, copies, replicas)}", flush=True)
        if copies.current >= replicas:
            return True
        await asyncio.sleep(1.0)
    return False


async def run_stream_replicas(settings: Settings, replicas: int, timeout_s: float) -> int:
    nc = await connect_nats(settings)
    try:
        js = nc.jetstream()
        for stream in (settings.stream, blob_stream(settings.blob_bucket)):
            try:
                info = await set_replicas(js, stream, replicas)
            except NotFoundError:
                print(f"{stream}: no such stream (nothing to move)")
                continue
            except ReplicasUnavailable as exc:
                print(f"chronicle stream-replicas: {exc}", file=sys.stderr)
                return 2
            leader = info.cluster.leader if info.cluster else None
            said = f"leader {leader}" if leader else "no leader yet (an election is under way)"
            print(f"{stream}: {replicas} replica(s) asked for; {said}", flush=True)
            if not await wait_current(js, stream, replicas, timeout_s):
                print(f"chronicle stream-replicas: {stream} not current after {timeout_s:.0f}s", file=sys.stderr)
                return 1
        print(f"done: set CHRONICLE_STREAM_REPLICAS={replicas} on every Chronicle process")
        return 0
    finally:
        await nc.close()
