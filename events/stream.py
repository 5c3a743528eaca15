"""The JetStream stream that holds every event: file storage, delete/purge denied, dedup window,
and as many replicas as the settings ask (on a NATS cluster); beside it, the work-queue stream of
compaction requests (retention ``workqueue``: a request is gone once a compactor acks it)."""

from __future__ import annotations

from collections.abc import Awaitable
from dataclasses import replace

from nats.js import JetStreamContext
from nats.js.api import (
    DiscardPolicy,
    RetentionPolicy,
    StorageType,
    StoreCompression,
    StreamConfig,
    StreamInfo,
)
from nats.js.errors import APIError, NotFoundError

from events.subjects import SubjectLayout

DUPLICATE_WINDOW_S = 120.0
WORK_MAX_AGE_S = 24 * 3600.0  # a request no compactor settled (its deliveries exhausted) expires
PARTITIONS_KEY = "chronicle.partitions"  # stream metadata: the partition count in every subject
# the server's answers to a replica count it cannot place: not clustered; too few servers (peers)
ERR_REPLICAS_NOT_CLUSTERED = 10074
ERR_INSUFFICIENT_RESOURCES = 10023
ERR_NO_SUITABLE_PEERS = 10005


class ReplicasUnavailable(RuntimeError):
    """The NATS server or cluster cannot hold the replica count asked for. ``pending``: a cluster
    could not place them *now* (too few peers known): one just started may not have gathered its
    peers yet, so a process starting waits a while before it gives up (services.bootstrap)."""

    def __init__(self, message: str, *, pending: bool = False) -> None:
        super().__init__(message)
        self.pending = pending


class TooFewReplicas(RuntimeError):
    """The stream exists with fewer replicas than this process is set to; moving it is an explicit
    operator step (``chronicle stream-replicas N``), never a side effect of a process starting."""


def too_few_replicas(stream: str, have: int, replicas: int) -> str:
    """What is wrong with a stream of ``have`` replicas under a process set to more, and the fix."""
    return (
        f"stream {stream} has {have} replica(s); this process is set to {replicas} "
        f"(CHRONICLE_STREAM_REPLICAS). Move it with `chronicle stream-replicas {replicas}`, or set "
        f"CHRONICLE_STREAM_REPLICAS={have}"
    )


class PartitionMismatch(RuntimeError):
    """The stream's subjects were made with another partition count than this process's."""


class StreamMissing(LookupError):
    """The event stream does not exist on this NATS server (a tool that only reads the log never
    creates it: the server is most likely not the stack's)."""

    def __init__(self, stream: str) -> None:
        super().__init__(f"no stream {stream}")
        self.stream = stream


def stream_config(
    layout: SubjectLayout, *, duplicate_window_s: float = DUPLICATE_WINDOW_S, replicas: int = 1
) -> StreamConfig:
    return StreamConfig(
        name=layout.stream,
        subjects=[layout.wildcard],
        storage=StorageType.FILE,
        deny_delete=True,
        deny_purge=True,
        duplicate_window=duplicate_window_s,
        allow_direct=True,
        max_msg_size=-1,
        # S2 on the stored blocks: events are JSON with repeated keys and ids, and the log is the
        # largest store (nats-server 2.10+; older servers ignore it). Messages are compressed when
        # their block is sealed, so a publish pays nothing for it.
        compression=StoreCompression.S2,
        metadata={PARTITIONS_KEY: str(layout.partitions)},
        num_replicas=replicas,
    )


def work_stream_config(layout: SubjectLayout, *, replicas: int = 1) -> StreamConfig:
    """Requests to do work (compaction), one subject per session: the newest request of a session
    replaces one not yet taken (``max_msgs_per_subject=1``), so a backlog never holds a session
    twice; an ack removes a request; the id dedups a decision taken twice."""
    return StreamConfig(
        name=layout.work_stream,
        subjects=[f"{layout.work_prefix}.>"],
        retention=RetentionPolicy.WORK_QUEUE,
        storage=StorageType.FILE,
        discard=DiscardPolicy.OLD,
        max_msgs_per_subject=1,
        max_age=WORK_MAX_AGE_S,
        duplicate_window=DUPLICATE_WINDOW_S,
        num_replicas=replicas,
    )


async def ensure_work_stream(js: JetStreamContext, layout: SubjectLayout, *, replicas: int = 1) -> None:
    """Create the work-queue stream, or bring an existing one to this release's configuration
    (it holds only pending work: changing it loses nothing)."""
    want = work_stream_config(layout, replicas=replicas)
    try:
        info = await js.stream_info(layout.work_stream)
    except NotFoundError:
        await replica_call(js.add_stream(want), layout.work_stream, replicas)
        return
    have = info.config
    if (have.subjects, have.max_msgs_per_subject, have.max_age, have.num_replicas or 1) != (
        want.subjects,
        want.max_msgs_per_subject,
        want.max_age,
        replicas,
    ):
        await replica_call(js.update_stream(want), layout.work_stream, replicas)


async def ensure_stream(js: JetStreamContext, layout: SubjectLayout, *, replicas: int = 1) -> None:
    """Create the stream with ``replicas`` copies if it is missing, and check that it was made
    with this layout's partition count. An existing stream is left as it is, but one with fewer
    replicas than ``replicas`` is refused (:class:`TooFewReplicas`); a count the server cannot
    place is refused too (:class:`ReplicasUnavailable`)."""
    try:
        info = await js.stream_info(layout.stream)
    except NotFoundError:
        await replica_call(js.add_stream(stream_config(layout, replicas=replicas)), layout.stream, replicas)
    else:
        have = info.config.num_replicas or 1
        if have < replicas:
            raise TooFewReplicas(too_few_replicas(layout.stream, have, replicas))
    await check_partitions(js, layout)
    await ensure_work_stream(js, layout, replicas=replicas)


async def require_stream(js: JetStreamContext, layout: SubjectLayout) -> None:
    """For a tool that only reads the log: the stream must exist (:class:`StreamMissing`; nothing
    is created, the work queue neither) with this layout's partition count
    (:class:`PartitionMismatch`; a stream that has not recorded its count is left as it is)."""
    try:
        info = await js.stream_info(layout.stream)
    except NotFoundError:
        raise StreamMissing(layout.stream) from None
    recorded = dict(info.config.metadata or {}).get(PARTITIONS_KEY)
    if recorded is not None and recorded != str(layout.partitions):
        raise PartitionMismatch(
            f"stream {layout.stream} was made with {recorded} partitions; this process is set to "
            f"{layout.partitions} (CHRONICLE_PARTITIONS must match the stream)"
        )


async def set_replicas(js: JetStreamContext, stream: str, replicas: int) -> StreamInfo:
    """Change an existing stream's replica count (nats-server copies the log to the new peers
    while it keeps serving; consumers that inherit the stream's count follow it)."""
    info = await js.stream_info(stream)
    return await replica_call(js.update_stream(replace(info.config, num_replicas=replicas)), stream, replicas)


async def replica_call(call: Awaitable[StreamInfo], stream: str, replicas: int) -> StreamInfo:
    """``call`` (a stream create or update), with the server's refusals to place ``replicas``
    copies turned into :class:`ReplicasUnavailable`."""
    try:
        return await call
    except APIError as exc:
        if exc.err_code == ERR_REPLICAS_NOT_CLUSTERED:
            raise ReplicasUnavailable(
                f"stream {stream}: {replicas} replicas need a NATS cluster, and this server is not clustered "
                f"(set CHRONICLE_STREAM_REPLICAS=1, or run a cluster: `chronicle up --nats-cluster 3`)"
            ) from exc
        if exc.err_code in (ERR_INSUFFICIENT_RESOURCES, ERR_NO_SUITABLE_PEERS):
            raise ReplicasUnavailable(
                f"stream {stream}: the NATS cluster cannot place {replicas} replicas ({exc.description}); "
                f"it needs at least {replicas} JetStream servers up",
                pending=True,
            ) from exc
        raise


async def check_partitions(js: JetStreamContext, layout: SubjectLayout) -> None:
    """Refuse a partition count other than the stream's: a session's events would land on another
    subject, out of order with the earlier ones and outside their optimistic concurrency. A stream
    made before the count was recorded adopts this one."""
    info = await js.stream_info(layout.stream)
    metadata = dict(info.config.metadata or {})
    recorded = metadata.get(PARTITIONS_KEY)
    if recorded is None:
        metadata[PARTITIONS_KEY] = str(layout.partitions)
        await js.update_stream(replace(info.config, metadata=metadata))
        return
    if recorded != str(layout.partitions):
        raise PartitionMismatch(
            f"stream {layout.stream} was made with {recorded} partitions; this process is set to "
            f"{layout.partitions} (CHRONICLE_PARTITIONS must match the stream)"
        )
