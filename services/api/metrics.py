"""Prometheus metrics and readiness: events published, applied (checkpoints), projection lag,
quarantined events, which backends answer; readiness that tells the truth (:func:`assess` is its
pure core). Each backend is probed on its own, concurrently, each within :data:`PROBE_TIMEOUT_S`:
one that is down makes only its own flag false, and neither ``/metrics`` nor ``/readyz`` waits
longer than a probe for it."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Coroutine, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, TypeVar

import nats.errors
import psycopg
from nats.js.api import ConsumerInfo, StreamInfo
from nats.js.errors import NotFoundError
from prometheus_client import CollectorRegistry, Counter, Gauge

from events.envelope import Event
from events.stream import too_few_replicas
from projections.runner import checkpoint_partition
from services.api import round_trip
from services.audit import quarantine
from services.audit.readers import log_mismatch
from services.bootstrap import Container
from services.compaction import presence
from services.compaction.queue import KIND

REGISTRY = CollectorRegistry()
PUBLISHED = Counter(
    "chronicle_events_published_total",
    "Events this API process had stored in the log (a publish ack that is not a duplicate), by type",
    ["type"],
    registry=REGISTRY,
)
APPLIED = Gauge(
    "chronicle_events_applied", "Highest stream sequence applied, per projector", ["projector"], registry=REGISTRY
)
STREAM_LAST = Gauge("chronicle_stream_last_seq", "Last sequence in the event stream", registry=REGISTRY)
OVERLAYS = Gauge("chronicle_compactions_recorded", "Summary overlays recorded (all sessions)", registry=REGISTRY)
COMPACTION_FAILURES = Gauge(
    "chronicle_compaction_failures", "Summarizer failures recorded as compaction.failed events", registry=REGISTRY
)
LAG = Gauge(
    "chronicle_projection_lag", "Events in the stream not yet applied, per projector", ["projector"], registry=REGISTRY
)
QUARANTINED = Counter(
    "chronicle_quarantined_events",
    "Stored events no projection applies (the quarantine table), by reason",
    ["reason"],
    registry=REGISTRY,
)
HOT_PATHS = Counter(
    "chronicle_api_hot_path_requests_total",
    "Appends and history reads the hot paths looked at: served there, or handed on to the routes",
    ["route", "outcome"],
    registry=REGISTRY,
)
RATE_LIMITED = Counter(
    "chronicle_rate_limited_requests_total",
    "Requests refused because their tenant was over its limit (CHRONICLE_RATE_LIMIT), by transport",
    ["transport"],
    registry=REGISTRY,
)
BACKEND_UP = Gauge(
    "chronicle_backend_up",
    "Whether the backend answered this process's last probe (1) or not (0): postgres, nats, stream",
    ["backend"],
    registry=REGISTRY,
)
REFRESH_AGE = Gauge(
    "chronicle_metrics_refresh_age_seconds",
    "Seconds since the values read from this backend were last refreshed (0: at this scrape); "
    "while it is down, its values are the last known ones",
    ["backend"],
    registry=REGISTRY,
)
COMPACTION_WAITING = Gauge(
    "chronicle_compaction_requests_waiting",
    "Compaction requests on the work queue no compactor has taken yet (or given back: redeliveries)",
    registry=REGISTRY,
)
COMPACTION_IN_PROGRESS = Gauge(
    "chronicle_compaction_requests_in_progress",
    "Compaction requests a compactor has taken and not yet finished (delivered, not acknowledged)",
    registry=REGISTRY,
)
COMPACTORS = Gauge(
    "chronicle_compactors_present",
    "Compactor processes running against this database (each holds its presence lock while it runs)",
    registry=REGISTRY,
)
COMPACTOR_PULLS = Gauge(
    "chronicle_compactor_pulls_waiting",
    "Pull requests idle compactors hold open on the work queue at this scrape (a busy compactor holds none)",
    registry=REGISTRY,
)
COMPACTION_OLDEST_WAIT = Gauge(
    "chronicle_compaction_oldest_wait_seconds",
    "Seconds the oldest compaction request on the work queue has waited (not yet taken, or taken and not "
    "finished), 0 when none waits",
    registry=REGISTRY,
)
COMMANDS_UP = Gauge(
    "chronicle_commands_up",
    "Whether a `chronicle commands` answered this process's last ping (1) or not (0: none runs, or it hangs), "
    "by command prefix; absent where CHRONICLE_READINESS_COMMANDS is false",
    ["prefix"],
    registry=REGISTRY,
)
SOURCES_MISSING = Counter(
    "chronicle_context_sources_missing_total",
    "Context reads and prompt renders refused because a read-only block's object is missing (409 source_missing)",
    registry=REGISTRY,
)
OBJECT_STORAGE_FAILED = Counter(
    "chronicle_object_storage_failures",
    "Requests answered 503 object_storage: S3/MinIO could not be used (skills, read-only sources, originals)",
    registry=REGISTRY,
)
WRITE_TURNS = Gauge(
    "chronicle_session_write_turns",
    "Sessions with a write of this API process holding or waiting for their turn (services/writes/turns.py)",
    registry=REGISTRY,
)
WRITES_WAITING = Gauge(
    "chronicle_session_writes_waiting",
    "Writes of this API process waiting for their turn behind another write to the same session",
    registry=REGISTRY,
)
_counted_upto: dict[str, int] = {}
"""Per database and stream (:attr:`Recorded.source`), the sequence up to which QUARANTINED holds
the quarantined events: rows are deleted (an erasure forgets its session's), so the counter
follows rows recorded past a mark, never the table's size."""

PROBE_TIMEOUT_S = 2.0
"""The longest one backend's probe may take (readiness and metrics answer within about this)."""
BACKENDS = ("postgres", "nats", "stream")
_refreshed: dict[str, float] = {}  # backend -> monotonic time its values were last read

READINESS_STALL_S = 60.0
READINESS_MAX_LAG = 100_000


def published(event: Event) -> None:
    """Count an event the log stored for this process (the API's publisher calls it once per
    event stored, never for a duplicate: :attr:`events.publisher.Publisher.on_stored`)."""
    PUBLISHED.labels(event.type).inc()


@dataclass(frozen=True, slots=True)
class Recorded:
    """The quarantined events with a sequence in ``(after, upto]``, by reason: ``upto`` is the
    lowest checkpoint serving reads, past which no projector records a refusal any more (each
    records at most up to its own checkpoint, in the transaction that moves it)."""

    source: str
    after: int
    upto: int
    by_reason: dict[str, int]


def count_quarantined(recorded: Recorded) -> None:
    """Count the events quarantined since the last count (every one once, whatever was deleted
    since: an erasure deletes its session's rows); a count read from an older mark (another
    refresh counted meanwhile) is dropped."""
    if _counted_upto.get(recorded.source, 0) != recorded.after or recorded.upto <= recorded.after:
        return
    for reason, n in recorded.by_reason.items():
        QUARANTINED.labels(reason).inc(n)
    _counted_upto[recorded.source] = recorded.upto


@dataclass(frozen=True, slots=True)
class Snapshot:
    """What readiness and the metrics are computed from, read once."""

    last_seq: int
    checkpoints: dict[str, tuple[int, datetime]]  # name -> (seq, updated_at)
    now: datetime
    quarantined: dict[str, int]


@dataclass(frozen=True, slots=True)
class Tables:
    """What Postgres says: checkpoints, its clock, quarantine counts, overlays and failures."""

    checkpoints: dict[str, tuple[int, datetime]]
    now: datetime
    quarantined: dict[str, int]
    overlays: int
    failures: int
    compactors: int = 0  # compactors holding their presence (services/compaction/presence.py)
    recorded: Recorded | None = None  # quarantined since this process last counted


@dataclass(frozen=True, slots=True)
class WorkQueue:
    """The compactors' shared consumer of the work queue as JetStream reports it."""

    waiting: int  # requests not yet delivered (a redelivery waits again)
    in_progress: int  # delivered and not yet acknowledged: a compactor is on them
    pulls_waiting: int  # pull requests open: an idle compactor holds one most of the time
    oldest_at: datetime | None = None  # when the oldest request that waits was stored (None: none waits)
    active_at: datetime | None = None  # the consumer's last delivery or acknowledgement (None: none yet)
    at: datetime | None = None  # the server's time when it answered (None: not reported); the times above are its


@dataclass(frozen=True, slots=True)
class Probe:
    """Each backend's answer or the error it gave (a timeout included), asked independently."""

    nats: bool  # connected, and the server answered a PING (:func:`services.api.round_trip.answers`)
    last_seq: int | BaseException  # the stream's last sequence
    tables: Tables | BaseException
    work: WorkQueue | BaseException | None = None  # None: not asked
    nats_failure: BaseException | None = None  # why ``nats`` is false
    replicas: int | None = None  # the stream's replica count (None: the stream did not answer)
    commands: BaseException | bool | None = None  # True: a commands service answered; its failure; None: not asked

    def snapshot(self) -> Snapshot | None:
        if isinstance(self.last_seq, BaseException) or isinstance(self.tables, BaseException):
            return None
        t = self.tables
        return Snapshot(self.last_seq, t.checkpoints, t.now, t.quarantined)


async def read_tables(c: Container) -> Tables:
    async with c.pool.connection(timeout=PROBE_TIMEOUT_S) as conn:
        cur = await conn.execute("SELECT name, seq, updated_at FROM checkpoints")
        rows = await cur.fetchall()
        cur = await conn.execute(
            "SELECT (SELECT count(*) FROM overlays), (SELECT count(*) FROM compaction_failures), now()"
        )
        row = await cur.fetchone()
        by_reason = await quarantine.counts(conn)
        compactors = await presence.present(conn)
        checkpoints = {str(n): (int(s), at) for n, s, at in rows}
        serving = projector_checkpoints(checkpoints, c.settings.projector_name, c.settings.partitions)
        source = f"{c.settings.database_url} {c.settings.stream}"
        after = _counted_upto.get(source, 0)
        upto = min((seq for seq, _ in serving.values()), default=0)
        new = await quarantine.counts_between(conn, after, upto) if upto > after else {}
    assert row is not None
    recorded = Recorded(source, after, upto, new)
    return Tables(checkpoints, row[2], by_reason, int(row[0]), int(row[1]), compactors, recorded)


T = TypeVar("T")
_abandoned: set[asyncio.Task[Any]] = set()  # probes past their bound, ending in the background


async def bounded(work: Coroutine[Any, Any, T], timeout_s: float) -> T:
    """``work``'s result within ``timeout_s``, else :class:`TimeoutError` at once. Work past the
    bound is cancelled and left to end in the background, not awaited: psycopg's cancellation of
    a query asks the server, which may be the very one not answering (it then takes many seconds)."""
    task = asyncio.ensure_future(work)
    try:
        done, _ = await asyncio.wait({task}, timeout=timeout_s)
    except asyncio.CancelledError:
        task.cancel()
        raise
    if task in done:
        return task.result()
    task.cancel()
    _abandoned.add(task)
    task.add_done_callback(_reap)
    raise TimeoutError


def _reap(task: asyncio.Task[Any]) -> None:
    _abandoned.discard(task)
    if not task.cancelled():
        task.exception()  # retrieved: an abandoned probe's error was already reported as a timeout


async def _stream_state(c: Container) -> tuple[int, int]:
    """The stream's last sequence and its replica count."""
    if not c.nc.is_connected:  # reconnecting: asking JetStream would only wait for the timeout
        raise ConnectionError("NATS is not connected")
    info = await c.js.stream_info(c.layout.stream)
    return int(info.state.last_seq), int(info.config.num_replicas or 1)


async def _jetstream_info(c: Container, api: str) -> tuple[dict[str, Any], datetime | None]:
    """JetStream's answer to the info request ``api`` (``CONSUMER.INFO.<stream>.<name>``, say) and
    the server's time when it answered (its ``ts``; None from a server that reports none). nats-py's
    info classes drop ``ts``, so its request is made here as nats-py makes it (the API prefix of the
    context's JetStream domain; an error answer raised as its error, a missing one as
    :class:`NotFoundError`)."""
    resp: dict[str, Any] = await c.js._api_request(f"{c.js._prefix}.{api}", b"", timeout=PROBE_TIMEOUT_S)
    ts = resp.get("ts")
    return resp, datetime.fromisoformat(ts) if isinstance(ts, str) and ts else None


async def oldest_request(c: Container, from_seq: int = 1) -> datetime | None:
    """When the first compaction request at or after stream sequence ``from_seq`` on the work queue
    was stored (None: none is). An acknowledged request leaves a work-queue stream, so what remains
    is in order of age: one look-up (the first at or after ``from_seq`` on the compaction
    subjects), however long the queue."""
    try:
        msg = await c.js.get_msg(c.layout.work_stream, from_seq, subject=f"{c.layout.work_prefix}.{KIND}.>", next=True)
    except NotFoundError:  # no message (or no stream yet)
        return None
    return msg.time


def first_live_seq(*, delivered_seq: int, ack_floor_seq: int, ack_pending: int) -> int:
    """The first stream sequence the oldest request that waits (to be delivered, or to be finished)
    can have (pure). JetStream delivers a request no more once the consumer's ``max_deliver``
    deliveries went unacknowledged (a compactor killed on the last), and the work-queue stream keeps
    it: no longer pending, nor waiting for an ack, nor below the ack floor. With no request waiting
    for an ack, every delivered one still on the stream is such a one, so the oldest that waits is
    after the last delivered; else it may be any after the ack floor (one in progress)."""
    return (ack_floor_seq if ack_pending else delivered_seq) + 1


def _last_active(*seqs: Any) -> datetime | None:
    times = [s.last_active for s in seqs if s is not None and s.last_active is not None]
    return max(times, default=None)


async def work_queue(c: Container) -> WorkQueue:
    """The compactors' consumer, then the oldest request that waits (:func:`first_live_seq`), with
    the server's time of the answer (:func:`oldest_wait` measures on its clock); before any
    compactor made the consumer, every request on the queue waits."""
    if not c.nc.is_connected:
        raise ConnectionError("NATS is not connected")
    stream = c.layout.work_stream
    try:
        resp, at = await _jetstream_info(c, f"CONSUMER.INFO.{stream}.{c.settings.compaction_queue}")
    except NotFoundError:
        try:
            resp, at = await _jetstream_info(c, f"STREAM.INFO.{stream}")
        except NotFoundError:
            return WorkQueue(0, 0, 0)
        return WorkQueue(int(StreamInfo.from_response(resp).state.messages), 0, 0, await oldest_request(c), at=at)
    info = ConsumerInfo.from_response(resp)
    pending, ack_pending = int(info.num_pending or 0), int(info.num_ack_pending or 0)
    start = first_live_seq(
        delivered_seq=int(info.delivered.stream_seq if info.delivered else 0),
        ack_floor_seq=int(info.ack_floor.stream_seq if info.ack_floor else 0),
        ack_pending=ack_pending,
    )
    oldest = await oldest_request(c, start) if pending or ack_pending else None
    return WorkQueue(
        pending, ack_pending, int(info.num_waiting or 0), oldest, _last_active(info.delivered, info.ack_floor), at
    )


async def commands_answer(c: Container, timeout_s: float) -> None:
    """Return once a ``chronicle commands`` answers the operator's ping
    (:attr:`events.subjects.SubjectLayout.commands_ping`); :class:`nats.errors.NoRespondersError`
    when none listens, :class:`TimeoutError` when none answers within ``timeout_s``."""
    if not c.nc.is_connected:
        raise ConnectionError("NATS is not connected")
    try:
        await c.nc.request(c.layout.commands_ping, b"", timeout=timeout_s)
    except nats.errors.TimeoutError as exc:
        raise TimeoutError from exc


async def probe(c: Container, *, work: bool = False, commands: bool = False) -> Probe:
    """Ask NATS (a PING: :func:`services.api.round_trip.answers`), the stream (its last sequence
    and replica count) and Postgres (and, with ``work``, the compaction work queue; with
    ``commands``, a commands service: :func:`commands_answer`), concurrently, each within
    :data:`PROBE_TIMEOUT_S`; a failure is kept in its own slot, never raised."""
    pong, stream, tables, queue, answered = await asyncio.gather(
        round_trip.answers(c.nc, PROBE_TIMEOUT_S),
        bounded(_stream_state(c), PROBE_TIMEOUT_S),
        bounded(read_tables(c), PROBE_TIMEOUT_S),
        bounded(work_queue(c), PROBE_TIMEOUT_S) if work else asyncio.sleep(0),
        bounded(commands_answer(c, PROBE_TIMEOUT_S), PROBE_TIMEOUT_S + 0.5) if commands else asyncio.sleep(0, None),
        return_exceptions=True,
    )
    last, replicas = (stream, None) if isinstance(stream, BaseException) else stream
    failure = pong if isinstance(pong, BaseException) else None
    asked = (answered if isinstance(answered, BaseException) else True) if commands else None
    return Probe(failure is None, last, tables, queue if work else None, failure, replicas, asked)


async def refresh(c: Container, *, work: bool = False) -> Probe:
    """Probe the backends and export what answered; a backend that did not keeps its last known
    values (its ``chronicle_metrics_refresh_age_seconds`` grows) and ``chronicle_backend_up`` 0.
    A commands service is asked too unless ``readiness_commands`` is false. Never raises for a
    backend's failure."""
    found = await probe(c, work=work, commands=c.settings.readiness_commands)
    export(found, c.settings.projector_name, c.settings.partitions)
    if found.commands is not None:
        COMMANDS_UP.labels(c.layout.commands).set(1 if found.commands is True else 0)
    turns = c.commands.optimistic.turns
    WRITE_TURNS.set(len(turns))
    WRITES_WAITING.set(turns.waiting)
    return found


def _answers(tables: Tables | BaseException) -> bool:
    """Whether Postgres answered the probe (a database without Chronicle's tables answers)."""
    return not isinstance(tables, BaseException) or isinstance(tables, psycopg.errors.UndefinedTable)


def export(found: Probe, projector: str, partitions: int, now: float | None = None) -> dict[str, int]:
    """Set the gauges from ``found`` (the lags per projector when both stream and Postgres answered)."""
    now = time.monotonic() if now is None else now
    up = {
        "nats": found.nats,
        "stream": not isinstance(found.last_seq, BaseException),
        "postgres": _answers(found.tables),
    }
    if not isinstance(found.last_seq, BaseException):
        STREAM_LAST.set(found.last_seq)
        _refreshed["stream"] = now
    if not isinstance(found.tables, BaseException):
        OVERLAYS.set(found.tables.overlays)
        COMPACTION_FAILURES.set(found.tables.failures)
        COMPACTORS.set(found.tables.compactors)
        if found.tables.recorded is not None:
            count_quarantined(found.tables.recorded)
        _refreshed["postgres"] = now
    if found.nats:
        _refreshed["nats"] = now
    if isinstance(found.work, WorkQueue):
        COMPACTION_WAITING.set(found.work.waiting)
        COMPACTION_IN_PROGRESS.set(found.work.in_progress)
        COMPACTOR_PULLS.set(found.work.pulls_waiting)
        COMPACTION_OLDEST_WAIT.set(round(oldest_wait(found.work, datetime.now(UTC)), 3))
    for backend in BACKENDS:
        BACKEND_UP.labels(backend).set(1 if up[backend] else 0)
        if backend in _refreshed:
            REFRESH_AGE.labels(backend).set(round(now - _refreshed[backend], 3))
    snap = found.snapshot()
    return {} if snap is None else export_lags(snap, projector, partitions)


_exported: set[str] = set()  # the checkpoints whose gauges this process last set


def export_lags(snap: Snapshot, projector: str, partitions: int) -> dict[str, int]:
    """The lag of each checkpoint that serves reads (:func:`projector_checkpoints`), set on the
    gauges; a checkpoint that no longer serves (the single projector's after a switch to
    partition workers, which nothing moves again) loses its series instead of a lag that grows."""
    lags: dict[str, int] = {}
    for name, (seq, _) in projector_checkpoints(snap.checkpoints, projector, partitions).items():
        APPLIED.labels(name).set(seq)
        lags[name] = max(0, snap.last_seq - seq)
        LAG.labels(name).set(lags[name])
    for name in _exported - lags.keys():
        APPLIED.remove(name)
        LAG.remove(name)
    _exported.clear()
    _exported.update(lags)
    return lags


def projector_checkpoints(
    checkpoints: Mapping[str, tuple[int, datetime]], projector: str, partitions: int
) -> dict[str, tuple[int, datetime]]:
    """The checkpoints that serve reads now: every partition's when all report, else the single
    projector's (with the partitions' that report), as the read-your-writes waiter counts them."""
    parts = {n: v for n, v in checkpoints.items() if checkpoint_partition(projector, n) is not None}
    if len(parts) == partitions or projector not in checkpoints:
        return parts
    return {projector: checkpoints[projector], **parts}


def suspects(snap: Snapshot, projector: str, partitions: int, *, stall_s: float) -> dict[str, int]:
    """The checkpoints whose own clock alone would call them stalled (events wait past them and
    they have not moved for ``stall_s``), each with the first sequence waiting past it: only for
    these does it matter when that event was stored (:func:`assess`'s ``waiting_since``)."""
    points = projector_checkpoints(snap.checkpoints, projector, partitions)
    return {
        name: seq + 1
        for name, (seq, at) in points.items()
        if seq < snap.last_seq and (snap.now - at).total_seconds() > stall_s
    }


def assess(
    snap: Snapshot,
    projector: str,
    partitions: int,
    *,
    stall_s: float,
    max_lag: int,
    unapplied_since: datetime | None = None,
    waiting_since: Mapping[str, datetime] | None = None,
) -> tuple[list[str], int | None]:
    """Why the projection is not ready (empty: it is), and its lag (the stream's last sequence
    minus the lowest projector checkpoint). A consumer has stalled when events wait past its
    checkpoint and it has made no progress for ``stall_s`` seconds while they did: the clock runs
    from the later of the checkpoint's last move and ``waiting_since[name]`` (when the first
    event past the checkpoint was stored), so a projector that was quiet for an hour is not
    stalled the moment an event arrives. Without ``waiting_since`` for a name, the clock runs from
    the checkpoint's last move. Before any projector checkpoint
    exists, events that have waited since ``unapplied_since`` (when readiness first saw them
    unapplied) for ``stall_s`` are a stall too: a projector that never starts is not ready; with
    no such time, nothing can be said yet (lag None). Quarantined events are never a reason."""
    points = projector_checkpoints(snap.checkpoints, projector, partitions)
    if not points:
        if not snap.last_seq or unapplied_since is None:
            return [], None
        reasons = []
        idle = (snap.now - unapplied_since).total_seconds()
        if idle > stall_s:
            reasons.append(
                f"projector {projector} has applied nothing for {idle:.0f}s with {snap.last_seq} events waiting"
            )
        if snap.last_seq > max_lag:
            reasons.append(f"projection lag {snap.last_seq} is past the threshold {max_lag}")
        return reasons, snap.last_seq
    reasons = []
    waiting = waiting_since or {}
    for name, (seq, at) in sorted(points.items()):
        since = max(at, waiting.get(name, at))
        idle = (snap.now - since).total_seconds()
        if seq < snap.last_seq and idle > stall_s:
            reasons.append(
                f"consumer {name} has not advanced for {idle:.0f}s with {snap.last_seq - seq} events waiting"
            )
    lag = max(0, snap.last_seq - min(seq for seq, _ in points.values()))
    if lag > max_lag:
        reasons.append(f"projection lag {lag} is past the threshold {max_lag}")
    return reasons, lag


async def stored_at(c: Container, seq: int) -> datetime:
    """When the stream stored its first event at or after ``seq``."""
    msg = await c.js.get_msg(c.layout.stream, seq, subject=c.layout.wildcard, next=True)
    if msg.time is None:
        raise LookupError(f"the stream gave no time for sequence {seq}")
    return msg.time


async def waiting_since(c: Container, first_waiting: Mapping[str, int]) -> dict[str, datetime]:
    """For each checkpoint, when its first waiting event was stored (each sequence asked once,
    within :data:`PROBE_TIMEOUT_S`); one not answered is left out (its checkpoint's clock decides)."""
    seqs = sorted(set(first_waiting.values()))
    found = await asyncio.gather(*(bounded(stored_at(c, s), PROBE_TIMEOUT_S) for s in seqs), return_exceptions=True)
    times = {s: t for s, t in zip(seqs, found, strict=True) if isinstance(t, datetime)}
    return {name: times[s] for name, s in first_waiting.items() if s in times}


def replica_reasons(stream: str, replicas: int, setting: int) -> list[str]:
    """Why the stream's replica count makes the process unready: fewer than it is set to (moved
    by ``chronicle stream-replicas`` while it ran; every process refuses that at start)."""
    return [too_few_replicas(stream, replicas, setting)] if replicas < setting else []


def compactor_reasons(compactors: int, *, required: bool) -> list[str]:
    """Why the compactors make the deployment unready: none runs while one is ``required``."""
    if compactors or not required:
        return []
    return [
        "no compactor is running (none holds its presence in Postgres): compaction requests wait; "
        "start `chronicle compactor`, or set CHRONICLE_READINESS_COMPACTOR=false where none runs on purpose"
    ]


def oldest_wait(queue: WorkQueue, now: datetime) -> float:
    """Seconds the oldest request that waits has waited (0: none waits), on the NATS server's clock
    (its store time against its time when it answered, :attr:`WorkQueue.at`): an API host whose
    clock is off neither makes up a wait nor hides one. ``now`` (this host's clock) only where the
    server reported no time."""
    return 0.0 if queue.oldest_at is None else max(0.0, (_server_now(queue, now) - queue.oldest_at).total_seconds())


def _server_now(queue: WorkQueue, now: datetime) -> datetime:
    return now if queue.at is None else queue.at


def compaction_wait_reasons(queue: WorkQueue, now: datetime, *, bound_s: float) -> list[str]:
    """Why the work queue makes the deployment unready: its oldest request has waited past
    ``bound_s`` (0: never) while no compactor took or finished one for as long (the consumer's last
    delivery or acknowledgement) and none asks for one (no pull request open). A compactor that
    hangs (stopped, wedged) keeps its presence but does all three no more; a busy one with a
    backlog delivers and acknowledges, and an idle one holds a pull open, as it does while a
    request waits out its retry delay on purpose (a failed summary's backoff)."""
    if not bound_s or queue.oldest_at is None or queue.pulls_waiting:
        return []
    waited = oldest_wait(queue, now)
    since = None if queue.active_at is None else (_server_now(queue, now) - queue.active_at).total_seconds()
    idle = waited if since is None else min(waited, max(0.0, since))
    if idle <= bound_s:
        return []
    return [
        f"the oldest compaction request has waited {waited:.0f}s and no compactor has taken, finished or "
        f"asked for one for {idle:.0f}s (past {bound_s:g}s): a compactor holds its presence but does not "
        "work (hung or overloaded); restart the `chronicle compactor` processes"
    ]


def commands_reasons(answer: BaseException | bool | None) -> list[str]:
    """Why the commands service makes the deployment unready (``answer``: :attr:`Probe.commands`)."""
    if not isinstance(answer, BaseException):
        return []
    if isinstance(answer, nats.errors.NoRespondersError):
        return [
            "no commands service is running (nothing listens for the commands over NATS): start `chronicle "
            "commands`, or set CHRONICLE_READINESS_COMMANDS=false where none runs on purpose"
        ]
    if isinstance(answer, TimeoutError):
        return [
            f"the commands service does not answer (hung or overloaded): no answer to a ping within "
            f"{PROBE_TIMEOUT_S:g}s, so commands over NATS time out; restart the `chronicle commands` processes"
        ]
    return [f"the commands service could not be asked: {_failure(answer)}"]


_first_unapplied: dict[str, datetime] = {}  # projector -> when readiness first saw events and no checkpoint


def _unapplied_since(snap: Snapshot, projector: str, partitions: int) -> datetime | None:
    """Since when this process has seen events in the stream and no checkpoint of ``projector``."""
    if snap.last_seq and not projector_checkpoints(snap.checkpoints, projector, partitions):
        return _first_unapplied.setdefault(projector, snap.now)
    _first_unapplied.pop(projector, None)
    return None


def _failure(exc: BaseException) -> str:
    if isinstance(exc, TimeoutError):
        return f"no answer within {PROBE_TIMEOUT_S:g}s"
    return f"{type(exc).__name__}: {exc}".rstrip(": ")


def _postgres_failure(exc: BaseException) -> str:
    """Why the tables were not read: a database that answers without Chronicle's tables (created
    again, or never migrated) is not a Postgres that does not answer."""
    if isinstance(exc, psycopg.errors.UndefinedTable):
        return (
            f"Postgres answers, but the database holds no Chronicle tables (run `chronicle migrate`): {_failure(exc)}"
        )
    return f"Postgres does not answer: {_failure(exc)}"


async def readiness(c: Container, *, stall_s: float | None = None, max_lag: int | None = None) -> dict[str, Any]:
    """``ready`` is false, with ``reasons``, when NATS or Postgres does not answer, no compactor
    runs (``compactor``: false; unless the setting ``readiness_compactor`` is false), compactors
    run but the oldest compaction request has waited past ``readiness_compaction_wait_s`` while
    none works (:func:`compaction_wait_reasons`; ``compaction_oldest_wait_s``), no commands
    service answers the operator's ping (``commands``: false; unless ``readiness_commands`` is
    false: :func:`commands_reasons`), the stream is
    missing or is not the log the read models were made from (``log``: :func:`services.audit.readers.log_mismatch`), a
    projector consumer has stalled while events wait, or the lag passes the threshold
    (``stall_s``/``max_lag``, by default the settings ``readiness_stall_s``/``readiness_max_lag``).
    ``quarantined`` (counts by reason) is reported and never makes it unready.

    ``nats``, ``stream`` and ``postgres`` are each their own component's answer (:func:`probe`:
    concurrent, each bounded), so with Postgres down ``nats`` and ``stream`` stay true; ``log`` and
    the lag need both the stream and Postgres."""
    s = c.settings
    found = await refresh(c, work=s.readiness_compactor and s.readiness_compaction_wait_s > 0)
    out: dict[str, Any] = {
        "nats": found.nats,
        "postgres": _answers(found.tables),
        "stream": not isinstance(found.last_seq, BaseException),
        "stream_replicas": None,
        "log": False,
        "compactor": None,
        "compaction_oldest_wait_s": None,
        "commands": None if found.commands is None else found.commands is True,
        "lag": None,
        "quarantined": {},
    }
    reasons: list[str] = []
    if not c.nc.is_connected:
        reasons.append("NATS is not connected")
    elif not found.nats:
        reasons.append(f"NATS does not answer: {_failure(found.nats_failure or TimeoutError())}")
    elif isinstance(found.last_seq, NotFoundError):
        reasons.append(f"stream {c.layout.stream} is missing")
    elif isinstance(found.last_seq, BaseException):
        reasons.append(f"stream {c.layout.stream} does not answer: {_failure(found.last_seq)}")
    elif found.replicas is not None:
        out["stream_replicas"] = found.replicas
        reasons.extend(replica_reasons(c.layout.stream, found.replicas, c.settings.stream_replicas))
    if isinstance(found.tables, BaseException):
        reasons.append(_postgres_failure(found.tables))
    else:
        out["quarantined"] = found.tables.quarantined
        out["compactor"] = found.tables.compactors > 0
        reasons.extend(compactor_reasons(found.tables.compactors, required=c.settings.readiness_compactor))
    if isinstance(found.work, WorkQueue):
        now = datetime.now(UTC)
        out["compaction_oldest_wait_s"] = round(oldest_wait(found.work, now), 1)
        if isinstance(found.tables, BaseException) or found.tables.compactors:  # none at all: said above
            reasons.extend(compaction_wait_reasons(found.work, now, bound_s=s.readiness_compaction_wait_s))
    elif isinstance(found.work, BaseException) and found.nats:
        reasons.append(f"the compaction work queue does not answer: {_failure(found.work)}")
    if found.nats:  # else NATS is the reason, and no commands service could answer
        reasons.extend(commands_reasons(found.commands))
    snap = found.snapshot()
    if snap is not None:
        out["lag"] = export_lags(snap, s.projector_name, s.partitions)
        if stall_s is None:
            stall_s = float(getattr(s, "readiness_stall_s", READINESS_STALL_S))
        if max_lag is None:
            max_lag = int(getattr(s, "readiness_max_lag", READINESS_MAX_LAG))
        since = _unapplied_since(snap, s.projector_name, s.partitions)
        waits = await waiting_since(c, suspects(snap, s.projector_name, s.partitions, stall_s=stall_s))
        found_reasons, out["projection_lag"] = assess(
            snap,
            s.projector_name,
            s.partitions,
            stall_s=stall_s,
            max_lag=max_lag,
            unapplied_since=since,
            waiting_since=waits,
        )
        reasons.extend(found_reasons)
        try:
            mismatch = await bounded(log_mismatch(c), PROBE_TIMEOUT_S)
        except Exception as exc:  # readiness reports, it does not raise
            reasons.append(f"the log binding could not be checked: {_failure(exc)}")
        else:
            out["log"] = mismatch is None
            if mismatch is not None:
                reasons.append(f"the read models belong to another log: {mismatch.detail}")
    out["reasons"] = reasons
    out["ready"] = not reasons
    return out
