"""A session erased by one process takes no write from another that wrote to it before (its
append chain, its ids and its data key cached): ``410 session_erased`` for every write, over HTTP
and over NATS, and no event after ``session.erased``. Real parts: a nats-server configured from
the settings, Postgres, and three service containers with nothing in memory shared: the eraser
(an API with the projector), a second API, and ``chronicle commands``' broker. Their key stores
poll erasures once an hour, so what refuses is each decision, not the poll."""

from __future__ import annotations

import contextlib
import json
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass

import httpx
import pytest
from nats.aio.client import Client as NatsClient

from events import log as eventlog
from projections.keystore import PgKeyStore
from services.api.app import build_app
from services.bootstrap import Container, open_container
from services.commands_nats.app import serving_commands
from services.settings import Settings
from tests.conftest import KEYS, running_stack, tenant_nats_settings
from tests.e2e.test_erasure import write_routes
from tests.integration.test_commands_nats import commands_on, connected, message, request
from tests.support import served


@pytest.fixture(scope="module", params=[True, False], ids=["sealed", "plain"])
def settings(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, pg_admin: str, s3_endpoint: str
) -> Iterator[Settings]:
    tmp = tmp_path_factory.mktemp("erase-across")
    with tenant_nats_settings(tmp, pg_admin, s3_endpoint, encryption=request.param) as s:
        yield s


@dataclass(frozen=True, slots=True)
class Processes:
    eraser: httpx.AsyncClient  # the API that erases (its container runs the projector)
    writer: httpx.AsyncClient  # another API
    nats: NatsClient  # tenant-a's connection: its commands are answered by a third container
    stack: Container  # the eraser's, to read the log


def no_poll(c: Container) -> None:
    """The container's writers learn no erasure from the key store's poll (one an hour)."""
    if isinstance(c.publisher.keys, PgKeyStore):
        c.publisher.keys._ttl = 3600.0


@pytest.fixture(scope="module")
async def processes(settings: Settings) -> AsyncIterator[Processes]:
    headers = {"Authorization": f"Bearer {KEYS['tenant-a']}"}
    async with contextlib.AsyncExitStack() as stack:
        eraser = await stack.enter_async_context(running_stack(settings))
        writer = await stack.enter_async_context(open_container(settings))
        commands = await stack.enter_async_context(open_container(settings))
        for c in (writer, commands):
            no_poll(c)
        await stack.enter_async_context(serving_commands(settings, commands))
        clients = []
        for c in (eraser, writer):
            url = await stack.enter_async_context(served(build_app(settings, c)))
            clients.append(
                await stack.enter_async_context(httpx.AsyncClient(base_url=url, headers=headers, timeout=30))
            )
        nc, _ = await stack.enter_async_context(connected(settings, "tenant-a"))
        yield Processes(clients[0], clients[1], nc, eraser)


async def written_by_both(p: Processes, settings: Settings) -> str:
    """A session the second API and the commands service have each appended to three times (each
    keeps a chain that knows the session's ids: its next append reads no read model), holding
    ``m0`` and ``m1``, and the blocks ``memory`` and ``notes`` (what the write routes and the
    commands of the tests' lists write to)."""
    sid = "s-" + uuid.uuid4().hex[:10]
    config = {"blocks": [{"label": label, "kind": "writable"} for label in ("memory", "notes")]}
    assert (await p.writer.put(f"/v1/sessions/{sid}/config", json=config)).status_code == 200
    for i in range(3):
        r = await p.writer.post(f"/v1/sessions/{sid}/messages", json={"message": message(f"m{i}")})
        assert r.status_code == 201, r.text
    for i in range(3, 6):
        status, body = await request(p.nats, settings, "append", {"session_id": sid, "message": message(f"m{i}")})
        assert status == 201, body
    return sid


async def last_event(p: Processes, settings: Settings, sid: str) -> int:
    return await eventlog.last_seq(p.stack.js, p.stack.layout, settings.layout().session_subject("tenant-a", sid))


async def erased(p: Processes, settings: Settings, sid: str) -> int:
    r = await p.eraser.post(f"/v1/sessions/{sid}:erase")
    assert r.status_code == 200, r.text
    seq = int(r.json()["seq"])
    assert await last_event(p, settings, sid) == seq
    return seq


async def test_appends_and_creates_over_nats_from_a_process_that_wrote_before_are_410(
    processes: Processes, settings: Settings
) -> None:
    """The outside-in trial's steps: the commands service wrote, another process erased."""
    sid = await written_by_both(processes, settings)
    seq = await erased(processes, settings, sid)
    answers = [
        await request(processes.nats, settings, "append", {"session_id": sid, "message": message("u2")}),
        await request(processes.nats, settings, "session.create", {"id": sid}),
        await request(processes.nats, settings, "append", {"session_id": sid, "message": message("u3")}),
    ]
    assert [(status, body.get("code")) for status, body in answers] == [(410, "session_erased")] * 3
    assert await last_event(processes, settings, sid) == seq


async def test_every_write_over_http_and_nats_from_the_processes_that_wrote_before_is_410(
    processes: Processes, settings: Settings
) -> None:
    sid = await written_by_both(processes, settings)
    seq = await erased(processes, settings, sid)
    answers = {}
    for method, path, body in [*write_routes(sid), ("POST", "/v1/sessions", {"id": sid})]:
        r = await processes.writer.request(method, path, json=body)
        answers[f"{method} {path}"] = (r.status_code, r.json().get("code"))
    commands = [("append", {"session_id": sid, "message": message("w1")}), *commands_on(sid)]
    for name, body in [*commands, ("session.create", {"id": sid})]:
        status, answer = await request(processes.nats, settings, name, body)
        answers[f"NATS {name}"] = (status, answer.get("code"))
    assert answers == dict.fromkeys(answers, (410, "session_erased"))
    assert await last_event(processes, settings, sid) == seq
    events = await processes.eraser.get(f"/v1/sessions/{sid}/events")
    last = json.loads(events.text.splitlines()[-1])
    assert (last["seq"], last["event"]["type"]) == (seq, "session.erased")


async def test_the_sdk_over_nats_hears_session_erased_after_another_process_erased(
    processes: Processes, settings: Settings
) -> None:
    """The trial itself: the SDK appends over NATS, erases over HTTP, then appends and creates."""
    from chronicle_sdk import ChronicleClient, ChronicleError, SessionManager

    sid = "s-" + uuid.uuid4().hex[:10]
    url, key = str(processes.eraser.base_url), KEYS["tenant-a"]
    async with (
        ChronicleClient(url, key) as h,
        ChronicleClient(url, key, nats_url=settings.nats_url, via="nats") as n,
    ):
        await SessionManager(n).append(sid, message("u1"))
        seq = await SessionManager(h).erase(sid)
        for write in (SessionManager(n).append(sid, message("u2")), SessionManager(n).create("x", id=sid)):
            with pytest.raises(ChronicleError) as info:
                await write
            assert (info.value.status, info.value.code) == (410, "session_erased")
    assert await last_event(processes, settings, sid) == seq


async def test_a_direct_publish_after_another_process_erased_writes_nothing(
    processes: Processes, settings: Settings
) -> None:
    """The SDK's direct path (chains published straight to JetStream) publishes its first event
    expecting the sequence it checked the session at, so nothing lands after ``session.erased``,
    whatever data key the client holds."""
    from chronicle_sdk import ChronicleClient, ChronicleError, SessionManager

    sid = "s-" + uuid.uuid4().hex[:10]
    url, key = str(processes.eraser.base_url), KEYS["tenant-a"]
    async with (
        ChronicleClient(url, key) as h,
        ChronicleClient(url, key, nats_url=settings.nats_url, append_via="jetstream") as d,
    ):
        await d.append_chain(sid, [message("u1"), message("u2")])  # its data key kept for the client's life
        seq = await SessionManager(h).erase(sid)
        with pytest.raises(ChronicleError) as info:
            await d.append_chain(sid, [message("u3"), message("u4")], "u2")
        assert (info.value.status, info.value.code) == (410, "session_erased"), info.value
    assert await last_event(processes, settings, sid) == seq
