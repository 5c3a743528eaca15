"""A cluster node that stops answering (a hung machine, a process stopped with SIGSTOP) while its
socket stays open: Chronicle's NATS clients leave it for another node within seconds. With
nats-py's defaults (a ping every two minutes, two unanswered allowed) they stayed on it for
minutes, and every publish, fetch and request through it timed out; an SRE trial saw writes fall
from ~20 a second to ~1 for the whole of a 60 s stop of one node of three."""

from __future__ import annotations

import asyncio
import base64
import json
import signal
import subprocess
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path

import nats
import nats.errors
import nkeys
import pytest
from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg

from events.credentials import nkey_public_key
from events.subjects import SubjectLayout
from services.bootstrap import NATS_STALE_AFTER_S, connect_nats, work_broker
from services.commands_nats.app import broker_for
from services.ops.natsconf import NATS_CLIENT_DROPPED_AFTER_S, NATS_ROUTE_STALE_AFTER_S, NatsAccess
from services.settings import Settings
from tests.conftest import OPERATOR_SEED, make_settings
from tests.support import nats_cluster_nodes

pytestmark = [
    pytest.mark.timeout(120),
    # a client leaving a stale server closes that connection's transport and drops the writer
    # without closing it (nats-py: FastStream's broker, the `commands` case, once in a CI run):
    # the socket is closed; the warning at its collection is the library's, not what is tested
    pytest.mark.filterwarnings("ignore:unclosed <StreamWriter:ResourceWarning"),
]

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


async def test_the_other_nodes_drop_a_hung_nodes_subscriptions_within_the_route_stale_bound(cluster: Nodes) -> None:
    """A hung node's queue subscriptions stay in the other nodes' interest for as long as its routes
    look alive: nats-server's default route ping (every two minutes) kept it there, and a request
    from a node without a local member went to it, unanswered, in turn with the live ones. The trial
    saw it as JetStream direct gets (any replica answers them: `GET …/last-seq`, and the appends
    that read a subject's last event) taking 5 or 10 s, one in three, for the whole of a node's stop.
    The generated cluster configuration pings routes often enough to drop such a node."""
    hung_url, hung = cluster[0]
    on_hung, on_live, asking = [await nats.connect(url, nkeys_seed_str=OPERATOR_SEED) for url in cluster_urls(cluster)]
    try:
        for nc, name in ((on_hung, b"hung"), (on_live, b"live")):

            async def answer(msg: Msg, name: bytes = name) -> None:
                await msg.respond(name)

            await nc.subscribe("svc", queue="q", cb=answer)
            await nc.flush()
        deadline = time.monotonic() + 10
        seen: set[bytes] = set()
        while seen != {b"hung", b"live"}:  # both members are in the asking node's interest
            assert time.monotonic() < deadline, seen
            seen.add((await asking.request("svc", b"", timeout=2)).data)
        hung.send_signal(signal.SIGSTOP)
        stopped = time.monotonic()
        try:
            deadline = stopped + NATS_ROUTE_STALE_AFTER_S + 10  # the bound, and a loaded machine's slack
            answered = 0
            while answered < 12:  # in a row: the hung member would take every other one
                assert time.monotonic() < deadline, (
                    f"requests still go to the stopped node {hung_url} {time.monotonic() - stopped:.0f}s on"
                )
                try:
                    assert (await asking.request("svc", b"", timeout=1)).data == b"live"
                except nats.errors.TimeoutError:
                    answered = 0
                    continue
                answered += 1
        finally:
            hung.send_signal(signal.SIGCONT)
    finally:
        for nc in (on_hung, on_live, asking):
            await nc.close()


async def test_a_node_drops_a_client_that_stops_answering_but_not_before_the_clients_own_stale_bound(
    cluster: Nodes,
) -> None:
    """A client that stops answering (a stopped commands process) keeps its subscriptions, its turn
    in a queue group among them, until its server's pings go unanswered: the node drops it. Not
    sooner than the clients' own detection (:data:`NATS_STALE_AFTER_S`) though: the routes' 2 s
    pings applied to clients too closed a client starved of CPU for ~5 s after about 6 s. The
    client here is a bare connection that reads what the server sends and answers nothing."""
    port = int(cluster[0][0].rsplit(":", 1)[1])
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        info = json.loads((await reader.readline()).split(b" ", 1)[1])
        key = nkeys.from_seed(OPERATOR_SEED.encode())
        sig = base64.b64encode(key.sign(info["nonce"].encode())).decode()
        connect = {"verbose": False, "pedantic": False, "protocol": 1, "nkey": key.public_key.decode(), "sig": sig}
        writer.write(b"CONNECT " + json.dumps(connect).encode() + b"\r\nSUB svc q 1\r\nPING\r\n")
        await writer.drain()
        while (line := await asyncio.wait_for(reader.readline(), timeout=5)) != b"PONG\r\n":
            assert line.startswith(b"INFO "), line  # admitted: an -ERR otherwise
        silent = time.monotonic()  # from here on the server's PINGs go unanswered
        bound = NATS_CLIENT_DROPPED_AFTER_S + 10  # the bound, and a loaded machine's slack
        while await asyncio.wait_for(reader.read(4096), timeout=max(0.1, silent + bound - time.monotonic())):
            pass
        dropped = time.monotonic() - silent
        assert dropped > NATS_STALE_AFTER_S, f"closed {dropped:.1f}s after it stopped answering"
    finally:
        writer.close()


def cluster_urls(cluster: Nodes) -> list[str]:
    return [url for url, _ in cluster]
