"""Publishing events to JetStream: idempotent, optionally conditional, retried when transient.

* The event id is the ``Nats-Msg-Id``: a publish retried inside the stream's duplicate window is
  stored once (the server answers ``duplicate=True`` with the first sequence).
* ``expected_last_subject_seq`` sets ``Nats-Expected-Last-Subject-Sequence`` on the event's
  session subject; the server rejects the publish with :class:`ConcurrencyConflict` if another
  event reached that subject first (``0`` means "the subject must be empty").
* Transient failures (timeouts, no responders while JetStream starts) are retried, a bounded
  number of times, with the same message id.
* :meth:`Publisher.publish_many` pipelines with ``publish_async`` for bulk appends.
* Every event is admitted first (:func:`events.admission.admit` on its encoded bytes and its
  subject): what a projector would refuse is never published; :class:`Refused` says why.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Sequence
from dataclasses import dataclass

import nats.errors
from nats.js import JetStreamContext
from nats.js.errors import APIError, NotFoundError

from events.admission import Refused, admit_built
from events.envelope import Event
from events.subjects import SubjectLayout

__all__ = ["ConcurrencyConflict", "PublishFailed", "Published", "Publisher", "Refused"]

HDR_MSG_ID = "Nats-Msg-Id"
HDR_EXPECTED_SUBJECT_SEQ = "Nats-Expected-Last-Subject-Sequence"
ERR_WRONG_LAST_SEQUENCE = 10071

TRANSIENT: tuple[type[BaseException], ...] = (
    asyncio.TimeoutError,
    nats.errors.TimeoutError,
    nats.errors.NoRespondersError,
    nats.errors.ConnectionReconnectingError,
)


class ConcurrencyConflict(Exception):
    """Another event reached the session subject after the expected sequence."""


class PublishFailed(Exception):
    """The publish did not succeed within the retry bound."""


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
    ) -> None:
        self._js = js
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

    async def publish(self, event: Event, *, expected_last_subject_seq: int | None = None) -> Published:
        headers = {HDR_MSG_ID: event.id}
        if expected_last_subject_seq is not None:
            headers[HDR_EXPECTED_SUBJECT_SEQ] = str(expected_last_subject_seq)
        subject, payload = self.encode(event)
        last_error: BaseException | None = None
        for attempt in range(self._attempts):
            try:
                ack = await self._js.publish(
                    subject, payload, timeout=self._timeout, stream=self.layout.stream, headers=headers
                )
                return Published(seq=ack.seq, duplicate=bool(ack.duplicate))
            except APIError as exc:
                if exc.err_code == ERR_WRONG_LAST_SEQUENCE:
                    raise ConcurrencyConflict(str(exc.description)) from exc
                if exc.code is not None and exc.code >= 500:
                    last_error = exc
                else:
                    raise
            except TRANSIENT as exc:
                last_error = exc
            await asyncio.sleep(self._delay(attempt))
        raise PublishFailed(f"publish of {event.type} {event.id} failed: {last_error!r}") from last_error

    async def publish_many(self, events: Sequence[Event], *, window: int = 4000) -> list[Published]:
        """Pipeline many unconditional publishes; returns one result per event, in order.

        Each event keeps its id as ``Nats-Msg-Id``, so re-running a failed bulk call appends
        nothing twice. Failed entries are retried once through :meth:`publish`. Every event is
        admitted before any is published: one :class:`Refused` event publishes nothing.
        """
        encoded = [self.encode(ev) for ev in events]
        results: list[Published] = []
        for start in range(0, len(events), window):
            chunk = events[start : start + window]
            futures = [
                await self._js.publish_async(subject, payload, stream=self.layout.stream, headers={HDR_MSG_ID: ev.id})
                for ev, (subject, payload) in zip(chunk, encoded[start : start + window], strict=True)
            ]
            done = await asyncio.gather(*futures, return_exceptions=True)
            for ev, outcome in zip(chunk, done, strict=True):
                if isinstance(outcome, BaseException):
                    results.append(await self.publish(ev))
                else:
                    results.append(Published(seq=outcome.seq, duplicate=bool(outcome.duplicate)))
        return results

    def _delay(self, attempt: int) -> float:
        return float(self._backoff * (2**attempt) * (0.5 + random.random()))  # noqa: S311
