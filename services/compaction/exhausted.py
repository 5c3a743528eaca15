"""The requests JetStream gives up on the compaction work queue, settled.

JetStream gives a request up when its last allowed delivery goes unanswered (the compactor on it
died or hung) and says so in a ``MAX_DELIVERIES`` advisory of the work consumer; it keeps the
request on the work-queue stream, unacknowledged, until it expires. The compactor that hears the
advisory (:class:`GivenUp`, watched by :class:`~services.compaction.worker.Compactor`) records it
as the session's ``compaction.failed`` inside the session's lease, as the work queue records a
failed attempt, and deletes it; one whose work was done before it was given up (no longer due) is
deleted with nothing recorded.
"""

from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import dataclass

from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.js import JetStreamContext
from nats.js.errors import APIError, NotFoundError
from pydantic import ValidationError

from events.catalog import CompactionRequested
from events.subjects import SubjectLayout
from services.compaction.lease import LeaseWaitTimedOut
from services.compaction.queue import (
    KIND,
    DeliveriesExhausted,
    SeriesOf,
    StillDue,
    WorkStats,
    exhausted_failure_id,
    series_number,
)
from services.compaction.service import Attempt, CompactionService, Series

log = logging.getLogger("chronicle.compactor")
MAX_DELIVER_ADVISORY = "io.nats.jetstream.advisory.v1.max_deliver"
ERR_NO_MESSAGE_FOUND = 10057  # JetStream's answer to deleting a message that is not (or no longer) there
RECORD_RETRIES_S = (0.5, 1.0)  # the pauses before recording a given-up request's failure again (in its lease)
DONE = "its work was done before it was given up"  # what a given-up request no longer due is logged as


@dataclass(frozen=True, slots=True)
class Recorder:
    """How a compactor records a request JetStream gave up (:class:`GivenUp`), as
    the work queue records a failed attempt: the compaction ``service`` (the session's lease,
    :meth:`~services.compaction.service.CompactionService.record_failure`), the session's attempt
    series (``series_of``, None: a series of its own) and ``attempts`` a series has, whether the
    request is still due (``still_due``, as the work queue asks it; None: always), and how long an
    advisory waits for its session's lease (``wait_s``: short, unlike a compaction's wait; past it,
    another compaction holds the lease and settles the session, and the request is deleted with
    nothing recorded)."""

    service: CompactionService
    series_of: SeriesOf | None
    attempts: int
    still_due: StillDue | None = None
    wait_s: float = 30


class GivenUp:
    """A compactor's settling of the requests JetStream gives up on the work queue: the stream
    and its ``layout``, the compactor's counts (``work``) and its ``recorder`` (None: a given-up
    request is deleted and logged only)."""

    def __init__(self, js: JetStreamContext, layout: SubjectLayout, work: WorkStats, recorder: Recorder | None) -> None:
        self.js = js
        self.layout = layout
        self.work = work
        self.recorder = recorder
        self._settling: set[asyncio.Task[None]] = set()
        self._one_at_a_time = asyncio.Semaphore(1)  # advisories waiting for a lease (see settle)

    async def watch(self, nc: NatsClient, durable: str | None) -> Subscription:
        """Listen for the requests JetStream gives up (its ``MAX_DELIVERIES`` advisory of the work
        consumer ``durable``: the last allowed delivery went unanswered, a compactor killed or hung
        on it; one compactor of a queue group hears each), and settle each in a task of its own
        (:meth:`settle`; it may wait for its session's lease). Unsubscribed when the connection
        closes."""
        subject = f"$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES.{self.layout.work_stream}.{durable}"
        return await nc.subscribe(subject, queue=f"{durable}-exhausted", cb=self._heard)

    async def _heard(self, advisory: Msg) -> None:
        task = asyncio.create_task(self.settle(advisory))
        self._settling.add(task)
        task.add_done_callback(self._settling.discard)

    async def stop(self) -> None:
        """Cancel the settlements under way and wait for them to end (the request of each stays:
        the oldest wait leaves it out, it expires); a cancellation of this wait stays one."""
        settling, self._settling = self._settling, set()
        for task in settling:
            task.cancel()
        await asyncio.gather(*settling, return_exceptions=True)

    async def settle(self, advisory: Msg) -> None:
        """Settle a request JetStream gave up: inside its session's lease (as a compactor records a
        failed attempt), record its ``compaction.failed`` (:class:`DeliveriesExhausted`; the
        series' next attempt number; an id derived from the request's and its stream sequence),
        then delete it from the work-queue stream, which kept it, unacknowledged, until it
        expired; count it (:attr:`WorkStats.exhausted`) and log it, naming the session. One
        advisory at a time waits for a lease, and briefly (:attr:`Recorder.wait_s`): advisories
        never take the lease pool from the compactions. A request no longer on the stream when the
        lease is held was settled by another hearing of the advisory (a duplicate, another
        compactor): nothing more. A request whose work was done before it was given up (no failing
        series, and no longer due: its compactor committed the summary and died before its ack) is
        deleted with nothing recorded, as the work queue acks it. Nothing is recorded for a message
        that is no request of its subject's session, a session erased, or a lease held by another
        compaction of the session past the wait (that compaction settles the session): the request
        is deleted and logged. A failure that cannot be recorded (the database, NATS: tried
        :data:`RECORD_RETRIES_S` more times) leaves the request on the stream, logged: the oldest
        wait leaves it out, a newer request of its session replaces it or it expires."""
        named = exhausted_of(advisory.data)
        if named is None:
            log.warning("an advisory on %s that names no stream sequence: ignored", advisory.subject)
            return
        seq, deliveries = named
        stream = self.layout.work_stream
        try:
            found = await self.js.get_msg(stream, seq)
        except NotFoundError:  # acknowledged after all, replaced by a newer request of its session, or settled
            return
        except Exception as exc:  # NATS: the request stays until it expires (the oldest wait leaves it out)
            log.warning("a compaction request JetStream gave up (%s seq %d) could not be read: %s", stream, seq, exc)
            return
        subject = found.subject or ""
        req = request_in(self.layout, subject, found.data or b"")
        rec = self.recorder
        level = logging.ERROR
        if req is None or rec is None:
            what: str | None = "nothing recorded" + (" (no request of its session)" if req is None else "")
            if not await self._delete(seq):
                return
        else:
            try:
                async with self._one_at_a_time:
                    what = await self._in_lease(rec, req, seq, deliveries)
            except LeaseWaitTimedOut:
                what = "nothing recorded (another compaction of the session held its lease; it settles the session)"
                if not await self._delete(seq):
                    return
            except Exception as exc:  # the database, NATS
                log.error(
                    "compaction request of %s/%s (%s seq %d), given up by JetStream after %d deliveries: its "
                    "compaction.failed could not be recorded (%s: %s); left on the work queue (the oldest wait "
                    "leaves it out; a newer request of the session replaces it, or it expires)",
                    req.tenant,
                    req.session,
                    stream,
                    seq,
                    deliveries,
                    type(exc).__name__,
                    exc,
                )
                return
        if what is None:
            return  # settled by another hearing of the advisory, or not deleted (logged)
        if what.startswith(DONE):
            level = logging.WARNING
        self.work.exhausted += 1
        try:
            where = "/".join(self.layout.work_session(KIND, subject))
        except ValueError:
            where = f"subject {subject}"
        log.log(
            level,
            "compaction request of %s (%s seq %d) delivered %d times without an answer (its compactor stopped on "
            "the last): JetStream delivers it no more; %s; deleted; the session is asked for again when it grows",
            where,
            stream,
            seq,
            deliveries,
            what,
        )

    async def _in_lease(self, rec: Recorder, req: CompactionRequested, seq: int, deliveries: int) -> str | None:
        """Inside the session's lease: settle the given-up request ``seq`` and delete it; what to
        log of it (its failure recorded, or why nothing was). None: it was no longer on the stream
        (settled by another hearing of the advisory), or could not be deleted (logged)."""
        async with rec.service.leases.hold(req.tenant, req.session, wait_s=rec.wait_s):
            if not await self._queued(seq):
                return None
            running = await rec.series_of(req) if rec.series_of is not None else Series()
            ongoing = 0 < running.failed < rec.attempts
            if not ongoing and rec.still_due is not None and not await rec.still_due(req):
                return f"{DONE} (no longer due): nothing recorded" if await self._delete(seq) else None
            attempt = Attempt(req.id, series_number(running, rec.attempts), req.estimate)

            async def record() -> str:
                published = await rec.service.record_failure(
                    req.tenant,
                    req.session,
                    req.leaf_id,
                    DeliveriesExhausted(deliveries),
                    attempt,
                    event_id=exhausted_failure_id(req.id, seq),  # a try again records it once
                )
                if published is None:
                    return "the session is erased: nothing recorded"
                return f"recorded as compaction.failed (attempt {attempt.number}, seq {published.seq})"

            what = None
            for pause_s in RECORD_RETRIES_S:
                try:
                    what = await record()
                    break
                except Exception as exc:  # the database, NATS
                    log.warning("the failure of a given-up compaction request not recorded (%s); again", exc)
                    await asyncio.sleep(pause_s)
            if what is None:
                what = await record()  # the last try: its error leaves the request on the stream
            return what if await self._delete(seq) else None

    async def _queued(self, seq: int) -> bool:
        try:
            await self.js.get_msg(self.layout.work_stream, seq)
        except NotFoundError:
            return False
        return True

    async def _delete(self, seq: int) -> bool:
        """Delete the work-queue stream's ``seq``: False when it was gone already, or could not be
        (logged; it stays until it expires, the oldest wait leaves it out)."""
        stream = self.layout.work_stream
        try:
            await self.js.delete_msg(stream, seq)
        except NotFoundError:
            return False
        except Exception as exc:
            if isinstance(exc, APIError) and exc.err_code == ERR_NO_MESSAGE_FOUND:
                return False  # deleted meanwhile (the server's answer is no NotFoundError)
            log.warning("a compaction request JetStream gave up (%s seq %d) could not be deleted: %s", stream, seq, exc)
            return False
        return True


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


def request_in(layout: SubjectLayout, subject: str, data: bytes) -> CompactionRequested | None:
    """The request a work-queue message on ``subject`` is (None: no request of that subject's
    session, such as a publish ack a tenant had the server reflect there)."""
    try:
        req = CompactionRequested.model_validate_json(data)
    except ValidationError:
        return None
    return req if layout.work_subject(KIND, req.tenant, req.session) == subject else None
