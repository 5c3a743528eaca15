"""The JetStream stream that holds every event: file storage, delete/purge denied, dedup window."""

from __future__ import annotations

from dataclasses import replace

from nats.js import JetStreamContext
from nats.js.api import StorageType, StoreCompression, StreamConfig
from nats.js.errors import NotFoundError

from events.subjects import SubjectLayout

DUPLICATE_WINDOW_S = 120.0
PARTITIONS_KEY = "chronicle.partitions"  # stream metadata: the partition count in every subject


class PartitionMismatch(RuntimeError):
    """The stream's subjects were made with another partition count than this process's."""


def stream_config(layout: SubjectLayout, *, duplicate_window_s: float = DUPLICATE_WINDOW_S) -> StreamConfig:
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
    )


async def ensure_stream(js: JetStreamContext, layout: SubjectLayout) -> None:
    """Create the stream if it is missing (an existing one is left as it is), and check that it
    was made with this layout's partition count."""
    try:
        await js.stream_info(layout.stream)
    except NotFoundError:
        await js.add_stream(stream_config(layout))
    await check_partitions(js, layout)


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
