"""The reference's ``getRecentHistory`` and ``getHistoryRowStats`` (§1.3, §6.1) over HTTP: the
``max_bytes`` window of ``GET …/history`` and ``GET …/history/stats``, on the running stack."""

from __future__ import annotations

from typing import Any

import httpx

from tests.e2e.helpers import PROSE, append, msg, new_sid


async def batch(client: httpx.AsyncClient, sid: str, messages: list[dict[str, Any]]) -> int:
    r = await client.post(f"/v1/sessions/{sid}/messages:batch", json={"messages": messages})
    assert r.status_code == 201, r.text
    return int(r.json()["seq"])


async def window(client: httpx.AsyncClient, sid: str, seq: int, max_bytes: int, min_recent: int = 1) -> dict[str, Any]:
    params = {"min_seq": seq, "max_bytes": max_bytes, "min_recent": min_recent}
    r = await client.get(f"/v1/sessions/{sid}/history", params=params)
    assert r.status_code == 200, r.text
    out: dict[str, Any] = r.json()
    return out


async def stats(client: httpx.AsyncClient, sid: str, seq: int | None = None, **params: str) -> dict[str, Any]:
    r = await client.get(f"/v1/sessions/{sid}/history/stats", params={"min_seq": seq or 0, **params})
    assert r.status_code == 200, r.text
    out: dict[str, Any] = r.json()
    return out


def ids(answer: dict[str, Any]) -> list[str]:
    return [m["id"] for m in answer["messages"]]


def kilobyte_rows(n: int = 10) -> list[dict[str, Any]]:
    """``n`` messages of about 1.1 KB of stored JSON each, alternating user and assistant."""
    return [msg(f"m{i}", "x" * 1024, "user" if i % 2 == 0 else "assistant") for i in range(n)]


async def test_an_empty_session_gives_nothing_untruncated(client: httpx.AsyncClient) -> None:
    sid = new_sid()
    seq = (await client.post("/v1/sessions", json={"id": sid})).json()["seq"]
    assert await window(client, sid, seq, 1024) == {
        "leaf_id": None,
        "truncated": False,
        "total_content_bytes": 0,
        "messages": [],
    }
    assert await stats(client, sid, seq) == {"leaf_id": None, "rows": []}


async def test_everything_fits_so_nothing_is_truncated(client: httpx.AsyncClient) -> None:
    sid = new_sid()
    seq = await batch(client, sid, [msg(f"m{i}", f"message {i}") for i in range(6)])
    w = await window(client, sid, seq, 10 * 1024 * 1024)
    assert ids(w) == [f"m{i}" for i in range(6)]
    assert w["truncated"] is False
    assert w["leaf_id"] == "m5"
    assert w["total_content_bytes"] == sum(r["bytes"] for r in (await stats(client, sid, seq))["rows"]) > 0


async def test_over_budget_is_the_suffix_ending_at_the_leaf(client: httpx.AsyncClient) -> None:
    sid = new_sid()
    seq = await batch(client, sid, kilobyte_rows())
    rows = (await stats(client, sid, seq))["rows"]
    assert all(1024 < r["bytes"] < 1536 for r in rows)
    w = await window(client, sid, seq, 3 * 1024)
    assert ids(w) == ["m8", "m9"]  # two rows fit 3 KB, three do not
    assert w["truncated"] is True
    assert w["messages"] == kilobyte_rows()[8:]
    assert w["total_content_bytes"] == sum(r["bytes"] for r in rows)


async def test_the_leaf_is_kept_even_alone_over_the_budget(client: httpx.AsyncClient) -> None:
    sid = new_sid()
    seq = await batch(client, sid, [msg("small", "hi"), msg("huge", "y" * 50_000, "assistant")])
    w = await window(client, sid, seq, 1024)
    assert ids(w) == ["huge"]
    assert w["truncated"] is True
    w = await window(client, sid, seq, 0, 0)  # no budget, no floor: still the leaf
    assert ids(w) == ["huge"]


async def test_total_is_the_sum_of_the_row_stats_which_are_the_stored_bytes(client: httpx.AsyncClient) -> None:
    sid = new_sid()
    messages = [
        msg("small", "hi"),
        msg("big", "z" * 10_000, "assistant"),
        {**msg("wide", 'é中😀 \u2028 "quoted" \\ ünïcødé'), "metadata": {"k": ["ü", 1, None]}},
    ]
    seq = await batch(client, sid, messages)
    answer = await stats(client, sid, seq)
    assert answer["leaf_id"] == "wide"
    rows = answer["rows"]
    assert [r["id"] for r in rows] == ["small", "big", "wide"]
    assert rows[1]["bytes"] > rows[0]["bytes"] + 9000
    for row in rows:  # the stored JSON's UTF-8 length: the body a message read serves, byte for byte
        served = await client.get(f"/v1/sessions/{sid}/messages/{row['id']}")
        assert row["bytes"] == len(served.content)
    assert rows[2]["bytes"] > len(served.text)  # bytes, not characters
    assert (await window(client, sid, seq, 1))["total_content_bytes"] == sum(r["bytes"] for r in rows)


async def test_the_window_counts_what_the_row_stats_report(client: httpx.AsyncClient) -> None:
    sid = new_sid()
    seq = await batch(client, sid, [msg(f"m{i}", "ü" * (100 * i)) for i in range(1, 8)])
    sizes = [r["bytes"] for r in (await stats(client, sid, seq))["rows"]]
    for k in range(1, 8):  # a budget of exactly the last k rows keeps them; one byte less keeps k-1
        exact = sum(sizes[-k:])
        assert len((await window(client, sid, seq, exact))["messages"]) == k
        assert len((await window(client, sid, seq, exact - 1))["messages"]) == max(1, k - 1)


async def test_min_recent_four_over_a_two_kilobyte_budget(client: httpx.AsyncClient) -> None:
    sid = new_sid()
    seq = await batch(client, sid, kilobyte_rows())
    w = await window(client, sid, seq, 2 * 1024, 4)
    assert ids(w) == ["m6", "m7", "m8", "m9"]
    assert w["truncated"] is True


async def test_min_recent_larger_than_the_path_returns_it_whole(client: httpx.AsyncClient) -> None:
    sid = new_sid()
    seq = await batch(client, sid, kilobyte_rows(3))
    w = await window(client, sid, seq, 1, 10)
    assert ids(w) == ["m0", "m1", "m2"]
    assert w["truncated"] is False


async def test_row_stats_carry_the_role_and_follow_the_leaf(client: httpx.AsyncClient) -> None:
    sid = new_sid()
    await batch(client, sid, kilobyte_rows(4))
    seq = (await append(client, sid, msg("alt", "another answer", "assistant"), "m1"))["seq"]
    latest = await stats(client, sid, seq)
    assert latest["leaf_id"] == "alt"
    assert [(r["id"], r["role"]) for r in latest["rows"]] == [("m0", "user"), ("m1", "assistant"), ("alt", "assistant")]
    other = await stats(client, sid, seq, leaf_id="m3")
    assert other["leaf_id"] == "m3"
    assert [(r["id"], r["role"]) for r in other["rows"]] == [
        ("m0", "user"),
        ("m1", "assistant"),
        ("m2", "user"),
        ("m3", "assistant"),
    ]
    assert await stats(client, sid, seq, leaf_id="no-such-message") == {"leaf_id": None, "rows": []}


async def test_row_stats_read_your_writes(client: httpx.AsyncClient) -> None:
    sid = new_sid()
    for i in range(5):  # each read right after its write, waiting for nothing but min_seq
        seq = (await append(client, sid, msg(f"m{i}", f"text {i}")))["seq"]
        assert [r["id"] for r in (await stats(client, sid, seq))["rows"]] == [f"m{j}" for j in range(i + 1)]
    seq = (await client.post(f"/v1/sessions/{sid}/messages:clear")).json()["seq"]
    assert await stats(client, sid, seq) == {"leaf_id": None, "rows": []}


async def test_an_overlay_applies_only_when_it_starts_inside_the_window(client: httpx.AsyncClient) -> None:
    sid = new_sid()
    config = {"compaction": {"protect_head": 1, "tail_token_budget": 10, "min_tail_messages": 2}}
    assert (await client.put(f"/v1/sessions/{sid}/config", json=config)).status_code == 200
    await batch(client, sid, [msg(f"m{i}", f"message number {i}{PROSE}") for i in range(8)])
    compacted = (await client.post(f"/v1/sessions/{sid}/compact", json={})).json()
    assert compacted["compacted"] is True, compacted
    overlay, seq = compacted["overlay"], compacted["seq"]
    first = int(overlay["from_message_id"][1:])
    last = int(overlay["to_message_id"][1:])
    assert 0 < first < last < 7
    tail = [f"m{i}" for i in range(last + 1, 8)]
    whole = await window(client, sid, seq, 10**6)
    assert ids(whole) == [f"m{i}" for i in range(first)] + [overlay["message_id"], *tail]
    assert whole["truncated"] is False
    from_inside = await window(client, sid, seq, 1, 8 - first)  # the window starts at the overlay's first
    assert ids(from_inside) == [overlay["message_id"], *tail]
    assert from_inside["truncated"] is True
    after = await window(client, sid, seq, 1, 7 - first)  # it starts after it: the raw rows
    assert ids(after) == [f"m{i}" for i in range(first + 1, 8)]
    rows = (await stats(client, sid, seq))["rows"]  # the raw path, overlays never applied
    assert [r["id"] for r in rows] == [f"m{i}" for i in range(8)]
    assert whole["total_content_bytes"] == after["total_content_bytes"] == sum(r["bytes"] for r in rows)
