"""The SDK against the real stack when an answer is lost after the server ran the request: the
client's retry stores nothing twice and answers what the lost attempt did."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import httpx

from chronicle_sdk import ChronicleClient
from tests.conftest import KEYS
from tests.e2e.sdk_support import ids, sid, text


class LosingTransport(httpx.AsyncHTTPTransport):
    """Sends every request to the API; the first answer to a path ending in ``lose`` is read and
    then lost (a read timeout), as when a connection drops after the server stored the write."""

    def __init__(self, lose: str) -> None:
        super().__init__()
        self.lose = lose
        self.lost: list[str] = []
        self.sent: list[tuple[str, str | None]] = []

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        self.sent.append((request.url.path, request.headers.get("idempotency-key")))
        response = await super().handle_async_request(request)
        if request.url.path.endswith(self.lose) and not self.lost:
            await response.aread()
            self.lost.append(request.url.path)
            raise httpx.ReadTimeout("the answer was lost", request=request)
        return response


async def test_a_chain_whose_answer_was_lost_is_stored_once_and_answered_as_created(api_url: str) -> None:
    transport = LosingTransport("/messages:batch")
    async with ChronicleClient(api_url, KEYS["tenant-a"], transport=transport, backoff_s=0.01) as c:
        s = c.session(sid("lost"))
        results = await s.append_all([text("a", "one"), text("b", "two"), text("c", "three")])
        assert transport.lost  # the first attempt ran, and its answer never came
        assert [(r.id, r.parent_id, r.created) for r in results] == [
            ("a", None, True),
            ("b", "a", True),
            ("c", "b", True),
        ]
        batches = [key for path, key in transport.sent if path.endswith("/messages:batch")]
        assert len(batches) == 2  # the first attempt and the retry
        assert batches[0] is not None
        assert batches[1] == batches[0]  # the retry names the call with the first attempt's key
        assert [m["id"] for m in await s.get_history()] == ["a", "b", "c"]
        appended = [e for e in await s.get_events() if e["event"]["type"] == "message.appended"]
        assert len(appended) == 3  # nothing stored twice
        again = await s.append_all([text("a", "one"), text("b", "two"), text("c", "three")])
        assert [r.created for r in again] == [False, False, False]  # another call: a repeat, not created
        assert [r.seq for r in again] == [r.seq for r in results]


async def test_a_fork_whose_answer_was_lost_is_made_once_and_answered(api_url: str) -> None:
    """The fork's id is the client's, so its retry names the same fork: answered as made, one
    session, each message copied once."""
    transport = LosingTransport("/fork")
    async with ChronicleClient(api_url, KEYS["tenant-a"], transport=transport, backoff_s=0.01) as c:
        source = c.session(sid("fork-src"))
        await source.append_all([text("a", "one"), text("b", "two")])
        forked = await c.manager().fork(source.id, "b", "what if")
        assert transport.lost  # the first attempt ran, and its answer never came
        assert (forked.parent_session_id, forked.name) == (source.id, "what if")
        assert len([path for path, _ in transport.sent if path.endswith("/fork")]) == 2  # the retry
        children = [s.id for s in await c.manager().list() if s.parent_session_id == source.id]
        assert children == [forked.id]
        fork = c.session(forked.id)
        assert [m["id"] for m in await fork.get_history()] == ["a", "b"]
        events = [e["event"]["type"] for e in await fork.get_events()]
        assert events == ["session.created", "message.appended", "message.appended"]


async def test_a_delete_whose_answer_was_lost_answers_the_ids_it_deleted(api_url: str) -> None:
    """The retry finds the messages gone (the lost attempt deleted them): the answer still names
    them, and never an id that did not exist."""
    transport = LosingTransport("/messages:delete")
    async with ChronicleClient(api_url, KEYS["tenant-a"], transport=transport, backoff_s=0.01) as c:
        s = c.session(sid("lost-delete"))
        await s.append_all([text("a", "one"), text("b", "two"), text("c", "three")])
        deleted = await s.delete_messages(["c", "nope", "a"])
        assert transport.lost  # the first attempt ran, and its answer never came
        assert len([path for path, _ in transport.sent if path.endswith("/messages:delete")]) == 2  # the retry
        assert deleted == ["c", "a"]  # as the first attempt would have answered
        assert ids(await s.get_history("b")) == ["b"]  # its parent, a, is gone: the path starts at b
        gone = [e for e in await s.get_events() if e["event"]["type"] == "messages.deleted"]
        assert [e["event"]["message_ids"] for e in gone] == [["c", "a"]]  # deleted once
        assert await s.delete_messages(["a", "b"]) == ["b"]  # another call: a was gone before it


class InterposingTransport(httpx.AsyncHTTPTransport):
    """Sends every request to the API, recording its path; before the first request to a path
    ending in ``before`` it runs ``first`` (another writer's request, made meanwhile)."""

    def __init__(self, before: str) -> None:
        super().__init__()
        self.before = before
        self.first: Callable[[], Awaitable[object]] | None = None
        self.sent: list[str] = []

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        self.sent.append(request.url.path)
        if request.url.path.endswith(self.before) and self.first is not None:
            first, self.first = self.first, None
            await first()
        return await super().handle_async_request(request)


async def test_a_delete_never_retried_answers_only_its_own_deletions_in_one_request(api_url: str) -> None:
    """Another writer deletes one of the listed ids just before the call's request: the call
    (answered at once, never retried) names only what it deleted, and sends nothing but the delete."""
    transport = InterposingTransport("/messages:delete")
    async with (
        ChronicleClient(api_url, KEYS["tenant-a"], transport=transport) as c,
        ChronicleClient(api_url, KEYS["tenant-a"]) as other,
    ):
        s = c.session(sid("raced-delete"))
        await s.append_all([text("a", "one"), text("b", "two"), text("c", "three")])
        transport.first = lambda: other.session(s.id).delete_messages(["a"])
        transport.sent.clear()
        assert await s.delete_messages(["a", "b"]) == ["b"]  # a was the other writer's deletion
        assert [p.rsplit("/", 1)[-1] for p in transport.sent] == ["messages:delete"]  # no other request
        gone = [e["event"]["message_ids"] for e in await s.get_events() if e["event"]["type"] == "messages.deleted"]
        assert gone == [["a"], ["b"]]
