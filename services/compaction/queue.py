"""The compaction work queue: requests on a JetStream work-queue stream, taken by FastStream
subscribers in every compactor process through one durable pull consumer.

Request side (:class:`Requests`): the projector's compaction state decides which sessions are due;
each due (session, leaf, estimate) is published once as ``compaction.requested`` to the session's
work subject, with a deterministic id, so the same decision published twice (again after a
restart, or by two projectors of one layout handing over) is one request (the stream's duplicate
window). The stream keeps one request per session (the newest): a backlog never holds a session
twice.

Work side (:func:`subscribe`): any number of compactor processes share the durable consumer
``compaction_queue``; each takes up to ``compactor_concurrency`` requests at once and runs
:meth:`CompactionService.compact` (the same code path as ``POST …/compact``) holding the
session's lease (:mod:`services.compaction.lease`). The stream can hand two processes the same
session at once (a newer request replaces one that is being worked on; a request whose compactor
stopped answering is redelivered while it may still run), so a request whose session is leased
elsewhere waits for the lease (up to ``compact_timeout_s``; its heartbeat keeps it meanwhile),
then weighs what the holder recorded. Acknowledgement is explicit, never FastStream's default
(which would terminate a message whose handler raised):

* done, or nothing to do: ack (the work-queue stream then drops the request); an attempt that
  recorded nothing has recorded ``compaction.skipped`` (see :meth:`CompactionService.compact`);
* no longer due by the committed state (weighed inside the session's lease): ack without work;
* failed: ``compaction.failed`` (id derived from the request's and the attempt's number;
  recorded inside the session's lease and applied before the lease is released, so the requests
  after it weigh it); then, attempts left, nak with the backoff delay of this attempt; after the
  last of ``compaction_attempts``, ack;
* one attempt series per session: a request that finds, inside the lease, a failed attempt of
  the session with attempts left (``series_of``, from the committed state) is that series' next
  attempt, due or not by the state: it naks itself until the failure's backoff delay is over,
  then summarises as the next number. A newer request replaces one being worked on (whose nak
  then redelivers nothing), so without this every newer request (every append) started a series
  of its own: an outage now costs one series per growth step, however many requests;
* attempts are numbered by the series (the state's ``failed_attempt``), not by deliveries: a nak
  to wait out the series' backoff, or a wait for the lease, is no attempt;
* a wait for the lease that runs out (another compaction of the session held it for
  ``compact_timeout_s``) is no failure: nothing is recorded, the series stays where it is, and the
  request naks itself for the first backoff delay, to decide after the holder (usually finding
  nothing due). So is a read model behind the session's log when the attempt begins
  (:class:`ReadModelBehind`; as after an overlay recorded but not yet visible, whose lease is
  released while the state still finds the session due): nothing was summarised;
* ``compact_timeout_s`` bounds an attempt's summary (:meth:`CompactionService.compact`), never
  its publishes: an overlay or a skip the server stored, its ack late, is no failed attempt;
* while a summary runs, a heartbeat (``in_progress``) keeps the request; a compactor that stops
  answering (killed) loses it after the first backoff delay, and another takes it (its attempt
  recorded nothing: the same number is tried again). The consumer's ``max_deliver``
  (:func:`max_deliveries`) bounds a request's deliveries: its last records ``compaction.failed``
  without summarising;
* not a request of its subject's session (a publish ack a tenant had JetStream reflect onto the
  subject, replacing the session's pending request): the session's request is read back from the
  committed state (one read) and worked on as above when the session is due or its failure series
  has attempts left (the request it replaced may be one naked for the series' backoff: the
  garbage waits that out in its place), else acked; on a subject that names no session, rejected
  (:func:`_request_of`). Garbage never loses a session's
  compaction, and costs another tenant one state read.

Overlay ids are deterministic, so a redelivery never records an overlay twice.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from faststream import AckPolicy
from faststream.nats import JStream, NatsBroker, NatsMessage, PullSub
from nats.js import JetStreamContext
from nats.js.api import AckPolicy as ConsumerAckPolicy
from nats.js.api import ConsumerConfig, DeliverPolicy
from pydantic import ValidationError

from events.catalog import CompactionRequested
from events.ids import derived_id
from events.publisher import HDR_MSG_ID
from events.sealing import KeyDestroyed
from events.subjects import SubjectLayout
from services.compaction.lease import LeaseWaitTimedOut
from services.compaction.service import Attempt, CompactionService, ReadModelBehind, Series

log = logging.getLogger("chronicle.compactor")
KIND = "compaction"
Key = tuple[str, str]


def request_id(tenant: str, session: str, leaf: str | None, estimate: int) -> str:
    """The same decision gives the same id: the stream stores it once."""
    return derived_id("compaction-requested", tenant, session, leaf or "", estimate)


@dataclass(frozen=True, slots=True)
class Retry:
    delay_s: float


@dataclass(frozen=True, slots=True)
class GiveUp:
    """Record ``compaction.failed`` and ack: no attempt is left."""


def after_failure(delivery: int, attempts: int, backoff_s: Sequence[float]) -> Retry | GiveUp:
    """What a failed ``delivery`` (1-based) of a request leads to (pure)."""
    if delivery >= attempts:
        return GiveUp()
    return Retry(backoff_s[min(delivery, len(backoff_s)) - 1])


def max_deliveries(attempts: int) -> int:
    """The hard bound on a request's deliveries (the consumer's ``max_deliver``). A delivery is not
    always an attempt: a request naks itself to wait out its series' backoff or a lease another
    compaction held past ``compact_timeout_s``, and a killed compactor's attempt records nothing.
    Attempts are counted by the series (:class:`Series`); this bound only keeps a request from
    being redelivered forever: its last delivery records ``compaction.failed`` without summarising."""
    return 4 * attempts + 1


class DeliveriesExhausted(RuntimeError):
    """JetStream gave a request up: its last allowed delivery went unanswered, its compactor killed
    or hung on it (see :class:`~services.compaction.worker.Compactor`); the error of the
    ``compaction.failed`` recorded for it."""

    def __init__(self, deliveries: int) -> None:
        times = f"{deliveries} deliver{'y' if deliveries == 1 else 'ies'}"
        super().__init__(f"the compactor stopped answering on its last allowed delivery ({times})")


def exhausted_failure_id(request_id: str, stream_seq: int) -> str:
    """The id of the ``compaction.failed`` recorded for a request JetStream gave up: derived from
    the request's id and its work-queue stream sequence, so each hearing of the advisory (a
    duplicate, another compactor) records the same event."""
    return derived_id("compaction-exhausted", request_id, stream_seq)


def series_number(running: Series, attempts: int) -> int:
    """The number of a request's attempt: the next of the session's series while it has attempts
    left, else the first of a new one."""
    return running.failed + 1 if 0 < running.failed < attempts else 1


def consumer_config(layout: SubjectLayout, durable: str, attempts: int, backoff_s: Sequence[float]) -> ConsumerConfig:
    """The one durable every compactor shares. ``backoff`` paces redeliveries of requests whose
    compactor went silent (its first entry is the ack wait a heartbeat renews; the last repeats);
    ``max_deliver``: :func:`max_deliveries`."""
    deliveries = max_deliveries(attempts)
    return ConsumerConfig(
        durable_name=durable,
        ack_policy=ConsumerAckPolicy.EXPLICIT,
        deliver_policy=DeliverPolicy.ALL,
        filter_subject=f"{layout.work_prefix}.{KIND}.>",
        max_deliver=deliveries,
        backoff=list(backoff_s)[:deliveries],
        max_ack_pending=-1,
    )


REQUESTS_ACK_TIMEOUT_S = 10.0
"""The longest :meth:`Requests.publish` waits for the work queue's acks (then it fails, to be tried again)."""


class Requests:
    """Publishes the state's due sessions as ``compaction.requested``, each decision once."""

    def __init__(self, js: JetStreamContext, layout: SubjectLayout) -> None:
        self._js = js
        self._layout = layout
        self._sent: dict[Key, str] = {}  # the last request id published per session
        self.published = 0

    def unsent(self, due: Sequence[CompactionRequested]) -> list[CompactionRequested]:
        """Those of ``due`` not yet published; sessions no longer due are forgotten (a later
        decision for them is new)."""
        keys = {(r.tenant, r.session) for r in due}
        for key in [k for k in self._sent if k not in keys]:
            del self._sent[key]
        return [r for r in due if self._sent.get((r.tenant, r.session)) != r.id]

    async def publish(self, due: Sequence[CompactionRequested]) -> int:
        """Publish what :meth:`unsent` returns (pipelined); the number published."""
        todo = self.unsent(due)
        futures = []
        for req in todo:
            subject = self._layout.work_subject(KIND, req.tenant, req.session)
            futures.append(
                await self._js.publish_async(
                    subject, req.to_json(), headers={HDR_MSG_ID: req.id}, stream=self._layout.work_stream
                )
            )
        # nats-py never settles the future of a publish the stream answers with an error (a full
        # work queue): waiting without a bound would stop the requests for good; the caller tries again
        done, pending = await asyncio.wait(futures, timeout=REQUESTS_ACK_TIMEOUT_S) if futures else (set(), set())
        for future in pending:  # cancelled: its pipeline slot is freed (a never-settled one held it)
            future.cancel()
        if pending:
            raise TimeoutError(f"{len(pending)} compaction request(s) not acknowledged by the work queue")
        for future in done:
            future.result()  # the first error, raised
        for req in todo:
            self._sent[(req.tenant, req.session)] = req.id
        self.published += len(todo)
        return len(todo)


def request(tenant: str, session: str, leaf: str | None, estimate: int, seq: int) -> CompactionRequested:
    return CompactionRequested(
        id=request_id(tenant, session, leaf, estimate),
        tenant=tenant,
        session=session,
        leaf_id=leaf,
        estimate=estimate,
        seq=seq,
    )


@dataclass
class WorkStats:
    compactions: int = 0  # overlays recorded
    nothing: int = 0  # requests settled with nothing to record (or no longer due)
    failures: int = 0  # failed attempts (each retried or, on the last, recorded)
    gave_up: int = 0  # requests whose series' attempts ran out (each failure is recorded)
    busy: int = 0  # waits for a session's lease that ran out, or read models behind (put off, nothing recorded)
    malformed: int = 0  # messages that were no request of their subject's session (see subscribe)
    dropped: int = 0  # of those, rejected unasked (the subject names no session, or no state to ask)
    exhausted: int = 0  # requests JetStream gave up, their last delivery unanswered (see Compactor.watch_exhausted)
    in_flight: int = 0


StillDue = Callable[[CompactionRequested], Awaitable[bool]]
SeriesOf = Callable[[CompactionRequested], Awaitable[Series]]
PendingOf = Callable[[str, str], Awaitable[CompactionRequested | None]]


class SessionLocks:
    """A lock per session, held only while someone holds or awaits it: this process's requests of
    a session wait for each other here, before they open a connection to wait for the lease."""

    def __init__(self) -> None:
        self._locks: dict[Key, tuple[asyncio.Lock, int]] = {}

    @contextlib.asynccontextmanager
    async def hold(self, key: Key) -> AsyncIterator[None]:
        lock, users = self._locks.get(key, (asyncio.Lock(), 0))
        self._locks[key] = (lock, users + 1)
        try:
            async with lock:
                yield
        finally:
            lock, users = self._locks[key]
            if users == 1:
                del self._locks[key]
            else:
                self._locks[key] = (lock, users - 1)


def subscribe(
    broker: NatsBroker,
    layout: SubjectLayout,
    service: CompactionService,
    *,
    durable: str,
    concurrency: int,
    attempts: int,
    backoff_s: Sequence[float],
    still_due: StillDue | None = None,
    series_of: SeriesOf | None = None,
    pending_of: PendingOf | None = None,
    compact_timeout_s: float = 600,
) -> WorkStats:
    """Register the work-queue subscriber on ``broker`` (started by the caller); its counters.

    ``still_due`` lets a request that the committed compaction state has since seen settled
    (compacted by someone, or no longer over its threshold) be acked without work; None: every
    request runs. ``series_of``: the session's attempt series from the committed state, which a
    request continues (see the module); None: each request is a series of its own, its attempts
    numbered by its deliveries. ``pending_of``: the request the committed state holds for a
    session (None when it finds nothing due nor a failure series with attempts left), asked for a
    message that is no request of its subject's session (:func:`_request_of`); None: such a
    message is dropped.
    """
    stats = WorkStats()
    busy = SessionLocks()  # one summary of a session at a time in this process
    beat_s = max(0.1, backoff_s[0] / 3)

    async def heartbeat(msg: NatsMessage) -> None:
        while True:
            await asyncio.sleep(beat_s)
            with contextlib.suppress(Exception):  # a lost connection: the request is redelivered
                await msg.in_progress()

    @broker.subscriber(
        f"{layout.work_prefix}.{KIND}.>",
        stream=JStream(name=layout.work_stream, declare=False),
        durable=durable,
        config=consumer_config(layout, durable, attempts, backoff_s),
        pull_sub=PullSub(batch_size=1, timeout=1.0),
        max_workers=concurrency,
        ack_policy=AckPolicy.MANUAL,
        title="compaction.requested",
        description="Summarise a session that its compactor's state found over compact_after.",
    )
    async def compaction_requested(msg: NatsMessage) -> None:
        delivery = msg.raw_message.metadata.num_delivered
        final = delivery >= max_deliveries(attempts)  # JetStream delivers it no more: it decides now
        req = await _request_of(msg, layout, stats, pending_of, final=final, retry_s=backoff_s[0])
        if req is None:  # settled (dropped, nothing due) or put off
            return
        key = (req.tenant, req.session)
        attempt: Attempt | None = None  # the summary this delivery runs (numbered in the lease)
        failure: Exception | None = None  # the attempt's error
        recorded = False  # its compaction.failed, inside the lease
        wait_s = 0.0
        stats.in_flight += 1
        beat = asyncio.create_task(heartbeat(msg))
        try:
            try:
                async with (
                    busy.hold(key),  # this process's requests of the session wait here, on no connection
                    service.leases.hold(req.tenant, req.session, wait_s=compact_timeout_s),  # other processes'
                    asyncio.timeout(2 * compact_timeout_s) as bound,  # a stuck query never holds it (an attempt: below)
                ):
                    # weighed inside the lease: a request that waited for it sees what the one before
                    # recorded (an overlay, a skip, or a failed attempt that this one continues)
                    running = await series_of(req) if series_of is not None else Series()
                    ongoing = 0 < running.failed < attempts
                    if not ongoing and still_due is not None and not await still_due(req):
                        stats.nothing += 1
                        await msg.ack()
                        return
                    # the series' next attempt, or the first of a new one: numbered by what is recorded,
                    # not by deliveries (a nak to wait, or a wait for the lease, is no attempt)
                    number = series_number(running, attempts) if series_of is not None else delivery
                    if final:  # its attempts died unsettled (killed), or it was put off too often
                        error = RuntimeError(f"delivered {delivery} times without an answer")
                        await _give_up(service, req, Attempt(req.id, number, req.estimate), error)
                        stats.gave_up += 1
                        await msg.ack()
                        return
                    if ongoing:
                        wait_s = series_wait(running, backoff_s, datetime.now(UTC))
                    if wait_s <= 0:
                        attempt = Attempt(req.id, number, req.estimate)
                        # the attempt bounds its summary; its publishes are bounded by their retries, and
                        # never by a timeout (fired after the server stored an overlay or a skip, before
                        # its ack, it would be taken for a failure: another summary)
                        bound.reschedule(None)
                        try:
                            outcome = await service.compact(
                                req.tenant, req.session, attempt=attempt, timeout_s=compact_timeout_s
                            )
                        except (KeyDestroyed, ReadModelBehind):
                            raise
                        except Exception as exc:
                            # recorded inside the lease, as a skip is: a request that waited for this one
                            # continues the series (or, after the last attempt, weighs it as a skip)
                            failure = exc
                            bound.reschedule(asyncio.get_running_loop().time() + compact_timeout_s)
                            await _give_up(service, req, attempt, exc)
                            recorded = True
                            raise
            except KeyDestroyed:  # erased while it waited or summarised: nothing to record, nothing to retry
                stats.nothing += 1
                log.info("%s/%s is erased: nothing to compact", *key)
                await msg.ack()
                return
            except (LeaseWaitTimedOut, ReadModelBehind) as exc:
                stats.busy += 1
                # another compaction of the session outlasted the wait, or the read model is behind the
                # session's log (its state may be too: one just recorded): no attempt ran, nothing is
                # recorded, the series stays where it is; this request decides later (usually: not due)
                why = "another compaction holds it" if isinstance(exc, LeaseWaitTimedOut) else "its read model lags"
                if final:  # JetStream delivers it no more; the holder's compaction settles the session
                    log.error("compaction of %s/%s: delivered %d times, always busy (%s); dropped", *key, delivery, why)
                    await msg.ack()
                else:
                    log.info("compaction of %s/%s: %s; again in %.1fs", *key, why, backoff_s[0])
                    await msg.nack(delay=backoff_s[0])
                return
            except Exception as exc:
                if attempt is None:  # failed before any summary (the database, NATS): no attempt of the series
                    log.warning("compaction of %s/%s could not start (delivery %d): %s", *key, delivery, exc)
                    if final:
                        await msg.ack()  # JetStream delivers it no more; the state asks again on growth
                    else:
                        await msg.nack(delay=backoff_s[0])
                    return
                stats.failures += 1
                match after_failure(attempt.number, attempts, backoff_s):
                    case Retry(delay_s=delay):
                        log.warning(
                            "compaction of %s/%s failed (attempt %d of %d); again in %.1fs: %s",
                            *key, attempt.number, attempts, delay, exc,
                        )  # fmt: skip
                        await msg.nack(delay=delay)
                    case GiveUp():
                        log.error("compaction of %s/%s failed %d times; recorded", *key, attempt.number, exc_info=exc)
                        if not recorded:  # recording it in the lease failed: here
                            with contextlib.suppress(KeyDestroyed):
                                await _give_up(service, req, attempt, failure or exc)
                        stats.gave_up += 1
                        await msg.ack()
                return
            if wait_s > 0:  # the series' backoff is not over: this request is its next attempt, later
                log.info("compaction of %s/%s: attempt %d of %d in %.1fs", *key, number, attempts, wait_s)
                await msg.nack(delay=wait_s)
                return
            if outcome.recorded:
                stats.compactions += 1
                log.info("compacted %s/%s at seq %d", *key, outcome.seq)
            else:
                stats.nothing += 1
                log.info("nothing to compact in %s/%s: %s", *key, outcome.reason)
            await msg.ack()
        finally:
            stats.in_flight -= 1
            beat.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await beat

    return stats


async def _request_of(
    msg: NatsMessage,
    layout: SubjectLayout,
    stats: WorkStats,
    pending_of: PendingOf | None,
    *,
    final: bool,
    retry_s: float,
) -> CompactionRequested | None:
    """The request ``msg`` stands for; None when it is settled here (acked or rejected) or put off.

    A request of its subject's session is itself. Anything else on a session's work subject (a
    tenant can have JetStream publish the ack of its own event there, as the server, where NATS
    permissions cannot stop it; it then replaces the session's pending request, the stream keeping
    one per subject) says only "look at this session again": the subject names the session, so the
    committed state (``pending_of``, one read) is asked what the session's request is. Due, or in
    a failure series with attempts left (the replaced request was naked for the series' backoff),
    it is worked on as that request, the same decision as the one replaced (the same id, so the
    same skip or failure events; a series' next attempt waits out its backoff, as any request of
    the session does); else the message is acked. Garbage costs one state read; a session
    it finds due gets the work it was due anyway. A message on a subject that names no session
    (nor a tenant) is rejected without asking anything."""
    subject = msg.raw_message.subject
    try:
        req = CompactionRequested.model_validate_json(msg.body)
    except ValidationError as exc:
        problem = f"not a compaction request ({exc.error_count()} error(s); {exc.errors()[0]['msg']})"
    else:
        if layout.work_subject(KIND, req.tenant, req.session) == subject:
            return req
        problem = "a request of another session"
    stats.malformed += 1
    try:
        tenant, session = layout.work_session(KIND, subject)
    except ValueError:
        stats.dropped += 1
        log.error(
            "dropping a malformed compaction request on %s: %s, on a subject that names no session", subject, problem
        )
        await msg.reject()  # it would fail the same way every time
        return None
    if pending_of is None:
        stats.dropped += 1
        log.error("dropping a malformed compaction request for %s/%s: %s", tenant, session, problem)
        await msg.reject()
        return None
    try:
        found = await pending_of(tenant, session)
    except Exception as exc:  # the database: the session is looked at again later
        log.warning("a malformed compaction request for %s/%s: its state could not be read: %s", tenant, session, exc)
        if final:
            await msg.ack()  # JetStream delivers it no more; the state asks again on growth
        else:
            await msg.nack(delay=retry_s)
        return None
    if found is None:
        stats.nothing += 1
        log.warning(
            "a malformed compaction request for %s/%s (%s): nothing is due there; dropped", tenant, session, problem
        )
        await msg.ack()
        return None
    log.warning(
        "a malformed compaction request for %s/%s (%s): the session is due (or its series goes on); "
        "its request is worked on",
        tenant,
        session,
        problem,
    )
    return found


def series_wait(running: Series, backoff_s: Sequence[float], now: datetime) -> float:
    """Seconds until the series' next attempt is due (its last failure's backoff delay); 0 within
    a tenth of the delay, which the clocks of two compactors may differ by (a request that naked
    itself for the delay is not sent to wait once more)."""
    if running.at is None:
        return 0.0
    delay = backoff_s[min(running.failed, len(backoff_s)) - 1]
    left = (running.at + timedelta(seconds=delay) - now).total_seconds()
    return left if left > delay / 10 else 0.0


async def _give_up(service: CompactionService, req: CompactionRequested, attempt: Attempt, exc: BaseException) -> None:
    """Record the attempt's ``compaction.failed``; :class:`KeyDestroyed` when the session is erased
    (nothing recorded)."""
    if await service.record_failure(req.tenant, req.session, req.leaf_id, exc, attempt) is None:
        raise KeyDestroyed(req.tenant, req.session)
