"""The one shape of every state-dependent command (optimistic concurrency on the session subject):

0. wait for the session's turn among this process's writes to it (:mod:`services.writes.turns`:
   they queue instead of conflicting with each other; other processes' writes still race);
1. read the session subject's last sequence from JetStream;
2. wait until the projection has applied it;
3. decide from the projection (``decide`` returns an event, or ``None`` for a no-op);
4. publish with that sequence as ``Nats-Expected-Last-Subject-Sequence``;
5. on a conflict (another writer got there first) repeat, a bounded number of times.

Appends may skip steps 1 and 2 (:class:`UnappliedChain`): this process remembers the chain of appends it
published to a session, each one published expecting the one before, so the chain is exactly the
session's events after its start. When the read model has applied up to the start of the chain,
the read model plus the chain's unapplied appends is the session's state at the chain's end; the
decision is made from that, and the publish expects the chain's end. A writer elsewhere makes the
publish conflict: the chain is forgotten and the attempt repeats the slow way. Only a decision
that publishes is taken this way: a refusal or a no-op publishes nothing that a conflict could
catch, so those are decided again the slow way (the session may have moved on elsewhere).

A chain may also know the session's message ids (:attr:`UnappliedChain.ids`, read once from the
read model, then kept by each append of the chain) and its latest leaf: an append of a new id
is then decided without reading the read model at all (``known``), which keeps its cost
independent of the database. With the ids it knows the ids stored messages name as their parent
that the session does not hold (:attr:`UnappliedChain.dangling`: deleted messages', whose
children keep them): only a new message with one of those ids could be its own ancestor, so
only its append is decided from the read model, which knows the id's descendants. What it
decides on is exact for the same reason as above: the publish expects the chain's end, so any
other writer's event makes it conflict, and the chain (its ids with it) is forgotten.

An erasure done by another process is caught the same way, with no round trip of its own: it is
recorded in Postgres (``erasures``) before its ``session.erased`` event is published on the
session's subject. A decision taken after that event reads the erasure (the append's one query
asks when the session has no row, :func:`services.writes.liveness.live_session` for the other
commands) and refuses ``410 session_erased``; a publish decided before it expects a sequence
the event has moved past, so it conflicts and is decided again. No write is published after
``session.erased``, whatever a process has cached (its chain, the session's data key).
"""

from __future__ import annotations

import asyncio
import random
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import psycopg
from psycopg_pool import AsyncConnectionPool, PoolTimeout

from events.catalog import MessageAppended
from events.envelope import Event
from events.publisher import ConcurrencyConflict, Publisher
from services.errors import ContentionExhausted, ErasedSession
from services.writes.pacing import Pacer
from services.writes.turns import SessionTurns
from services.writes.waiting import AppliedWaiter

Conn = psycopg.AsyncConnection[Any]


@dataclass(frozen=True, slots=True)
class Decision:
    """An event to publish (or None for a no-op) and how to answer once it has a sequence.

    ``replayed``: how to answer when the log already held the event's id (the publish was a
    duplicate within the stream's duplicate window: nothing was written, and the sequence is the
    first one's); None answers as ``answer`` does. Only a duplicate on the session's own subject
    gets here: one whose stored message is on another subject (someone took the id first,
    publishing on their own subjects) is :class:`~events.publisher.ForeignDuplicate`, raised
    out of :meth:`OptimisticWriter.run` (events/publisher.py)."""

    event: Event | None
    answer: Callable[[int], Any]
    replayed: Callable[[int], Awaitable[Any]] | None = None


@dataclass(frozen=True, slots=True)
class Appended:
    """What a decision needs of an append (never its body: a chain stays small)."""

    seq: int
    message_id: str
    parent_id: str | None
    body_sha256: str


@dataclass(slots=True)
class UnappliedChain:
    """Appends this process published to one session, each expecting the sequence before it."""

    base: int  # the session's last sequence before the first of ``appends``
    last: int  # the sequence of the newest of ``appends``
    appends: list[Appended] = field(default_factory=list)
    # every message id of the session at ``last`` (None: not known; then ``appends`` are kept)
    ids: set[str] | None = None
    leaf: str | None = None  # the latest leaf at ``last``, when ``ids`` are known
    ids_tried: bool = False  # the ids were asked for once (a session over the cap has none)
    # with ``ids``: the ids messages name as their parent that are not in ``ids`` (deleted ones')
    dangling: frozenset[str] = frozenset()

    def know(self, ids: set[str], leaf: str | None, dangling: set[str] | frozenset[str] = frozenset()) -> None:
        """The session's ids, latest leaf and dangling parent ids at ``last``: from now on
        ``appends`` are not kept."""
        self.ids, self.leaf, self.ids_tried, self.dangling = ids, leaf, True, frozenset(dangling)
        self.appends, self.base = [], self.last

    def above(self, message_id: str) -> str | None:
        """The first id above ``message_id`` that is none of ``appends``, following their parents:
        what the message descends from in the read model (None: a root of the chain's, or an
        id not among ``appends``, which the read model alone answers for)."""
        parents = {a.message_id: a.parent_id for a in self.appends}
        if message_id not in parents:
            return None
        node: str | None = message_id
        seen: set[str] = set()
        while node is not None and node in parents and node not in seen:
            seen.add(node)
            node = parents[node]
        return node

    def unapplied(self, applied: int) -> list[Appended] | None:
        """The appends the read model (at ``applied``) lacks, or None when it lacks more than the
        chain holds (it has not reached the chain's start)."""
        if applied < self.base:
            return None
        return [a for a in self.appends if a.seq > applied]


FastDecide = Callable[[Conn, UnappliedChain], Awaitable[Decision | None]]
KnownDecide = Callable[[UnappliedChain], Decision | None]

MAX_CHAINS = 10_000  # sessions remembered per process (least recently appended to go first)
MAX_CHAIN = 1_000  # unapplied appends remembered per session
MAX_SESSION_IDS = 20_000  # a session with more messages keeps no ids (its appends read the read model)
MAX_KNOWN_IDS = 500_000  # ids kept per process, all chains together (~40 MB; the oldest chains go first)


class OptimisticWriter:
    def __init__(
        self,
        publisher: Publisher,
        pool: AsyncConnectionPool[Conn],
        waiter: AppliedWaiter,
        attempts: int,
        turn_timeout_s: float,
    ) -> None:
        self._pub = publisher
        self._pool = pool
        self._waiter = waiter
        self._attempts = attempts
        self.turns = SessionTurns(turn_timeout_s)
        self._chains: OrderedDict[tuple[str, str], UnappliedChain] = OrderedDict()
        self._known_ids = 0  # ids kept by all chains

    def pacer(self, tenant: str, session: str) -> Pacer:
        """Pacing of one long write to ``session`` (:mod:`services.writes.pacing`), its budget the read wait."""
        return Pacer(self._waiter, tenant, session, self._waiter.timeout_s)

    async def catch_up(self, tenant: str, session: str) -> int:
        """Wait until the projection has applied every event of the session; returns its last seq."""
        last = await self._pub.last_subject_seq(tenant, session)
        await self._waiter.wait_session(tenant, session, last)
        return last

    async def run(
        self,
        tenant: str,
        session: str,
        decide: Callable[[Conn], Awaitable[Decision]],
        fast: FastDecide | None = None,
        known: KnownDecide | None = None,
    ) -> Any:
        """Decide and publish under optimistic concurrency, in the session's turn among this
        process's writes to it (:mod:`services.writes.turns`). ``fast`` decides from the read
        model and this process's :class:`UnappliedChain` without waiting for the projector (None:
        it cannot); ``known`` from a chain that knows the session's ids, without the read model."""
        key = (tenant, session)
        turn = await self.turns.take(key)
        try:
            return await self._decide_and_publish(key, decide, fast, known)
        finally:
            self.turns.give_back(key, turn)

    async def _decide_and_publish(
        self,
        key: tuple[str, str],
        decide: Callable[[Conn], Awaitable[Decision]],
        fast: FastDecide | None,
        known: KnownDecide | None,
    ) -> Any:
        """:meth:`run`'s attempts, at most ``attempts``: only a writer in another process (or one
        of this process's that writes without a turn) makes one conflict."""
        tenant, session = key
        for attempt in range(self._attempts):
            decision: Decision | None = None
            tip = self._chains.get(key) if fast is not None else None
            if tip is not None and fast is not None:
                last = tip.last
                try:
                    if tip.ids is not None and known is not None:
                        decision = known(tip)
                    else:
                        async with self._pool.connection() as conn:
                            decision = await fast(conn, tip)
                except PoolTimeout:  # no connection (the database is away): the slow way would wait again
                    raise
                except Exception:  # a refusal is only as fresh as the chain: decide again the slow way
                    decision = None
                if decision is not None and decision.event is None:
                    decision = None  # a no-op (a replay) publishes nothing: no conflict would catch staleness
                if decision is None:
                    self._forget(key)
            if decision is None:
                last = await self.catch_up(tenant, session)
                async with self._pool.connection() as conn:
                    try:
                        decision = await decide(conn)
                    except ErasedSession:
                        self._erased(key)
                        raise
            if decision.event is None:
                return decision.answer(last)
            try:
                published = await self._pub.publish(decision.event, expected_last_subject_seq=last)
            except ConcurrencyConflict:
                self._forget(key)
                await asyncio.sleep(random.uniform(0, 0.002 * min(attempt + 1, 10)))  # noqa: S311
                continue
            self._remember(key, last, published.seq, decision.event, fast is not None)
            if published.duplicate and decision.replayed is not None:
                return await decision.replayed(published.seq)
            return decision.answer(published.seq)
        raise ContentionExhausted(f"gave up after {self._attempts} conflicting attempts")

    def _remember(self, key: tuple[str, str], expected: int, seq: int, event: Event, chain: bool) -> None:
        """Extend the session's chain with an append published expecting ``expected``; anything
        else ends the chain (the next append of the session takes the slow way once)."""
        tip = self._forget(key)
        if not chain or not isinstance(event, MessageAppended) or seq <= expected:  # a duplicate: not new
            return
        if tip is None or tip.last != expected:
            tip = UnappliedChain(base=expected, last=expected)
        if tip.ids is not None:
            tip.ids.add(event.message_id)
            tip.leaf = event.message_id
            tip.base = seq
        elif len(tip.appends) >= MAX_CHAIN:  # the projector is far behind: let appends wait for it
            return
        else:
            tip.appends.append(Appended(seq, event.message_id, event.parent_id, event.body_sha256))
        tip.last = seq
        self._chains[key] = tip  # newest last: the least recently used session goes first
        self._known_ids += len(tip.ids or ())
        while len(self._chains) > MAX_CHAINS or self._known_ids > MAX_KNOWN_IDS:
            self._forget(next(iter(self._chains)))

    def _erased(self, key: tuple[str, str]) -> None:
        """A decision found the session erased (by any process): its chain and, at once, its data
        key go (the key store's poll would drop the key within its interval; until then only a
        decision's refusal stood between a write and the destroyed key)."""
        self._forget(key)
        if self._pub.keys is not None:
            self._pub.keys.forget(*key)

    def _forget(self, key: tuple[str, str]) -> UnappliedChain | None:
        tip = self._chains.pop(key, None)
        if tip is not None:
            self._known_ids -= len(tip.ids or ())
        return tip

    def know(
        self,
        tenant: str,
        session: str,
        tip: UnappliedChain,
        ids: set[str] | None,
        leaf: str | None,
        dangling: set[str] | frozenset[str] = frozenset(),
    ) -> None:
        """``tip`` learns the session's ids, latest leaf and dangling parent ids at its end (read
        from the read model together with ``tip``'s unapplied appends, with no await since);
        ``ids`` None: the session has too many to keep (the chain does not ask again).

        Only while ``tip`` is still the session's chain: the read was awaited, and meanwhile
        another append of this process may have ended ``tip`` and started a new chain, whose end
        these ids and this leaf are not. Taught to the new chain, they would let its next append
        take a stale leaf as its parent while expecting the new chain's end, which the log would
        accept: two children of one parent where appends without a parent must make one chain."""
        if self._chains.get((tenant, session)) is not tip or tip.ids is not None:
            return
        tip.ids_tried = True
        if ids is not None:
            tip.know(ids, leaf, dangling)
            self._known_ids += len(ids)

    def trim(self, tenant: str, session: str, applied: int) -> None:
        """Forget the appends the read model has applied (``applied`` is its session sequence)."""
        tip = self._chains.get((tenant, session))
        if tip is not None and applied >= tip.base:
            tip.appends = [a for a in tip.appends if a.seq > applied]
            tip.base = max(tip.base, min(applied, tip.last))
