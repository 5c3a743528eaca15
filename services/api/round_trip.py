"""Whether the NATS server answers: a PING's PONG within a bound (readiness's ``nats``).

A server that is stopped (SIGSTOP), or wedged, keeps its TCP connections open: the client counts
itself connected until its own pings go unanswered, minutes later. A PING answers that at once.
nats-py's ``flush(timeout)`` is that PING, but a flush that times out cancels its PONG's future,
which stays queued: the PONG that arrives once the server goes on finds it cancelled, and the
client's read loop ends on the ``InvalidStateError`` ("nats: encountered error"): the connection
stays "connected" and reads nothing more, no message, no reply (nats-py 2.16 against the pinned
nats-server, stopped and continued). So the PING is never abandoned here: one is in flight at a
time per connection, awaited up to the bound by each check and left to be answered; a later check
waits on the same one. Its own timeout (:data:`PING_WAIT_S`) is longer than the client takes to
declare the connection stale and reconnect (which drops every PONG future), so it never cancels
one that is still queued.
"""

from __future__ import annotations

import asyncio
import functools
import weakref
from dataclasses import dataclass

from nats.aio.client import Client as NatsClient

PING_WAIT_S = 3600
"""The in-flight PING's own timeout: longer than nats-py's stale-connection detection (its ping
interval, 120 s, times its outstanding pings, 2, and one more), after which it reconnects."""


@dataclass
class _Ping:
    answered: asyncio.Task[None]
    reconnects: int  # the connection's reconnect count when it was sent


_in_flight: weakref.WeakKeyDictionary[NatsClient, _Ping] = weakref.WeakKeyDictionary()


def _ended(nc: NatsClient, task: asyncio.Task[None]) -> None:
    """Forget an answered (or failed) PING: the task refers to its connection, which the weak key
    would otherwise never let go."""
    if not task.cancelled():
        task.exception()  # a PING nobody waits on any more (reconnected since) may fail unseen
    ping = _in_flight.get(nc)
    if ping is not None and ping.answered is task:
        del _in_flight[nc]


async def answers(nc: NatsClient, timeout_s: float) -> None:
    """Return once the server answers a PING; :class:`TimeoutError` when it has not within
    ``timeout_s`` (the PING stays in flight), :class:`ConnectionError` while not connected."""
    if not nc.is_connected:
        raise ConnectionError("NATS is not connected")
    reconnects = int(nc.stats["reconnects"])
    ping = _in_flight.get(nc)
    if ping is None or ping.answered.done() or ping.reconnects != reconnects:  # a reconnect drops its PONG
        task = asyncio.ensure_future(nc.flush(PING_WAIT_S))
        task.add_done_callback(functools.partial(_ended, nc))
        ping = _in_flight[nc] = _Ping(task, reconnects)
    done, _ = await asyncio.wait({ping.answered}, timeout=timeout_s)
    if not done:
        raise TimeoutError
    ping.answered.result()
