"""A fork racing an erasure is not reported made. Of its new session: its copies land after
``session.erased`` (tombstones), so the fork answers ``410 session_erased`` rather than ``201``
with a session that never holds them. Of its source: the copies (under the fork's own key) would
keep the erased content readable, so the fork is erased too and answers ``410``."""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from events import log as eventlog
from events.ids import TENANT_SCOPE
from events.omitted import OMITTED
from projections import queries
from services.bootstrap import Container, open_container
from services.errors import ErasedSession
from services.writes.commands import FORK_REQUESTER, Commands, WriteReceipt, fork
from services.writes.erasure import Eraser, Erasure
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

    async def create_then_erase(self: Commands, tenant: str, *args: object, **kwargs: object) -> WriteReceipt:
        created = await create(self, tenant, *args, **kwargs)  # type: ignore[arg-type]
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


def erase_after_copying(monkeypatch: pytest.MonkeyPatch, c: Container, other: Container, victim: str) -> None:
    """The fork's copies are followed by ``other``'s erasure of ``victim`` (in the window before
    the check that follows them)."""
    publish_many = c.commands._pub.publish_many

    async def publish_then_erase(events: Any, **kw: Any) -> Any:
        published = await publish_many(events, **kw)
        await other.eraser.erase_session(T, victim)
        return published

    monkeypatch.setattr(c.commands._pub, "publish_many", publish_then_erase)


@pytest.mark.parametrize("window", ["before-the-copies", "after-the-copies"])
async def test_a_fork_whose_source_is_erased_while_it_is_made_is_erased_and_410(
    two_processes: tuple[Container, Container],
    new_id: Callable[[str], str],
    monkeypatch: pytest.MonkeyPatch,
    window: str,
) -> None:
    """The trial's leak: forks racing the source's erasure answered 201 and their history showed
    the erased text. The source's erasure is recorded (another process) after the fork's read of
    it: before its copies (none is published) or after them (they are, then erased with the
    fork). Either way the fork is erased and answers 410."""
    c, other = two_processes
    sid = await source_of_two(c, new_id)
    fork_id = new_id("fork-of-erased")
    if window == "before-the-copies":
        erase_after_creating(monkeypatch, other, sid)
    else:
        erase_after_copying(monkeypatch, c, other, sid)
    with pytest.raises(ErasedSession, match="the fork is erased too"):
        await fork(c.commands, c.eraser, T, sid, "m1", fork_id, None)
    monkeypatch.undo()
    types = await types_on(c, fork_id)
    assert types[-1] == "session.erased"
    copies = 0 if window == "before-the-copies" else 2  # published, then erased: tombstones from then on
    assert types.count("message.appended") == copies
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


async def test_a_tenant_erasure_erases_a_session_made_while_it_runs(
    two_processes: tuple[Container, Container], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A fork made (here: a session created) after the erasure listed the tenant's sessions and
    before it ended is erased too: the sessions are listed again until none is left."""
    c, other = two_processes
    tenant = f"t-{uuid.uuid4().hex[:10]}"
    first = await c.commands.append(tenant, "first", message("m0"), OMITTED)
    await c.waiter.wait_all(first.seq, timeout_s=20)  # listed from the read model
    erase = Eraser.erase_session
    made: list[str] = []

    async def erase_and_meanwhile(self: Eraser, t: str, session: str, **kw: Any) -> Erasure:
        if not made:  # while the first round runs, the tenant makes another session
            made.append("late")
            late = await c.commands.append(t, "late", message("m0"), OMITTED)
            await c.waiter.wait_all(late.seq, timeout_s=20)
        return await erase(self, t, session, **kw)

    monkeypatch.setattr(Eraser, "erase_session", erase_and_meanwhile)
    done = await other.eraser.erase_tenant(tenant)
    assert {e.session for e in done} == {"first", "late", TENANT_SCOPE}
    async with c.pool.connection() as conn:
        cur = await conn.execute("SELECT session_id FROM erasures WHERE tenant = %s ORDER BY 1", (tenant,))
        assert [r[0] for r in await cur.fetchall()] == sorted(["first", "late", TENANT_SCOPE])


async def test_the_fork_of_an_erased_source_is_erased_through_a_failing_erasure(
    two_processes: tuple[Container, Container],
    new_id: Callable[[str], str],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The fork's erasure fails twice (NATS away for a moment, say) and is tried again: the fork
    does not stay live with the erased content. One that never succeeds is raised and logged."""
    c, other = two_processes
    sid = await source_of_two(c, new_id)
    fork_id = new_id("fork-retried")
    erase_after_creating(monkeypatch, other, sid)
    erase = Eraser.erase_session
    failures = {fork_id: 2}

    async def flaky(self: Eraser, t: str, session: str, **kw: Any) -> Erasure:
        if failures.get(session, 0) > 0:
            failures[session] -= 1
            raise ConnectionError("NATS away for a moment")
        return await erase(self, t, session, **kw)

    monkeypatch.setattr(Eraser, "erase_session", flaky)
    with pytest.raises(ErasedSession, match="the fork is erased too"):
        await fork(c.commands, c.eraser, T, sid, "m1", fork_id, None)
    assert failures[fork_id] == 0
    assert (await types_on(c, fork_id))[-1] == "session.erased"

    sid = await source_of_two(c, new_id)
    never = new_id("fork-never-erased")
    erase_after_creating(monkeypatch, other, sid)
    failures[never] = 99
    with pytest.raises(ConnectionError):
        await fork(c.commands, c.eraser, T, sid, "m1", never, None)
    assert f"the fork {never!r} of the erased session {sid!r} could not be erased: erase it" in caplog.text
