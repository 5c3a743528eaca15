"""NATS's ``max_payload`` bounds a message's headers and payload together, and a message over it is
a protocol error that closes the connection it came on, for good (nats-py checks the payload
alone, so it sends it). Chronicle's writers keep their events :data:`HEADER_ROOM` under it: the
largest one is stored with its headers, one past it is ``too_large`` and the connection stays
open. ``/healthz`` fails when the connection is closed all the same, so a liveness probe restarts
the process instead of leaving it to answer 503 to every write."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from events.admission import HEADER_ROOM, MAX_EVENT_BYTES, MAX_WRITTEN_BYTES, Refused
from events.catalog import ContextWritten
from events.omitted import OMITTED
from services.api.app import build_app
from services.bootstrap import open_container
from services.ops.localstack import free_port
from services.ops.natsconf import NatsAccess
from services.settings import UnusableSetting
from tests.conftest import make_settings, running_stack
from tests.integration.helpers import text_message
from tests.support import nats_server, served

T = "tenant-a"
LONGEST_ID = "e" * 128
"""The longest event id, as its ``Nats-Msg-Id`` header."""


def sized(session: str, size: int) -> ContextWritten:
    """A block write whose stored JSON is exactly ``size`` bytes, under the longest event id."""

    def event(content: str) -> ContextWritten:
        return ContextWritten(
            id=LONGEST_ID,
            tenant=T,
            session=session,
            label="notes",
            content=content,
            tokens=1,
            mode="replace",
            writer="api",
        )

    event_ = event("x" * (size - len(event("").to_json())))
    assert len(event_.to_json()) == size
    return event_


async def test_the_largest_event_a_writer_publishes_is_stored_with_both_headers(
    nats_url: str, fresh_db: str, new_id: Callable[[str], str]
) -> None:
    async with running_stack(make_settings(nats_url, fresh_db), projector=False) as c:
        session = new_id("big")
        published = await c.publisher.publish(sized(session, MAX_WRITTEN_BYTES), expected_last_subject_seq=0)
        stored = await c.js.get_msg(c.layout.stream, published.seq)
        assert len(stored.data or b"") == MAX_WRITTEN_BYTES
        assert stored.headers is not None
        assert set(stored.headers) >= {"Nats-Msg-Id", "Nats-Expected-Last-Subject-Sequence"}
        assert c.nc.is_connected


@pytest.mark.parametrize("size", [MAX_WRITTEN_BYTES + 1, MAX_EVENT_BYTES - HEADER_ROOM // 4, MAX_EVENT_BYTES])
async def test_an_event_that_fits_max_payload_only_without_its_headers_is_refused_and_the_connection_stays(
    nats_url: str, fresh_db: str, new_id: Callable[[str], str], size: int
) -> None:
    """The trial's case: a block write whose event was a few bytes under 1 MiB was sent, the
    server closed the API's connection, and every write of every tenant answered 503 after it."""
    async with running_stack(make_settings(nats_url, fresh_db), projector=False) as c:
        session = new_id("big")
        with pytest.raises(Refused) as refused:
            await c.publisher.publish(sized(session, size), expected_last_subject_seq=0)
        assert refused.value.reason == "too_large"
        assert f"more than the {MAX_WRITTEN_BYTES} an event may have" in str(refused.value)
        assert c.nc.is_connected
        after = await c.commands.append(T, session, text_message("m1", "still written"), OMITTED)
        assert after.seq > 0


async def test_healthz_fails_once_the_nats_connection_is_closed_for_good(nats_url: str, fresh_db: str) -> None:
    settings = make_settings(nats_url, fresh_db)
    async with (
        running_stack(settings, projector=False) as c,
        served(build_app(settings, c)) as url,
        httpx.AsyncClient(base_url=url, timeout=10) as http,
    ):
        assert (await http.get("/healthz")).json() == {"status": "ok"}
        await c.nc.close()  # as nats-py does after the server answers a protocol error
        answer = await http.get("/healthz")
        assert answer.status_code == 503
        assert answer.json()["status"] == "nats_closed"


async def test_a_nats_server_that_takes_smaller_messages_than_an_event_is_refused_at_start(
    tmp_path: Path, fresh_db: str
) -> None:
    """Writers bound events by 1 MiB less their headers: under a smaller ``max_payload`` an event
    within that bound would close the connection (nats-py checks the payload alone). Said at start."""
    port = free_port()
    settings = make_settings(f"nats://127.0.0.1:{port}", fresh_db)
    small = {"max_payload": 512 * 1024}
    refused = pytest.raises(UnusableSetting, match=r"takes messages of at most 524288 bytes \(max_payload\)")
    with nats_server(tmp_path, NatsAccess.of(settings), port=port, extra=small), refused:
        async with open_container(settings):
            pass
