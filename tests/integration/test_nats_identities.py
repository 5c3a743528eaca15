"""The trust boundary on NATS: the server Chronicle generates lets a tenant publish its own events
and nothing else; only the operator identity uses the JetStream API; nobody connects anonymously."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import nats
import nats.errors
import pytest
from nats.aio.client import Client as NatsClient
from nats.js.api import ConsumerConfig

from events.catalog import SessionCreated
from events.credentials import tenant_inbox_prefix, tenant_nkey_seed
from events.stream import ensure_stream
from services.ops.localstack import free_port
from services.ops.natsconf import NatsAccess
from services.settings import Settings
from tests.conftest import KEYS, OPERATOR_SEED, make_settings, operator_nats
from tests.support import nats_handshake, nats_server

Violations = list[str]


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return make_settings(f"nats://127.0.0.1:{free_port()}", "postgresql://unused/none")


@pytest.fixture
async def server(settings: Settings, tmp_path: Path) -> AsyncIterator[str]:
    port = int(settings.nats_url.rsplit(":", 1)[1])
    with nats_server(tmp_path, NatsAccess.of(settings), port=port) as url:
        nc = await operator_nats(url)
        await ensure_stream(nc.jetstream(), settings.layout())
        await nc.close()
        yield url


@contextlib.asynccontextmanager
async def as_tenant(url: str, tenant: str) -> AsyncIterator[tuple[NatsClient, Violations]]:
    """Connected with ``tenant``'s credentials; the server's permission errors are collected."""
    violations: Violations = []

    async def on_error(exc: Exception) -> None:
        violations.append(str(exc).lower())

    nc = await nats.connect(
        url,
        nkeys_seed_str=tenant_nkey_seed(KEYS[tenant]),
        inbox_prefix=tenant_inbox_prefix(tenant),
        error_cb=on_error,
        allow_reconnect=False,
    )
    try:
        yield nc, violations
    finally:
        await nc.close()


async def refused(violations: Violations, subject: str, attempt: Callable[[], Awaitable[object]]) -> None:
    """``attempt`` fails, and the server says it was a permissions violation on ``subject``."""
    with pytest.raises((nats.errors.TimeoutError, nats.errors.NoRespondersError, nats.errors.Error, TimeoutError)):
        await attempt()
    for _ in range(100):
        if any("permissions violation" in v and subject.lower() in v for v in violations):
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"no permissions violation for {subject!r}: {violations}")


def created(settings: Settings, tenant: str, session: str) -> tuple[str, bytes]:
    event = SessionCreated(tenant=tenant, session=session, name="x")
    return settings.layout().session_subject(tenant, session), event.to_json()


async def stream_messages(url: str, settings: Settings) -> int:
    nc = await operator_nats(url)
    try:
        return int((await nc.jetstream().stream_info(settings.stream)).state.messages)
    finally:
        await nc.close()


async def test_nobody_connects_anonymously_or_with_an_unknown_key(server: str) -> None:
    assert await nats_handshake(server, None) == "-ERR 'Authorization Violation'"
    assert await nats_handshake(server, tenant_nkey_seed("not-a-key-of-this-stack")) == "-ERR 'Authorization Violation'"
    assert await nats_handshake(server, tenant_nkey_seed(KEYS["tenant-a"])) == "PONG"
    assert await nats_handshake(server, OPERATOR_SEED) == "PONG"


async def test_a_tenant_publishes_its_own_events_and_gets_the_ack(server: str, settings: Settings) -> None:
    subject, data = created(settings, "tenant-a", "s-" + uuid.uuid4().hex[:8])
    async with as_tenant(server, "tenant-a") as (nc, violations):
        ack = await nc.jetstream().publish(subject, data, stream=settings.stream, timeout=5)
        single = ack.seq
        bulk = await (await nc.jetstream().publish_async(subject, data, stream=settings.stream))
    assert bulk.seq == single + 1
    assert violations == []


async def test_a_tenant_cannot_publish_on_another_tenants_subjects(server: str, settings: Settings) -> None:
    before = await stream_messages(server, settings)
    subject, data = created(settings, "tenant-b", "s-" + uuid.uuid4().hex[:8])
    forged, _ = created(settings, "tenant-a", "s-x")  # tenant-a's layout, but a subject outside it
    outside = forged.rsplit(".", 2)[0] + ".not-a-partition.s-x"
    async with as_tenant(server, "tenant-a") as (nc, violations):
        js = nc.jetstream(timeout=1)
        await refused(violations, subject, lambda: js.publish(subject, data, stream=settings.stream, timeout=1))
        await refused(violations, outside, lambda: js.publish(outside, data, timeout=1))
    assert await stream_messages(server, settings) == before


async def test_a_tenant_cannot_request_compaction_work(server: str, settings: Settings) -> None:
    """The work-queue stream is the operator's: a tenant can neither publish a request nor take one."""
    layout = settings.layout()
    subject = layout.work_subject("compaction", "tenant-a", "s-1")
    async with as_tenant(server, "tenant-a") as (nc, violations):
        js = nc.jetstream(timeout=1)
        await refused(violations, subject, lambda: js.publish(subject, b"{}", timeout=1))
        api = f"$JS.API.CONSUMER.INFO.{layout.work_stream}"
        await refused(violations, api, lambda: js.consumer_info(layout.work_stream, settings.compaction_queue))
    nc = await operator_nats(server)
    try:
        assert (await nc.jetstream().stream_info(layout.work_stream)).state.messages == 0
    finally:
        await nc.close()


async def test_a_tenant_cannot_send_or_flood_the_operators_commands_ping(server: str, settings: Settings) -> None:
    """Readiness pings ``chronicle commands`` on a subject of the operator's (services/api/metrics.py):
    no tenant token can name it, so no tenant may publish there, with or without a reply subject."""
    ping = settings.layout().commands_ping
    operator = await operator_nats(server)
    try:
        heard = await operator.subscribe(ping)
        await operator.flush()
        async with as_tenant(server, "tenant-a") as (nc, violations):
            await refused(violations, ping, lambda: nc.request(ping, b"", timeout=1))
            await nc.publish(ping, b"flood")
            await nc.flush()
        await operator.publish(ping, b"the operator's")  # the subscription hears what reaches it
        msg = await heard.next_msg(timeout=5)
        assert msg.data == b"the operator's"
    finally:
        await operator.close()


async def test_a_tenant_cannot_delete_or_change_the_stream(server: str, settings: Settings) -> None:
    async with as_tenant(server, "tenant-a") as (nc, violations):
        js = nc.jetstream(timeout=1)
        api = f"$JS.API.STREAM.DELETE.{settings.stream}"
        await refused(violations, api, lambda: js.delete_stream(settings.stream))
        await refused(violations, "$JS.API.STREAM.PURGE", lambda: js.purge_stream(settings.stream))
        await refused(violations, "$JS.API.STREAM.INFO", lambda: js.stream_info(settings.stream))
    nc = await operator_nats(server)
    try:
        info = await nc.jetstream().stream_info(settings.stream)
        assert info.config.deny_delete
        assert info.config.deny_purge
    finally:
        await nc.close()


async def test_a_tenant_cannot_read_the_log(server: str, settings: Settings) -> None:
    subject, data = created(settings, "tenant-b", "s-" + uuid.uuid4().hex[:8])
    nc = await operator_nats(server)
    await nc.jetstream().publish(subject, data, stream=settings.stream)
    await nc.close()
    async with as_tenant(server, "tenant-a") as (tnc, violations):
        js = tnc.jetstream(timeout=1)
        durable = ConsumerConfig(durable_name="snoop")
        await refused(
            violations, "$JS.API.CONSUMER.DURABLE.CREATE", lambda: js.add_consumer(settings.stream, durable, timeout=1)
        )
        await refused(
            violations,
            "$JS.API.DIRECT.GET",
            lambda: js.get_last_msg(settings.stream, subject, direct=True),
        )
        # a plain subscription to the event subjects, or to other clients' inboxes, is denied
        for pattern in (settings.layout().wildcard, "_INBOX.>", "$JS.API.>"):
            await tnc.subscribe(pattern)
            await tnc.flush()
            for _ in range(100):
                if any("permissions violation for subscription" in v and pattern.lower() in v for v in violations):
                    break
                await asyncio.sleep(0.02)
            else:
                raise AssertionError(f"subscribing to {pattern!r} was not refused: {violations}")
