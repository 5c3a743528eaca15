"""``GET /v1/sessions/{sid}/events?follow=true``: a session's events as they are stored (the
reference broadcasts a session's changes to its clients; here a client follows the log). Real
HTTP (the API served by uvicorn), real NATS and Postgres, encryption on: keys are made while a
client follows."""

from __future__ import annotations

import asyncio
import contextlib
import json
import uuid
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from events import log as eventlog
from events.omitted import OMITTED
from services.api import following
from services.api.app import build_app
from services.bootstrap import Container
from services.settings import Settings
from tests.conftest import KEYS, READ_ONLY_KEY, make_settings, running_stack
from tests.integration.helpers import text_message
from tests.support import served

T = "tenant-a"
PER_TENANT = 2


@pytest.fixture(scope="module")
def settings(nats_url: str, db_url: str, s3_endpoint: str) -> Settings:
    return make_settings(
        nats_url, db_url, s3_endpoint=s3_endpoint, encryption=True, follow_streams_per_tenant=PER_TENANT
    )


@pytest.fixture(scope="module")
async def stack(settings: Settings) -> AsyncIterator[Container]:
    async with running_stack(settings) as c:
        yield c


@pytest.fixture
def app(settings: Settings, stack: Container) -> FastAPI:
    return build_app(settings, stack)


@pytest.fixture
async def client(app: FastAPI) -> AsyncIterator[httpx.AsyncClient]:
    async with (
        served(app) as url,
        httpx.AsyncClient(base_url=url, headers={"Authorization": f"Bearer {KEYS[T]}"}, timeout=30) as http,
    ):
        yield http


def new_sid() -> str:
    return "f-" + uuid.uuid4().hex[:12]


class Follower:
    """An open followed answer, read line by line in the background."""

    def __init__(self, response: httpx.Response) -> None:
        self.response = response
        self.lines: asyncio.Queue[str | None] = asyncio.Queue()
        self.task = asyncio.create_task(self._read())

    async def _read(self) -> None:
        async for line in self.response.aiter_lines():
            await self.lines.put(line)
        await self.lines.put(None)  # the answer ended

    async def next(self, timeout: float = 20) -> dict[str, Any] | None:
        """The next record (keep-alives skipped); None when the answer ended."""
        while True:
            line = await asyncio.wait_for(self.lines.get(), timeout)
            if line is None:
                return None
            if line.strip():
                record: dict[str, Any] = json.loads(line)
                return record

    async def ended(self, timeout: float = 20) -> bool:
        return await self.next(timeout) is None


@pytest.fixture
async def follow(client: httpx.AsyncClient) -> AsyncIterator[Any]:
    opened: list[tuple[Any, Follower]] = []

    async def open_follow(sid: str, **params: Any) -> Follower:
        streaming = client.stream("GET", f"/v1/sessions/{sid}/events", params={"follow": "true", **params})
        response = await streaming.__aenter__()
        assert response.status_code == 200, await response.aread()
        assert response.headers["content-type"].startswith("application/x-ndjson")
        follower = Follower(response)
        opened.append((streaming, follower))
        return follower

    yield open_follow
    for streaming, follower in opened:
        follower.task.cancel()
        await streaming.__aexit__(None, None, None)


async def test_a_follower_gets_the_stored_events_then_each_new_one_as_it_is_stored(
    stack: Container, follow: Any
) -> None:
    sid = new_sid()
    first = await stack.commands.append(T, sid, text_message("m1", "before the follower"), OMITTED)
    follower = await follow(sid)
    got = await follower.next()
    assert got is not None
    assert (got["seq"], got["event"]["type"], got["event"]["message"]["id"]) == (first.seq, "message.appended", "m1")
    second = await stack.commands.append(T, sid, text_message("m2", "while it follows"), OMITTED)
    got = await follower.next()
    assert got is not None
    assert (got["seq"], got["event"]["message"]["parts"][0]["text"]) == (second.seq, "while it follows")
    assert got["event"]["parent_id"] == "m1"


async def test_a_session_made_while_followed_is_read_with_its_new_key(stack: Container, follow: Any) -> None:
    sid = new_sid()
    follower = await follow(sid)  # no session, no key yet
    await stack.commands.create_session(T, sid, "a secret name", None, {})
    got = await follower.next()
    assert got is not None
    assert got["event"]["type"] == "session.created"
    assert got["event"]["name"] == "a secret name"  # opened: the key made after the answer began was loaded
    assert "sealed" not in got["event"]


async def test_from_seq_and_to_seq_bound_what_is_sent_and_to_seq_ends_the_answer(stack: Container, follow: Any) -> None:
    sid = new_sid()
    seqs = [(await stack.commands.append(T, sid, text_message(f"m{i}", f"turn {i}"), OMITTED)).seq for i in range(2)]
    follower = await follow(sid, from_seq=seqs[1], to_seq=seqs[1] + 1_000_000)
    got = await follower.next()
    assert got is not None
    assert got["seq"] == seqs[1]
    waited = await follow(sid, from_seq=seqs[1] + 1, to_seq=seqs[1] + 1)  # nothing there yet: it waits
    third = await stack.commands.append(T, sid, text_message("m2", "turn 2"), OMITTED)
    got = await waited.next()
    assert got is not None
    assert got["event"]["message"]["id"] == "m2"
    assert third.seq == seqs[1] + 1  # nothing else writes to this stream meanwhile
    assert await waited.ended()  # to_seq was sent: the answer ended


async def test_limit_ends_the_answer(stack: Container, follow: Any) -> None:
    sid = new_sid()
    follower = await follow(sid, limit=1)
    await stack.commands.append(T, sid, text_message("m1", "one"), OMITTED)
    got = await follower.next()
    assert got is not None
    assert got["event"]["message"]["id"] == "m1"
    assert await follower.ended()


async def test_a_deletion_is_sent_and_ends_the_answer(stack: Container, follow: Any) -> None:
    sid = new_sid()
    await stack.commands.append(T, sid, text_message("m1", "soon gone"), OMITTED)
    follower = await follow(sid)
    assert (await follower.next()) is not None
    deleted = await stack.commands.delete_session(T, sid)
    got = await follower.next()
    assert got is not None
    assert (got["seq"], got["event"]["type"]) == (deleted.seq, "session.deleted")
    assert await follower.ended()


async def test_an_erasure_ends_the_answer_and_nothing_of_the_session_is_shown(
    client: httpx.AsyncClient, stack: Container, follow: Any
) -> None:
    sid = new_sid()
    await stack.commands.append(T, sid, text_message("m1", "private words"), OMITTED)
    follower = await follow(sid)
    assert (await follower.next()) is not None
    r = await client.post(f"/v1/sessions/{sid}:erase")
    assert r.status_code == 200, r.text
    got = await follower.next()
    assert got is not None
    assert got["seq"] == r.json()["seq"]
    assert "private words" not in json.dumps(got)
    assert await follower.ended()


async def test_a_silent_answer_sends_keep_alive_blank_lines(
    stack: Container, client: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(following, "TICK_S", 0.05)
    monkeypatch.setattr(following, "KEEPALIVE_S", 0.2)
    sid = new_sid()
    async with client.stream("GET", f"/v1/sessions/{sid}/events", params={"follow": "true"}) as r:
        assert r.status_code == 200
        lines = r.aiter_lines()
        assert await asyncio.wait_for(anext(lines), 10) == ""  # nothing stored: a keep-alive came
        await stack.commands.append(T, sid, text_message("m1", "after the silence"), OMITTED)
        while (line := await asyncio.wait_for(anext(lines), 10)) == "":
            pass
        assert json.loads(line)["event"]["message"]["id"] == "m1"


async def test_a_tenant_past_its_open_answers_gets_429_and_a_slot_comes_back_when_one_closes(
    client: httpx.AsyncClient, stack: Container, follow: Any
) -> None:
    sid = new_sid()
    await stack.commands.append(T, sid, text_message("m1", "something to send"), OMITTED)
    followers = [await follow(sid) for _ in range(PER_TENANT)]
    for follower in followers:  # each answer is sending: it counts
        assert await follower.next() is not None
    refused = await client.get(f"/v1/sessions/{sid}/events", params={"follow": "true"})
    assert refused.status_code == 429, refused.text
    assert refused.json()["code"] == "too_many_streams"
    other = httpx.AsyncClient(
        base_url=str(client.base_url), headers={"Authorization": f"Bearer {KEYS['tenant-b']}"}, timeout=30
    )
    async with other, other.stream("GET", f"/v1/sessions/{sid}/events", params={"follow": "true"}) as r:
        assert r.status_code == 200  # another tenant's answers are counted apart
    followers[0].task.cancel()
    await followers[0].response.aclose()
    for _ in range(200):  # the server sees the client leave, then frees the slot
        async with client.stream("GET", f"/v1/sessions/{sid}/events", params={"follow": "true"}) as again:
            if again.status_code == 200:
                break
        await asyncio.sleep(0.05)
    else:
        raise AssertionError("the closed answer's slot never came back")


async def test_a_tenants_read_only_keys_follow_with_slots_of_their_own(
    client: httpx.AsyncClient, stack: Container, follow: Any
) -> None:
    sid = new_sid()
    await stack.commands.append(T, sid, text_message("m1", "something to send"), OMITTED)
    for _ in range(200):  # an earlier test's answers, closed by its teardown, have given their slots back
        if not following.open_answers(T):
            break
        await asyncio.sleep(0.05)
    auditor = httpx.AsyncClient(
        base_url=str(client.base_url), headers={"Authorization": f"Bearer {READ_ONLY_KEY}"}, timeout=30
    )
    async with contextlib.AsyncExitStack() as held, auditor:
        for _ in range(PER_TENANT):  # every slot of the read-only keys
            r = await held.enter_async_context(
                auditor.stream("GET", f"/v1/sessions/{sid}/events", params={"follow": "true"})
            )
            assert r.status_code == 200, await r.aread()
        refused = await auditor.get(f"/v1/sessions/{sid}/events", params={"follow": "true"})
        assert refused.status_code == 429, refused.text
        assert refused.json()["code"] == "too_many_streams"
        assert "read-only keys" in refused.json()["detail"]
        # the full keys' slots are free: the auditor's followers took none of them, and are as many
        followers = [await follow(sid) for _ in range(PER_TENANT)]
        for follower in followers:
            assert await follower.next() is not None
        refused = await client.get(f"/v1/sessions/{sid}/events", params={"follow": "true"})
        assert refused.status_code == 429, refused.text
        assert "full keys" in refused.json()["detail"]
        assert following.open_answers(T, read_only=True) == PER_TENANT


@pytest.mark.parametrize("params", [{"from_seq": 0}, {"to_seq": 0}, {"limit": 0}, {"follow": "maybe"}])
async def test_bad_parameters_are_422(client: httpx.AsyncClient, params: dict[str, Any]) -> None:
    r = await client.get(f"/v1/sessions/{new_sid()}/events", params={"follow": "true", **params})
    assert r.status_code == 422, r.text
    assert r.json()["code"] == "invalid_request"


async def test_a_to_seq_of_another_sessions_event_ends_the_answer_once_the_stream_reaches_it(
    stack: Container, follow: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(following, "TICK_S", 0.05)
    sid, other = new_sid(), new_sid()
    mine = await stack.commands.append(T, sid, text_message("m1", "mine"), OMITTED)
    follower = await follow(sid, to_seq=mine.seq + 1)  # the next event of the stream, whoever's
    got = await follower.next()
    assert got is not None
    assert got["seq"] == mine.seq
    theirs = await stack.commands.append(T, other, text_message("o1", "another session's"), OMITTED)
    assert theirs.seq == mine.seq + 1
    assert await follower.ended()  # to_seq is passed: nothing of this session can come before it


async def test_a_to_seq_before_from_seq_is_refused_not_an_empty_answer(client: httpx.AsyncClient) -> None:
    """An empty answer read as "no events there" (the auditor trial): it is ``422`` now."""
    r = await client.get(f"/v1/sessions/{new_sid()}/events", params={"follow": "true", "from_seq": 10, "to_seq": 9})
    assert (r.status_code, r.json()["code"]) == (422, "invalid_request")


async def test_open_answers_end_within_a_tick_when_the_server_stops(
    app: FastAPI, stack: Container, follow: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(following, "TICK_S", 0.05)
    sid = new_sid()
    await stack.commands.append(T, sid, text_message("m1", "before the stop"), OMITTED)
    follower = await follow(sid)
    assert await follower.next() is not None
    app.state.stopping.set()  # what ApiServer.shutdown does first
    assert await follower.ended(timeout=5)


async def test_a_reader_that_falls_behind_is_ended_and_resumes_without_a_gap(
    stack: Container, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(eventlog, "FOLLOW_PENDING_MSGS", 3)
    sid = new_sid()
    subject = stack.layout.session_subject(T, sid)
    first = await stack.commands.append(T, sid, text_message("m0", "first"), OMITTED)
    stream = eventlog.follow(stack.js, stack.layout, subject, first.seq, 0.05)
    got = [await anext(stream)]  # subscribed, and the first event taken
    seqs = [first.seq]
    for i in range(1, 12):
        seqs.append((await stack.commands.append(T, sid, text_message(f"m{i}", f"turn {i}"), OMITTED)).seq)
    async with asyncio.timeout(20):  # the server has sent every event to the buffer (the positive signal)
        while True:
            infos = await stack.js.consumers_info(stack.layout.stream)
            delivered = [i.delivered.stream_seq for i in infos if i.config.filter_subject == subject and i.delivered]
            if any((seq or 0) >= seqs[-1] for seq in delivered):
                break
            await asyncio.sleep(0.02)
    with pytest.raises(eventlog.FollowerBehind):
        await drain(stream, got)
    taken = [ev.seq for ev in got if ev is not None]
    assert taken == seqs[: len(taken)]  # in order, no gap
    assert len(taken) < len(seqs)
    # the client resumes from its last seq + 1: the backlog read to its end (as a followed answer does)
    taken += [ev.seq async for ev in eventlog.read(stack.js, stack.layout, subject, taken[-1] + 1)]
    assert taken == seqs


async def drain(stream: AsyncIterator[eventlog.StoredEvent | None], into: list[eventlog.StoredEvent | None]) -> None:
    async for ev in stream:
        into.append(ev)


async def test_a_client_that_leaves_leaves_no_consumer_behind(stack: Container, client: httpx.AsyncClient) -> None:
    sid = new_sid()
    subject = stack.layout.session_subject(T, sid)
    await stack.commands.append(T, sid, text_message("m1", "one"), OMITTED)

    async def consumers() -> int:
        infos = await stack.js.consumers_info(stack.layout.stream)
        return len([i for i in infos if i.config.filter_subject == subject])

    async with client.stream("GET", f"/v1/sessions/{sid}/events", params={"follow": "true"}) as r:
        lines = r.aiter_lines()
        assert json.loads(await asyncio.wait_for(anext(lines), 10))["event"]["message"]["id"] == "m1"
        async with asyncio.timeout(10):  # the follower's, made once the backlog (direct gets) is read
            while not await consumers():
                await asyncio.sleep(0.05)
    async with asyncio.timeout(20):  # the server saw the client go and unsubscribed
        while await consumers():
            await asyncio.sleep(0.05)
    assert following.open_answers(T) == 0
