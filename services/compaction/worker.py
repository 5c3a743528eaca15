"""The ``chronicle compactor`` worker: its share of the compaction work queue.

The sessions that need compaction are decided by the projector (its compaction state, committed
with the read models: :mod:`services.compaction.requester`), which publishes them as
``compaction.requested``. Each compactor process runs a FastStream subscriber of the work queue
(:func:`~services.compaction.queue.subscribe`), on the one durable consumer every compactor
shares: whichever process is free summarises, with explicit acks, bounded redelivery with backoff,
``compaction.failed`` for each failed attempt and one series of attempts per session. A compactor
reads nothing of the log: a session without compaction costs it nothing. A redelivered request is
checked against the committed state first (:func:`~services.compaction.state.still_due`,
:func:`~services.compaction.state.series`); a message on a session's work subject that is no
request of it is read back from there (:func:`~services.compaction.state.pending`). A request
JetStream gives up (its last allowed delivery unanswered: the compactor on it died or hung) is
recorded as the session's ``compaction.failed`` by the compactor that hears the advisory
(:meth:`Compactor.watch_exhausted`; :mod:`services.compaction.exhausted`), and deleted from the
work queue; one whose work was done before it was given up (no longer due) is deleted with nothing
recorded.

Appends never wait for any of this.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from faststream.nats import NatsBroker
from nats.aio.client import Client as NatsClient
from nats.aio.subscription import Subscription
from nats.js import JetStreamContext
from nats.js.api import ConsumerConfig
from nats.js.errors import NotFoundError

from events.subjects import SubjectLayout
from services import brokers
from services.compaction import presence
from services.compaction.exhausted import GivenUp, Recorder
from services.compaction.queue import WorkStats

log = logging.getLogger("chronicle.compactor")


class Compactor:
    """One compactor process: the work-queue subscriber, and the watcher of the requests JetStream
    gives up (:meth:`watch_exhausted`)."""

    def __init__(
        self,
        nc: NatsClient,
        js: JetStreamContext,
        layout: SubjectLayout,
        broker: NatsBroker,
        work: WorkStats,
        consumer: ConsumerConfig,
        retired: str | None = None,
        presence_conninfo: str | None = None,
        recorder: Recorder | None = None,
    ) -> None:
        """``retired``: the durable consumer of the log that compactors kept before the projector
        kept the compaction state; deleted at the start (an upgrade leaves it behind).
        ``presence_conninfo``: the database where this compactor holds its presence while it runs
        (:mod:`services.compaction.presence`: readiness counts compactors there); None: none.
        ``recorder``: records the requests JetStream gives up as ``compaction.failed``; None: they
        are deleted and logged only."""
        self.nc = nc
        self.js = js
        self.layout = layout
        self.broker = broker
        self.work = work
        self._consumer = consumer
        self._retired = retired
        self._presence = presence_conninfo
        self._watching: Subscription | None = None
        self.given_up = GivenUp(js, layout, work, recorder)

    async def run(self, stop: asyncio.Event) -> None:
        """Take work until ``stop``; a stop while it starts ends the start (with its nats-server
        gone, the work queue's broker would wait to connect for good, SIGTERM unheeded)."""
        starting = asyncio.ensure_future(self._start())
        stopped = asyncio.ensure_future(stop.wait())
        await asyncio.wait({starting, stopped}, return_when=asyncio.FIRST_COMPLETED)
        if not starting.done():
            starting.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await starting
            await self._unwatch()
            await brokers.stop(self.broker)
            return
        stopped.cancel()
        if starting.exception() is not None:
            await self._unwatch()
        starting.result()  # its error, if it failed
        await self._serve(stop)

    async def _start(self) -> None:
        if self._retired is not None:
            with contextlib.suppress(NotFoundError):
                await self.js.delete_consumer(self.layout.stream, self._retired)
        await ensure_consumer(self.js, self.layout, self._consumer)
        self._watching = await self.watch_exhausted()  # before the first pull (one makes the server give up)
        await self.broker.start()

    async def _serve(self, stop: asyncio.Event) -> None:
        if not brokers.paced_when_closed(self.broker):
            log.warning(
                "FastStream's pull subscriber is not the shape services/brokers.py is written for: should the "
                "work queue's NATS connection close for good, this process would spin instead of stopping"
            )
        gone = asyncio.Event()
        held = None if self._presence is None else asyncio.create_task(presence.hold(self._presence, gone))
        try:
            await stop.wait()
        finally:
            gone.set()
            if held is not None:
                held.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await held
            await self._unwatch()
            await brokers.stop(self.broker)

    async def _unwatch(self) -> None:
        watching, self._watching = self._watching, None
        if watching is not None:
            with contextlib.suppress(Exception):  # a closed connection: gone with it
                await watching.unsubscribe()
        await self.given_up.stop()

    async def watch_exhausted(self) -> Subscription:
        """Listen for the requests JetStream gives up on this compactor's work consumer and settle
        each (:meth:`~services.compaction.exhausted.GivenUp.watch`)."""
        return await self.given_up.watch(self.nc, self._consumer.durable_name)

    async def idle(self) -> bool:
        """No request waits in the work queue, none is in flight here."""
        if self.work.in_flight:
            return False
        info = await self.js.stream_info(self.layout.work_stream)
        return int(info.state.messages) == 0


async def ensure_consumer(js: JetStreamContext, layout: SubjectLayout, config: ConsumerConfig) -> None:
    """Create the work queue's durable consumer, or bring it to ``config`` (attempts and backoff
    may change between releases); the subscribers then bind to it."""
    await js.add_consumer(layout.work_stream, config=config)
