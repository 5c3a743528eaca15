"""A process whose NATS connection is closed for good stops with one line and a non-zero exit
instead of staying up and failing every request: nats-py closes, without reconnecting, after the
server answers a protocol error by closing the connection. The real trigger, a message whose
payload is within the server's ``max_payload`` but not with its headers (nats-py checks the
payload alone), is what the test sends."""

from __future__ import annotations

import asyncio
import contextlib
import uuid

import pytest
from faststream.nats import NatsBroker

from services import brokers
from services.commands_nats.app import broker_for
from services.ops import processes
from services.ops.processes import NatsClosed, stopped_if_nats_closes
from tests.conftest import make_settings, operator_nats


async def test_a_connection_the_server_closes_stops_the_process_body_and_says_why(
    nats_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(processes, "NATS_CLOSED_POLL_S", 0.05)
    nc = await operator_nats(nats_url)
    stop = asyncio.Event()

    async def body() -> None:
        async with stopped_if_nats_closes(lambda: [nc], stop.set):
            assert not stop.is_set()
            # within max_payload alone, over it with the header: the server closes the connection
            await nc.publish("chronicle.test.oversize", b"x" * (nc.max_payload - 8), headers={"X-Pad": "y" * 64})
            await asyncio.wait_for(stop.wait(), timeout=10)  # the body ends as on a signal

    try:
        with pytest.raises(NatsClosed) as raised:
            await body()
        assert nc.is_closed
        assert "closed for good" in str(raised.value)
        assert "maximum payload" in str(raised.value).lower()
    finally:
        await nc.close()


async def test_a_body_that_ends_with_the_connection_open_raises_nothing(
    nats_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(processes, "NATS_CLOSED_POLL_S", 0.05)
    nc = await operator_nats(nats_url)
    stopped: list[bool] = []
    try:
        async with stopped_if_nats_closes(lambda: [None, nc], lambda: stopped.append(True)):
            await asyncio.sleep(0.2)
        assert not stopped
    finally:
        await nc.close()


async def test_a_brokers_own_connection_is_watched_once_it_started(
    nats_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The command service answers, and the compactor takes work, on a FastStream broker's
    connection of their own: its close stops the process as the container's does."""
    monkeypatch.setattr(processes, "NATS_CLOSED_POLL_S", 0.05)
    broker = broker_for(make_settings(nats_url, "postgresql://unused@127.0.0.1:1/none"))
    assert brokers.broker_connection(broker) is None  # not started: nothing to watch yet
    await broker.start()
    stop = asyncio.Event()
    try:
        nc = brokers.broker_connection(broker)
        assert nc is not None
        assert nc.is_connected

        async def body() -> None:
            async with stopped_if_nats_closes(lambda: [brokers.broker_connection(broker)], stop.set):
                await nc.publish("chronicle.test.oversize", b"x" * (nc.max_payload - 8), headers={"X-Pad": "y" * 64})
                await asyncio.wait_for(stop.wait(), timeout=10)

        with pytest.raises(NatsClosed, match="closed for good"):
            await body()
    finally:
        with contextlib.suppress(Exception):
            await broker.stop()


async def test_a_broker_whose_connection_closed_stops_without_an_error(nats_url: str) -> None:
    """Each subscriber's unsubscribe fails on the closed connection (FastStream raises them
    together: the command service exited 1 with their tracebacks); :func:`brokers.stop` takes
    them as done."""
    with pytest.raises(ExceptionGroup):  # what FastStream does: the reason for brokers.stop
        await (await _closed_broker(nats_url)).stop()
    await brokers.stop(await _closed_broker(nats_url))  # raises nothing


async def _closed_broker(nats_url: str) -> NatsBroker:
    """A started broker with two subscribers, its connection closed for good, as nats-py leaves
    it after a protocol error (here closed by hand: with subscribers' traffic beside it, the
    oversize message's close at times reaches the client as a reset, and it reconnects instead)."""
    broker = broker_for(make_settings(nats_url, "postgresql://unused@127.0.0.1:1/none"))
    for i in range(2):
        broker.subscriber(f"chronicle.test.stop{uuid.uuid4().hex[:8]}.{i}")(_ignore)
    await broker.start()
    nc = brokers.broker_connection(broker)
    assert nc is not None
    await nc.close()
    return broker


async def _ignore(body: str) -> None:  # pragma: no cover (nothing is published)
    pass
