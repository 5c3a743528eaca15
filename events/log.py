"""Reading the log back: one session's events, or the whole stream, in stream order."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncGenerator
from dataclasses import dataclass
from datetime import datetime

import nats.errors
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.api import ConsumerConfig, DeliverPolicy
from nats.js.errors import NotFoundError

from events.subjects import SubjectLayout


@dataclass(frozen=True, slots=True)
class StoredEvent:
    seq: int
    subject: str
    data: bytes
    headers: dict[str, str] | None = None  # as stored (Nats-Msg-Id, the expectations it was published with)
    time: datetime | None = None  # when the stream stored it


def _stored(msg: Msg) -> StoredEvent:
    return StoredEvent(
        seq=msg.metadata.sequence.stream,
        subject=msg.subject,
        data=msg.data,
        headers=msg.headers or None,
        time=msg.metadata.timestamp,
    )


async def stored_at(js: JetStreamContext, layout: SubjectLayout, seq: int) -> StoredEvent | None:
    """The event stored at ``seq`` (None: the log no longer holds it)."""
    try:
        msg = await js.get_msg(layout.stream, seq)
    except NotFoundError:
        return None
    return StoredEvent(seq, str(msg.subject), msg.data or b"", msg.headers, msg.time)


async def last_seq(js: JetStreamContext, layout: SubjectLayout, subject: str | None = None) -> int:
    """Last stream sequence overall, or of one subject (0 when none)."""
    if subject is None:
        info = await js.stream_info(layout.stream)
        return int(info.state.last_seq)
    try:
        msg = await js.get_last_msg(layout.stream, subject, direct=True)
    except NotFoundError:
        return 0
    return int(msg.seq or 0)


async def read(
    js: JetStreamContext,
    layout: SubjectLayout,
    subject: str | None = None,
    from_seq: int = 1,
    to_seq: int | None = None,
    idle_timeout_s: float = 5.0,
) -> AsyncGenerator[StoredEvent, None]:
    """Events on ``subject`` (default: all) with ``from_seq <= seq <= to_seq``, in order.

    Reads through an ordered (ephemeral, flow-controlled) consumer and stops at the last
    sequence present when the read began, so it always terminates.

    Complete, or :class:`ReadIncomplete`: the subscription never drops a message for a full
    buffer (nats-py counted a dropped message as delivered for its ordered consumer, which then
    never noticed the hole: a reader slower than delivery, a rebuild or verify of a large log,
    silently lacked events); the server's flow control bounds what waits in the buffer instead.
    A whole-log read checks that each sequence follows the one before, or that the stream holds
    none in between (a message deleted from the stream is not a hole).
    """
    end = await last_seq(js, layout, subject)
    if to_seq is not None:
        end = min(end, to_seq)
    if end < max(from_seq, 1):
        return
    config = ConsumerConfig(deliver_policy=DeliverPolicy.BY_START_SEQUENCE, opt_start_seq=max(from_seq, 1))
    sub = await js.subscribe(
        subject or layout.wildcard,
        ordered_consumer=True,
        config=config,
        stream=layout.stream,
        pending_msgs_limit=-1,
        pending_bytes_limit=0,  # never drop: flow control holds the server back
    )
    before = max(from_seq, 1) - 1
    try:
        while True:
            try:
                msg = await sub.next_msg(timeout=idle_timeout_s)
            except (TimeoutError, nats.errors.TimeoutError) as exc:
                raise TimeoutError("the event stream stopped delivering before the end") from exc
            seq = msg.metadata.sequence.stream
            if subject is None and seq > before + 1:
                await check_hole(js, layout, before, min(seq, end + 1))
            if seq > end:
                return
            yield _stored(msg)
            before = seq
            if seq >= end:
                return
    finally:
        await sub.unsubscribe()


class ReadIncomplete(RuntimeError):
    """A read of the log did not receive a sequence the stream holds (a delivery lost on the way)."""


async def check_hole(js: JetStreamContext, layout: SubjectLayout, before: int, after: int) -> None:
    """:class:`ReadIncomplete` unless the stream holds no message between ``before`` and ``after``
    (exclusive): a whole-log read went from one to the other. Only asked at a jump, which a log
    that never deletes does not have."""
    for seq in range(before + 1, after):
        try:
            await js.get_msg(layout.stream, seq)
        except NotFoundError:
            continue  # deleted from the stream: nothing to read there
        raise ReadIncomplete(
            f"the read of stream {layout.stream} did not receive sequence {seq}, which the stream holds: "
            "a delivery was lost on the way; read again"
        )


class FollowerBehind(Exception):
    """A follower's reader fell behind: more events wait in its buffer than :func:`follow` keeps."""


FOLLOW_PENDING_MSGS = 5_000
FOLLOW_PENDING_BYTES = 8 * 1024 * 1024


async def follow(
    js: JetStreamContext,
    layout: SubjectLayout,
    subject: str,
    from_seq: int = 1,
    tick_s: float = 1.0,
) -> AsyncGenerator[StoredEvent | None, None]:
    """Events on ``subject`` from ``from_seq`` on, in order, as they are stored: never ends by
    itself. ``None`` when nothing came for ``tick_s`` (a caller's chance to send a keep-alive or
    to stop). Meant for what comes next: a reader far behind catches up with :func:`read` first
    (a backlog arrives at once and would pass the buffer's bound below). An ordered consumer:
    flow-controlled, and reset from the last sequence delivered when the server or the
    connection loses messages, so none is skipped or repeated.

    The server keeps delivering to a reader that does not read (its stall heartbeats are
    answered), so the buffer is bounded: :class:`FollowerBehind` is raised once more than
    :data:`FOLLOW_PENDING_MSGS` messages or :data:`FOLLOW_PENDING_BYTES` wait in it, before
    nats-py's own limits (twice those) would drop one unseen; the caller resumes from the
    last event it took."""
    config = ConsumerConfig(deliver_policy=DeliverPolicy.BY_START_SEQUENCE, opt_start_seq=max(from_seq, 1))
    sub = await js.subscribe(
        subject,
        ordered_consumer=True,
        config=config,
        stream=layout.stream,
        pending_msgs_limit=2 * FOLLOW_PENDING_MSGS,
        pending_bytes_limit=2 * FOLLOW_PENDING_BYTES,
    )
    try:
        while True:
            try:
                msg = await sub.next_msg(timeout=tick_s)
            except (TimeoutError, nats.errors.TimeoutError):
                yield None
                continue
            if sub.pending_msgs > FOLLOW_PENDING_MSGS or sub.pending_bytes > FOLLOW_PENDING_BYTES:
                raise FollowerBehind(f"{sub.pending_msgs} events ({sub.pending_bytes} bytes) wait for the reader")
            yield _stored(msg)
    finally:
        with contextlib.suppress(nats.errors.Error):  # the connection may be closing with the process
            await sub.unsubscribe()
