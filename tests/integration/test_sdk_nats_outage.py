"""The SDK's NATS connection outlives an outage of NATS: during it, calls over NATS raise the SDK's
:class:`Unavailable` (never nats-py's own errors); after it, calls succeed again on the same client,
however long the outage was (nats-py gave up after 5 reconnects, ~10 s, and every later call raised
``ConnectionClosedError`` for the client's life). Real parts: a nats-server of the test's own
(stopped and started again on the same port and store), Postgres, a projector, the commands
service and the HTTP API on a port."""

from __future__ import annotations

import subprocess
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path

import pytest

from chronicle_sdk import ChronicleClient, Unavailable
from services.api.app import build_app
from services.commands_nats.app import serving_commands
from services.ops.localstack import free_port, start_nats
from services.ops.natsconf import NatsAccess
from services.settings import Settings
from tests.conftest import KEYS, make_settings, running_stack
from tests.integration.helpers import text_message
from tests.support import scratch_database, served

OLD_GIVE_UP_S = 12.0
"""Longer than nats-py took to give up with the SDK's old ``max_reconnect_attempts=5`` (2 s apart)."""


class Restartable:
    """A nats-server that the test stops and starts again (same port, same JetStream store)."""

    def __init__(self, tmp: Path, settings: Settings) -> None:
        self.tmp, self.settings = tmp, settings
        self.port = int(settings.nats_url.rsplit(":", 1)[1])
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        access = NatsAccess.of(self.settings)
        self.proc = start_nats(self.port, self.tmp / "nats", self.tmp / "nats.log", access)

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait(timeout=10)
            self.proc = None


@pytest.fixture
def server(tmp_path: Path, pg_admin: str, s3_endpoint: str) -> Iterator[Restartable]:
    with scratch_database(pg_admin) as db:
        url, prefix = f"nats://127.0.0.1:{free_port()}", f"c{uuid.uuid4().hex[:8]}.cmd"
        settings = make_settings(url, db, s3_endpoint=s3_endpoint, command_prefix=prefix)
        nats = Restartable(tmp_path, settings)
        nats.start()
        try:
            yield nats
        finally:
            nats.stop()


@pytest.fixture
async def api_url(server: Restartable) -> AsyncIterator[str]:
    settings = server.settings
    async with running_stack(settings) as c, serving_commands(settings, c), served(build_app(settings, c)) as url:
        yield url


def client(api_url: str, server: Restartable, path: str) -> ChronicleClient:
    """tenant-a's client, writing as NATS commands (``path="nats"``) or straight to JetStream."""
    return ChronicleClient(
        api_url,
        KEYS["tenant-a"],
        nats_url=server.settings.nats_url,
        via="nats" if path == "nats" else "http",
        append_via="jetstream" if path == "jetstream" else None,
        timeout_s=3.0,
        retries=2,
        max_backoff_s=0.5,
        retry_budget_s=0,  # each call during the outage fails after its two retries
    )


async def until_it_answers(call: Callable[[], Awaitable[None]], deadline_s: float = 60.0) -> None:
    """Call ``call()`` until it succeeds; every failure before must be :class:`Unavailable`."""
    end = time.monotonic() + deadline_s
    while True:
        try:
            await call()
            return
        except Unavailable:
            assert time.monotonic() < end, "the client never came back after NATS did"


@pytest.mark.parametrize("path", ["nats", "jetstream"])
async def test_calls_over_nats_raise_unavailable_during_an_outage_and_succeed_after_it(
    api_url: str, server: Restartable, path: str
) -> None:
    sid = f"outage-{uuid.uuid4().hex[:8]}"
    async with client(api_url, server, path) as c:

        async def write(mid: str, parent: str | None) -> None:
            """One message over the path under test (a NATS command, or published to JetStream)."""
            if path == "nats":
                await c.append(sid, text_message(mid, mid), parent)
            else:
                await c.append_chain(sid, [text_message(mid, mid)], parent_id=parent)

        await write("m0", None)
        server.stop()
        down_since = time.monotonic()
        tries = 0
        while time.monotonic() < down_since + OLD_GIVE_UP_S or tries < 3:
            tries += 1
            with pytest.raises(Unavailable):
                await write(f"d{tries}", "m0")
        server.start()
        await until_it_answers(lambda: write("m1", "m0"))
        history = await c.request("GET", f"/v1/sessions/{sid}/history", session=sid)
        assert [m["id"] for m in history["messages"]] == ["m0", "m1"]
