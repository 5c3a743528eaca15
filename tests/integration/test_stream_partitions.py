"""The stream records its partition count; a process set to another count refuses to start."""

from __future__ import annotations

import dataclasses

import pytest
from nats.js.api import StoreCompression

from events.stream import PARTITIONS_KEY, PartitionMismatch, check_partitions, stream_config
from services.bootstrap import Container, open_container
from tests.conftest import make_settings, operator_nats


async def test_a_process_with_another_partition_count_refuses_the_stream(nats_url: str, fresh_db: str) -> None:
    settings = make_settings(nats_url, fresh_db, partitions=4)
    async with open_container(settings) as c:
        info = await c.js.stream_info(settings.stream)
        assert (info.config.metadata or {})[PARTITIONS_KEY] == "4"
    other = settings.model_copy(update={"partitions": 8})
    with pytest.raises(PartitionMismatch, match="made with 4 partitions; this process is set to 8"):
        async with open_container(other):
            pass
    async with open_container(settings):  # the right count still starts
        pass


async def test_a_stream_made_before_the_count_was_recorded_adopts_it(nats_url: str, fresh_db: str) -> None:
    settings = make_settings(nats_url, fresh_db, partitions=4)
    layout = settings.layout()
    nc = await operator_nats(nats_url)
    try:
        js = nc.jetstream()
        await js.add_stream(dataclasses.replace(stream_config(layout), metadata=None))
        await check_partitions(js, layout)
        info = await js.stream_info(layout.stream)
        assert (info.config.metadata or {})[PARTITIONS_KEY] == "4"
        await js.delete_stream(layout.stream)
    finally:
        await nc.close()


async def test_the_stream_is_stored_s2_compressed(stack: Container) -> None:
    """The log's blocks are compressed on the pinned nats-server (2.10+ keeps the setting)."""
    info = await stack.js.stream_info(stack.layout.stream)
    assert info.config.compression == StoreCompression.S2
