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
request of it is read back from there (:func:`~services.compaction.state.pending`).

Appends never wait for any of this.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging

from faststream.nats import NatsBroker
from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.js import JetStreamContext
from nats.js.api import ConsumerConfig
from nats.js.errors import NotFoundError

from events.subjects import SubjectLayout
from services import brokers
from services.compaction import presence
from services.compaction.queue import KIND, WorkStats

log = logging.getLogger("chronicle.compactor")
MAX_DELIVER_ADVISORY = "io.nats.jetstream.advisory.v1.max_deliver"


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
    ) -> None:
        """``retired``: the durable consumer of the log that compactors kept before the projector
        kept the compaction state; deleted at the start (an upgrade leaves it behind).
        ``presence_conninfo``: the database where this compactor holds its presence while it runs
        (:mod:`services.compaction.presence`: readiness counts compactors there); None: none."""
        self.nc = nc
        self.js = js
        self.layout = layout
        self.broker = broker
        self.work = work
        self._consumer = consumer
        self._retired = retired
        self._presence = presence_conninfo
        self._watching: Subscription | None = None

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

    async def watch_exhausted(self) -> Subscription:
        """Listen for the requests JetStream gives up (its ``MAX_DELIVERIES`` advisory of the work
        consumer: the last allowed delivery went unanswered, a compactor killed or hung on it; one
        compactor of a queue group hears each): log it, naming the session, count it
        (:attr:`WorkStats.exhausted`), and delete it from the work-queue stream, which kept it,
        unacknowledged, until it expired. Nothing else is recorded for it: the process that would
        have recorded its ``compaction.failed`` is the one that stopped answering. Unsubscribed
        when the connection closes."""
        durable = self._consumer.durable_name
        subject = f"$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES.{self.layout.work_stream}.{durable}"
        return await self.nc.subscribe(subject, queue=f"{durable}-exhausted", cb=self._exhausted)

    async def _exhausted(self, advisory: Msg) -> None:
        named = exhausted_of(advisory.data)
        if named is None:
            log.warning("an advisory on %s that names no stream sequence: ignored", advisory.subject)
            return
        seq, deliveries = named
        stream = self.layout.work_stream
        try:
            found = await self.js.get_msg(stream, seq)
            with contextlib.suppress(NotFoundError):
                await self.js.delete_msg(stream, seq)
        except NotFoundError:  # acknowledged after all, or replaced by a newer request of its session
            return
        except Exception as exc:  # NATS: the request stays until it expires (the oldest wait leaves it out)
            log.warning("a compaction request JetStream gave up (%s seq %d) could not be deleted: %s", stream, seq, exc)
            return
        self.work.exhausted += 1
        try:
            where = "/".join(self.layout.work_session(KIND, found.subject or ""))
        except ValueError:
            where = f"subject {found.subject}"
        log.error(
            "compaction request of %s (%s seq %d) delivered %d times without an answer (its compactor stopped on "
            "the last): JetStream delivers it no more; deleted, nothing recorded; the session is asked for again "
            "when it grows",
            where,
            stream,
            seq,
            deliveries,
        )

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


def exhausted_of(advisory: bytes) -> tuple[int, int] | None:
    """The stream sequence a ``MAX_DELIVERIES`` advisory names and the deliveries it had (None:
    not such an advisory: no tenant may publish on its subject, but one can have the server send a
    reply there, the ack of its own event)."""
    try:
        body = json.loads(advisory)
    except ValueError:
        return None
    if not isinstance(body, dict) or body.get("type") != MAX_DELIVER_ADVISORY:
        return None
    seq = body.get("stream_seq")
    if not isinstance(seq, int) or seq <= 0:
        return None
    deliveries = body.get("deliveries")
    return seq, deliveries if isinstance(deliveries, int) else 0
