"""Time-travel reads take turns (services/slots.py ``AsOfGate``).

A read with ``as_of_seq`` folds the session from the log's first event and holds its bodies in
memory; nothing bounded how many ran at once, and a read-only key may send them. A tenant now
folds at most ``CHRONICLE_AS_OF_SLOTS_PER_TENANT`` sessions at once in a process: its next one is
``429 as_of_busy`` at once (``Retry-After``), while another tenant's fold is served. The folds are
held open by a fold that waits on an event the test sets (real NATS, Postgres and the API app)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from events.omitted import OMITTED
from projections.timetravel import SessionState
from services.api.app import build_app
from services.audit import readers
from tests.conftest import make_settings, running_stack
from tests.integration.helpers import tenant_client, text_message

TENANT = "tenant-a"
WAIT_S = 10.0


async def test_a_tenant_past_its_concurrent_folds_is_told_as_of_busy_and_another_tenant_is_served(
    nats_url: str, fresh_db: str, s3_endpoint: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = make_settings(nats_url, fresh_db, s3_endpoint=s3_endpoint, as_of_slots=3, as_of_slots_per_tenant=2)
    fold = readers.session_as_of
    release = asyncio.Event()
    folding: list[str] = []

    async def held_fold(c: Any, tenant: str, session: str, as_of_seq: int) -> SessionState:
        folding.append(tenant)
        await release.wait()
        return await fold(c, tenant, session, as_of_seq)

    monkeypatch.setattr(readers, "session_as_of", held_fold)
    async with running_stack(settings) as c:
        seqs = {}
        for t in (TENANT, "tenant-b"):
            r = await c.commands.append(t, "s1", text_message("m1", "we deploy on Friday"), OMITTED)
            seqs[t] = r.seq
        await c.waiter.wait_all(max(seqs.values()))
        app = build_app(c.settings, c)
        async with tenant_client(app, TENANT) as a, tenant_client(app, "tenant-b") as b:
            history = {"as_of_seq": seqs[TENANT]}
            held = [asyncio.create_task(a.get("/v1/sessions/s1/history", params=history)) for _ in range(2)]
            async with asyncio.timeout(WAIT_S):
                while folding.count(TENANT) < 2:
                    await asyncio.sleep(0.01)
            busy = await asyncio.wait_for(a.get("/v1/sessions/s1/context", params=history), WAIT_S)
            assert busy.status_code == 429, busy.text
            assert busy.json()["code"] == "as_of_busy"
            assert busy.headers["retry-after"] == "1"
            assert folding.count(TENANT) == 2  # refused before it folded anything
            other = asyncio.create_task(b.get("/v1/sessions/s1/history", params={"as_of_seq": seqs["tenant-b"]}))
            async with asyncio.timeout(WAIT_S):
                while folding.count("tenant-b") < 1:
                    await asyncio.sleep(0.01)
            now = await a.get("/v1/sessions/s1/history")  # a read of now takes no slot
            assert now.status_code == 200, now.text
            release.set()
            for answer in [*await asyncio.gather(*held), await other]:
                assert answer.status_code == 200, answer.text
                assert [m["id"] for m in answer.json()["messages"]] == ["m1"]
            assert c.as_of_gate.running(TENANT) == 0
            again = await a.get("/v1/sessions/s1/context", params=history)
            assert again.status_code == 200, again.text
