"""A fork racing an erasure is not reported made. Of its new session: its copies land after
``session.erased`` (tombstones), so the fork answers ``410 session_erased`` rather than ``201``
with a session that never holds them. Of its source: the copies (under the fork's own key) would
keep the erased content readable, so the fork is erased too and answers ``410``."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable

import pytest

from events import log as eventlog
from events.omitted import OMITTED
from projections import queries
from services.bootstrap import Container, open_container
from services.errors import ErasedSession
from services.writes.commands import FORK_REQUESTER, Commands, WriteReceipt, fork
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


def erase_after_creating(monkeypatch: pytest.MonkeyPatch, other: Container, victim: str) -> None:
    """The fork's creation of its new session is followed by ``other``'s erasure of ``victim``
    (another process's request, in the window before the copies)."""
    create = Commands.create_session

    async def create_then_erase(self: Commands, tenant: str, *args: object) -> WriteReceipt:
        created = await create(self, tenant, *args)  # type: ignore[arg-type]
        await other.eraser.erase_session(tenant, victim)
        return created

    monkeypatch.setattr(Commands, "create_session", create_then_erase)


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
    erase_after_creating(monkeypatch, other, fork_id)
    with pytest.raises(ErasedSession):
        await fork(c.commands, c.eraser, T, sid, "m1", fork_id, None)
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
    forked = await fork(c.commands, c.eraser, T, sid, "m1", new_id("fork-kept"), None)
    assert forked.messages == 2
    await other.eraser.erase_session(T, forked.id)
    types = await types_on(c, forked.id)
    assert types == ["session.created", "message.appended", "message.appended", "session.erased"]


async def test_a_fork_whose_source_is_erased_while_it_is_made_is_erased_and_410(
    two_processes: tuple[Container, Container], new_id: Callable[[str], str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The trial's leak: forks racing the source's erasure answered 201 and their history showed
    the erased text. The source's erasure is recorded between the fork's read of it and its
    copies (another process); the fork's copies are published, then the fork is erased."""
    c, other = two_processes
    sid = await source_of_two(c, new_id)
    fork_id = new_id("fork-of-erased")
    erase_after_creating(monkeypatch, other, sid)
    with pytest.raises(ErasedSession, match="the fork is erased too"):
        await fork(c.commands, c.eraser, T, sid, "m1", fork_id, None)
    monkeypatch.undo()
    types = await types_on(c, fork_id)
    assert types[-1] == "session.erased"
    assert types.count("message.appended") == 2  # published, then erased: tombstones from here on
    async with c.pool.connection() as conn:
        cur = await conn.execute(
            "SELECT requested_by, reason FROM erasures WHERE tenant = %s AND session_id = %s", (T, fork_id)
        )
        assert await cur.fetchone() == (
            FORK_REQUESTER,
            f"its source session {sid!r} was erased while the fork was being made",
        )
        await c.waiter.wait_all(await other.publisher.last_subject_seq(T, fork_id), timeout_s=20)
        assert await queries.get_session(conn, T, fork_id) is None
        assert await queries.history(conn, T, fork_id, "m1") == []
