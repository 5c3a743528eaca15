"""A fork whose new session is erased while its messages are being copied is not reported made:
its copies land after ``session.erased`` (tombstones), so the fork answers ``410 session_erased``
rather than ``201`` with a session that never holds them."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable

import pytest

from events import log as eventlog
from events.omitted import OMITTED
from services.bootstrap import Container, open_container
from services.errors import ErasedSession
from services.writes.commands import Commands, WriteReceipt, fork
from tests.conftest import make_settings, running_stack
from tests.integration.test_erasure_across_processes import no_poll

T = "tenant-a"


def message(mid: str) -> dict[str, object]:
    return {"id": mid, "role": "user", "parts": [{"type": "text", "text": f"hello {mid}"}]}


async def types_on(c: Container, sid: str) -> list[str]:
    """The types of the session's events, in log order."""
    return [json.loads(e.data)["type"] async for e in eventlog.read(c.js, c.layout, c.layout.session_subject(T, sid))]


async def source_of_two(c: Container, new_id: Callable[[str], str]) -> str:
    sid = new_id("fork-src")
    for mid in ("m0", "m1"):
        await c.commands.append(T, sid, message(mid), OMITTED)
    return sid


@pytest.fixture(scope="module")
async def two_processes(nats_url: str, db_url: str) -> AsyncIterator[tuple[Container, Container]]:
    """An API process's container that forks, and another process's stack that erases and runs
    the projector (as ``chronicle up`` runs them apart): the forker's key store learns of no
    erasure from its hourly poll, so its own publishes do not refuse."""
    settings = make_settings(nats_url, db_url)
    async with running_stack(settings) as eraser, open_container(settings) as forker:
        no_poll(forker)
        yield forker, eraser


async def test_a_fork_erased_between_its_creation_and_its_copies_is_410(
    two_processes: tuple[Container, Container], new_id: Callable[[str], str], monkeypatch: pytest.MonkeyPatch
) -> None:
    c, other = two_processes
    sid = await source_of_two(c, new_id)
    fork_id = new_id("fork-erased")
    create = Commands.create_session

    async def create_then_erased(self: Commands, tenant: str, *args: object) -> WriteReceipt:
        created = await create(self, tenant, *args)  # type: ignore[arg-type]
        await other.eraser.erase_session(tenant, fork_id)  # another process, in the window
        return created

    monkeypatch.setattr(Commands, "create_session", create_then_erased)
    with pytest.raises(ErasedSession):
        await fork(c.commands, T, sid, "m1", fork_id, None)
    monkeypatch.undo()
    types = await types_on(c, fork_id)
    assert types[:2] == ["session.created", "session.erased"]  # the copies came after the erasure
    assert types.count("message.appended") == 2


async def test_a_fork_erased_after_its_copies_is_made_and_then_erased(
    two_processes: tuple[Container, Container], new_id: Callable[[str], str]
) -> None:
    """The check after the copies refuses only an erasure that preceded some of them."""
    c, other = two_processes
    sid = await source_of_two(c, new_id)
    forked = await fork(c.commands, T, sid, "m1", new_id("fork-kept"), None)
    assert forked.messages == 2
    await other.eraser.erase_session(T, forked.id)
    types = await types_on(c, forked.id)
    assert types == ["session.created", "message.appended", "message.appended", "session.erased"]
