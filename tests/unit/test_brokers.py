"""services/brokers.py's pacing of a pull subscriber's fetch on a closed connection, on stand-ins
for FastStream's subscribers (a broker whose real pull loop would spin is run by
tests/e2e/test_nats_closed_processes.py, as a process it can end; its stop:
tests/integration/test_nats_closed.py)."""

from __future__ import annotations

import time
from types import SimpleNamespace
from typing import Any

import pytest
from nats.errors import ConnectionClosedError
from nats.js import JetStreamContext

from services import brokers


def _pull_subscription(answer: Any) -> JetStreamContext.PullSubscription:
    """A pull subscription whose fetch answers ``answer`` (an exception is raised)."""
    subscription = JetStreamContext.PullSubscription.__new__(JetStreamContext.PullSubscription)

    async def fetch(batch: int = 1, timeout: float | None = 5, heartbeat: float | None = None) -> Any:
        if isinstance(answer, Exception):
            raise answer
        return answer

    subscription.fetch = fetch  # type: ignore[method-assign]
    return subscription


def _broker(*subscriptions: object) -> Any:
    return SimpleNamespace(subscribers=[SimpleNamespace(subscription=s) for s in subscriptions])


async def test_a_fetch_on_a_closed_connection_waits_before_it_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(brokers, "CLOSED_FETCH_PAUSE_S", 0.2)
    closed = _pull_subscription(ConnectionClosedError())
    assert brokers.paced_when_closed(_broker(closed)) == 1
    start = time.monotonic()
    with pytest.raises(ConnectionClosedError):
        await closed.fetch(batch=1, timeout=1.0)
    assert time.monotonic() - start >= 0.2


async def test_other_fetches_pass_as_they_were(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(brokers, "CLOSED_FETCH_PAUSE_S", 60)  # a pause here would time the test out
    got: list[Any] = ["a message"]
    messages = _pull_subscription(got)
    timed_out = _pull_subscription(TimeoutError())
    brokers.paced_when_closed(_broker(messages, timed_out))
    assert await messages.fetch(batch=1, timeout=1.0) is got
    with pytest.raises(TimeoutError):
        await timed_out.fetch(batch=1, timeout=1.0)


def test_only_pull_subscriptions_are_paced() -> None:
    """Push subscribers (the command service's) have no fetch; a subscriber not started yet has
    no subscription; FastStream keeping it elsewhere counts 0, and the compactor warns."""
    assert brokers.paced_when_closed(_broker(None, object(), _pull_subscription([]))) == 1
    assert brokers.paced_when_closed(_broker()) == 0
    no_subscription: Any = SimpleNamespace(subscribers=[SimpleNamespace()])
    assert brokers.paced_when_closed(no_subscription) == 0
