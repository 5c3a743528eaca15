"""The sessions the auditor's view is tested on, written through the HTTP API (and, for what only
other writers produce, a summarizer failure, an unload and a bad event, published to the log as
the operator), with the stream sequences the tests move the time slider to; and erased sessions,
erased through the API, for its erasures list."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import httpx

from events.catalog import CompactionFailed, SkillUnloaded
from events.publisher import Publisher
from services.settings import Settings
from tests.conftest import operator_nats
from tests.e2e.helpers import PROSE, msg, new_sid, unique_word

SOUL = "You are a careful release assistant."
MEMORY = "The user deploys on Fridays"
BIG_TEXT_CHARS = 30_000
"""Over the 20,000-byte row cap the view's API runs with: the message is stored capped."""
LOAD_OUTPUT = "Deploy checklist: freeze, tag, ship."


ERASER = ("audit-erasures", "key-erasures-" + uuid.uuid4().hex)
"""A tenant only the view's API knows (tenant, full key): the erasure tests erase its sessions, so
its erasures are theirs alone."""
ERASER_READ_ONLY = "key-erasures-ro-" + uuid.uuid4().hex
"""ERASER's read-only key: what the tests sign in to the view with, as an auditor would."""
QUIET = ("audit-quiet", "key-quiet-ro-" + uuid.uuid4().hex)
"""A tenant only the view's API knows, with a read-only key: it never erases anything."""


@dataclass(frozen=True)
class Seeded:
    sid: str
    older_sid: str
    word: str
    seq_created: int
    seq_m7: int
    seq_last: int
    events: int
    overlay_id: str


def _tool_message() -> dict[str, Any]:
    return {
        "id": "m1",
        "role": "assistant",
        "parts": [
            {"type": "text", "text": "Let me load the checklist."},
            {
                "type": "tool-load_context",
                "toolCallId": "call-1",
                "toolName": "load_context",
                "input": {"label": "skills", "key": "deploy.md"},
                "output": LOAD_OUTPUT,
                "state": "output-available",
            },
        ],
    }


async def _ok(r: httpx.Response) -> dict[str, Any]:
    assert r.status_code in (200, 201), r.text
    out: dict[str, Any] = r.json()
    return out


async def seed(client: httpx.AsyncClient, settings: Settings) -> Seeded:
    """A branched, compacted session with three prompt versions (freeze, refresh, compaction), a
    written block, a capped message, an unloaded skill output, a summarizer failure and a
    quarantined event; and an older one."""
    older = new_sid("audit-old")
    await _ok(await client.post("/v1/sessions", json={"id": older, "name": "Older session"}))
    sid = new_sid("audit")
    word = unique_word()
    created = await _ok(await client.post("/v1/sessions", json={"id": sid, "name": "Release audit"}))
    config = {
        "blocks": [
            {"label": "soul", "kind": "readonly", "content": SOUL},
            {"label": "memory", "kind": "writable", "description": "What to remember", "max_tokens": 200},
        ],
        "compaction": {"protect_head": 1, "tail_token_budget": 10, "min_tail_messages": 2, "compact_after": 10**9},
    }
    await _ok(await client.put(f"/v1/sessions/{sid}/config", json=config))

    async def add(message: dict[str, Any], **parent: Any) -> int:
        r = await _ok(await client.post(f"/v1/sessions/{sid}/messages", json={"message": message, **parent}))
        return int(r["seq"])

    await add(msg("m0", f"We deploy on Friday {word}"), parent_id=None)
    await _ok(await client.get(f"/v1/sessions/{sid}/system-prompt"))  # v1 frozen
    await add(_tool_message())
    await add(msg("m2", "What about Thursday? <b>bold?</b>"))
    await add(msg("m3b", "Thursday works too.", "assistant"))  # the first branch, off m2
    await add(msg("m3", "Friday is better.", "assistant"), parent_id="m2")  # the second branch
    for i in range(4, 8):
        seq_m7 = await add(msg(f"m{i}", f"step {i} of the release{PROSE}", "user" if i % 2 == 0 else "assistant"))
    await _ok(await client.put(f"/v1/sessions/{sid}/context/memory", json={"content": MEMORY}))
    await _ok(await client.post(f"/v1/sessions/{sid}/system-prompt:refresh"))  # v2
    more = {"content": "Ask before a Friday deploy.", "mode": "append"}
    await _ok(await client.put(f"/v1/sessions/{sid}/context/memory", json=more))  # for v3, rendered by the compaction
    compacted = await _ok(await client.post(f"/v1/sessions/{sid}/compact", json={"leaf_id": "m7"}))
    assert compacted["compacted"] is True, compacted
    await add(msg("m8", "x" * BIG_TEXT_CHARS, "assistant"))  # over the row cap: stored capped

    nc = await operator_nats(settings.nats_url)
    try:
        pub = Publisher(nc.jetstream(), settings.layout())
        await pub.publish(
            SkillUnloaded(
                tenant="tenant-a", session=sid, label="skills", key="deploy.md", message_id="m1", tool_call_id="call-1"
            )
        )
        await pub.publish(
            CompactionFailed(
                tenant="tenant-a",
                session=sid,
                leaf_id="m8",
                summarizer="openai-compatible",
                error="HTTP 503",
                attempt=1,
            )
        )
        bad = await nc.jetstream().publish(
            settings.layout().session_subject("tenant-a", sid), b"this is not json", stream=settings.stream
        )
    finally:
        await nc.close()
    await _ok(await client.get(f"/v1/sessions/{sid}/tree", params={"min_seq": bad.seq}))
    events = (await client.get(f"/v1/sessions/{sid}/events")).text.strip().splitlines()
    return Seeded(
        sid=sid,
        older_sid=older,
        word=word,
        seq_created=int(created["seq"]),
        seq_m7=seq_m7,
        seq_last=bad.seq,
        events=len(events),
        overlay_id=compacted["overlay"]["id"],
    )


async def live_session(client: httpx.AsyncClient, sid: str, text: str = "soon erased text") -> str:
    """A session named after its id, with one message."""
    await _ok(await client.post("/v1/sessions", json={"id": sid, "name": "soon erased"}))
    await _ok(await client.post(f"/v1/sessions/{quote(sid, safe='')}/messages", json={"message": msg("m1", text)}))
    return sid


async def erase(client: httpx.AsyncClient, sid: str, reason: str | None = None) -> int:
    """Erase ``sid`` through the API (with ``reason`` when given; no body else): the sequence of
    its ``session.erased`` event."""
    url = f"/v1/sessions/{quote(sid, safe='')}:erase"
    erased = await _ok(await (client.post(url) if reason is None else client.post(url, json={"reason": reason})))
    return int(erased["seq"])
