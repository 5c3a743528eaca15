"""The projector: a durable JetStream pull consumer feeding projections, one transaction a batch.

Contract:
* Each fetched batch is applied in one Postgres transaction together with the checkpoint (the
  highest stream sequence applied); the batch is acked only after that commit.
* Fetching, decoding and planning run ahead of the transaction (a bounded queue of prepared
  batches), so the Python work of batch N+1 overlaps Postgres's work on batch N.
* Sequences at or below the checkpoint are skipped (redelivery has no effect).
* The checkpoint, not the consumer, is the truth: on start and after any failure the durable
  consumer is re-created at ``checkpoint + 1``, so nothing is skipped after a crash.
* One runner per checkpoint name: a Postgres advisory lock keeps a second instance waiting.
* The commit sends ``NOTIFY chronicle_applied`` so readers waiting on a sequence wake at once.
* Projections see only events the contract admits (:func:`events.admission.admit` on the stored
  bytes and subject); the others, and an event a projection's database refuses for its data
  (:data:`projections.quarantine.DATA_ERRORS`: the batch is re-applied one event at a time, each
  in a savepoint), are recorded in ``quarantine`` in the batch's transaction, and the checkpoint
  moves past them: one bad event never stops the projector, and a rebuild decides the same.
  So is an event whose claim-checked body can never be had
  (:class:`events.admission.BodyUnavailable`: reason ``body_unavailable``); a projection that
  meets one while preparing leaves its plans to the transaction, where the batch is re-applied
  one event at a time and that event quarantined.
* An event of an erased session is a tombstone (applied by no projection, never quarantined; the
  checkpoint moves past it), also when the erasure is learned after the event was admitted: the
  session's ``session.erased`` later in the same batch (a proven one the database lost: restored
  from an older backup), whose earlier events are then tombstones before any body is fetched
  (:func:`projections.quarantine.tombstone_erased`); or a projection meeting the session's
  destroyed key (:class:`events.sealing.KeyDestroyed`, opening a sealed claim-checked body), which
  is handled as a body that can never be had, but the event is a tombstone. A rebuild, which
  knows every erasure, decides the same. A refused event whose bytes name an erased session (a
  stray, on another subject) is a tombstone too; the sessions a batch's refusals name are asked
  about again in its transaction, under the advisory lock an erasure is recorded under
  (:func:`projections.keystore.erased_under_lock`, shared, one a tenant): a batch that waited while an erasure
  ran records no stray of it, and an erasure recorded meanwhile waits for the batch's commit, so
  its own deletes (step 4 of services/writes/erasure.py) find what the batch recorded.
* Any other failure (the database or NATS is down) re-positions after an exponential backoff
  (``retry_base_s`` doubling up to ``retry_cap_s``, reset once a batch commits), one warning line
  per retry, never a traceback (it is logged at DEBUG), naming the error even when its text is
  empty (:func:`describe`: ``TimeoutError: timed out``).
* Nothing waits on the database without a bound: connecting (``connect_timeout_s``) and each
  database step (``db_timeout_s``: a commit, positioning, an idle advance) time out and count as a
  failure, so a connection whose server vanished (a Postgres restart) is retried, never awaited
  forever. After a failure the pool's broken connections are dropped before the retry.
* Consuming that makes no progress for ``stall_s`` (no fetch returned, no slice of a batch
  screened or planned, no commit: an await that never returns) is abandoned (a cancelled task that
  does not end within :data:`CANCEL_GRACE_S` is left behind, and no longer positions, fetches or
  marks progress) and the runner re-positions at its checkpoint, one log line, ``stats.stalls``;
  the limit doubles after each stall (up to 16 times) until a batch commits, so slow work ends.
* The lock's session is watched (every ``lock_check_s``): when it ends (a Postgres restart ends it
  and frees the lock), consuming stops at once and the runner takes the lock again before it
  consumes another batch.
* The checkpoints must belong to the stream (:func:`projections.logbinding.check_log`, in the
  transaction that reads them at every positioning): on :class:`LogMismatch` (the stream was made
  again, or is another's) :meth:`ProjectorRunner.run` raises it at once, having consumed nothing.
* ``stop`` always ends :meth:`ProjectorRunner.run`: the batch in flight gets ``stop_grace_s`` to
  commit (or roll back), then the work is cancelled.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import json
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol, runtime_checkable

import nats.errors
import psycopg
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy
from nats.js.errors import NotFoundError
from psycopg_pool import AsyncConnectionPool

from events.admission import BodyUnavailable
from events.catalog import SessionErased
from events.envelope import Event
from events.sealing import KeyDestroyed, KeyReader, kid_in
from events.subjects import SubjectLayout
from projections.keystore import PgKeyStore, erased_under_lock
from projections.logbinding import LogMismatch, check_log
from projections.quarantine import (
    DATA_ERRORS,
    ErasedSet,
    Quarantined,
    Tombstone,
    data_error,
    forget,
    record,
    refused_item,
    refused_sessions,
    screen,
    tombstone_erased,
    tombstone_refused,
)

log = logging.getLogger("chronicle.projector")

LOCK_CLASS = "hashtext('chronicle-projector')"
"""The first key of every projector's advisory lock (two-key form; the second: its checkpoint's name
hashed): ``pg_locks`` shows them with this ``classid`` and ``objsubid`` 2."""

NOTIFY_CHANNEL = "chronicle_applied"
PREPARE_SLICE = 100
FETCH_CHUNK = 48
"""At most this many messages per pull request: an event is at most 1 MiB (the stream's limit),
so what one request has in flight stays under nats-server's default ``max_pending`` of a client
connection (64 MiB). Past it the server cut the projector off as a slow consumer and the
messages in flight were lost (a tenant publishing ~1 MB events made that happen: issue of the
adversarial trial). The batch is still up to ``batch_size``: more requests, each ~0.3 ms."""
PIPELINE_MAX_ITEMS = 16
"""A batch of at most this many events is applied in pipeline mode: its statements go without
waiting for each other's answers (a handful of round trips instead of one per statement, what a
batch of one append costs most). Projections use no ``COPY`` (not possible in pipeline mode) for
batches this small."""
_PER_EVENT: tuple[type[Exception], ...] = (*DATA_ERRORS, BodyUnavailable, KeyDestroyed)
"""What one event's data makes a batch raise: re-applied one event at a time, the event quarantined
(a tombstone, for a destroyed key: its session is erased)."""


class Projection(Protocol):
    """A read model: applies already-decoded events inside the runner's transaction. Every event
    it is given was admitted (:func:`events.admission.admit`, by :func:`projections.quarantine.screen`):
    a projection may rely on what admission checked (the history projection does not hash again
    an inline body admission hashed: :func:`projections.history.hash_is_own`)."""

    name: str

    async def apply(self, conn: psycopg.AsyncConnection[Any], items: Sequence[tuple[int, Event]]) -> None: ...


@runtime_checkable
class Planning(Protocol):
    """A projection whose per-event work (fetching bodies, planning rows) needs no connection:
    the runner calls :meth:`prepare` before the transaction, one plan per item, and
    :meth:`apply_prepared` inside it with the plans of the items past the checkpoint."""

    name: str

    async def prepare(
        self, items: Sequence[tuple[int, Event]], batch: Sequence[tuple[int, Event]] | None = None
    ) -> list[Any]:
        """One plan per item of ``items``, a slice of ``batch`` (all the items one transaction
        applies; None: ``items`` are the batch): a decision that depends on the events before an
        item in its batch reads ``batch``, so a batch prepared in slices plans as a whole one does."""
        ...

    async def apply_prepared(self, conn: psycopg.AsyncConnection[Any], plans: Sequence[Any]) -> None: ...


@runtime_checkable
class Selective(Protocol):
    """A projection that ignores most events and can say which, before any transaction: a batch
    no projection of the runner wants is acknowledged without one. Its checkpoint then moves at
    most every ``checkpoint_interval_s`` (or when the consumer is idle, or with the next applied
    batch); after a restart the skipped events are read again, and skipped again."""

    name: str

    def wants(self, event: Event) -> bool: ...

    def wants_stored(self, tenant: str, session: str, data: bytes) -> bool:
        """Before decoding: False only when no event of ``session`` with these bytes is wanted
        (the event is then neither decoded nor admitted by this runner; the projector's runner
        admits, and quarantines, every event). Batches are prepared while the previous one
        commits: when :attr:`generation` has changed by the time a batch that left events out
        commits, the batch is prepared again."""
        ...

    @property
    def generation(self) -> int:
        """Changes whenever what :meth:`wants_stored` answers may have changed."""
        ...


Prepared = Mapping[str, Sequence[Any]]
Sources = Mapping[int, tuple[str, bytes]]
"""For a sequence: the subject and raw bytes it is stored as (what a data error quarantines)."""
StoredTimes = Mapping[int, datetime]
"""For a sequence: when the stream stored it (its JetStream timestamp): a quarantine row's
``recorded_at``, which a rebuild of the same log reproduces."""


async def prepare(
    projections: Sequence[Projection],
    items: Sequence[tuple[int, Event]],
    batch: Sequence[tuple[int, Event]] | None = None,
) -> dict[str, list[Any]]:
    """The plans of every planning projection for ``items`` (outside any transaction). A
    projection that meets a body that can never be had (:class:`BodyUnavailable`), or an erased
    session's destroyed key (:class:`KeyDestroyed`), has no plans here: :func:`apply_batch`
    applies it unplanned, and quarantines (or, for a destroyed key, passes) the event that raises."""
    plans: dict[str, list[Any]] = {}
    for p in projections:
        if isinstance(p, Planning):
            with contextlib.suppress(BodyUnavailable, KeyDestroyed):
                plans[p.name] = await p.prepare(items, batch)
    return plans


@dataclass
class RunnerStats:
    applied: int = 0
    batches: int = 0
    skipped: int = 0
    quarantined: int = 0
    last_seq: int = 0
    pending: int = 0  # messages the consumer had not delivered yet when the last batch was fetched
    lock_losses: int = 0  # times the advisory lock's session ended under a running runner
    gaps: int = 0  # deliveries the consumer made that never arrived: re-positioned at the checkpoint
    stalls: int = 0  # times consuming made no progress for ``stall_s``: abandoned and re-positioned


class LockLost(Exception):
    """The advisory lock's session ended (the database restarted or closed it): the lock is gone."""


class Stalled(Exception):
    """Consuming made no progress for the runner's ``stall_s``: an await that never returned."""


class DeliveryGap(Exception):
    """A message the consumer delivered never arrived (its consumer sequence was skipped: lost in
    a disconnect, e.g. a slow-consumer cut). Nothing after it may be applied or acknowledged (the
    consumer acknowledges all up to a sequence): the runner re-positions at its checkpoint."""


def partition_checkpoint(projector: str, partition: int) -> str:
    """The checkpoint (and lock) name of one partition of a projector: ``<name>.pNNN``."""
    return f"{projector}.p{partition:03d}"


def checkpoint_partition(projector: str, name: str) -> int | None:
    """The partition a checkpoint name of ``projector`` stands for (the inverse of
    :func:`partition_checkpoint`); None for the unpartitioned one and for other names."""
    prefix = f"{projector}.p"
    digits = name[len(prefix) :] if name.startswith(prefix) else ""
    return int(digits) if digits.isascii() and digits.isdigit() else None


def retry_delay(failures: int, base_s: float, cap_s: float) -> float:
    """The wait before retry number ``failures`` (1, 2, ...): ``base_s`` doubling, at most ``cap_s``."""
    return float(min(cap_s, base_s * 2 ** min(max(failures - 1, 0), 32)))


async def read_checkpoint(conn: psycopg.AsyncConnection[Any], name: str) -> int:
    cur = await conn.execute("SELECT seq FROM checkpoints WHERE name = %s", (name,))
    row = await cur.fetchone()
    return int(row[0]) if row else 0


async def apply_batch(
    conn: psycopg.AsyncConnection[Any],
    name: str | Sequence[str],
    projections: Sequence[Projection],
    items: Sequence[tuple[int, Event]],
    *,
    notify: bool = True,
    prepared: Prepared | None = None,
    refused: Sequence[Quarantined] = (),
    sources: Sources | None = None,
    quarantined: list[Quarantined] | None = None,
    passed: Sequence[int] = (),
    layout: SubjectLayout | None = None,
    stored: StoredTimes | None = None,
) -> int:
    """Apply ``items`` past the checkpoint and advance it, in the caller's open transaction.

    ``prepared`` holds plans made by :func:`prepare` for these ``items`` (one per item, in the
    same order), used for the items past the checkpoint. Items are applied in stream order, each
    sequence once, whatever order they came in (redeliveries may mix older ones in). Returns how
    many items were applied. Several names (one per partition a worker consumes) all move
    together, never backwards; the lowest decides what is fresh.

    ``refused`` are the batch's events the contract refused: those past the checkpoint are
    recorded in ``quarantine`` and the checkpoint moves past them. The projections run in a
    savepoint; when one raises a data error, :class:`BodyUnavailable` or :class:`KeyDestroyed`, the
    items are applied again one at a time, each in its own savepoint, and the ones that fail are
    quarantined as ``data_error`` or ``body_unavailable`` (with their ``sources``' subject and
    bytes), or, meeting a destroyed key (their session is erased), passed as tombstones. Each is
    recorded at the time ``stored`` gives for its sequence, when the stream stored it.
    ``quarantined``, when given, receives what this call recorded. ``passed`` are sequences
    no projection applies (tombstones of erased sessions): the checkpoint moves past them.
    With ``layout`` (the projector and a rebuild pass it), a ``session.erased`` applied drops the
    session's quarantined events, on its ids under any partition token, and its strays
    (:func:`~projections.quarantine.forget`: indexed lookups of the rows it owns or that name it,
    which ``layout`` lets :func:`~projections.quarantine.record` mark).
    With ``layout``, what is to be recorded is decided again under the erasure lock
    (:func:`~projections.keystore.erased_under_lock`): a refusal of an erased session (its subject's,
    or the one its bytes name) is a tombstone, as a rebuild that knows the erasure decides it.
    """
    names = sorted({name} if isinstance(name, str) else set(name))  # one lock order for every worker
    cur = await conn.execute(  # creates the rows if needed and locks them until the commit
        "INSERT INTO checkpoints (name, seq) SELECT unnest(%s::text[]), 0 "
        "ON CONFLICT (name) DO UPDATE SET name = excluded.name RETURNING seq",
        (names,),
    )
    checkpoint = min((int(r[0]) for r in await cur.fetchall()), default=0)
    order: dict[int, int] = {}  # sequence -> index of its first occurrence in items
    for i, (seq, _) in enumerate(items):
        if seq > checkpoint:
            order.setdefault(seq, i)
    late = list({q.seq: q for q in refused if q.seq > checkpoint}.values())
    gone = [seq for seq in passed if seq > checkpoint]
    if not order and not late and not gone:
        return 0
    picked = [order[seq] for seq in sorted(order)]
    failed: list[Quarantined] = []
    erased: list[int] = []  # picked, and met their session's destroyed key: tombstones
    if picked:
        try:
            async with conn.transaction():  # a savepoint: a data error rolls back to here only
                await _apply(conn, projections, items, picked, prepared)
        except _PER_EVENT:
            failed, erased = await _apply_each(conn, projections, items, picked, prepared, sources or {})
    kept = [*late, *failed]
    if kept and layout is not None:
        # decided again under the erasure lock: a refusal of a session whose erasure is recorded by
        # now is a tombstone (a stray screened while the erasure ran, in a batch that waited);
        # an erasure recorded after this waits for the commit, and its deletes come later still
        now_erased = await erased_under_lock(conn, refused_sessions(kept, layout))
        kept, _ = tombstone_refused(kept, layout, ErasedSet(now_erased))
    if kept:
        await record(conn, names[0], kept, layout, announce=notify, stored=stored)
        if quarantined is not None:
            quarantined.extend(kept)
    erased_now = {(e.tenant, e.session) for _, e in items if isinstance(e, SessionErased)}
    if erased_now and layout is not None:
        # the session's refusals quarantined before its erasure (also in this batch, or before a
        # proven erasure was recorded again, or committed after the eraser's own delete of these
        # rows), on its ids under any partition token (a tenant scope's: on every subject of the
        # tenant that names no session), its strays too: gone, as a rebuild that knows the erasure
        # tombstones every refusal of the session (projections.quarantine.refusal_erased)
        await forget(conn, layout, erased_now)
    top = max([items[picked[-1]][0] if picked else 0, *(q.seq for q in late), *gone])
    await conn.execute(
        "WITH moved AS (UPDATE checkpoints SET seq = GREATEST(seq, %s), updated_at = now() WHERE name = ANY(%s) "
        "RETURNING seq) SELECT pg_notify(%s, %s) FROM (SELECT 1 FROM moved LIMIT 1) one WHERE %s",
        (top, names, NOTIFY_CHANNEL, f"{names[0]}:{top}", notify),
    )
    return len(picked) - len(failed) - len(erased)


async def _apply(
    conn: psycopg.AsyncConnection[Any],
    projections: Sequence[Projection],
    items: Sequence[tuple[int, Event]],
    picked: Sequence[int],
    prepared: Prepared | None,
) -> None:
    """Every projection applies the ``picked`` items (indexes into ``items``, in stream order)."""
    for projection in projections:
        plans = prepared.get(projection.name) if prepared is not None else None
        if plans is not None and isinstance(projection, Planning):
            await projection.apply_prepared(conn, [plans[i] for i in picked])
        else:
            await projection.apply(conn, [items[i] for i in picked])


async def _apply_each(
    conn: psycopg.AsyncConnection[Any],
    projections: Sequence[Projection],
    items: Sequence[tuple[int, Event]],
    picked: Sequence[int],
    prepared: Prepared | None,
    sources: Sources,
) -> tuple[list[Quarantined], list[int]]:
    """Apply the ``picked`` items one at a time, each in a savepoint; the ones a projection's
    database refuses for their data, or whose body can never be had, are rolled back and returned
    as quarantine items; the ones that meet their session's destroyed key (it was erased since
    they were admitted) are rolled back and returned as tombstones (their sequences)."""
    failed: list[Quarantined] = []
    erased: list[int] = []
    for i in picked:
        seq, event = items[i]
        current = "?"
        try:
            async with conn.transaction():
                for projection in projections:
                    current = projection.name
                    async with conn.pipeline():  # its exit syncs: an error is this projection's
                        await _apply(conn, [projection], items, [i], prepared)
        except DATA_ERRORS as exc:
            subject, raw = sources.get(seq) or ("", event.to_json())
            failed.append(data_error(seq, subject, raw, current, exc))
        except BodyUnavailable as exc:  # the same for every projection and consumer: no name
            subject, raw = sources.get(seq) or ("", event.to_json())
            failed.append(refused_item(seq, subject, raw, exc))
        except KeyDestroyed:  # its session is erased: nothing of it is materialised, nothing kept
            erased.append(seq)
    return failed, erased


@dataclass
class ProjectorRunner:
    js: JetStreamContext
    pool: AsyncConnectionPool[psycopg.AsyncConnection[Any]]
    conninfo: str
    layout: SubjectLayout
    projections: Sequence[Projection]
    name: str = "projector"
    filter_subject: str | None = None
    # a worker of several partitions: one filter and one checkpoint per partition
    filter_subjects: Sequence[str] = ()
    checkpoints: Sequence[str] = ()
    # advisory locks held while running (default: the checkpoints'); a projector of every partition
    # also takes every partition's, so it never runs next to partition workers
    locks: Sequence[str] = ()
    # where to start when the other layout (unpartitioned <-> per partition) ran last: a sequence
    # for this runner's checkpoints, or None to keep them
    seed: Callable[[psycopg.AsyncConnection[Any]], Awaitable[int | None]] | None = None
    batch_size: int = 1000
    replicas: int = 0  # the consumer's copies on a NATS cluster; 0: the stream's
    # a consumer's creation on a cluster waits for its group to elect a leader: seconds, under load
    consumer_timeout_s: float = 20.0
    idle_timeout_s: float = 1.0
    prefetch: int = 2
    retry_base_s: float = 0.1
    retry_cap_s: float = 30.0
    connect_timeout_s: float = 10.0
    db_timeout_s: float = 60.0
    lock_check_s: float = 1.0
    # consuming that makes no progress for this long (no fetch returned, no batch prepared or
    # committed) is abandoned and re-positioned: longer than a commit or a positioning may take
    stall_s: float = 180.0
    stop_grace_s: float = 15.0
    on_batch: Callable[[int, int], None] | None = None
    # work that runs beside the consuming while :meth:`run` runs (started first, cancelled last);
    # what a projection's commits decide and the runner's process acts on after them
    sidecars: Sequence[Callable[[asyncio.Event], Coroutine[Any, Any, None]]] = ()
    # data keys: sealed events are opened with them, erased sessions' events are tombstones
    keys: KeyReader | None = None
    checkpoint_interval_s: float = 1.0  # at most this stale while batches are skipped (Selective)
    # the projector whose log binding is checked at every positioning (default: this runner's name);
    # a partition worker checks its base projector's
    log_owner: str | None = None
    stats: RunnerStats = field(default_factory=RunnerStats)
    _failures: int = field(default=0, init=False, repr=False)  # in a row; a committed batch resets it
    _saved_at: float = field(default=float("-inf"), init=False, repr=False)  # when the checkpoint was last written
    _delivered: int = field(default=0, init=False, repr=False)  # the consumer sequence of the last delivery seen
    _alive_at: float = field(default=0.0, init=False, repr=False)  # when consuming last made progress (monotonic)
    _round: int = field(default=0, init=False, repr=False)  # which consuming round may commit (a stalled one may not)
    _stalls_in_row: int = field(default=0, init=False, repr=False)  # stalls since a batch last committed
    _committing: int | None = field(default=None, init=False, repr=False)  # the round whose commit is under way

    @property
    def durable(self) -> str:
        return "chronicle-" + self.name.replace(".", "-")

    @property
    def checkpoint_names(self) -> list[str]:
        return sorted(self.checkpoints) if self.checkpoints else [self.name]

    async def run(self, stop: asyncio.Event) -> None:
        """Consume until ``stop`` is set; failures re-position from the checkpoint with backoff.

        Once ``stop`` is set the batch in flight has ``stop_grace_s`` to finish, then the work is
        cancelled: a stop request is never lost in an await that does not return.
        """
        beside = [asyncio.create_task(side(stop), name=f"projector-{self.name}-sidecar") for side in self.sidecars]
        work = asyncio.create_task(self._run(stop), name=f"projector-{self.name}")
        stopping = asyncio.create_task(stop.wait())
        try:
            await asyncio.wait({work, stopping}, return_when=asyncio.FIRST_COMPLETED)
            if not work.done():
                done, _ = await asyncio.wait({work}, timeout=self.stop_grace_s)
                if not done:
                    log.warning("projector %s did not stop within %.0fs; cancelling it", self.name, self.stop_grace_s)
            if not work.done():
                work.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await work
            else:
                work.result()
        finally:
            stopping.cancel()
            if not work.done():  # run itself was cancelled
                work.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await work
            for task in beside:
                task.cancel()
            for task in beside:
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task

    async def _run(self, stop: asyncio.Event) -> None:
        """The advisory lock's connection is opened again after every failure (a database restart
        ends it, and with it the lock), and watched while consuming, so the runner never consumes
        without holding its lock."""
        while not stop.is_set():
            try:
                async with await self._connect() as lock_conn:
                    await self._hold_lock(lock_conn, stop)
                    held = await self._held_locks(lock_conn)
                    self._round += 1
                    self._alive_at = time.monotonic()
                    await _first_of(
                        self._watch_lock(lock_conn, held), self._watch_progress(), self._consume_all(stop, self._round)
                    )
            except (asyncio.CancelledError, LogMismatch):
                raise
            except Exception as exc:
                self._failures += 1
                if isinstance(exc, LockLost):
                    self.stats.lock_losses += 1
                if isinstance(exc, Stalled):
                    self.stats.stalls += 1
                    self._stalls_in_row += 1
                delay = retry_delay(self._failures, self.retry_base_s, self.retry_cap_s)
                # one line (docs/reliability.md): a fault the runner recovers from (a database
                # restart, a node failing over, the process stopped and continued) is expected, and
                # its line says it all; the traceback is there for whoever logs at DEBUG
                log.warning(
                    "projector %s failed (%s); retry %d in %.1fs from its checkpoint",
                    self.name,
                    describe(exc),
                    self._failures,
                    delay,
                )
                log.debug("projector %s failure", self.name, exc_info=True)
                await self._drop_broken_connections()
                await _sleep_or_stop(stop, delay)

    def _current(self) -> bool:
        """Whether the calling task belongs to the consuming round now running (or to none): an
        abandoned round's task that wakes up later must not position, fetch or mark progress."""
        round_ = _ROUND.get()
        return round_ is None or round_ == self._round

    def _progress(self) -> None:
        if self._current():
            self._alive_at = time.monotonic()

    @property
    def _stall_limit(self) -> float:
        """``stall_s``, doubled for each stall since a batch last committed (up to 16 times): work
        that is slow, not stuck (a batch of claim-checked bodies from a slow store), finishes."""
        return self.stall_s * (1 << min(self._stalls_in_row, 4))

    async def _watch_progress(self) -> None:
        """Raise :class:`Stalled` when consuming has made no progress for ``stall_s``: every step
        of it is bounded, but an await that never returns (seen once after the process was stopped
        for 80 s under load, with redeliveries, a NATS restart and Postgres connections killed
        before) left the projector silent and every reader waiting until it was restarted by hand.
        The round is abandoned (:func:`_first_of`) and the runner re-positions at its checkpoint."""
        while True:
            await asyncio.sleep(min(self.lock_check_s, self.stall_s))
            idle = time.monotonic() - self._alive_at
            if idle > self._stall_limit:
                raise Stalled(f"consuming made no progress for {idle:.0f}s")

    async def _consume_all(self, stop: asyncio.Event, round_: int) -> None:
        _ROUND.set(round_)  # this task's, and the fetcher's it starts (a copy of its context)
        while not stop.is_set() and self._current():
            try:
                await self._consume(await self._position(), stop, round_)
            except DeliveryGap as gap:  # what was committed is before it: the checkpoint is exact
                self.stats.gaps += 1
                log.warning("projector %s: %s; re-positioning at its checkpoint", self.name, gap)

    async def _connect(self) -> psycopg.AsyncConnection[Any]:
        async with asyncio.timeout(self.connect_timeout_s + 1):
            return await psycopg.AsyncConnection.connect(
                self.conninfo,
                autocommit=True,
                connect_timeout=max(1, round(self.connect_timeout_s)),
                keepalives=1,
                keepalives_idle=5,
                keepalives_interval=2,
                keepalives_count=3,
            )

    async def _drop_broken_connections(self) -> None:
        """Let the pool test its idle connections now: after a database restart every one of them
        is broken, and each would otherwise cost a failed batch and a longer backoff."""
        with contextlib.suppress(Exception):
            async with asyncio.timeout(self.db_timeout_s):
                await self.pool.check()

    def _lock_names(self) -> list[str]:
        return sorted(self.locks) or self.checkpoint_names

    async def _held_locks(self, conn: psycopg.AsyncConnection[Any]) -> int:
        async with asyncio.timeout(self.db_timeout_s):
            cur = await conn.execute(
                "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted AND pid = pg_backend_pid()"
            )
            row = await cur.fetchone()
        return int(row[0]) if row else 0

    async def _watch_lock(self, conn: psycopg.AsyncConnection[Any], held: int) -> None:
        """Raise :class:`LockLost` when the lock's session ends or holds fewer locks than it took
        (``held``), checked every ``lock_check_s``; runs until cancelled (the consuming side ends
        first on ``stop``, so the batch in flight is never cut short here)."""
        while True:
            await asyncio.sleep(self.lock_check_s)
            try:
                now = await self._held_locks(conn)
            except Exception as exc:
                raise LockLost(f"the advisory lock's connection ended ({type(exc).__name__}: {exc})") from exc
            if now < held:
                raise LockLost(f"the advisory lock's session holds {now} of its {held} locks")

    async def _hold_lock(self, conn: psycopg.AsyncConnection[Any], stop: asyncio.Event) -> None:
        """One advisory lock per checkpoint: two workers never own the same partition."""
        warned = False
        while not stop.is_set():
            held: list[str] = []
            for name in self._lock_names():
                cur = await conn.execute(f"SELECT pg_try_advisory_lock({LOCK_CLASS}, hashtext(%s))", (name,))
                row = await cur.fetchone()
                if not (row and row[0]):
                    break
                held.append(name)
            else:
                return
            for name in held:
                await conn.execute(f"SELECT pg_advisory_unlock({LOCK_CLASS}, hashtext(%s))", (name,))
            if not warned:
                log.warning("another projector holds a checkpoint of %r; waiting for it to stop", self.name)
                warned = True
            await _sleep_or_stop(stop, 1.0)

    async def _position(self) -> JetStreamContext.PullSubscription:
        async with asyncio.timeout(self.db_timeout_s), self.pool.connection() as conn, conn.transaction():
            names = self.checkpoint_names
            seeded = await self.seed(conn) if self.seed is not None else None
            if seeded is not None:
                await conn.execute(
                    "INSERT INTO checkpoints (name, seq) SELECT unnest(%s::text[]), %s "
                    "ON CONFLICT (name) DO UPDATE SET seq = excluded.seq, updated_at = now()",
                    (names, seeded),
                )
                log.info("projector %s starts from the other layout's checkpoint %d", self.name, seeded)
            cur = await conn.execute("SELECT name, seq FROM checkpoints WHERE name = ANY(%s)", (names,))
            found = dict(await cur.fetchall())
            checkpoint = min(int(found.get(n, 0)) for n in names)  # a missing row: nothing applied yet
            try:
                await check_log(conn, self.js, self.layout.stream, self.log_owner or self.name)
            except LogMismatch as exc:
                log.error("projector %s refuses to start: %s", self.name, exc)
                raise
        if not self._current():
            raise Stalled("this consuming round was abandoned as stalled")
        with contextlib.suppress(NotFoundError):
            await self.js.delete_consumer(self.layout.stream, self.durable)
        config = ConsumerConfig(
            durable_name=self.durable,
            ack_policy=AckPolicy.ALL,
            ack_wait=60.0,
            max_ack_pending=max(self.batch_size * 4, 1000),
            filter_subject=None if self.filter_subjects else self.filter_subject or self.layout.wildcard,
            filter_subjects=list(self.filter_subjects) or None,
            deliver_policy=DeliverPolicy.BY_START_SEQUENCE if checkpoint else DeliverPolicy.ALL,
            opt_start_seq=checkpoint + 1 if checkpoint else None,
            num_replicas=self.replicas or None,
        )
        await self.js.add_consumer(self.layout.stream, config, timeout=self.consumer_timeout_s)
        log.info("projector %s positioned at sequence %d", self.name, checkpoint + 1)
        self._progress()
        self._delivered = 0  # a new consumer: its deliveries are numbered from 1
        return await self.js.pull_subscribe_bind(self.durable, stream=self.layout.stream)

    async def _advance_when_idle(self) -> None:
        """With nothing pending for this consumer's filter, every event up to the stream's last
        sequence that this projector could see is applied: move the checkpoint there, so readers
        waiting on a sequence of another partition are not kept waiting by an idle one."""
        stream = await self.js.stream_info(self.layout.stream)
        last = int(stream.state.last_seq)
        info = await self.js.consumer_info(self.layout.stream, self.durable)
        if info.num_pending or info.num_ack_pending:
            return
        await self._save_checkpoint(last)

    async def _save_checkpoint(self, seq: int) -> None:
        """Move the checkpoint forward to ``seq`` (never back) outside a batch."""
        names = self.checkpoint_names
        async with asyncio.timeout(self.db_timeout_s), self.pool.connection() as conn, conn.transaction():
            cur = await conn.execute(
                "INSERT INTO checkpoints (name, seq) SELECT unnest(%s::text[]), %s ON CONFLICT (name) DO UPDATE "
                "SET seq = excluded.seq, updated_at = now() WHERE checkpoints.seq < excluded.seq",
                (names, seq),
            )
            if cur.rowcount:
                await conn.execute("SELECT pg_notify(%s, %s)", (NOTIFY_CHANNEL, f"{names[0]}:{seq}"))
        self._saved_at = time.monotonic()

    def _unwanted(self, batch: _Batch) -> bool:
        """No projection of this runner wants any event of the batch, and nothing is refused."""
        selective = self._all_selective()
        return (
            bool(selective)
            and not batch.refused
            and not any(p.wants(event) for _, event in batch.items for p in selective)
        )

    async def _consume(self, sub: JetStreamContext.PullSubscription, stop: asyncio.Event, round_: int) -> None:
        """Commit prepared batches in order while the fetcher prepares the next ones (``round_``: a
        round abandoned as stalled commits nothing more, should its await return after all)."""
        queue: asyncio.Queue[_Batch | BaseException | None] = asyncio.Queue(maxsize=self.prefetch)
        fetcher = asyncio.create_task(self._fetch_loop(sub, stop, queue))
        try:
            while (batch := await queue.get()) is not None:
                if isinstance(batch, BaseException):
                    raise batch
                if round_ != self._round:
                    raise Stalled("this consuming round was abandoned as stalled")
                self._committing = round_
                try:
                    await self._commit(batch)
                finally:
                    if self._committing == round_:  # an abandoned round's ending leaves the next one's alone
                        self._committing = None
                if self._current():
                    self._stalls_in_row = 0
                self._progress()
        finally:
            fetcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await fetcher
            with contextlib.suppress(Exception):  # the next position subscribes anew
                async with asyncio.timeout(self.idle_timeout_s + 5):
                    await sub.unsubscribe()

    async def _fetch_loop(
        self,
        sub: JetStreamContext.PullSubscription,
        stop: asyncio.Event,
        queue: asyncio.Queue[_Batch | BaseException | None],
    ) -> None:
        try:
            while not stop.is_set() and self._current():
                msgs = await self._fetch(sub)
                if msgs or self._committing != self._round:  # idle fetches while a commit hangs are no progress
                    self._progress()
                if not msgs:
                    if queue.empty():
                        await self._advance_when_idle()
                    continue
                await queue.put(await self._prepare(msgs))
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # handed to the committing side, which re-positions
            await queue.put(exc)
            return
        await queue.put(None)

    async def _prepare(self, msgs: list[Msg]) -> _Batch:
        """Admit and decode, then plan, in slices, yielding between them, so a commit that has
        finished is acknowledged and the next one started without waiting for the whole batch's
        Python. What the contract refuses becomes a quarantine item, never an exception. The
        whole batch is screened before any of it is planned: an event of a session whose erasure
        comes later in the batch is a tombstone then (:func:`tombstone_erased`), its body (sealed
        with the key the erasure destroyed) never fetched."""
        items: list[tuple[int, Event]] = []
        refused: list[Quarantined] = []
        passed: list[int] = []
        sources: dict[int, tuple[str, bytes]] = {}
        stored: dict[int, datetime] = {}
        selective = self._all_selective()
        for start in range(0, len(msgs), PREPARE_SLICE):
            chunk = msgs[start : start + PREPARE_SLICE]
            if self.keys is not None:
                await self.keys.load(self._wanted_keys(chunk))
            screened: list[tuple[Msg, int, tuple[int, Event] | Quarantined | Tombstone]] = []
            for m in chunk:
                seq = m.metadata.sequence.stream
                if selective and not self._wanted_stored(selective, m):
                    continue
                sources[seq] = (m.subject, m.data)
                stored[seq] = m.metadata.timestamp
                decided = screen(seq, m.subject, m.data, self.layout, self.keys, self._proofs)
                if isinstance(decided, Quarantined) and self.keys is not None and "no data key" in decided.detail:
                    # a key made since this session was asked about, named where kid_in did not see it
                    await self.keys.load([(*self.layout.parse(m.subject), _sealed_kid(m.data))])
                    decided = screen(seq, m.subject, m.data, self.layout, self.keys, self._proofs)
                screened.append((m, seq, decided))
            screened = await self._recheck_erasures(screened)
            if self._proofs is not None:
                await self._proofs.record_learned()  # before the batch that applies them commits
            for _, seq, decided in screened:
                if isinstance(decided, Quarantined):
                    refused.append(decided)
                elif isinstance(decided, Tombstone):
                    passed.append(seq)
                else:
                    items.append(decided)
            self._progress()
            await asyncio.sleep(0)
        if self.keys is not None:
            items, erased = tombstone_erased(items, self.keys)
            passed.extend(erased)
        prepared: dict[str, list[Any]] = {}
        unplanned: set[str] = set()
        for start in range(0, len(items), PREPARE_SLICE):
            planning = [p for p in self.projections if isinstance(p, Planning) and p.name not in unplanned]
            planned = await prepare(planning, items[start : start + PREPARE_SLICE], items)
            for name, plans in planned.items():
                prepared.setdefault(name, []).extend(plans)
            unplanned.update(p.name for p in planning if p.name not in planned)
            self._progress()
            await asyncio.sleep(0)
        for name in unplanned:  # plans of some slices only: the projection applies the batch unplanned
            prepared.pop(name, None)
        top = max(m.metadata.sequence.stream for m in msgs)
        left_out = (msgs, self._generations(selective)) if len(sources) < len(msgs) else None
        return _Batch(msgs[-1], top, items, prepared, refused, sources, stored, left_out, passed)

    @property
    def _proofs(self) -> PgKeyStore | None:
        """The key store, which tells Chronicle's own erasures and records those the database lost."""
        return self.keys if isinstance(self.keys, PgKeyStore) else None

    async def _recheck_erasures(
        self, screened: list[tuple[Msg, int, tuple[int, Event] | Quarantined | Tombstone]]
    ) -> list[tuple[Msg, int, tuple[int, Event] | Quarantined | Tombstone]]:
        """Screen the quarantine items of session subjects again after asking the database (once
        for the chunk) whether their sessions are erased (the subject's, and the one their bytes
        name): an erasure recorded since a session was asked about is read, not guessed. A refused
        event of an erased session is a tombstone (its raw bytes are the session's), and a
        ``session.erased`` that was unrecorded may be recorded now. Refusals are rare: a chunk
        without one asks nothing."""
        if not isinstance(self.keys, PgKeyStore):
            return screened
        sessions = refused_sessions((d for _, _, d in screened if isinstance(d, Quarantined)), self.layout)
        if not sessions:
            return screened
        await self.keys.refresh(sessions)
        keys, proofs = self.keys, self._proofs
        return [
            (m, seq, screen(seq, m.subject, m.data, self.layout, keys, proofs) if isinstance(d, Quarantined) else d)
            for m, seq, d in screened
        ]

    def _wanted_keys(self, msgs: Sequence[Msg]) -> set[tuple[str, str, str | None]]:
        """(tenant, session, key id) of every message: its subject's (the subject is the
        authority) and the key id it names, if sealed."""
        found: set[tuple[str, str, str | None]] = set()
        for m in msgs:
            with contextlib.suppress(ValueError):
                found.add((*self.layout.parse(m.subject), kid_in(m.data)))
        return found

    @staticmethod
    def _generations(selective: Sequence[Selective]) -> tuple[int, ...]:
        return tuple(p.generation for p in selective)

    def _wanted_stored(self, selective: Sequence[Selective], m: Msg) -> bool:
        try:
            tenant, session = self.layout.parse(m.subject)
        except ValueError:  # not a session subject: decoded (and refused) as usual
            return True
        return any(p.wants_stored(tenant, session, m.data) for p in selective)

    def _all_selective(self) -> list[Selective]:
        """The projections, when every one is :class:`Selective` (else none)."""
        selective: list[Selective] = [p for p in self.projections if isinstance(p, Selective)]
        return selective if len(selective) == len(self.projections) else []

    async def _fetch(self, sub: JetStreamContext.PullSubscription) -> list[Msg]:
        """Up to ``batch_size`` messages: wait for the first, then take what is already pending,
        ``FETCH_CHUNK`` at a time. :class:`DeliveryGap` when a delivery is missing."""
        try:
            msgs = self._contiguous(await sub.fetch(1, timeout=self.idle_timeout_s))
        except (TimeoutError, nats.errors.TimeoutError):
            self.stats.pending = 0
            return []
        pending = msgs[-1].metadata.num_pending
        while pending > 0 and len(msgs) < self.batch_size:
            try:
                more = await sub.fetch(
                    min(pending, self.batch_size - len(msgs), FETCH_CHUNK), timeout=self.idle_timeout_s
                )
            except (TimeoutError, nats.errors.TimeoutError):
                break
            msgs.extend(self._contiguous(more))
            pending = more[-1].metadata.num_pending
        self.stats.pending = max(pending, 0)
        return msgs

    def _contiguous(self, msgs: list[Msg]) -> list[Msg]:
        """``msgs`` when each is the consumer's next delivery (its consumer sequence one more than
        the last seen; a redelivery is a new delivery and numbered so too), else
        :class:`DeliveryGap`: acknowledging past a missing delivery would acknowledge it unapplied."""
        if not self._current():
            raise Stalled("this consuming round was abandoned as stalled")
        for m in msgs:
            delivered = m.metadata.sequence.consumer
            if delivered != self._delivered + 1:
                raise DeliveryGap(
                    f"delivery {self._delivered + 1} of its consumer never arrived (next came {delivered}, "
                    f"stream sequence {m.metadata.sequence.stream})"
                )
            self._delivered = delivered
        return msgs

    async def _commit(self, batch: _Batch) -> None:
        if batch.left_out is not None and batch.left_out[1] != self._generations(self._all_selective()):
            batch = await self._prepare(batch.left_out[0])  # left out under what its projections no longer say
        items = batch.items
        if self._unwanted(batch):
            if time.monotonic() - self._saved_at >= self.checkpoint_interval_s:
                await self._save_checkpoint(batch.top)
            await batch.last.ack()
            self._done(batch, 0, 0)
            return
        quarantined: list[Quarantined] = []
        async with (
            asyncio.timeout(self.db_timeout_s),
            self.pool.connection() as conn,
            conn.pipeline() if len(batch.sources) <= PIPELINE_MAX_ITEMS else contextlib.nullcontext(),
            conn.transaction(),
        ):
            applied = await apply_batch(
                conn,
                self.checkpoint_names,
                self.projections,
                items,
                prepared=batch.prepared,
                refused=batch.refused,
                sources=batch.sources,
                quarantined=quarantined,
                passed=batch.passed,
                layout=self.layout,
                stored=batch.stored,
            )
        self._saved_at = time.monotonic()
        await batch.last.ack()
        self._done(batch, applied, len(quarantined))

    def _done(self, batch: _Batch, applied: int, quarantined: int) -> None:
        self._failures = 0
        self.stats.batches += 1
        self.stats.applied += applied
        self.stats.quarantined += quarantined
        self.stats.skipped += len(batch.sources) - applied - quarantined
        self.stats.last_seq = max(self.stats.last_seq, batch.top)  # redeliveries may have mixed older ones in
        if self.on_batch is not None:
            self.on_batch(applied, batch.top)


@dataclass(frozen=True, slots=True)
class _Batch:
    """Fetched messages, admitted, decoded and planned, waiting for their transaction."""

    last: Msg
    top: int  # the highest sequence fetched
    items: list[tuple[int, Event]]
    prepared: Prepared
    refused: list[Quarantined]
    sources: Sources
    stored: StoredTimes  # when the stream stored each sequence of ``sources``
    # the fetched messages and their projections' generations, when some were left out undecoded
    left_out: tuple[list[Msg], tuple[int, ...]] | None = None
    passed: list[int] = field(default_factory=list)  # tombstones: sequences of erased sessions


def _sealed_kid(data: bytes) -> str | None:
    with contextlib.suppress(ValueError):
        raw = json.loads(data)
        sealed = raw.get("sealed") if isinstance(raw, dict) else None
        kid = sealed.get("kid") if isinstance(sealed, dict) else None
        return kid if isinstance(kid, str) else None
    return None


def first_line(exc: BaseException) -> str:
    """An error's message in one line (its first, at most 300 characters), for a log line."""
    lines = str(exc).strip().splitlines()
    return lines[0][:300] if lines else ""


def describe(exc: BaseException) -> str:
    """``<class>: <first line>`` for a log line, never with an empty message: a timeout raised
    without text (``asyncio.timeout``'s) is ``TimeoutError: timed out``, any other error without
    text ``<class>: no message`` (a retry's line read ``failed (TimeoutError: )``)."""
    text = first_line(exc) or ("timed out" if isinstance(exc, TimeoutError) else "no message")
    return f"{type(exc).__name__}: {text}"


_ROUND: contextvars.ContextVar[int | None] = contextvars.ContextVar("chronicle_projector_round", default=None)
"""The consuming round a task belongs to (:meth:`ProjectorRunner._current`)."""
CANCEL_GRACE_S = 10.0
"""How long :func:`_first_of` waits for a cancelled task to end before it abandons it."""
_abandoned: set[asyncio.Task[None]] = set()  # cancelled, not yet ended: kept referenced until they end


async def _first_of(*coros: Coroutine[Any, Any, None]) -> None:
    """Run ``coros`` together until the first one ends; cancel the others; re-raise its error. A
    cancelled task that has not ended after :data:`CANCEL_GRACE_S` (an await that ignores its
    cancellation) is abandoned with a warning: the caller goes on, never waits on it forever."""
    tasks = [asyncio.create_task(c, name=getattr(c, "__qualname__", None)) for c in coros]
    try:
        done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        for task in done:
            task.result()
    finally:
        for task in tasks:
            task.cancel()
        _, left = await asyncio.wait(tasks, timeout=CANCEL_GRACE_S)
        for task in tasks:
            if task in left:
                log.warning(
                    "task %s did not end %.0fs after its cancellation; abandoned", task.get_name(), CANCEL_GRACE_S
                )
                _abandoned.add(task)
                task.add_done_callback(_abandoned.discard)
            elif not task.cancelled():
                task.exception()  # retrieved (re-raised above for the first one to end)


async def _sleep_or_stop(stop: asyncio.Event, seconds: float) -> None:
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), timeout=seconds)
