"""``Session.follow_events``: a session's events as the log stores them, through the SDK's own
HTTP transport against the API process (what the reference broadcasts to a session's clients)."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import httpx
import pytest

from chronicle_sdk import ChronicleClient, InvalidId
from services.settings import Settings
from tests.conftest import KEYS
from tests.e2e.sdk_support import open_client, sid, text


async def collect(session: Any, into: list[dict[str, Any]], **params: Any) -> None:
    async for record in session.follow_events(**params):
        into.append(record)


async def until(records: list[dict[str, Any]], n: int, timeout: float = 20) -> None:
    """Wait until ``n`` records came (the positive signal), within ``timeout``."""
    async with asyncio.timeout(timeout):
        while len(records) < n:
            await asyncio.sleep(0.02)


async def test_a_follower_sees_another_writers_messages_then_the_deletion_and_stops(
    api_url: str, api_settings: Settings
) -> None:
    async with open_client(api_url, api_settings) as reader, open_client(api_url, api_settings) as writer:
        session_id = sid("follow")
        records: list[dict[str, Any]] = []
        following = asyncio.create_task(collect(reader.session(session_id), records))
        other = writer.session(session_id)
        await other.append_message(text("m1", "from another device"))
        await other.append_message(text("m2", "and again"))
        await until(records, 2)
        assert [r["event"]["message"]["id"] for r in records] == ["m1", "m2"]
        # what was followed is readable at once: the follower's reads wait for it
        assert [m["id"] for m in await reader.session(session_id).get_history()] == ["m1", "m2"]
        await writer.manager().delete(session_id)
        await asyncio.wait_for(following, 20)  # the deletion ends it
        assert records[-1]["event"]["type"] == "session.deleted"


async def test_following_from_a_seq_up_to_another_gives_exactly_those(api_url: str, api_settings: Settings) -> None:
    async with open_client(api_url, api_settings) as sdk:
        session = sdk.session(sid("follow"))
        seqs = [(await session.append_message(text(f"m{i}", f"turn {i}"))).seq for i in range(3)]
        got = [r["seq"] async for r in session.follow_events(from_seq=seqs[1], to_seq=seqs[2])]
        assert got == seqs[1:]


async def test_stopping_early_with_aclosing_as_documented_ends_the_follow(api_url: str, api_settings: Settings) -> None:
    """``contextlib.aclosing(session.follow_events())``, as the docstring says (and typed so:
    mypy, which checks the tests, refused it while ``follow_events`` was an ``AsyncIterator``)."""
    async with open_client(api_url, api_settings) as sdk:
        session = sdk.session(sid("follow"))
        first = await session.append_message(text("m1", "only one"))
        events = session.follow_events()
        async with contextlib.aclosing(events) as followed:
            async for record in followed:
                assert record["seq"] == first.seq
                break  # the answer stays open (no to_seq): leaving the block closes it
        with pytest.raises(StopAsyncIteration):  # closed: it gives nothing more
            await events.__anext__()


async def test_an_error_answer_raises_its_typed_error(api_url: str) -> None:
    async with ChronicleClient(api_url, KEYS["tenant-a"]) as sdk:
        with pytest.raises(InvalidId):
            async for _ in sdk.session("a\u0000b").follow_events():
                pass


async def test_the_httpx_transport_follows_too(api_url: str, api_settings: Settings) -> None:
    transport = httpx.AsyncHTTPTransport()
    async with ChronicleClient(api_url, KEYS["tenant-a"], transport=transport) as sdk:
        session = sdk.session(sid("follow"))
        first = await session.append_message(text("m1", "over httpx"))
        got = [r async for r in session.follow_events(to_seq=first.seq)]
        assert [r["seq"] for r in got] == [first.seq]


async def test_the_httpx_transport_splits_lines_on_newlines_only(api_url: str) -> None:
    """U+2028, U+2029 and U+0085 stand unescaped in the events' NDJSON lines (JSON needs no escape
    for them); httpx's ``aiter_lines`` split there as ``str.splitlines()`` does, so following such a
    message raised ``JSONDecodeError``, again on every resume at its seq. Split on ``\\n`` only."""
    body = "para one\u2028para two\u2029three\x85four"
    async with ChronicleClient(api_url, KEYS["tenant-a"], transport=httpx.AsyncHTTPTransport()) as sdk:
        session = sdk.session(sid("follow"))
        first = await session.append_message(text("m1", body))
        last = await session.append_message(text("m2", "after it"))
        got = [r async for r in session.follow_events(to_seq=last.seq)]
        assert [r["seq"] for r in got] == [first.seq, last.seq]
        assert got[0]["event"]["message"]["parts"][0]["text"] == body
