"""The NATS client Chronicle's processes connect with: nats-py's, but a stream's message is never
taken for the server's status or control message, whatever headers its publisher stored with it.

nats-py tells the server's status messages from messages by their headers alone: a pull
consumer's fetch skips (404, 408, 409) or raises on (any other) a message with a ``Status``
header, and a push consumer (the ordered consumers of ``events.log``: a followed events answer,
whole-log reads such as rebuild, verify and archive) takes an empty message with ``Status: 100``
for a heartbeat or flow control, and answers its ``Nats-Consumer-Stalled`` header by publishing
to the subject it names. A tenant that publishes straight to its subjects chooses its events'
headers (NATS permissions filter subjects, not headers), so one event with ``Status: 404`` made
the projector skip it, find a delivery missing and re-position for ever (every tenant's
projections halted), and one empty event with ``Status: 100``, ``Description: Idle Heartbeat``
and ``Nats-Consumer-Stalled: $JS.API.STREAM.DELETE.<stream>`` had a follower of its session,
as the operator, delete the whole log. A direct get (``JetStreamManager.get_msg(direct=True)``)
took an empty stored message with a ``Status`` header for the server's answer: a session whose
newest event was one had no last sequence (its events page empty, every write to it a conflict),
and ``request`` took any answer with ``Status: 503`` for "no responders": a direct get of an event
stored with it failed (the read-back that tells a duplicate id held by another tenant's event from
this publish's own among them, so a tenant that took another's derived id with such an event
failed its write where a fresh id was due).

The server's own status and control messages never come with a ``$JS.ACK.`` reply subject
(no reply, or ``$JS.FC.`` for flow control); every message a consumer delivers from the stream
does. So a message with such a reply is a message, its headers whatever they are. Likewise a
direct get's answer is a stored message when it has a ``Nats-Sequence`` (the server adds it to
every message it answers with, and to no status)."""

from __future__ import annotations

from typing import Any

import nats.aio.client
import nats.errors
import nats.js.client
from faststream.nats import NatsBroker
from nats.aio.msg import Msg
from nats.js import api
from nats.js.manager import JetStreamManager

NO_RESPONDERS = "503"
STREAM_DELIVERY = "$JS.ACK."
"""The reply subject prefix of every message a consumer delivers from a stream."""


def status_of(msg: Msg | None) -> str | None:
    """The server status ``msg`` is (``JetStreamContext.is_status_msg``'s answer), never one for a
    message delivered from the stream: its ``Status`` header is its publisher's."""
    if msg is None or msg.headers is None or msg.reply.startswith(STREAM_DELIVERY):
        return None
    return msg.headers.get("Status")


def _is_status_msg(cls: type[nats.js.client.JetStreamContext], msg: Msg | None) -> str | None:
    return status_of(msg)


_LIFT = JetStreamManager._lift_msg_to_raw_msg
"""nats-py's reading of a direct get's answer (a status when it is empty and has ``Status``)."""


def stored_message(msg: Msg) -> api.RawStreamMsg:
    """A direct get's answer as the stream message it is: one with a ``Nats-Sequence`` is a
    stored message even when it is empty and has a ``Status`` header (its publisher's); anything
    else as nats-py reads it (an empty answer with a status: none, or an error)."""
    headers = msg.headers or {}
    if msg.data or "Nats-Sequence" not in headers:
        raw: api.RawStreamMsg = _LIFT(msg)
        return raw
    raw = api.RawStreamMsg()
    raw.subject = headers["Nats-Subject"]
    raw.seq = int(headers["Nats-Sequence"])
    raw.data = None  # as nats-py gives an empty message's
    raw.headers = headers
    if stamp := headers.get("Nats-Time-Stamp"):
        raw.time = api.Base._parse_utc_iso(stamp)
    return raw


def _lift_msg_to_raw_msg(cls: type[JetStreamManager], msg: Msg) -> api.RawStreamMsg:
    return stored_message(msg)


class Client(nats.aio.client.Client):
    """nats-py's client, whose push consumers take a message delivered from the stream as a message
    (nats-py's pull consumers are told by :func:`guard_status_headers`)."""

    _from_stream = False

    def _build_message(self, sid: int, subject: bytes, reply: bytes, data: bytes, headers: Any) -> Any:
        # called for each message just before nats-py asks whether it is a control message,
        # with no await between the two
        self._from_stream = reply.startswith(STREAM_DELIVERY.encode())
        return super()._build_message(sid, subject, reply, data, headers)

    def _is_control_message(self, data: bytes, header: dict[str, str]) -> str | None:
        if self._from_stream:
            return None
        result: str | None = super()._is_control_message(data, header)
        return result

    async def request(
        self,
        subject: str,
        payload: bytes = b"",
        timeout: float = 0.5,  # noqa: ASYNC109 (nats-py's signature)
        old_style: bool = False,
        headers: dict[str, Any] | None = None,
    ) -> Msg:
        """nats-py's ``request``, but an answer is "no responders" only when it is no stored message
        (a direct get's answer has a ``Nats-Sequence``; the server's 503 has none)."""
        if old_style:
            answer: Msg = await super().request(subject, payload, timeout, old_style=True, headers=headers)
            return answer
        if not self._skip_subject_validation:
            nats.aio.client._validate_subject(subject)
        msg: Msg = await self._request_new_style(subject, payload, timeout=timeout, headers=headers)
        if msg.headers and msg.headers.get("Status") == NO_RESPONDERS and "Nats-Sequence" not in msg.headers:
            raise nats.errors.NoRespondersError
        return msg


def guard_status_headers() -> None:
    """Make nats-py's pull consumers (``PullSubscription.fetch``, which asks
    ``JetStreamContext.is_status_msg`` by the class's name) tell a stream's message from a status
    by its reply subject (:func:`status_of`), and its direct gets (which call
    ``JetStreamManager._lift_msg_to_raw_msg`` by the class's name) by its sequence
    (:func:`stored_message`), in this process. Idempotent."""
    nats.js.client.JetStreamContext.is_status_msg = classmethod(_is_status_msg)  # type: ignore[method-assign,assignment]
    JetStreamManager._lift_msg_to_raw_msg = classmethod(_lift_msg_to_raw_msg)  # type: ignore[method-assign,assignment]


async def connect(servers: str | list[str], **options: Any) -> Client:
    """``nats.connect``, with the :class:`Client` above and :func:`guard_status_headers` in force."""
    guard_status_headers()
    nc = Client()
    await nc.connect(servers, **options)
    return nc


class Broker(NatsBroker):
    """FastStream's NATS broker, connected by :func:`connect` (FastStream takes no client class:
    its ``_connect`` calls ``nats.connect``, whose client is nats-py's own), so its push consumers
    and requests read a stream's message as the :class:`Client` does and its pull subscribers'
    fetches are told by :func:`guard_status_headers`; everything else as FastStream does it."""

    async def _connect(self) -> Client:
        connection = await connect(**self._connection_kwargs)
        self.config.connect(connection)
        return connection
