"""The reference's ``getRecentHistory`` and ``getHistoryRowStats`` tests (§6.1), through the SDK
on the real stack, on every write path (HTTP, NATS commands, direct JetStream)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from chronicle_sdk import ChronicleClient, HistoryRowStat, RecentHistory, Session, Via
from services.settings import Settings
from tests.e2e.helpers import PROSE
from tests.e2e.sdk_support import VIAS, ids, open_client, sid, text


@pytest.fixture(params=VIAS)
async def sdk(request: pytest.FixtureRequest, api_url: str, api_settings: Settings) -> AsyncIterator[ChronicleClient]:
    """An SDK client whose writes go through ``request.param``."""
    via: Via = request.param
    async with open_client(api_url, api_settings, via=via) as c:
        yield c


def kilobyte_rows(n: int = 10) -> list[dict[str, Any]]:
    """``n`` messages of about 1.1 KB of stored JSON each, alternating user and assistant."""
    return [text(f"m{i}", "x" * 1024, "user" if i % 2 == 0 else "assistant") for i in range(n)]


async def with_rows(sdk: ChronicleClient, messages: list[dict[str, Any]]) -> Session:
    s = Session.create(sdk, sid())
    await s.append_all(messages)
    return s


async def test_an_empty_session_gives_nothing_untruncated(sdk: ChronicleClient) -> None:
    s = Session.create(sdk, sid())  # never written: the server has no such session
    assert await s.get_recent_history(1024) == RecentHistory([], False, 0)
    assert await s.get_history_row_stats() == []
    await s.append_message(text("m1", "x"))
    await s.clear_messages()  # written, then emptied
    assert await s.get_recent_history(1024) == RecentHistory([], False, 0)
    assert await s.get_history_row_stats() == []


async def test_everything_fits_so_nothing_is_truncated(sdk: ChronicleClient) -> None:
    s = await with_rows(sdk, [text(f"m{i}", f"message {i}") for i in range(6)])
    recent = await s.get_recent_history(10 * 1024 * 1024)
    assert recent.messages == await s.get_history()
    assert len(recent.messages) == 6
    assert recent.truncated is False


async def test_over_budget_is_the_suffix_ending_at_the_leaf(sdk: ChronicleClient) -> None:
    s = await with_rows(sdk, kilobyte_rows())
    recent = await s.get_recent_history(3 * 1024)
    assert recent.messages == kilobyte_rows()[8:]
    assert recent.truncated is True


async def test_the_leaf_is_kept_even_alone_over_the_budget(sdk: ChronicleClient) -> None:
    s = await with_rows(sdk, [text("small", "hi"), text("huge", "y" * 50_000, "assistant")])
    recent = await s.get_recent_history(1024)
    assert ids(recent.messages) == ["huge"]
    assert recent.truncated is True
    assert ids((await s.get_recent_history(-5, 0)).messages) == ["huge"]  # below 0 counts as 0


async def test_total_is_the_sum_of_the_row_stats(sdk: ChronicleClient) -> None:
    s = await with_rows(sdk, [text("small", "hi"), text("big", "z" * 10_000, "assistant"), text("wide", "é中😀")])
    stats = await s.get_history_row_stats()
    assert [row.id for row in stats] == ["small", "big", "wide"]
    assert all(isinstance(row, HistoryRowStat) for row in stats)
    assert stats[1].bytes > stats[0].bytes + 9000
    assert (await s.get_recent_history(1)).total_content_bytes == sum(row.bytes for row in stats)


async def test_an_overlay_inside_the_window_is_applied(sdk: ChronicleClient) -> None:
    s = Session.create(sdk, sid()).on_compaction(protect_head=1, tail_token_budget=10, min_tail_messages=2)
    await s.append_all([text(f"m{i}", f"message number {i}{PROSE}") for i in range(8)])
    overlay = await s.compact()
    assert overlay is not None
    first = int(overlay.from_message_id[1:])
    inside = await s.get_recent_history(1, 8 - first)  # the window starts at the overlay's first
    assert ids(inside.messages)[0] == overlay.message_id
    assert inside.messages == (await s.get_history())[first:]
    outside = await s.get_recent_history(1, 7 - first)  # it starts after it: no overlay
    assert ids(outside.messages) == [f"m{i}" for i in range(first + 1, 8)]


async def test_min_recent_four_over_a_two_kilobyte_budget(sdk: ChronicleClient) -> None:
    s = await with_rows(sdk, kilobyte_rows())
    recent = await s.get_recent_history(2 * 1024, 4)
    assert ids(recent.messages) == ["m6", "m7", "m8", "m9"]
    assert recent.truncated is True


async def test_min_recent_larger_than_the_path_returns_it_whole(sdk: ChronicleClient) -> None:
    s = await with_rows(sdk, kilobyte_rows(3))
    recent = await s.get_recent_history(1, 10)
    assert ids(recent.messages) == ["m0", "m1", "m2"]
    assert recent.truncated is False


async def test_row_stats_carry_the_role(sdk: ChronicleClient) -> None:
    s = await with_rows(sdk, kilobyte_rows(3))
    await s.append_message(text("alt", "another answer", "assistant"), "m0")
    assert [(row.id, row.role) for row in await s.get_history_row_stats()] == [("m0", "user"), ("alt", "assistant")]
    assert [(row.id, row.role) for row in await s.get_history_row_stats("m2")] == [
        ("m0", "user"),
        ("m1", "assistant"),
        ("m2", "user"),
    ]


async def test_recent_history_and_row_stats_read_your_writes(sdk: ChronicleClient) -> None:
    s = Session.create(sdk, sid())
    for i in range(6):
        await s.append_message(text(f"r{i}", f"turn {i}"))
        assert ids((await s.get_recent_history(10**6)).messages)[-1] == f"r{i}"
        assert [row.id for row in await s.get_history_row_stats()] == [f"r{j}" for j in range(i + 1)]
