"""A cluster node that stops answering (a hung machine, a process stopped with SIGSTOP) while its
socket stays open: Chronicle's NATS clients leave it for another node within seconds. With
nats-py's defaults (a ping every two minutes, two unanswered allowed) they stayed on it for
minutes, and every publish, fetch and request through it timed out; an SRE trial saw writes fall
from ~20 a second to ~1 for the whole of a 60 s stop of one node of three."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path

import pytest
from nats.aio.client import Client as NatsClient

from events.credentials import nkey_public_key
from events.subjects import SubjectLayout
from services.bootstrap import NATS_STALE_AFTER_S, connect_nats, work_broker
from services.commands_nats.app import broker_for
from services.ops.natsconf import NatsAccess
from services.settings import Settings
from tests.conftest import OPERATOR_SEED, make_settings
from tests.support import nats_cluster_nodes

pytestmark = pytest.mark.timeout(120)

Nodes = list[tuple[str, subprocess.Popen[bytes]]]


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Nodes]:
    access = NatsAccess((nkey_public_key(OPERATOR_SEED),), SubjectLayout())
    with nats_cluster_nodes(tmp_path, access) as nodes:
        yield nodes


async def _connect(settings: Settings) -> NatsClient:
    return await connect_nats(settings)


async def _commands_broker(settings: Settings) -> NatsClient:
    return await broker_for(settings).connect()


async def _work_broker(settings: Settings) -> NatsClient:
    return await work_broker(settings).connect()


@pytest.mark.parametrize("connect", [_connect, _commands_broker, _work_broker], ids=["client", "commands", "compactor"])
async def test_a_client_leaves_a_node_that_stops_answering_within_its_stale_bound(
    cluster: Nodes, db_url: str, connect: Callable[[Settings], Awaitable[NatsClient]]
) -> None:
    settings = make_settings(",".join(url for url, _ in cluster), db_url)
    nc = await connect(settings)
    try:
        port = nc.connected_url.port if nc.connected_url else None
        hung = next(proc for url, proc in cluster if url.endswith(f":{port}"))
        hung.send_signal(signal.SIGSTOP)
        stopped = time.monotonic()
        try:
            deadline = stopped + NATS_STALE_AFTER_S + 10  # the bound, and a reconnect's time
            while nc.connected_url is None or nc.connected_url.port == port or not nc.is_connected:
                assert time.monotonic() < deadline, (
                    f"still on the stopped node (or reconnecting) {time.monotonic() - stopped:.0f}s after it stopped"
                )
                await asyncio.sleep(0.2)
            await nc.flush(timeout=2)  # and the new node answers
        finally:
            hung.send_signal(signal.SIGCONT)
    finally:
        await nc.close()
