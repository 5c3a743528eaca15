"""Micro-compaction on the real stack: row cap at write time (original kept), read-time views."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable

import httpx
import pytest

from events.blobs import BlobRef
from events.objects import is_sealed_object, open_object
from events.omitted import OMITTED
from projections import queries
from services.api.app import build_app
from services.bootstrap import Container
from tests.conftest import KEYS, make_settings, running_stack

T = "tenant-a"


@pytest.fixture(scope="module")
async def capped(nats_url: str, db_url: str, s3_endpoint: str) -> AsyncIterator[Container]:
    settings = make_settings(nats_url, db_url, s3_endpoint=s3_endpoint, row_cap_bytes=20_000)
    async with running_stack(settings) as c:
        yield c


@pytest.fixture
async def http(capped: Container) -> AsyncIterator[httpx.AsyncClient]:
    app = build_app(capped.settings, capped)
    transport = httpx.ASGITransport(app=app)
    headers = {"Authorization": f"Bearer {KEYS['tenant-a']}"}
    async with httpx.AsyncClient(transport=transport, base_url="http://chronicle", headers=headers) as client:
        yield client


def tool_message(mid: str, output: object) -> dict[str, object]:
    return {
        "id": mid,
        "role": "assistant",
        "parts": [
            {
                "type": "tool-read",
                "toolCallId": f"c-{mid}",
                "state": "output-available",
                "input": {"p": 1},
                "output": output,
            }
        ],
    }


async def test_oversized_message_is_capped_and_the_original_kept(
    capped: Container, http: httpx.AsyncClient, new_id: Callable[[str], str]
) -> None:
    sid = new_id("cap")
    output = {"path": "/tmp/x", "totalLines": 9000, "content": "line of text\n" * 3000}
    body = tool_message("big", output)
    r = await capped.commands.append(T, sid, body, OMITTED)
    again = await capped.commands.append(T, sid, body, OMITTED)
    assert (again.created, again.seq) == (False, r.seq)  # idempotent on the original body
    await capped.waiter.wait_session(T, sid, r.seq)
    async with capped.pool.connection() as conn:
        row = await queries.get_message(conn, T, sid, "big")
    assert row is not None
    stored = json.loads(row.content)
    assert len(row.content.encode()) <= 20_000
    part = stored["parts"][0]
    assert part["output"]["path"] == "/tmp/x"
    assert "[truncated" in part["output"]["content"]
    assert stored["metadata"]["compactedToolOutputs"] == ["c-big"]
    assert row.original_ref is not None
    original = await capped.originals.get(BlobRef.model_validate(row.original_ref))
    if is_sealed_object(original):  # CHRONICLE_TEST_ENCRYPTION=1
        await capped.keys.refresh([(T, sid)])
    assert json.loads(open_object(original, capped.keys, T, sid)) == body  # sealed, or behind its owner
    served = await http.get(f"/v1/sessions/{sid}/messages/big", params={"original": "true"})
    assert served.json() == body
    capped_view = await http.get(f"/v1/sessions/{sid}/messages/big")
    assert capped_view.json() == stored


async def test_read_time_truncation_and_byte_window(
    capped: Container, http: httpx.AsyncClient, new_id: Callable[[str], str]
) -> None:
    sid = new_id("views")
    for i in range(6):
        await capped.commands.append(T, sid, tool_message(f"t{i}", "x" * 2000), OMITTED)
    r = await capped.commands.append(
        T, sid, {"id": "long", "role": "user", "parts": [{"type": "text", "text": "y" * 12_000}]}, OMITTED
    )
    for i in range(4):
        r = await capped.commands.append(
            T, sid, {"id": f"r{i}", "role": "user", "parts": [{"type": "text", "text": "z" * 900}]}, OMITTED
        )
    h = (await http.get(f"/v1/sessions/{sid}/history", params={"truncate_older": "true", "min_seq": r.seq})).json()
    msgs = {m["id"]: m for m in h["messages"]}
    assert "[truncated 2000 chars]" in msgs["t0"]["parts"][0]["output"]
    assert msgs["long"]["parts"][0]["text"].endswith("... [truncated 12000 chars]")
    assert msgs["r3"]["parts"][0]["text"] == "z" * 900
    raw = (await http.get(f"/v1/sessions/{sid}/history")).json()
    assert {m["id"]: m for m in raw["messages"]}["t0"]["parts"][0]["output"] == "x" * 2000  # stored: untouched
    w = (await http.get(f"/v1/sessions/{sid}/history", params={"max_bytes": 2000, "min_recent": 4})).json()
    assert [m["id"] for m in w["messages"]] == ["r0", "r1", "r2", "r3"]
    assert w["truncated"] is True
    assert w["total_content_bytes"] > 20_000


async def test_a_fork_keeps_a_capped_messages_original(
    capped: Container, http: httpx.AsyncClient, new_id: Callable[[str], str]
) -> None:
    sid, fork = new_id("cap"), new_id("fork")
    body = tool_message("big", {"path": "/tmp/y", "content": "another line\n" * 3000})
    await capped.commands.append(T, sid, body, OMITTED)
    forked = await http.post(f"/v1/sessions/{sid}/fork", json={"at_message_id": "big", "id": fork})
    assert forked.status_code == 201, forked.text
    seq = forked.json()["seq"]
    original = await http.get(f"/v1/sessions/{fork}/messages/big", params={"original": "true", "min_seq": seq})
    assert original.status_code == 200, original.text
    assert original.json() == body  # whole, from an object of the fork's own
    again = await capped.commands.append(T, fork, body, OMITTED)
    assert again.created is False  # the fork's copy carries the original's hash: the same message
