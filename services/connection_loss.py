"""A NATS connection that lost its server (nats-server killed, a network cut): how it is closed,
and what it logs while it reconnects (docs/reliability.md).

- nats-py's ``close()`` writes what is pending to the socket before it closes it, even when that
  socket is gone (the client reconnecting): uvloop's transport then raises ``RuntimeError: unable
  to perform operation on <TCPTransport closed=True>`` (asyncio's, ``ConnectionResetError``) out
  of ``close()``, half done, and a process stopped during an outage exited 1 with that traceback.
  :func:`close_nats` drops what is pending first (nothing can send it any more) and takes such an
  error as the close it is.
- nats-py tells its error callback of every failed reconnect attempt (two a second, each process):
  :class:`ReconnectNoise` keeps one line for the first, one line per
  :data:`RECONNECT_SUMMARY_S` while it goes on, and one line once reconnected."""

from __future__ import annotations

import logging
from dataclasses import dataclass

from nats.aio.client import Client as NatsClient

from events.publisher import lost_connection

log = logging.getLogger("chronicle.nats")

RECONNECT_SUMMARY_S = 30.0
"""How often a connection that keeps failing to reconnect says so again."""


def nats_node(nc: NatsClient) -> str:
    """``host:port`` of the NATS server ``nc`` is connected to (a cluster's node), no credentials."""
    url = nc.connected_url
    return f"{url.hostname}:{url.port}" if url is not None else "(not connected)"


async def close_nats(nc: NatsClient) -> None:
    """Close ``nc``; while it is not connected (reconnecting after losing its server) what is
    pending is dropped first: no server will read it, and nats-py's close would write it to the
    closed socket and fail half done."""
    if nc.is_closed:
        return
    if not nc.is_connected:
        nc._pending.clear()
        nc._pending_data_size = 0
    try:
        await nc.close()
    except (ConnectionError, RuntimeError) as exc:  # its socket closed between the look above and the write
        if not lost_connection(exc):
            raise
        log.debug("nats: closed on a lost socket: %r", exc)


@dataclass(slots=True)
class ReconnectNoise:
    """Which of a connection's failed reconnect attempts are logged: the first of an outage, then
    a summary every :data:`RECONNECT_SUMMARY_S`; and the line once it is back. Pure: the caller
    gives the time and logs what it is given."""

    summary_s: float = RECONNECT_SUMMARY_S
    failed: int = 0
    since: float = 0.0
    said: float = 0.0

    def attempt_failed(self, now: float, error: BaseException) -> str | None:
        """The line for a failed reconnect attempt at ``now``, or None when it is not logged."""
        self.failed += 1
        if self.failed == 1:
            self.since = self.said = now
            return (
                f"nats: reconnecting: {error!r} (the attempts go on, every half second; "
                f"said again every {self.summary_s:g} s while they fail)"
            )
        if now - self.said < self.summary_s:
            return None
        self.said = now
        return (
            f"nats: still reconnecting: {self.failed} attempts failed in {now - self.since:.0f} s, the last {error!r}"
        )

    def reconnected(self, now: float, where: str) -> str | None:
        """The line once the connection is back (None when no attempt had failed); the count
        starts again."""
        failed, since = self.failed, self.since
        self.failed = 0
        if failed == 0:
            return None
        return f"nats: reconnected to {where} after {failed} failed attempts in {now - since:.1f} s"
