"""Stream replicas: created at the configured count on a cluster, refused where the servers cannot hold
it, refused (with the command to run) where an existing stream has fewer, and moved by that command."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Iterator

import nats
import pytest
from nats.aio.client import Client as NatsClient
from nats.js import JetStreamContext
from nats.js.api import ConsumerConfig

from events.credentials import nkey_public_key
from events.stream import ReplicasUnavailable, TooFewReplicas, ensure_stream, set_replicas
from events.subjects import SubjectLayout
from services.api import metrics
from services.bootstrap import open_container, when_jetstream_ready
from services.ops.cli import SETTINGS_EXIT
from services.ops.natsconf import NatsAccess
from services.ops.replicas import copies_current, run_stream_replicas
from services.settings import Settings
from tests.conftest import OPERATOR_SEED, make_settings
from tests.support import chronicle_cli, nats_cluster

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def cluster_urls(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[str]]:
    access = NatsAccess((nkey_public_key(OPERATOR_SEED),), SubjectLayout())
    with nats_cluster(tmp_path_factory.mktemp("cluster"), access) as urls:
        yield urls


@pytest.fixture
async def cluster_nc(cluster_urls: list[str]) -> AsyncIterator[NatsClient]:
    nc = await nats.connect(cluster_urls, nkeys_seed_str=OPERATOR_SEED)
    await when_jetstream_ready(lambda: _account(nc))
    try:
        yield nc
    finally:
        await nc.close()


async def _account(nc: NatsClient) -> None:
    await nc.jetstream().account_info()


def on_cluster(urls: list[str], db_url: str, **overrides: object) -> Settings:
    return make_settings(",".join(urls), db_url, **overrides)


async def test_more_replicas_than_one_server_can_hold_are_refused_clearly(nats_url: str, db_url: str) -> None:
    settings = make_settings(nats_url, db_url, stream_replicas=3)
    with pytest.raises(ReplicasUnavailable, match=r"need a NATS cluster.*CHRONICLE_STREAM_REPLICAS=1"):
        async with open_container(settings):
            pass


async def test_the_stream_is_created_with_the_configured_replicas(
    cluster_nc: NatsClient, cluster_urls: list[str], db_url: str
) -> None:
    settings = on_cluster(cluster_urls, db_url, stream_replicas=3)
    async with open_container(settings) as c:
        info = await c.js.stream_info(settings.stream)
        assert info.config.num_replicas == 3
        assert info.cluster is not None
        assert info.cluster.leader
        assert await _eventually_current(c.js, settings.stream, 3)
        await c.blobs.put(b"a blob")  # the bucket is made on first use
        blob = await c.js.stream_info(f"OBJ_{settings.blob_bucket}")
        assert blob.config.num_replicas == 3


async def test_more_replicas_than_the_cluster_has_nodes_are_refused(
    cluster_nc: NatsClient, cluster_urls: list[str], db_url: str
) -> None:
    settings = on_cluster(cluster_urls, db_url, stream_replicas=5)
    with pytest.raises(ReplicasUnavailable, match="cannot place 5 replicas"):
        await ensure_stream(cluster_nc.jetstream(), settings.layout(), replicas=5)


async def test_a_stream_with_fewer_replicas_is_refused_until_moved(
    cluster_nc: NatsClient, cluster_urls: list[str], db_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    one = on_cluster(cluster_urls, db_url, stream_replicas=1)
    three = one.model_copy(update={"stream_replicas": 3})
    js = cluster_nc.jetstream()
    await ensure_stream(js, one.layout())
    await js.add_consumer(one.stream, ConsumerConfig(durable_name="follower"))
    with pytest.raises(TooFewReplicas, match=r"has 1 replica.*`chronicle stream-replicas 3`"):
        async with open_container(three):
            pass

    assert await run_stream_replicas(three, 3, timeout_s=60) == 0
    assert "3/3 copies current" in capsys.readouterr().out
    info = await js.stream_info(one.stream)
    assert info.config.num_replicas == 3
    assert copies_current(info, 3)[0] == 3
    assert await _consumer_moved(js, one.stream, "follower", 3)  # it inherited the stream's count
    async with open_container(three):
        pass


@pytest.mark.parametrize("case", ["fewer-than-set", "more-than-nodes"])
async def test_a_process_refused_its_replica_count_says_so_in_one_line(
    cluster_nc: NatsClient, cluster_urls: list[str], db_url: str, case: str
) -> None:
    """A count the stream or the cluster cannot hold is a setting to change: one line, exit 2 (it
    was the message at the end of a 30-60 line traceback, exit 1)."""
    if case == "fewer-than-set":
        one = on_cluster(cluster_urls, db_url, stream_replicas=1)
        await ensure_stream(cluster_nc.jetstream(), one.layout())
        settings = one.model_copy(update={"stream_replicas": 3})
    else:
        settings = on_cluster(cluster_urls, db_url, stream_replicas=5)
    done = chronicle_cli(settings, "projector", timeout=90)
    assert done.returncode == SETTINGS_EXIT, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    if case == "fewer-than-set":
        assert lines[0] == (
            f"chronicle projector: stream {settings.stream} has 1 replica(s); this process is set to 3 "
            "(CHRONICLE_STREAM_REPLICAS). Move it with `chronicle stream-replicas 3`, or set "
            "CHRONICLE_STREAM_REPLICAS=1"
        )
    else:
        assert lines[0].startswith(f"chronicle projector: stream {settings.stream}: the NATS cluster cannot place 5")
        assert lines[0].endswith("it needs at least 5 JetStream servers up")


async def test_moving_to_more_replicas_than_nodes_is_refused(
    cluster_nc: NatsClient, cluster_urls: list[str], db_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    settings = on_cluster(cluster_urls, db_url)
    await ensure_stream(cluster_nc.jetstream(), settings.layout())
    assert await run_stream_replicas(settings, 5, timeout_s=10) == 2
    assert "cannot place 5 replicas" in capsys.readouterr().err


async def _eventually_current(js: JetStreamContext, stream: str, replicas: int) -> bool:
    for _ in range(100):
        if copies_current(await js.stream_info(stream), replicas)[0] >= replicas:
            return True
        await asyncio.sleep(0.1)
    return False


async def _consumer_moved(js: JetStreamContext, stream: str, name: str, replicas: int) -> bool:
    """The consumer has a leader and ``replicas - 1`` other copies (its group elects after a move)."""
    for _ in range(100):
        cluster = (await js.consumer_info(stream, name)).cluster
        if cluster is not None and cluster.leader and len(cluster.replicas or []) == replicas - 1:
            return True
        await asyncio.sleep(0.1)
    return False


async def test_the_streams_creation_time_survives_a_leader_change(
    cluster_nc: NatsClient, cluster_urls: list[str], db_url: str
) -> None:
    """The log's identity (projections/logbinding.py) is the stream's creation time: it comes from
    the stream's assignment, so every leader reports the same one and a failover is no mismatch."""
    settings = on_cluster(cluster_urls, db_url, stream_replicas=3)
    async with open_container(settings) as c:  # binds the log
        before = await c.js.stream_info(settings.stream)
        assert before.created is not None
        assert before.cluster is not None
        assert await _eventually_current(c.js, settings.stream, 3)
        await cluster_nc.request(f"$JS.API.STREAM.LEADER.STEPDOWN.{settings.stream}", b"", timeout=10)
        for _ in range(100):
            after = await c.js.stream_info(settings.stream)
            if after.cluster is not None and after.cluster.leader not in (None, before.cluster.leader):
                break
            await asyncio.sleep(0.1)
        else:
            raise AssertionError("the stream kept its leader")
        assert after.created == before.created
    async with open_container(settings):  # the check passes under the new leader
        pass


async def test_readyz_names_a_stream_moved_below_the_replica_setting(
    cluster_nc: NatsClient, cluster_urls: list[str], db_url: str, s3_endpoint: str
) -> None:
    """Processes check the stream's replicas at start only: after ``chronicle stream-replicas 1``
    under processes set to 3, readiness said ready (an SRE trial). It reports the stream's count
    and is not ready while it is below the setting, saying how to mend it."""
    three = on_cluster(cluster_urls, db_url, stream_replicas=3, s3_endpoint=s3_endpoint, readiness_compactor=False)
    three = three.model_copy(update={"stream": f"R{uuid.uuid4().hex[:8]}"})
    async with open_container(three) as c:
        assert await _eventually_current(c.js, three.stream, 3)
        before = await metrics.readiness(c)
        assert before["stream_replicas"] == 3
        assert not [r for r in before["reasons"] if "replica" in r], before
        await set_replicas(c.js, three.stream, 1)  # what `chronicle stream-replicas 1` asks
        after = await metrics.readiness(c)
    assert (after["ready"], after["stream_replicas"]) == (False, 1), after
    assert (
        f"stream {three.stream} has 1 replica(s); this process is set to 3 (CHRONICLE_STREAM_REPLICAS). Move it "
        "with `chronicle stream-replicas 3`, or set CHRONICLE_STREAM_REPLICAS=1"
    ) in after["reasons"], after
