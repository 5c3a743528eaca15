"""Reading the log back: one session's events, or the whole stream, in stream order."""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncGenerator
from dataclasses import dataclass
from datetime import UTC, datetime

import nats.errors
import nats.js.errors
from nats.aio.client import Client as NatsClient
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
    limit: int | None = None,
) -> AsyncGenerator[StoredEvent, None]:
    """Events on ``subject`` (default: all) with ``from_seq <= seq <= to_seq``, in order, at most
    ``limit`` of them (a hint: what the reader takes before it stops; the read asks for no more).

    Stops at the last sequence present when the read began, so it always terminates. One
    session's events are read in batches of direct gets (:func:`_read_subject`: what is read is
    what is asked for, whatever the session's size); the whole log through an ordered
    (ephemeral, flow-controlled) consumer.

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
    if subject is not None:
        async with contextlib.aclosing(
            _read_subject(js, layout, subject, max(from_seq, 1), end, idle_timeout_s, limit)
        ) as batched:
            async for stored in batched:
                yield stored
        return
    async with contextlib.aclosing(_read_consumer(js, layout, None, max(from_seq, 1), end, idle_timeout_s)) as pushed:
        async for stored in pushed:
            yield stored


async def _read_consumer(
    js: JetStreamContext, layout: SubjectLayout, subject: str | None, from_seq: int, end: int, idle_timeout_s: float
) -> AsyncGenerator[StoredEvent, None]:
    """:func:`read` through an ordered consumer (``from_seq <= end``)."""
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


DIRECT_BATCH = 256
"""The most events one direct get of a session's read asks for (fewer when the reader's limit is
nearer)."""
DIRECT_BATCH_BYTES = 4 * 1024 * 1024
"""The most bytes one direct get answers with (the server sends one event at least, whatever its
size): what one batch can leave in the reader's buffer."""
_ADDED_HEADERS = frozenset(
    ("Nats-Stream", "Nats-Subject", "Nats-Sequence", "Nats-Time-Stamp", "Nats-Num-Pending", "Nats-Last-Sequence")
)
"""What a direct get adds to an event's stored headers."""


async def _read_subject(
    js: JetStreamContext,
    layout: SubjectLayout,
    subject: str,
    from_seq: int,
    end: int,
    idle_timeout_s: float,
    limit: int | None,
) -> AsyncGenerator[StoredEvent, None]:
    """One session's events through batched direct gets (nats-server 2.11+: ``next_by_subj`` with
    ``batch``): each asks for the next events of the subject from a sequence, so a page of a big
    session reads that page, not what an ordered consumer would push past it (a flow-control
    window: 70 to 100 ms for a page of 100 in a session of 50,000). Where the gets stop short of
    ``end`` (a replica answering before it applied the last events; an event deleted since) the
    rest is read through an ordered consumer, from the stream's leader; so is everything after
    the first event where the server answers one event, not a batch (a server before 2.11), and
    after a get no server answered (no responders, or the replica answering went away). A reply
    is the server's status only without a sequence: a stored event may carry a header named
    ``Status`` (a direct publisher's), which a status check by that name took for the batch's end."""
    nc: NatsClient = js._nc  # nats-py has no batched direct get: asked on its connection
    inbox = nc.new_inbox()
    sub = await nc.subscribe(inbox, pending_msgs_limit=-1, pending_bytes_limit=0)  # a batch is bounded in bytes
    next_seq, left = from_seq, limit
    try:
        while next_seq <= end and (left is None or left > 0):
            want = DIRECT_BATCH if left is None else min(DIRECT_BATCH, left)
            request = {"seq": next_seq, "next_by_subj": subject, "batch": want, "max_bytes": DIRECT_BATCH_BYTES}
            await nc.publish(f"{js._prefix}.DIRECT.GET.{layout.stream}", json.dumps(request).encode(), reply=inbox)
            while True:
                try:
                    msg = await sub.next_msg(timeout=idle_timeout_s)
                except (TimeoutError, nats.errors.TimeoutError):
                    status = "silent"  # the replica answering went away: the leader's consumer reads on
                    break
                headers = msg.headers or {}
                if "Nats-Sequence" not in headers:  # the server's status (every stored event has its sequence;
                    status = headers.get("Status", "")  # a stored header may be named Status too)
                    break
                seq = int(headers["Nats-Sequence"])
                if seq > end:
                    return
                yield _direct_stored(msg, seq, headers)
                next_seq = seq + 1
                if left is not None:
                    left -= 1
                if "Nats-Num-Pending" not in headers:  # one event, not a batch: a server before 2.11
                    status = "unbatched"
                    break
            if status == "204" and headers.get("Nats-Num-Pending", "0") != "0":
                continue  # the batch's end (its count or its bytes): ask for the next
            if status not in ("204", "404", "503", "silent", "unbatched"):
                raise nats.js.errors.APIError(
                    code=int(status) if status.isdigit() else None, description=headers.get("Description")
                )
            break  # nothing more on this server (204 with none pending, 404), none answering (503, silent): done,
            # or read on from the leader
    finally:
        with contextlib.suppress(nats.errors.Error):
            await sub.unsubscribe()
    if next_seq <= end and (left is None or left > 0):
        async with contextlib.aclosing(_read_consumer(js, layout, subject, next_seq, end, idle_timeout_s)) as rest:
            async for stored in rest:
                yield stored


def _direct_stored(msg: Msg, seq: int, headers: dict[str, str]) -> StoredEvent:
    """A direct get's answer as :func:`_stored` makes a consumer's: its headers as stored, its
    time to the consumer's precision."""
    stored = {k: v for k, v in headers.items() if k not in _ADDED_HEADERS}
    return StoredEvent(
        seq=seq,
        subject=headers["Nats-Subject"],
        data=msg.data,
        headers=stored or None,
        time=_stamp(headers["Nats-Time-Stamp"]),
    )


def _stamp(text: str) -> datetime:
    """An RFC 3339 time with nanoseconds (``2026-12-07T21:20:07.96993052Z``), as nats-py makes a
    consumer message's from its integer nanoseconds."""
    whole, _, frac = text.removesuffix("Z").partition(".")
    seconds = int(datetime.fromisoformat(whole).replace(tzinfo=UTC).timestamp())
    ns = seconds * 1_000_000_000 + int((frac or "0")[:9].ljust(9, "0"))
    return datetime.fromtimestamp(ns / 1_000_000_000.0, UTC)


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
