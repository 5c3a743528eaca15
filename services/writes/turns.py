"""One write at a time per session within a process, in arrival order (a queue in front of the
optimistic concurrency of :mod:`services.writes.optimistic`, not in place of it).

Writes that decide from a session's state and publish expecting its last sequence race: of N
concurrent ones each round, one wins and N-1 conflict and decide again, N²/2 decisions in all,
until some run out of attempts (``503 contention``). Those of one process take turns instead:
each decides (from this process's chain of unapplied appends, with no round trip when it can)
and publishes while the others wait, so none of them conflicts with another. Writers in other
processes still race, and the log's ``Nats-Expected-Last-Subject-Sequence`` still decides
between them.

* **Bounded**: a session has an entry only while a write holds or waits for its turn; the last
  one out removes it.
* **Cancellation**: a write cancelled while waiting leaves the queue (its place is given to the
  next if it had just been handed the turn); one cancelled while holding gives the turn back.
* **Bounded wait**: a write that has not had its turn within ``timeout_s`` answers
  :class:`~services.errors.ContentionExhausted` (``503 contention``, as running out of attempts).
* **Re-entry**: a write already holding its session's turn (a decision that writes to its own
  session) goes on without waiting for itself, as it did before turns.
* **Uncontended cost**: a turn nobody holds is taken without suspending and with no timer (1 to 2 µs
  on the shared 2-core machine: docs/benchmarks.md, eleventh pass).
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from services.errors import ContentionExhausted

Key = tuple[str, str]


class _Turn:
    """A session's turn: the write holding it (since when, loop time) and the writes waiting,
    oldest first."""

    __slots__ = ("owner", "since", "waiting")

    def __init__(self, owner: asyncio.Task[object] | None, since: float) -> None:
        self.owner = owner  # None while handed to a waiting write that has not run yet
        self.since = since
        self.waiting: deque[asyncio.Future[None]] | None = None


class SessionTurns:
    """The sessions of one process with a write holding or waiting for its turn."""

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self._turns: dict[Key, _Turn] = {}

    def __len__(self) -> int:
        """Sessions with a write holding or waiting for their turn."""
        return len(self._turns)

    @property
    def waiting(self) -> int:
        """Writes waiting for their session's turn (behind the one holding it)."""
        return sum(len(t.waiting or ()) for t in self._turns.values())

    async def take(self, key: Key) -> _Turn | None:
        """Wait for the session's turn, and return it for :meth:`give_back`; None when the
        calling task holds it already (re-entry: nothing to give back).
        :class:`ContentionExhausted` after ``timeout_s``; a cancelled wait leaves no trace (a turn
        handed to it meanwhile goes to the next write)."""
        turn = self._turns.get(key)
        me = asyncio.current_task()
        if turn is None:  # nobody holds or waits: taken at once, no suspension, no timer
            turn = self._turns[key] = _Turn(me, asyncio.get_running_loop().time())
            return turn
        if turn.owner is me:
            return None
        handed: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if turn.waiting is None:
            turn.waiting = deque()
        turn.waiting.append(handed)
        try:
            async with asyncio.timeout(self.timeout_s):
                await handed
        except BaseException as exc:  # timed out or cancelled
            ahead = 1 + (turn.waiting.index(handed) if handed in turn.waiting else len(turn.waiting))
            if handed.done() and not handed.cancelled():
                self._hand_on(key, turn)  # handed the turn as it was given up: the next write has it
            elif handed in turn.waiting:  # (a hand-on may have passed over it already)
                turn.waiting.remove(handed)
            if isinstance(exc, TimeoutError):
                raise ContentionExhausted(self._waited(turn, ahead)) from None
            raise
        turn.owner = me
        turn.since = asyncio.get_running_loop().time()
        return turn

    def _waited(self, turn: _Turn, ahead: int) -> str:
        """What a write that waited ``timeout_s`` for its turn is told: how many writes were ahead
        of it and how long the one writing had held the turn (a client's retry of a write still
        running, waiting for a database connection, say, waits behind its own first attempt)."""
        held = asyncio.get_running_loop().time() - turn.since
        writes = "write" if ahead == 1 else "writes"
        return (
            f"waited {self.timeout_s:g}s for its turn behind {ahead} earlier {writes} to this session in this "
            f"process (the one writing has held its turn for {held:.2f}s; a write sent again waits behind its "
            "first attempt while that still runs)"
        )

    def give_back(self, key: Key, turn: _Turn | None) -> None:
        """End the turn ``take`` gave (None: a re-entry's, nothing to give back): the next
        waiting write has it, or the session's entry goes."""
        if turn is not None:
            self._hand_on(key, turn)

    def _hand_on(self, key: Key, turn: _Turn) -> None:
        turn.owner = None
        while turn.waiting:
            handed = turn.waiting.popleft()
            if not handed.done():
                handed.set_result(None)
                return
        del self._turns[key]

    @asynccontextmanager
    async def turn(self, key: Key) -> AsyncIterator[None]:
        """Hold the session's turn for the block (:meth:`take` and :meth:`give_back`)."""
        held = await self.take(key)
        try:
            yield
        finally:
            self.give_back(key, held)
