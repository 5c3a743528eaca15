"""Cluster settings and their pure parts: NATS URL lists, node configurations, waiting for JetStream."""

from __future__ import annotations

import asyncio
from pathlib import Path

import nats.errors
import pytest
from nats.js.errors import APIError

from events.stream import ReplicasUnavailable
from services.bootstrap import NATS_PING_INTERVAL_S, NATS_STALE_AFTER_S, when_jetstream_ready
from services.ops.localstack import ROUTE_PORT_OFFSET, local_cluster, other_log, rotated
from services.ops.natsconf import (
    CLIENT_PING_INTERVAL_S,
    CLIENT_PING_MAX,
    NATS_CLIENT_DROPPED_AFTER_S,
    ROUTE_USER,
    ClusterNode,
    cluster_extra,
)
from services.ops.replicas import blob_stream
from services.settings import Settings


def test_nats_url_names_one_server_or_several() -> None:
    assert Settings(nats_url="nats://a:4222").nats_servers() == ["nats://a:4222"]
    assert Settings(nats_url=" nats://a:4222, nats://b:4222 ,").nats_servers() == ["nats://a:4222", "nats://b:4222"]
    with pytest.raises(ValueError, match="names no server"):
        Settings(nats_url=" , ").nats_servers()


def test_replica_settings_have_their_bounds() -> None:
    assert (Settings().stream_replicas, Settings().consumer_replicas) == (1, 1)
    with pytest.raises(ValueError, match="stream_replicas"):
        Settings(stream_replicas=0)
    with pytest.raises(ValueError, match="stream_replicas"):
        Settings(stream_replicas=6)


def test_a_node_routes_to_every_other_node_with_the_password() -> None:
    nodes = [ClusterNode(f"n{i}", "127.0.0.1", 6000 + i) for i in range(3)]
    extra = cluster_extra(nodes[1], nodes, "p@ss/word")
    assert extra["server_name"] == "n1"
    cluster = extra["cluster"]
    assert (cluster["host"], cluster["port"]) == ("127.0.0.1", 6001)
    assert cluster["authorization"] == {"user": ROUTE_USER, "password": "p@ss/word"}
    assert cluster["routes"] == [
        f"nats-route://{ROUTE_USER}:p%40ss%2Fword@127.0.0.1:6000",
        f"nats-route://{ROUTE_USER}:p%40ss%2Fword@127.0.0.1:6002",
    ]
    assert cluster_extra(nodes[0], nodes, "x", listen="0.0.0.0")["cluster"]["host"] == "0.0.0.0"


def test_a_node_pings_its_routes_every_2s_and_its_clients_less_often_than_they_ping_it() -> None:
    """Routes: a hung node's subscriptions leave the others' interest within seconds. Clients: the
    top-level ping is the clients' (a route takes the cluster block's); NATS asks for a server
    interval above its clients' so that a client slow to answer (starved of CPU for a few seconds)
    is not closed before its own pings would have found the server gone."""
    node = ClusterNode("n1", "127.0.0.1", 6000)
    extra = cluster_extra(node, [node], "x")
    assert (extra["cluster"]["ping_interval"], extra["cluster"]["ping_max"]) == ("2s", 2)
    assert (extra["ping_interval"], extra["ping_max"]) == (f"{CLIENT_PING_INTERVAL_S}s", CLIENT_PING_MAX)
    assert CLIENT_PING_INTERVAL_S > NATS_PING_INTERVAL_S
    assert CLIENT_PING_INTERVAL_S * CLIENT_PING_MAX > NATS_STALE_AFTER_S  # the fewest seconds it keeps a silent one
    assert NATS_CLIENT_DROPPED_AFTER_S >= CLIENT_PING_INTERVAL_S * (CLIENT_PING_MAX + 1)


def test_a_cluster_without_a_route_password_is_refused() -> None:
    node = ClusterNode("n1", "127.0.0.1", 6000)
    with pytest.raises(ValueError, match="route password"):
        cluster_extra(node, [node], "")


def test_local_cluster_ports_and_rotation() -> None:
    cluster = local_cluster(4250, 3)
    assert [port for port, _ in cluster] == [4250, 4251, 4252]
    assert [n.route_port for _, n in cluster] == [4250 + ROUTE_PORT_OFFSET + i for i in range(3)]
    assert [n.name for _, n in cluster] == ["n1", "n2", "n3"]
    assert rotated(["a", "b", "c"], 4) == ["b", "c", "a"]
    assert rotated([], 2) == []
    assert blob_stream("chronicle-blobs") == "OBJ_chronicle-blobs"


def _unavailable() -> APIError:
    err = APIError(code=503, description="JetStream system temporarily unavailable", err_code=10008)
    return err


async def test_waits_while_jetstream_is_unavailable_then_goes_on() -> None:
    failures: list[BaseException] = [_unavailable(), nats.errors.NoRespondersError(), nats.errors.TimeoutError()]
    calls = 0

    async def step() -> None:
        nonlocal calls
        calls += 1
        if failures:
            raise failures.pop(0)

    await when_jetstream_ready(step, timeout_s=5, pause_s=0)
    assert calls == 4


async def test_gives_up_after_the_timeout_with_the_last_error() -> None:
    async def step() -> None:
        raise _unavailable()

    with pytest.raises(APIError, match="temporarily unavailable"):
        await asyncio.wait_for(when_jetstream_ready(step, timeout_s=0.05, pause_s=0.01), timeout=5)


async def test_other_errors_are_not_waited_for() -> None:
    calls = 0

    async def step() -> None:
        nonlocal calls
        calls += 1
        raise APIError(code=400, description="bad request", err_code=10052)

    with pytest.raises(APIError, match="bad request"):
        await when_jetstream_ready(step, timeout_s=5, pause_s=0)
    assert calls == 1


async def test_a_cluster_still_gathering_its_peers_is_waited_for() -> None:
    """A cluster that cannot place the replicas yet (pending) is retried until it can."""
    calls = 0

    async def step() -> None:
        nonlocal calls
        calls += 1
        if calls < 3:
            raise ReplicasUnavailable("cannot place 3 replicas (no suitable peers)", pending=True)

    await when_jetstream_ready(step, placement_s=5, pause_s=0)
    assert calls == 3


async def test_replicas_that_cannot_be_placed_are_refused_after_the_placement_wait() -> None:
    calls = 0

    async def step() -> None:
        nonlocal calls
        calls += 1
        raise ReplicasUnavailable("cannot place 5 replicas", pending=True)

    with pytest.raises(ReplicasUnavailable, match="cannot place 5"):
        await asyncio.wait_for(when_jetstream_ready(step, placement_s=0.05, pause_s=0.01), timeout=5)
    assert calls > 1


async def test_a_server_that_is_not_clustered_is_refused_at_once() -> None:
    calls = 0

    async def step() -> None:
        nonlocal calls
        calls += 1
        raise ReplicasUnavailable("3 replicas need a NATS cluster")

    with pytest.raises(ReplicasUnavailable, match="need a NATS cluster"):
        await when_jetstream_ready(step, placement_s=5, pause_s=0)
    assert calls == 1


def test_a_data_dir_serves_only_the_log_layout_it_was_made_with(tmp_path: Path) -> None:
    assert other_log(tmp_path, 1) is None
    assert other_log(tmp_path, 3) is None
    (tmp_path / "nats").mkdir()
    assert other_log(tmp_path, 1) is None
    assert "one nats-server" in (other_log(tmp_path, 3) or "")
    for name in ("nats-n1", "nats-n2", "nats-n3"):
        (tmp_path / name).mkdir()
    assert other_log(tmp_path, 3) is None
    assert "a NATS cluster (nats-n1, nats-n2, nats-n3)" in (other_log(tmp_path, 1) or "")
    assert "a cluster of 3 nats-servers" in (other_log(tmp_path, 5) or "")
