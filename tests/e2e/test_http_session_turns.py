"""Many concurrent writes to one session through one API process take turns
(services/writes/turns.py) instead of racing each other to the log: all of them succeed, appends
without a parent make one chain, and the process keeps no turn once they are answered."""

from __future__ import annotations

import asyncio
import re
import uuid
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from tests.conftest import KEYS
from tests.e2e.helpers import events
from tests.integration.helpers import logged_message


@pytest.fixture
async def wide(api_url: str) -> AsyncIterator[httpx.AsyncClient]:
    """tenant-a, with a connection per concurrent request."""
    limits = httpx.Limits(max_connections=400, max_keepalive_connections=400)
    headers = {"Authorization": f"Bearer {KEYS['tenant-a']}"}
    async with httpx.AsyncClient(base_url=api_url, headers=headers, timeout=60, limits=limits) as c:
        yield c


def _message(mid: str) -> dict[str, Any]:
    return {"message": {"id": mid, "role": "user", "parts": [{"type": "text", "text": f"this is {mid}"}]}}


async def _turns(client: httpx.AsyncClient) -> tuple[int, int]:
    """``chronicle_session_write_turns`` and ``chronicle_session_writes_waiting`` of the API process."""
    text = (await client.get("/metrics")).text

    def value(name: str) -> int:
        m = re.search(rf"^{name} (\S+)$", text, re.MULTILINE)
        assert m, text
        return int(float(m.group(1)))

    return value("chronicle_session_write_turns"), value("chronicle_session_writes_waiting")


def _chain(answers: list[dict[str, Any]]) -> list[str]:
    """The appended ids from the root down, asserting that they make one chain (each message the
    parent of exactly one other but the last)."""
    child_of = {a["parent_id"]: a["id"] for a in answers}
    assert len(child_of) == len(answers), "two appends took the same parent"
    order, node = [], child_of.get(None)
    while node is not None:
        order.append(node)
        node = child_of.get(node)
    assert len(order) == len(answers), "the appends are not one chain from one root"
    return order


async def test_200_concurrent_appends_to_one_session_all_succeed_as_one_chain(wide: httpx.AsyncClient) -> None:
    sid = "turns-" + uuid.uuid4().hex[:8]
    assert (await wide.post("/v1/sessions", json={"id": sid})).status_code == 201
    replies = await asyncio.gather(
        *(wide.post(f"/v1/sessions/{sid}/messages", json=_message(f"m{i}")) for i in range(200))
    )
    assert [r.status_code for r in replies] == [201] * 200, {r.status_code: r.text for r in replies}
    answers = [r.json() for r in replies]
    order = _chain(answers)
    assert [a["seq"] for a in sorted(answers, key=lambda a: a["seq"])] == [
        next(a["seq"] for a in answers if a["id"] == mid) for mid in order
    ]  # the chain is in the log's order
    history = await wide.get(f"/v1/sessions/{sid}/history", params={"min_seq": max(a["seq"] for a in answers)})
    assert [m["id"] for m in history.json()["messages"]] == order
    assert await _turns(wide) == (0, 0)  # every write answered: no session keeps a turn


async def test_clients_that_give_up_leave_the_other_writes_fine(api_url: str, wide: httpx.AsyncClient) -> None:
    """Clients that close their connection while their appends wait for their turn: the others
    all succeed, whatever was stored is one chain, and the turns are all given back."""
    sid = "turns-gone-" + uuid.uuid4().hex[:8]
    assert (await wide.post("/v1/sessions", json={"id": sid})).status_code == 201
    headers = {"Authorization": f"Bearer {KEYS['tenant-a']}"}
    limits = httpx.Limits(max_connections=100)
    async with httpx.AsyncClient(base_url=api_url, headers=headers, timeout=60, limits=limits) as leaving:
        staying = [
            asyncio.create_task(wide.post(f"/v1/sessions/{sid}/messages", json=_message(f"s{i}"))) for i in range(100)
        ]
        gone = [
            asyncio.create_task(leaving.post(f"/v1/sessions/{sid}/messages", json=_message(f"g{i}")))
            for i in range(100)
        ]
        while not any(t.done() for t in staying):  # the burst is under way: many wait for their turn
            await asyncio.sleep(0.005)
        for task in gone:
            task.cancel()
        await asyncio.gather(*gone, return_exceptions=True)
    replies = await asyncio.gather(*staying)
    assert [r.status_code for r in replies] == [201] * 100, {r.status_code: r.text for r in replies}
    # the server does not cancel an abandoned request: it finishes it, answering into the void
    deadline = asyncio.get_running_loop().time() + 30
    while await _turns(wide) != (0, 0):
        assert asyncio.get_running_loop().time() < deadline, "the API process keeps turns"
        await asyncio.sleep(0.05)
    logged = await events(wide, sid)
    stored = [logged_message(e["event"]).message_id for e in logged if e["event"]["type"] == "message.appended"]
    history = await wide.get(f"/v1/sessions/{sid}/history", params={"min_seq": logged[-1]["seq"]})
    ids = [m["id"] for m in history.json()["messages"]]
    assert sorted(ids) == sorted(stored)  # everything stored is on the one path
    assert {f"s{i}" for i in range(100)} <= set(ids)
