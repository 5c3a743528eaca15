"""A fork retried with its id completes and answers as the first call would: the copies an earlier
call did not publish are published (each once: its event id derives from the fork's id and what
it copies), a completed fork (its log holds the copy of ``at_message_id``, published last)
publishes nothing and answers the same whatever its source became, and an id that is not this
fork is ``409``."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
import pytest

from events import log as eventlog
from events.ids import derived_id
from events.publisher import HDR_MSG_ID
from services.api.app import build_app
from services.bootstrap import Container
from services.writes.commands import fork
from tests.conftest import KEYS
from tests.integration.test_compaction import T, _append_chain, _fork_overlay_id, _overlay, _view_ids
from tests.support import served

Logged = list[tuple[int, str, str | None]]


@pytest.fixture(scope="module")
async def http(stack: Container) -> AsyncIterator[httpx.AsyncClient]:
    """tenant-a over real HTTP: the API with the shared stack's container."""
    headers = {"Authorization": f"Bearer {KEYS[T]}"}
    async with (
        served(build_app(stack.settings, stack)) as url,
        httpx.AsyncClient(base_url=url, headers=headers, timeout=30) as client,
    ):
        yield client


async def logged(c: Container, sid: str) -> Logged:
    """The session's events in log order: sequence, type and event id."""
    subject = c.layout.session_subject(T, sid)
    return [
        (e.seq, json.loads(e.data)["type"], (e.headers or {}).get(HDR_MSG_ID))
        async for e in eventlog.read(c.js, c.layout, subject)
    ]


def types(events: Logged) -> list[str]:
    return [t for _, t, _ in events]


async def source(c: Container, new_id: Callable[[str], str]) -> str:
    """m0 → m1 → m2, with an overlay over m0..m1 in force on that path."""
    sid = new_id("fork-src")
    await _append_chain(c, sid, ["m0", "m1", "m2"])
    await _overlay(c, sid, "m0", "m1", "S")
    return sid


def request(at: str, fork_id: str, name: str | None = "What if") -> dict[str, Any]:
    return {"at_message_id": at, "id": fork_id, **({"name": name} if name is not None else {})}


async def cut_fork(c: Container, monkeypatch: pytest.MonkeyPatch, sid: str, fork_id: str, stored: int) -> None:
    """The first call of a fork at m2, whose publish of the copies fails (the connection to NATS
    lost, the process killed) after ``stored`` of them were stored."""
    publish_many = c.commands._pub.publish_many

    async def lost(events: Any, **kw: Any) -> Any:
        if stored:
            await publish_many(events[:stored], **kw)
        raise ConnectionError("the connection to NATS was lost")

    monkeypatch.setattr(c.commands._pub, "publish_many", lost)
    with pytest.raises(ConnectionError):
        await fork(c.commands, c.eraser, T, sid, "m2", fork_id, "What if")
    monkeypatch.undo()


async def forked(
    c: Container, http: httpx.AsyncClient, new_id: Callable[[str], str], label: str
) -> tuple[str, str, Any]:
    """A source, and its fork at m2 made in one go: their ids and the fork's answer."""
    sid, fork_id = await source(c, new_id), new_id(label)
    first = await http.post(f"/v1/sessions/{sid}/fork", json=request("m2", fork_id))
    assert first.status_code == 201, first.text
    return sid, fork_id, first.json()


COPIES = ["message.appended"] * 2 + ["compaction.recorded", "message.appended"]
"""A fork's copies in log order: the copy of ``at_message_id`` last, alone."""


@pytest.mark.parametrize("published", ["none", "some"])
async def test_a_fork_whose_copies_were_not_all_published_is_completed_by_its_retry(
    stack: Container,
    http: httpx.AsyncClient,
    new_id: Callable[[str], str],
    monkeypatch: pytest.MonkeyPatch,
    published: str,
) -> None:
    """The first call's publish of the copies fails (the connection to NATS lost, the process
    killed) after none or some of them were stored: the retry publishes the rest, none twice,
    and answers 201 as a fork made in one go does."""
    c = stack
    sid = await source(c, new_id)
    fork_id = new_id("fork-retried")
    await cut_fork(c, monkeypatch, sid, fork_id, 2 if published == "some" else 0)
    half = await logged(c, fork_id)
    assert types(half) == ["session.created"] + (["message.appended"] * 2 if published == "some" else [])

    r = await http.post(f"/v1/sessions/{sid}/fork", json=request("m2", fork_id))
    assert r.status_code == 201, r.text
    events = await logged(c, fork_id)
    assert events[: len(half)] == half
    assert types(events) == ["session.created", *COPIES]
    assert r.json() == {"id": fork_id, "parent_session_id": sid, "messages": 3, "seq": events[-1][0]}
    overlay = derived_id("fork", T, fork_id, "m0-m1-S")  # test_compaction's overlay id
    assert [i for _, _, i in events[1:]] == [
        *(derived_id("fork-message", T, fork_id, m) for m in ("m0", "m1")),
        overlay,
        derived_id("fork-message", T, fork_id, "m2"),
    ]
    await c.waiter.wait_all(events[-1][0], timeout_s=20)
    assert await _view_ids(c, fork_id) == [await _fork_overlay_id(c, fork_id), "m2"]
    assert await _view_ids(c, sid, "m2") == ["compaction_m0-m1-S", "m2"]
    session = (await http.get(f"/v1/sessions/{fork_id}")).json()
    made = (session["name"], session["parent_session_id"], session["metadata"])
    assert made == ("What if", sid, {"forked_from": "m2"})


@pytest.mark.parametrize("published", [0, 2])
async def test_a_fork_is_charged_the_copies_it_publishes_and_a_retry_only_what_it_still_publishes(
    stack: Container, new_id: Callable[[str], str], monkeypatch: pytest.MonkeyPatch, published: int
) -> None:
    """Under a request limit (services/requests/limits.py) a fork is charged every event past its
    first, once it has read its source: its copies, the overlay among them; a cut fork's retry
    publishes no creation, its first copy is the request's own token; a complete fork's retry
    publishes nothing and is charged nothing."""
    c = stack
    sid = await source(c, new_id)
    whole: list[int] = []
    whole_id = new_id("fork-charged")
    await fork(c.commands, c.eraser, T, sid, "m2", whole_id, "What if", whole.append)
    assert whole == [len(COPIES)]  # 3 messages and the overlay, past the new session's creation
    await fork(c.commands, c.eraser, T, sid, "m2", whole_id, "What if", whole.append)
    assert whole == [len(COPIES)]  # complete: answered from its log

    fork_id = new_id("fork-cut-charged")
    await cut_fork(c, monkeypatch, sid, fork_id, published)
    retried: list[int] = []
    await fork(c.commands, c.eraser, T, sid, "m2", fork_id, "What if", retried.append)
    assert retried == [len(COPIES) - published - 1]
    assert types(await logged(c, fork_id)) == ["session.created", *COPIES]


@pytest.mark.parametrize("name", ["What if", None], ids=["named", "unnamed"])
async def test_a_retry_of_a_completed_fork_answers_the_same_and_publishes_nothing(
    stack: Container, http: httpx.AsyncClient, new_id: Callable[[str], str], name: str | None
) -> None:
    """Even after a copy was deleted from the fork: what the fork's log holds was copied (the
    deleted message does not come back). A retry that gives no name is the same fork whatever
    name the first call gave."""
    c = stack
    sid = await source(c, new_id)
    fork_id = new_id("fork-done")
    first = await http.post(f"/v1/sessions/{sid}/fork", json=request("m2", fork_id))
    assert first.status_code == 201, first.text
    deleted = await http.request("DELETE", f"/v1/sessions/{fork_id}/messages", params={"ids": "m1"})
    assert deleted.status_code == 200, deleted.text
    before = await logged(c, fork_id)
    again = await http.post(f"/v1/sessions/{sid}/fork", json=request("m2", fork_id, name))
    assert (again.status_code, again.json()) == (201, first.json())
    assert await logged(c, fork_id) == before
    assert types(before) == ["session.created", *COPIES, "messages.deleted"]


async def test_a_retry_naming_a_session_that_is_not_that_fork_is_409_and_writes_nothing(
    stack: Container, http: httpx.AsyncClient, new_id: Callable[[str], str]
) -> None:
    c = stack
    sid, other = await source(c, new_id), await source(c, new_id)
    fork_id, plain, gone = new_id("fork-taken"), new_id("plain"), new_id("fork-deleted")
    assert (await http.post(f"/v1/sessions/{sid}/fork", json=request("m2", fork_id))).status_code == 201
    assert (await http.post("/v1/sessions", json={"id": plain, "name": "What if"})).status_code == 201
    assert (await http.post(f"/v1/sessions/{sid}/fork", json=request("m2", gone))).status_code == 201
    assert (await http.delete(f"/v1/sessions/{gone}")).status_code == 200
    attempts = [
        (sid, request("m1", fork_id)),  # another at_message_id
        (other, request("m2", fork_id)),  # another source
        (sid, request("m2", fork_id, "Another name")),
        (sid, request("m2", plain)),  # not a fork
        (sid, request("m2", gone)),  # this fork, deleted
    ]
    for target in (fork_id, plain, gone):
        before = await logged(c, target)
        for source_id, body in attempts:
            if body["id"] != target:
                continue
            r = await http.post(f"/v1/sessions/{source_id}/fork", json=body)
            assert r.status_code == 409, (body, r.text)
            assert r.json()["code"] == "session_exists"
        assert await logged(c, target) == before


async def test_two_calls_of_one_fork_at_once_make_it_once_and_answer_alike(
    stack: Container, new_id: Callable[[str], str]
) -> None:
    """A client's retry racing its first call (the first still running when the client gave up
    on it): one creates the session, the other finds it made; their copies are one set."""
    c = stack
    sid = await source(c, new_id)
    fork_id = new_id("fork-raced")
    one, two = await asyncio.gather(
        fork(c.commands, c.eraser, T, sid, "m2", fork_id, None),
        fork(c.commands, c.eraser, T, sid, "m2", fork_id, None),
    )
    assert one == two
    events = await logged(c, fork_id)
    assert types(events) == ["session.created", *COPIES]
    assert one.seq == events[-1][0]


async def test_a_retry_of_an_erased_fork_is_410_and_writes_nothing(
    stack: Container, http: httpx.AsyncClient, new_id: Callable[[str], str]
) -> None:
    c = stack
    sid, fork_id = await source(c, new_id), new_id("fork-erased")
    assert (await http.post(f"/v1/sessions/{sid}/fork", json=request("m2", fork_id))).status_code == 201
    assert (await http.post(f"/v1/sessions/{fork_id}:erase")).status_code == 200
    before = await logged(c, fork_id)
    r = await http.post(f"/v1/sessions/{sid}/fork", json=request("m2", fork_id))
    assert (r.status_code, r.json()["code"]) == (410, "session_erased")
    assert await logged(c, fork_id) == before


async def test_a_completed_fork_is_not_changed_by_what_its_source_became(
    stack: Container, http: httpx.AsyncClient, new_id: Callable[[str], str]
) -> None:
    """A retry of a completed fork answers from the fork's own log: a new overlay on the forked
    path is not copied into it, and its message or the whole source gone is no 404."""
    c = stack
    sid, fork_id, first = await forked(c, http, new_id, "fork-kept")
    before = await logged(c, fork_id)
    await _overlay(c, sid, "m0", "m2", "S2")  # in force on the forked path from now on
    assert await _view_ids(c, sid, "m2") == ["compaction_m0-m2-S2"]
    again = await http.post(f"/v1/sessions/{sid}/fork", json=request("m2", fork_id))
    assert (again.status_code, again.json()) == (201, first)
    assert await logged(c, fork_id) == before
    deleted = await http.request("DELETE", f"/v1/sessions/{sid}/messages", params={"ids": "m2"})
    assert deleted.status_code == 200, deleted.text
    again = await http.post(f"/v1/sessions/{sid}/fork", json=request("m2", fork_id))
    assert (again.status_code, again.json()) == (201, first)
    assert (await http.delete(f"/v1/sessions/{sid}")).status_code == 200
    again = await http.post(f"/v1/sessions/{sid}/fork", json=request("m2", fork_id))
    assert (again.status_code, again.json()) == (201, first)
    assert await logged(c, fork_id) == before
    await c.waiter.wait_all(before[-1][0], timeout_s=20)
    assert await _view_ids(c, fork_id) == [await _fork_overlay_id(c, fork_id), "m2"]


async def test_a_retry_completes_a_cut_fork_with_the_overlays_the_first_call_carried(
    stack: Container,
    http: httpx.AsyncClient,
    new_id: Callable[[str], str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The first call stopped after the new session: an overlay recorded on the source since is
    not the first call's, and is not copied."""
    c = stack
    sid = await source(c, new_id)
    fork_id = new_id("fork-cut")
    await cut_fork(c, monkeypatch, sid, fork_id, 0)
    await _overlay(c, sid, "m1", "m2", "S2")
    r = await http.post(f"/v1/sessions/{sid}/fork", json=request("m2", fork_id))
    assert r.status_code == 201, r.text
    events = await logged(c, fork_id)
    assert types(events) == ["session.created", *COPIES]
    assert events[3][2] == derived_id("fork", T, fork_id, "m0-m1-S")
    assert r.json()["seq"] == events[-1][0]


async def test_a_retry_of_a_cut_fork_whose_source_was_erased_erases_it_and_is_410(
    stack: Container,
    http: httpx.AsyncClient,
    new_id: Callable[[str], str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Its copies hold the source's content: they must not outlive the source's erasure."""
    c = stack
    sid = await source(c, new_id)
    fork_id = new_id("fork-orphan")
    await cut_fork(c, monkeypatch, sid, fork_id, 2)
    assert (await http.post(f"/v1/sessions/{sid}:erase")).status_code == 200
    r = await http.post(f"/v1/sessions/{sid}/fork", json=request("m2", fork_id))
    assert (r.status_code, r.json()["code"]) == (410, "session_erased")
    events = await logged(c, fork_id)
    assert types(events)[-1] == "session.erased"
    await c.waiter.wait_all(events[-1][0], timeout_s=20)  # the fork's erasure answers before it is applied
    assert (await http.get(f"/v1/sessions/{fork_id}")).status_code == 410  # erased, as its reads say


async def test_a_retry_reads_the_fork_s_log_only_as_far_as_its_copies(
    stack: Container, http: httpx.AsyncClient, new_id: Callable[[str], str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The writes to the fork since are not read again on every retry."""
    c = stack
    sid, fork_id, first = await forked(c, http, new_id, "fork-busy")
    await _append_chain(c, fork_id, [f"later{i}" for i in range(40)])
    await _overlay(c, sid, "m0", "m2", "S2")  # a copy the fork lacks: no reason to read further
    read, delivered = eventlog.read, []

    async def counted(*args: Any, **kw: Any) -> Any:
        async for stored in read(*args, **kw):
            delivered.append(stored.seq)
            yield stored

    monkeypatch.setattr(eventlog, "read", counted)
    again = await http.post(f"/v1/sessions/{sid}/fork", json=request("m2", fork_id))
    assert again.status_code == 201, again.text
    assert len(delivered) == 1 + len(COPIES)
    assert again.json() == first


async def test_a_retry_whose_log_read_stops_is_503_unavailable(
    stack: Container, http: httpx.AsyncClient, new_id: Callable[[str], str], monkeypatch: pytest.MonkeyPatch
) -> None:
    c = stack
    sid, fork_id, _ = await forked(c, http, new_id, "fork-stalled")
    before = await logged(c, fork_id)

    async def stalled(*args: Any, **kw: Any) -> Any:
        raise TimeoutError("the event stream stopped delivering before the end")
        yield  # an async generator, as the reader

    monkeypatch.setattr(eventlog, "read", stalled)
    r = await http.post(f"/v1/sessions/{sid}/fork", json=request("m2", fork_id))
    monkeypatch.undo()
    assert (r.status_code, r.json()["code"]) == (503, "unavailable")
    assert await logged(c, fork_id) == before
