"""Fixtures of the integration tests that stop and start the projector by hand (the pacing tests of
forks and batches)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from services.bootstrap import Container
from tests.conftest import make_settings, running_stack


class Projector:
    """The stack's projector, which a test stops and starts again."""

    def __init__(self, c: Container) -> None:
        self._c = c
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._stop.clear()
        self._task = asyncio.create_task(self._c.projector().run(self._stop))

    async def stop(self) -> None:
        self._stop.set()
        if self._task is not None:
            await asyncio.wait_for(self._task, timeout=15)
            self._task = None


@pytest.fixture
async def stack_and_projector(
    nats_url: str, fresh_db: str, s3_endpoint: str
) -> AsyncIterator[tuple[Container, Projector]]:
    settings = make_settings(nats_url, fresh_db, s3_endpoint=s3_endpoint)
    async with running_stack(settings, projector=False) as c:
        projector = Projector(c)
        projector.start()
        try:
            yield c, projector
        finally:
            await projector.stop()


def observed_waits(c: Container, monkeypatch: pytest.MonkeyPatch, sid: str) -> tuple[list[int], asyncio.Event]:
    """The sequences a write to ``sid`` waits for the projector to apply (its pacing), and an event
    set at the first."""
    waits: list[int] = []
    waiting = asyncio.Event()
    wait_session = c.waiter.wait_session

    async def observed(tenant: str, session: str, seq: int, timeout_s: float | None = None) -> None:
        if session == sid and seq > 0:
            waits.append(seq)
            waiting.set()
        await wait_session(tenant, session, seq, timeout_s)

    monkeypatch.setattr(c.waiter, "wait_session", observed)
    return waits, waiting
