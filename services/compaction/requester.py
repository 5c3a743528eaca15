"""The projector's side of compaction: after its commits, the sessions its compaction state
finds over ``compact_after`` go out as ``compaction.requested``.

The state (:class:`~services.compaction.state.CompactorState`) is one of the projector's
projections, so its decisions are committed with the read models and the checkpoint. After each
batch, while the projector is caught up with the log (at most a batch behind), the due sessions
are published to the work queue (:class:`~services.compaction.queue.Requests`, each decision once,
with a deterministic id); a projector far behind (after a restart under load) only catches up.
The compactor processes take the requests from there; appends never wait for any of this.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from psycopg_pool import AsyncConnectionPool

from events.catalog import CompactionRequested
from services.compaction.queue import Requests, request
from services.compaction.state import CompactorState, Conn

log = logging.getLogger("chronicle.compactor")


class Requester:
    """Publishes the due sessions of a projector's compaction state, after its commits."""

    def __init__(
        self,
        state: CompactorState,
        requests: Requests,
        pool: AsyncConnectionPool[Conn],
        caught_up: Callable[[], bool],
    ) -> None:
        self.state = state
        self.requests = requests
        self._pool = pool
        self._caught_up = caught_up
        self._moved = asyncio.Event()  # the state moved (or was loaded): due sessions may be new

    def due(self) -> list[CompactionRequested]:
        """The sessions the state finds over their threshold, as requests."""
        return [request(c.tenant, c.session, c.leaf, c.estimate, c.seq) for c in self.state.candidates.values()]

    def after_batch(self, applied: int, last_seq: int) -> None:
        """The runner's ``on_batch``: a commit may have made sessions due."""
        if self._caught_up():
            self._moved.set()

    async def run(self, stop: asyncio.Event) -> None:
        """Load the state's tracked and due sessions (after a restart nothing new may arrive for
        them), then publish what each commit makes due, until cancelled."""
        while not stop.is_set():
            try:
                async with self._pool.connection() as conn:
                    await self.state.load(conn)
                break
            except Exception:  # the database is not there yet: the projector waits for it too
                log.warning("loading the compaction state failed; trying again", exc_info=True)
                await asyncio.sleep(1.0)
        self._moved.set()
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

    def settled(self) -> bool:
        """Every due session's request is published."""
        return not self.requests.unsent(self.due())
