"""An API with a Postgres pool of one connection (``CHRONICLE_DB_POOL_MAX=1``) serves concurrent
conversations: no request holds a pooled connection while it waits for another. A config or a
block write sized the prompt it would leave with the connection of its decision held and asked
the key store, which took a second one (the session's data key, the erasure poll): a pool held
whole by such writes waited for itself until the pool's timeout (30 s, then ``503``), and the
writes of the same sessions queued behind them answered ``503 contention``. Real HTTP (uvicorn),
NATS, Postgres, encryption on (each new session's key is made on the way)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator

import httpx
import pytest

from services.api.app import build_app
from services.bootstrap import open_container
from services.settings import Settings
from tests.conftest import KEYS, make_settings, running_stack
from tests.integration.helpers import text_message
from tests.support import served

CONVERSATIONS = 4
ANSWER_S = 10.0
"""Each answer's bound: a request waiting for a connection its own request holds waits for the
pool's timeout (30 s) instead."""
CONFIG = {"blocks": [{"kind": "writable", "label": "memory", "description": "facts", "max_tokens": 500}]}


@pytest.fixture
def settings(nats_url: str, fresh_db: str, s3_endpoint: str) -> Settings:
    return make_settings(nats_url, fresh_db, s3_endpoint=s3_endpoint, db_pool_max=1, db_pool_min=1, encryption=True)


@pytest.fixture
async def http(settings: Settings) -> AsyncIterator[httpx.AsyncClient]:
    async with running_stack(settings) as c, served(build_app(settings, c)) as url:
        headers = {"Authorization": f"Bearer {KEYS['tenant-a']}"}
        async with httpx.AsyncClient(base_url=url, headers=headers, timeout=ANSWER_S) as client:
            yield client


async def conversation(http: httpx.AsyncClient, turns: int = 2) -> list[int]:
    """A session configured, then turns of a user message, a memory write and the history read."""
    sid = f"pool-{uuid.uuid4().hex[:8]}"
    statuses = [(await http.put(f"/v1/sessions/{sid}/config", json=CONFIG)).status_code]
    for t in range(turns):
        r = await http.post(f"/v1/sessions/{sid}/messages", json={"message": text_message(f"u{t}", f"turn {t}")})
        statuses.append(r.status_code)
        w = await http.put(f"/v1/sessions/{sid}/context/memory", json={"content": f"fact {t}", "mode": "append"})
        statuses.append(w.status_code)
        h = await http.get(f"/v1/sessions/{sid}/history", params={"min_seq": w.json().get("seq", 0)})
        statuses.append(h.status_code)
    return statuses


async def test_concurrent_conversations_on_a_pool_of_one_are_all_answered(http: httpx.AsyncClient) -> None:
    answers = await asyncio.gather(*(conversation(http) for _ in range(CONVERSATIONS)))
    assert all(s in (200, 201) for statuses in answers for s in statuses), answers


async def test_a_create_sent_again_to_another_process_on_a_pool_of_one_is_replayed(
    settings: Settings, http: httpx.AsyncClient
) -> None:
    """A create whose answer was lost, sent again to a process that does not hold the session's
    key (another API, or this one restarted): its replay reads the first ``session.created`` from
    the log and opens it with the key, which that process's key store fetches from Postgres. It
    did so with the decision's connection held: a second connection, which a pool of one never
    has (30 s, then ``503``)."""
    sid = f"pool-{uuid.uuid4().hex[:8]}"
    first = await http.post("/v1/sessions", json={"id": sid, "name": "first"})
    assert first.status_code == 201, first.text
    async with open_container(settings) as other, served(build_app(settings, other)) as url:
        headers = {"Authorization": f"Bearer {KEYS['tenant-a']}"}
        async with httpx.AsyncClient(base_url=url, headers=headers, timeout=ANSWER_S) as again:
            replayed = await again.post("/v1/sessions", json={"id": sid, "name": "first"})
    assert replayed.status_code in (200, 201), replayed.text
    assert replayed.json()["seq"] == first.json()["seq"]
