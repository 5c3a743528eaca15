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
as the operator, delete the whole log.

The server's own status and control messages never come with a ``$JS.ACK.`` reply subject
(no reply, or ``$JS.FC.`` for flow control); every message a consumer delivers from the stream
does. So a message with such a reply is a message, its headers whatever they are."""

from __future__ import annotations

from typing import Any

import nats.aio.client
import nats.js.client
from nats.aio.msg import Msg

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


def guard_status_headers() -> None:
    """Make nats-py's pull consumers (``PullSubscription.fetch``, which asks
    ``JetStreamContext.is_status_msg`` by the class's name) tell a stream's message from a status
    by its reply subject (:func:`status_of`), in this process. Idempotent."""
    nats.js.client.JetStreamContext.is_status_msg = classmethod(_is_status_msg)  # type: ignore[method-assign,assignment]


async def connect(servers: str | list[str], **options: Any) -> Client:
    """``nats.connect``, with the :class:`Client` above and :func:`guard_status_headers` in force."""
    guard_status_headers()
    nc = Client()
    await nc.connect(servers, **options)
    return nc
