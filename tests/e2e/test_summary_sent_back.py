"""A client that sends history back with its next message (the usual loop) sends the compaction
summary back too: over HTTP (one append, ``messages:batch``) and through the SDK's ``append_all``
(HTTP, NATS commands, JetStream), the summary is a harmless replay, never stored as a message;
another body under its id, or an id in its form that no overlay has, is refused, nothing written."""

from __future__ import annotations

import uuid
from typing import Any

import httpx
import pytest

from chronicle_sdk import InvalidId, MessageConflict, Via
from services.settings import Settings
from tests.e2e.helpers import PROBLEM, PROSE, append, msg, new_sid
from tests.e2e.sdk_support import VIAS, open_client

CONFIG = {"blocks": [], "compaction": {"protect_head": 1, "tail_token_budget": 60, "min_tail_messages": 1}}


async def _compacted(client: httpx.AsyncClient, sid: str) -> tuple[list[dict[str, Any]], int]:
    """The trial's session: r0…r7 (~100 tokens each), compacted to r0, the summary, r7; its history
    and the overlay's ``seq``."""
    assert (await client.put(f"/v1/sessions/{sid}/config", json=CONFIG)).status_code == 200
    batch = {"messages": [msg(f"r{i}", f"turn {i}{PROSE}") for i in range(8)]}
    assert (await client.post(f"/v1/sessions/{sid}/messages:batch", json=batch)).status_code == 201
    r = await client.post(f"/v1/sessions/{sid}/compact", json={})
    assert (r.status_code, r.json().get("compacted")) == (200, True), r.text
    seq = r.json()["seq"]
    return await _history(client, sid, seq), seq


async def _history(client: httpx.AsyncClient, sid: str, seq: int = 0) -> list[dict[str, Any]]:
    r = await client.get(f"/v1/sessions/{sid}/history", params={"min_seq": seq})
    assert r.status_code == 200, r.text
    messages: list[dict[str, Any]] = r.json()["messages"]
    return messages


def _ids(messages: list[dict[str, Any]]) -> list[str]:
    return [str(m["id"]) for m in messages]


async def test_the_summary_appended_as_history_showed_it_is_a_replay(client: httpx.AsyncClient) -> None:
    sid = new_sid("sum-one")
    history, seq = await _compacted(client, sid)
    summary = history[1]
    assert _ids(history) == ["r0", summary["id"], "r7"]
    again = await append(client, sid, summary, expect=200)
    assert again == {"id": summary["id"], "parent_id": "r0", "seq": seq, "created": False}
    assert await _history(client, sid, seq) == history

    # another body under its id: the conflict a message's id taken by another body is
    r = await client.post(f"/v1/sessions/{sid}/messages", json={"message": {**summary, "role": "user"}})
    assert (r.status_code, r.headers["content-type"], r.json()["code"]) == (409, PROBLEM, "message_conflict")
    assert "compaction summary" in r.json()["detail"]
    # an id in a summary's form that no overlay of the session has (another session's, say)
    foreign = {**summary, "id": f"compaction_{uuid.uuid4()}"}
    r = await client.post(f"/v1/sessions/{sid}/messages", json={"message": foreign})
    assert (r.status_code, r.headers["content-type"], r.json()["code"]) == (422, PROBLEM, "invalid_id")
    assert await _history(client, sid) == history
    r = await client.get(f"/v1/sessions/{sid}/history", params={"compacted": "false"})
    assert _ids(r.json()["messages"]) == [f"r{i}" for i in range(8)]


async def test_a_batch_of_history_and_a_new_message_puts_it_after_the_last_real_message(
    client: httpx.AsyncClient,
) -> None:
    sid = new_sid("sum-batch")
    history, _ = await _compacted(client, sid)
    body = {"messages": [*history, msg("new", "and now?")], "parent_id": None}
    r = await client.post(f"/v1/sessions/{sid}/messages:batch", json=body)
    assert r.status_code == 201, r.text
    answers = r.json()["messages"]
    assert [(a["id"], a["parent_id"], a["created"]) for a in answers] == [
        ("r0", None, False),
        (history[1]["id"], "r0", False),
        ("r7", "r6", False),
        ("new", "r7", True),
    ]
    assert _ids(await _history(client, sid, r.json()["seq"])) == [*_ids(history), "new"]

    # a changed summary part-way: refused at its index, the messages before it replayed, nothing after
    changed = {**history[1], "parts": [{"type": "text", "text": "edited"}]}
    r = await client.post(
        f"/v1/sessions/{sid}/messages:batch", json={"messages": [history[0], changed, msg("n2", "x")]}
    )
    problem = r.json()
    assert (r.status_code, problem["code"], problem["failed_index"]) == (409, "message_conflict", 1)
    assert [w["id"] for w in problem["written"]] == ["r0"]
    assert _ids(await _history(client, sid)) == [*_ids(history), "new"]


@pytest.mark.parametrize("via", VIAS)
async def test_the_sdks_append_all_of_history_and_a_new_message_leaves_no_stray_branch(
    client: httpx.AsyncClient, api_url: str, api_settings: Settings, via: Via
) -> None:
    sid = new_sid(f"sum-sdk-{via}")
    history, _ = await _compacted(client, sid)
    async with open_client(api_url, api_settings, via=via) as sdk:
        session = sdk.session(sid)
        sent = await session.get_history()
        assert sent == history
        results = await session.append_all([*sent, msg("new", "and now?")])
        assert [(r.id, r.parent_id, r.created) for r in results][-2:] == [("r7", "r6", False), ("new", "r7", True)]
        assert not results[1].created
        assert _ids(await session.get_history()) == [*_ids(history), "new"]
        assert [m["id"] for m in await session.get_branches("r0")] == ["r1"]  # no summary under r0
        with pytest.raises(MessageConflict):
            await session.append_all([sent[0], {**sent[1], "role": "user"}])
        with pytest.raises(InvalidId):
            await session.append_all([{**sent[1], "id": f"compaction_{uuid.uuid4()}"}])
