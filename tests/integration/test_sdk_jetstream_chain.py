"""An SDK chain published straight to JetStream (``append_all(…, via="jetstream")``) that fails
says what of it is stored, as over HTTP: ``written`` (the acknowledged prefix, in chain order),
``failed_index`` and a message saying how to go on. Real parts: a nats-server configured for the
tenants, Postgres, a projector and the HTTP API on a port; the events stream is made full
(``max_msgs``, discarding new messages) so that it takes only the chain's first messages."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from nats.js.api import DiscardPolicy

from chronicle_sdk import ChronicleClient, ChronicleError, Unavailable
from services.api.app import build_app
from services.bootstrap import Container
from services.settings import Settings
from tests.conftest import KEYS, running_stack, tenant_nats_settings
from tests.integration.helpers import text_message
from tests.support import served


@pytest.fixture
def settings(tmp_path: Path, pg_admin: str, s3_endpoint: str) -> Iterator[Settings]:
    with tenant_nats_settings(tmp_path, pg_admin, s3_endpoint) as s:
        yield s


@pytest.fixture
async def stack(settings: Settings) -> AsyncIterator[tuple[Container, str]]:
    async with running_stack(settings) as c, served(build_app(settings, c)) as url:
        yield c, url


async def chain_error(stack: tuple[Container, str], settings: Settings, length: int, room: int) -> ChronicleError:
    """The error of a chain of ``length`` messages (``m0``, ``m1``, …) published to JetStream
    when the events stream takes ``room`` more messages and refuses every one after them."""
    c, url = stack
    chain = [text_message(f"m{i}", f"hello {i}") for i in range(length)]
    async with ChronicleClient(url, KEYS["tenant-a"], nats_url=settings.nats_url, append_via="jetstream") as sdk:
        await sdk.append_chain("s-other", [text_message("x", "x")], parent_id=None)  # the stream is not empty
        info = await c.js.stream_info(c.layout.stream)
        config = info.config
        config.max_msgs, config.discard = info.state.messages + room, DiscardPolicy.NEW
        await c.js.update_stream(config)
        with pytest.raises(ChronicleError) as caught:
            await sdk.append_chain("s-" + uuid.uuid4().hex[:10], chain, parent_id=None)
    return caught.value


async def test_a_jetstream_chain_that_fails_part_way_carries_written_and_failed_index(
    stack: tuple[Container, str], settings: Settings
) -> None:
    err = await chain_error(stack, settings, length=6, room=3)
    assert isinstance(err, Unavailable)
    assert err.failed_index == 3
    assert [w.id for w in err.written] == ["m0", "m1", "m2"]
    assert [w.parent_id for w in err.written] == [None, "m0", "m1"]
    assert "3 of the chain's 6 messages are stored" in str(err)
    assert "message 3 may be too; messages 4-5 were published with it and may be stored too" in str(err)
    assert "append_all(messages[3:], parent_id='m2')" in str(err)


async def test_a_jetstream_chain_whose_first_message_fails_says_nothing_is_stored(
    stack: tuple[Container, str], settings: Settings
) -> None:
    err = await chain_error(stack, settings, length=3, room=0)
    assert (err.failed_index, err.written) == (0, [])
    assert "0 of the chain's 3 messages are stored" in str(err)
