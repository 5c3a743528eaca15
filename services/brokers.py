"""What a FastStream NATS broker does once its connection is closed for good (the server closed it
on a protocol error, and nats-py never reconnects then: docs/reliability.md), made such that its
process stops with its one line and exit status 4 (services/ops/processes.py,
``stopped_if_nats_closes``):

- A pull subscriber's loop fetches again at once after a fetch fails with the connection closed,
  and on a closed connection a fetch fails without waiting: the loop never yields to the event
  loop, the process spins at full CPU and nothing else in it runs, the watch that would stop it
  included (``chronicle compactor`` ran so for good). :func:`paced_when_closed` makes such a fetch
  wait before it fails.
- Stopping the broker unsubscribes each subscriber, which fails on a closed connection: one error
  each, raised together (``chronicle commands`` exited 1 with their tracebacks). :func:`stop`
  takes them as done: nothing is left to unsubscribe from. So too on a connection that lost its
  server (nats-server killed): ``ConnectionReconnectingError`` each (the process exited 4)."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, ParamSpec, TypeVar

from faststream.nats import NatsBroker
from nats.aio.client import Client as NatsClient
from nats.errors import ConnectionClosedError, ConnectionReconnectingError
from nats.js import JetStreamContext

from services.connection_loss import close_nats

P = ParamSpec("P")
T = TypeVar("T")

CLOSED_FETCH_PAUSE_S = 1.0
"""How long a pull subscriber's fetch on a closed connection waits before it fails."""


def _paced(fetch: Callable[P, Awaitable[T]]) -> Callable[P, Coroutine[Any, Any, T]]:
    @functools.wraps(fetch)
    async def paced(*args: P.args, **kwargs: P.kwargs) -> T:
        try:
            return await fetch(*args, **kwargs)
        except ConnectionClosedError:
            await asyncio.sleep(CLOSED_FETCH_PAUSE_S)  # FastStream's loop calls again at once
            raise

    return paced


def paced_when_closed(broker: NatsBroker) -> int:
    """Make each started pull subscriber of ``broker`` wait :data:`CLOSED_FETCH_PAUSE_S` before a
    fetch fails on a closed connection; how many it found (0 where FastStream keeps its pull
    subscription elsewhere than this was written against: the caller warns)."""
    found = 0
    for subscriber in broker.subscribers:
        subscription = getattr(subscriber, "subscription", None)
        if isinstance(subscription, JetStreamContext.PullSubscription):
            subscription.fetch = _paced(subscription.fetch)  # type: ignore[method-assign]
            found += 1
    return found


async def stop(broker: NatsBroker) -> None:
    """Stop ``broker``; its subscribers' failures to unsubscribe from a connection that is closed,
    or that lost its server (reconnecting: nothing reaches a server, the subscriptions go with the
    connection), are none, and the connection is then closed (FastStream leaves it open after such
    a failure, and its drain would fail alike)."""
    connection = broker_connection(broker)
    try:
        await broker.stop()
    except* (ConnectionClosedError, ConnectionReconnectingError):
        pass
    if connection is not None:
        await close_nats(connection)


def broker_connection(broker: NatsBroker) -> NatsClient | None:
    """A FastStream broker's NATS connection (its own, beside the container's); None before it started."""
    try:
        return broker.connection
    except Exception:  # not started (FastStream's empty connection state raises)
        return None
