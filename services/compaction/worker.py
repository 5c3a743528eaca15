"""The ``chronicle compactor`` worker: its state of the log, its requests, its share of the work.

Each compactor process runs three things:

* its own durable consumer of the log (checkpoint ``compactor_name``) feeding
  :class:`~services.compaction.state.CompactorState`, which keeps every tracked session's token
  estimate and knows which sessions are over their ``compact_after``;
* after each batch, while the state is caught up with the log (at most a batch behind), the due
  sessions go out as ``compaction.requested`` (:class:`~services.compaction.queue.Requests`, each
  decision once); a state far behind (after a restart under load) only catches up;
* a FastStream subscriber of the compaction work queue (:func:`~services.compaction.queue.subscribe`),
  on the one durable consumer every compactor shares: whichever process is free summarises, with
  explicit acks, bounded redelivery with backoff and ``compaction.failed`` when attempts run out.

Appends never wait for any of this.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from faststream.nats import NatsBroker
from nats.js import JetStreamContext
from nats.js.api import ConsumerConfig

from events.catalog import CompactionRequested
from events.subjects import SubjectLayout
from projections.runner import ProjectorRunner
from services.compaction.queue import Requests, WorkStats, request
from services.compaction.state import CompactorState

log = logging.getLogger("chronicle.compactor")


class Compactor:
    """One compactor process: state consumer, requester and work-queue subscriber."""

    def __init__(
        self,
        runner: ProjectorRunner,
        state: CompactorState,
        requests: Requests,
        broker: NatsBroker,
        work: WorkStats,
        consumer: ConsumerConfig,
    ) -> None:
        self.runner = runner
        self.state = state
        self.requests = requests
        self.broker = broker
        self.work = work
        self._consumer = consumer
        self._moved = asyncio.Event()  # the state moved (or was loaded): due sessions may be new
        runner.on_batch = self._after_batch

    @property
    def caught_up(self) -> bool:
        """The state's consumer is at most a batch behind the log: its decisions are current."""
        return self.runner.stats.pending <= self.runner.batch_size

    def due(self) -> list[CompactionRequested]:
        """The sessions the state finds over their threshold, as requests."""
        return [request(c.tenant, c.session, c.leaf, c.estimate, c.seq) for c in self.state.candidates.values()]

    def still_due(self, req: CompactionRequested) -> bool:
        """False when this process's state has passed the request's decision and no longer finds
        the session due (compacted meanwhile, or cleared); True when it cannot tell."""
        passed = self.runner.stats.last_seq >= req.seq
        return not passed or (req.tenant, req.session) in self.state.candidates

    def _after_batch(self, applied: int, last_seq: int) -> None:
        if self.caught_up:
            self._moved.set()

    async def run(self, stop: asyncio.Event) -> None:
        async with self.runner.pool.connection() as conn:
            await self.state.load(conn)
        self._moved.set()
        await ensure_consumer(self.runner.js, self.runner.layout, self._consumer)
        await self.broker.start()
        requester = asyncio.create_task(self._request(stop))
        try:
            await self.runner.run(stop)
        finally:
            requester.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await requester
            await self.broker.stop()

    async def _request(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            await self._moved.wait()
            self._moved.clear()
            try:
                sent = await self.requests.publish(self.due())
            except Exception:
                log.warning("publishing compaction requests failed; trying again", exc_info=True)
                await asyncio.sleep(1.0)
                self._moved.set()
                continue
            if sent:
                log.debug("requested compaction of %d session(s)", sent)

    async def idle(self) -> bool:
        """Nothing due is unrequested, no request waits in the work queue, none is in flight here."""
        if self.requests.unsent(self.due()) or self.work.in_flight:
            return False
        info = await self.runner.js.stream_info(self.runner.layout.work_stream)
        return int(info.state.messages) == 0


async def ensure_consumer(js: JetStreamContext, layout: SubjectLayout, config: ConsumerConfig) -> None:
    """Create the work queue's durable consumer, or bring it to ``config`` (attempts and backoff
    may change between releases); the subscribers then bind to it."""
    await js.add_consumer(layout.work_stream, config=config)
