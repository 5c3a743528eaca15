"""Publishing events to JetStream: idempotent, optionally conditional, retried when transient.

* The event id is the ``Nats-Msg-Id``: a publish retried inside the stream's duplicate window is
  stored once (the server answers ``duplicate=True`` with the first sequence).
* ``expected_last_subject_seq`` sets ``Nats-Expected-Last-Subject-Sequence`` on the event's
  session subject; the server rejects the publish with :class:`ConcurrencyConflict` if another
  event reached that subject first (``0`` means "the subject must be empty").
* Transient failures (timeouts, no responders while JetStream starts, a write on a socket the
  server's end closed: :func:`lost_connection`) are retried, a bounded number of times, with the
  same message id; :class:`PublishFailed` once they are spent.
* :meth:`Publisher.publish_many` pipelines with ``publish_async`` for bulk appends.
* JetStream deduplicates by ``Nats-Msg-Id`` across the whole stream, not per subject: an id is
  taken by whoever publishes it first, on any subject. A tenant may publish straight to its own
  subjects, so it can take an id another tenant's write derives (:func:`events.ids.derived_id`
  is a hash of public inputs) and have that write answered "duplicate" with the taken message's
  sequence. So a duplicate is checked (only a duplicate: the common path costs nothing more):
  the message stored at that sequence must be on the subject this publish was for (subjects
  name tenant and session, and nobody publishes on another tenant's). If it is not,
  :class:`ForeignDuplicate` is raised instead of reporting success; callers whose id is their
  own choice (never a client's) may ask for the event to be published again under a fresh
  random id instead (``fresh_id_on_foreign``).
* Every event is admitted first (:func:`events.admission.admit` on its encoded bytes and its
  subject): what a projector would refuse is never published; :class:`Refused` says why.
* ``on_stored`` is told of each event the stream stored for this publisher, once: an ack that is
  not a duplicate (a retry JetStream deduplicated, a replayed append, a conflict or a failure
  stored nothing), whichever method published it (the API counts its events with it).
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

import nats.errors
from nats.js import JetStreamContext
from nats.js.api import PubAck
from nats.js.errors import APIError, NotFoundError

from events.admission import MAX_WRITTEN_BYTES, Refused, admit_built
from events.envelope import Event, new_event_id
from events.objects import owned
from events.sealing import SEALED_FIELDS, DataKey, DataKeys, seal_blob, seal_event, sealed_size
from events.subjects import SubjectLayout

__all__ = [
    "ConcurrencyConflict",
    "ForeignDuplicate",
    "PublishFailed",
    "Published",
    "Publisher",
    "Refused",
    "lost_connection",
]

HDR_MSG_ID = "Nats-Msg-Id"
HDR_EXPECTED_SUBJECT_SEQ = "Nats-Expected-Last-Subject-Sequence"
ERR_WRONG_LAST_SEQUENCE = 10071

TRANSIENT: tuple[type[BaseException], ...] = (
    asyncio.TimeoutError,
    nats.errors.TimeoutError,
    nats.errors.NoRespondersError,
    nats.errors.ConnectionReconnectingError,
)


LOST_SOCKET = "unable to perform operation on"
"""How uvloop's ``RuntimeError`` for a write on a closed transport begins."""


def lost_connection(exc: BaseException) -> bool:
    """Whether ``exc`` is nats-py writing to a socket its server's end closed (nats-server killed)
    before the client noticed and began to reconnect: uvloop raises ``RuntimeError: unable to
    perform operation on <TCPTransport closed=True>``, asyncio a ``ConnectionError``. Transient: the
    client reconnects; not a bug to answer ``500``."""
    return isinstance(exc, ConnectionError) or (isinstance(exc, RuntimeError) and str(exc).startswith(LOST_SOCKET))


class ConcurrencyConflict(Exception):
    """Another event reached the session subject after the expected sequence."""


class PublishFailed(Exception):
    """The publish did not succeed within the retry bound."""


class ForeignDuplicate(Exception):
    """JetStream answered "duplicate" for the event's id, but the message stored under that id
    (at ``seq``) is not on the subject the event was published on: someone else, publishing on
    their own subjects, took the id first. Nothing of the event was stored."""

    def __init__(self, event_id: str, subject: str, seq: int) -> None:
        super().__init__(
            f"event id {event_id} is held by the message at stream sequence {seq}, which is not on {subject!r}: "
            "nothing was stored"
        )
        self.event_id = event_id
        self.subject = subject
        self.seq = seq


StoredOn = Callable[[Event, str, int], Awaitable[bool]]
"""Whether the message stored at a sequence is on a subject (``(event, subject, seq)``): how a
:class:`Publisher` checks a duplicate. The default reads the message back (direct get); a
publisher without the right to read the log (a tenant's) asks the API instead."""
StoredHook = Callable[[Event], None]
"""Told of each event a :class:`Publisher` had stored (not a duplicate); it must not raise."""


@dataclass(frozen=True, slots=True)
class Published:
    seq: int
    duplicate: bool


class Publisher:
    """Publishes :class:`Event` objects onto their session subjects."""

    def __init__(
        self,
        js: JetStreamContext,
        layout: SubjectLayout,
        *,
        attempts: int = 5,
        timeout_s: float = 2.0,
        backoff_s: float = 0.05,
        keys: DataKeys | None = None,
        stored_on: StoredOn | None = None,
        on_stored: StoredHook | None = None,
    ) -> None:
        self._js = js
        self.on_stored = on_stored
        self._stored_on = stored_on or self._read_back_on
        self.keys = keys  # None: events are published as they are (nothing sealed)
        self.layout = layout
        self._attempts = attempts
        self._timeout = timeout_s
        self._backoff = backoff_s

    @property
    def js(self) -> JetStreamContext:
        return self._js

    def subject_of(self, event: Event) -> str:
        return self.layout.session_subject(event.tenant, event.session)

    def encode(self, event: Event) -> tuple[str, bytes]:
        """The subject and bytes ``event`` is published as, admitted by the contract (else
        :class:`Refused`): a publisher built on the contract cannot send what a projector refuses."""
        return admit_built(event, self.layout)

    async def encode_sealed(self, event: Event) -> tuple[str, bytes]:
        """:meth:`encode`, with the event's personal fields sealed by its session's data key when
        this publisher seals (:mod:`events.sealing`); :class:`~events.sealing.KeyDestroyed` when
        the session is erased."""
        subject, data = self.encode(event)
        if self.keys is None or event.type == "session.erased":
            return subject, data
        key = await self.keys.for_writing(event.tenant, event.session)  # an erased session takes no writes
        if key is None or event.type not in SEALED_FIELDS:
            return subject, data
        sealed = seal_event(event, data, key)
        if len(sealed) > MAX_WRITTEN_BYTES:
            raise Refused(
                "too_large", f"{len(sealed)} bytes sealed, more than the {MAX_WRITTEN_BYTES} an event may have"
            )
        return subject, sealed

    async def stored_size(self, event: Event) -> int:
        """How many bytes ``event`` would be stored as (sealed, when this publisher seals it),
        whatever the limit (:data:`~events.admission.MAX_WRITTEN_BYTES`): for a writer that
        refuses what would not fit before it publishes anything, saying by how much.
        :class:`~events.sealing.KeyDestroyed` when the session is erased."""
        if self.keys is None or event.type == "session.erased" or event.type not in SEALED_FIELDS:
            return len(event.to_json())
        return self.size_with(event, await self.keys.for_writing(event.tenant, event.session))

    async def sizing_key(self, tenant: str, session: str) -> DataKey | None:
        """The key :meth:`size_with` measures the session's events with (None: this publisher
        seals nothing), made when the session has none; :class:`~events.sealing.KeyDestroyed`
        when it is erased. A writer that measures while it holds a database connection fetches it
        before taking that connection: the key store takes a connection of its own, and writers
        holding a small pool whole each waited for a second one (for the pool's timeout)."""
        return await self.keys.for_writing(tenant, session) if self.keys is not None else None

    @staticmethod
    def size_with(event: Event, key: DataKey | None) -> int:
        """:meth:`stored_size` with the session's key given (:meth:`sizing_key`), without I/O."""
        if key is None or event.type not in SEALED_FIELDS:
            return len(event.to_json())
        return sealed_size(event, key)

    async def seal_object(self, tenant: str, session: str, data: bytes) -> bytes:
        """An object's bytes (a claim-checked body, an original) as this publisher stores them:
        behind a header naming their session (events/objects.py), sealed with its data key inside
        it when this publisher seals."""
        key = await self.keys.for_writing(tenant, session) if self.keys is not None else None
        return owned(data if key is None else seal_blob(data, key, tenant, session), tenant, session)

    async def last_subject_seq(self, tenant: str, session: str) -> int:
        """Stream sequence of the newest event of a session (0 when it has none)."""
        subject = self.layout.session_subject(tenant, session)
        for attempt in range(self._attempts):
            try:
                msg = await self._js.get_last_msg(self.layout.stream, subject, direct=True)
                return int(msg.seq or 0)
            except NotFoundError:
                return 0
            except TRANSIENT:
                if attempt + 1 == self._attempts:
                    raise
                await asyncio.sleep(self._delay(attempt))
        raise AssertionError("unreachable")

    async def publish(
        self, event: Event, *, expected_last_subject_seq: int | None = None, fresh_id_on_foreign: bool = False
    ) -> Published:
        """Publish ``event``; a duplicate whose stored message is not on the event's subject raises
        :class:`ForeignDuplicate`, or, with ``fresh_id_on_foreign``, publishes the event again under
        a fresh random id (which nobody can have taken; the caller's ``event.id`` is then not the
        stored one)."""
        published = await self._publish_once(event, expected_last_subject_seq)
        if not published.duplicate:
            return published
        try:
            await self.check_duplicate(event, published.seq)
        except ForeignDuplicate:
            if not fresh_id_on_foreign:
                raise
            fresh = event.model_copy(update={"id": new_event_id()})
            return await self._publish_once(fresh, expected_last_subject_seq)
        return published

    async def check_duplicate(self, event: Event, seq: int) -> None:
        """:class:`ForeignDuplicate` unless the message at ``seq`` (what JetStream answered a
        publish of ``event`` with, as a duplicate) is on the event's subject."""
        subject = self.subject_of(event)
        if not await self._stored_on(event, subject, seq):
            raise ForeignDuplicate(event.id, subject, seq)

    async def _read_back_on(self, event: Event, subject: str, seq: int) -> bool:
        """The message at ``seq`` read back (direct get: any replica answers; the leader's get
        when a replica does not have it yet), and its subject compared."""
        for attempt in range(self._attempts):
            try:
                try:
                    msg = await self._js.get_msg(self.layout.stream, seq, direct=True)
                except NotFoundError:
                    msg = await self._js.get_msg(self.layout.stream, seq)
                return msg.subject == subject
            except NotFoundError:
                return False  # nothing there (the log never deletes): certainly not this publish's
            except TRANSIENT:
                if attempt + 1 == self._attempts:
                    raise
                await asyncio.sleep(self._delay(attempt))
        raise AssertionError("unreachable")

    async def _publish_once(self, event: Event, expected_last_subject_seq: int | None) -> Published:
        headers = {HDR_MSG_ID: event.id}
        if expected_last_subject_seq is not None:
            headers[HDR_EXPECTED_SUBJECT_SEQ] = str(expected_last_subject_seq)
        subject, payload = await self.encode_sealed(event)
        last_error: BaseException | None = None
        for attempt in range(self._attempts):
            try:
                # no ``stream=`` (a ``Nats-Expected-Stream`` header, stored with every event, ~35 B):
                # the server refuses streams with overlapping subjects, so only this one takes them
                ack = await self._js.publish(subject, payload, timeout=self._timeout, headers=headers)
                return self._stored(ack, event)
            except APIError as exc:
                if exc.err_code == ERR_WRONG_LAST_SEQUENCE:
                    raise ConcurrencyConflict(str(exc.description)) from exc
                if exc.code is not None and exc.code >= 500:
                    last_error = exc
                else:
                    raise
            except TRANSIENT as exc:
                last_error = exc
            except (RuntimeError, ConnectionError) as exc:  # the socket lost under the write: same id again
                if not lost_connection(exc):
                    raise
                last_error = exc
            await asyncio.sleep(self._delay(attempt))
        raise PublishFailed(f"publish of {event.type} {event.id} failed: {last_error!r}") from last_error

    async def publish_many(
        self,
        events: Sequence[Event],
        *,
        window: int = 4000,
        fresh_id_on_foreign: bool = False,
        into: list[Published] | None = None,
    ) -> list[Published]:
        """Pipeline many unconditional publishes; returns one result per event, in order.

        Each event keeps its id as ``Nats-Msg-Id``, so re-running a failed bulk call appends
        nothing twice. Failed entries are retried once through :meth:`publish`. Every event is
        admitted before any is published: one :class:`Refused` event publishes nothing. A
        duplicate is checked as :meth:`publish` checks it: :class:`ForeignDuplicate` (the events
        before it in ``events`` may be stored), or with ``fresh_id_on_foreign`` the event is
        published again under a fresh id.

        ``into`` (returned, when given) receives each result in order as it is settled: after an
        error it holds the unbroken acknowledged prefix, the events stored before the one that
        failed. Events after that one, pipelined with it, may be stored too (their acks, which can
        come back out of order, are not counted); that one may be too when its ack was lost.
        """
        encoded = [await self.encode_sealed(ev) for ev in events]
        results: list[Published] = [] if into is None else into
        for start in range(0, len(events), window):
            chunk = events[start : start + window]
            futures = [
                await self._js.publish_async(subject, payload, headers={HDR_MSG_ID: ev.id})
                for ev, (subject, payload) in zip(chunk, encoded[start : start + window], strict=True)
            ]
            done = await self._settled(futures)
            for ev, outcome in zip(chunk, done, strict=True):
                if isinstance(outcome, BaseException):  # sealed anew: same id, so stored once
                    results.append(await self.publish(ev, fresh_id_on_foreign=fresh_id_on_foreign))
                    continue
                published = self._stored(outcome, ev)
                if published.duplicate:
                    try:
                        await self.check_duplicate(ev, published.seq)
                    except ForeignDuplicate:
                        if not fresh_id_on_foreign:
                            raise
                        published = await self._publish_once(ev.model_copy(update={"id": new_event_id()}), None)
                results.append(published)
        return results

    async def _settled(self, futures: Sequence[asyncio.Future[PubAck]]) -> list[PubAck | BaseException]:
        """Each pipelined publish's ack or error. nats-py (2.x) never settles the future of a
        publish the stream answered with an error (its reply handler raises instead of setting
        it), nor one whose reply is lost: a wait that sees no ack for the publish timeout times its
        attempts gives up on those left, cancelled (their pipeline slots freed), as failures that
        :meth:`publish_many` publishes again one by one (same id: stored once), where an error
        is raised as it is."""
        pending = set(futures)
        while pending:  # a stall as long as publish's whole retry budget is no passing pause
            done, pending = await asyncio.wait(pending, timeout=self._timeout * self._attempts)
            if not done:
                break  # no acknowledgement at all for that long: the rest will not come
        for f in pending:
            f.cancel()
        return [TimeoutError("no acknowledgement") if f.cancelled() else (f.exception() or f.result()) for f in futures]

    def _stored(self, ack: PubAck, event: Event) -> Published:
        """The ack's sequence, once it is this layout's stream that stored the event: a stream
        of another name that took the subject (this one gone, another made over its subjects)
        is not the log, and its sequences mean nothing to the read models. An event stored now
        (not a duplicate) is told to ``on_stored``."""
        if ack.stream != self.layout.stream:
            raise PublishFailed(
                f"stream {ack.stream!r} stored the event, not {self.layout.stream!r}: another stream takes the "
                f"subjects under {self.layout.prefix!r}"
            )
        published = Published(seq=ack.seq, duplicate=bool(ack.duplicate))
        if not published.duplicate and self.on_stored is not None:
            self.on_stored(event)
        return published

    def _delay(self, attempt: int) -> float:
        return float(self._backoff * (2**attempt) * (0.5 + random.random()))  # noqa: S311
