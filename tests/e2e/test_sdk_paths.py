"""Both append paths (HTTP API and direct JetStream publish) give identical histories for one script."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from chronicle_sdk import AppendResult, ChronicleClient, Session, SessionManager, Via
from services.settings import Settings
from tests.e2e.sdk_support import client_for, sid, text


class CountingTransport(httpx.AsyncHTTPTransport):
    """Records ``(method, path)`` of every request the SDK sends."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[str, str]] = []

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        self.calls.append((request.method, request.url.path))
        return await super().handle_async_request(request)


BIG = "x" * (300 * 1024)  # over the 256 KiB payload limit: claim check


def tool_message(mid: str) -> dict[str, Any]:
    return {
        "id": mid,
        "role": "assistant",
        "parts": [
            {"type": "step-start"},
            {
                "type": "tool-set_context",
                "toolCallId": "call_1",
                "state": "output-available",
                "input": {"label": "memory", "content": "caf\u00e9 \u2603"},
                "output": "Written to memory. Usage: 3 tokens",
            },
            {"type": "text", "text": "Done \U0001f600"},
        ],
        "metadata": {"nested": {"list": [1, 2.5, None, True]}},
    }


async def run_script(s: Session, manager: SessionManager, via: Via) -> list[tuple[str, str | None, bool]]:
    results: list[AppendResult] = []
    results.append(await s.append_message(text("m1", "hello"), via=via))
    results.append(await s.append_message(text("m2", "hi there", "assistant"), via=via))
    results.append(await s.append_message(text("m3", "other branch", "assistant"), "m1", via=via))
    results.append(await s.append_message(text("m4", "follow-up"), via=via))
    results.append(await s.append_message(text("m1", "hello"), via=via))  # idempotent repeat
    results.append(await s.append_message(text("r1", "a new root"), None, via=via))
    results += await s.append_all([text("c1", "chain 1"), text("c2", "chain 2"), text("c3", "chain 3")], "m2", via=via)
    last = await manager.append_all(s.id, [text("d1", "root chain"), text("d2", "root chain 2")], via=via)
    assert last == "d2"
    results.append(await s.append_message(tool_message("t1"), "d2", via=via))
    results.append(await s.append_message(text("big", BIG), via=via))
    return [(r.id, r.parent_id, r.created) for r in results]


async def snapshot(s: Session) -> dict[str, Any]:
    """Everything a reader can see of the tree: each message's path and children, plus the log's facts."""
    events = [e["event"] for e in await s.get_events() if e["event"]["type"] in ("message.appended", "session.created")]
    all_ids = [e["message_id"] for e in events if e["type"] == "message.appended"]
    return {
        "latest": await s.get_history(),
        "paths": {mid: await s.get_history(mid) for mid in all_ids},
        "children": {mid: [m["id"] for m in await s.get_branches(mid)] for mid in all_ids},
        "events": [
            (e["type"], e.get("message_id"), e.get("parent_id"), e.get("role"), e.get("body_sha256")) for e in events
        ],
        "big_is_referenced": any(e.get("message_id") == "big" and e.get("message_ref") for e in events),
        "leaf": await s.get_latest_leaf(),
        "length": await s.get_path_length(),
    }


async def test_http_and_jetstream_give_identical_histories(api_url: str, api_settings: Settings) -> None:
    snapshots: dict[str, dict[str, Any]] = {}
    answers: dict[str, list[tuple[str, str | None, bool]]] = {}
    posts: dict[str, int] = {}
    batches: dict[str, int] = {}
    for via in ("http", "jetstream"):
        transport = CountingTransport()
        async with client_for(api_url, api_settings, transport=transport) as c:
            s = Session.create(c, sid(f"paths-{via}"))
            answers[via] = await run_script(s, SessionManager(c), via)
            snapshots[via] = await snapshot(s)
        posts[via] = sum(1 for m, p in transport.calls if m == "POST" and p.endswith("/messages"))
        batches[via] = sum(1 for m, p in transport.calls if m == "POST" and p.endswith("/messages:batch"))
    assert answers["http"] == answers["jetstream"]
    assert answers["http"][4] == ("m1", None, False)
    assert snapshots["http"] == snapshots["jetstream"]
    assert snapshots["http"]["big_is_referenced"]
    assert snapshots["http"]["latest"][-1]["parts"][0]["text"] == BIG
    assert [m["id"] for m in snapshots["http"]["paths"]["c3"]] == ["m1", "m2", "c1", "c2", "c3"]
    assert [m["id"] for m in snapshots["http"]["paths"]["d2"]] == ["d1", "d2"]
    assert snapshots["http"]["paths"]["t1"][-1] == tool_message("t1")
    # the direct path published everything itself but for the idempotent repeat (the API answers
    # it) and the claim-checked body (only the server writes the object store); HTTP chains are
    # one messages:batch request each
    assert posts == {"http": 8, "jetstream": 2}
    assert batches == {"http": 2, "jetstream": 0}


async def test_direct_append_needs_nats_settings(api_url: str) -> None:
    from tests.conftest import KEYS

    async with ChronicleClient(api_url, KEYS["tenant-a"]) as c:
        s = Session.create(c, sid())
        with pytest.raises(ValueError, match="nats_url"):
            await s.append_message(text("m1", "x"), via="jetstream")
