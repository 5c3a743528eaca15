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

from nats.js import JetStreamContext
from nats.js.api import StreamInfo
from nats.js.errors import NotFoundError

from events.stream import ReplicasUnavailable, set_replicas
from services.bootstrap import connect_nats
from services.settings import Settings


def blob_stream(bucket: str) -> str:
    """The stream behind a JetStream Object Store bucket."""
    return f"OBJ_{bucket}"


def copies_current(info: StreamInfo, replicas: int) -> tuple[int, int]:
    """How many of the stream's ``replicas`` copies are current (the leader's included), and the
    largest lag (operations) among the others."""
    cluster = info.cluster
    if replicas == 1 or cluster is None:
        return 1, 0
    peers = cluster.replicas or []
    current = (1 if cluster.leader else 0) + sum(1 for p in peers if p.current)
    return current, max((p.lag or 0 for p in peers), default=0)


async def wait_current(js: JetStreamContext, stream: str, replicas: int, timeout_s: float) -> bool:
    """Until every copy of ``stream`` is current (True), or ``timeout_s`` passes (False)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        current, lag = copies_current(await js.stream_info(stream), replicas)
        print(f"  {stream}: {current}/{replicas} copies current, largest lag {lag}", flush=True)
        if current >= replicas:
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
