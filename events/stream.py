"""The JetStream stream that holds every event: file storage, delete/purge denied, dedup window."""

from __future__ import annotations

from nats.js import JetStreamContext
from nats.js.api import StorageType, StreamConfig
from nats.js.errors import NotFoundError

from events.subjects import SubjectLayout

DUPLICATE_WINDOW_S = 120.0


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
    )


async def ensure_stream(js: JetStreamContext, layout: SubjectLayout) -> None:
    """Create the stream if it is missing; an existing stream is left as it is."""
    try:
        await js.stream_info(layout.stream)
    except NotFoundError:
        await js.add_stream(stream_config(layout))
