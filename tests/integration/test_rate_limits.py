"""Per-tenant request limits (``CHRONICLE_RATE_LIMIT``): a tenant over its limit gets ``429
rate_limited`` with the time to wait, over HTTP and over NATS commands alike; what it was refused
did not happen; other tenants and tenant-less routes go on. Real parts: a nats-server configured
from the settings (tenant credentials), Postgres, a projector, `chronicle commands`' broker, and
the API served by uvicorn. Each test serves a fresh app or broker: fresh buckets."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest

from chronicle_sdk import ChronicleClient
from events.commands import STATUS_HEADER
from services.api.app import build_app
from services.api.metrics import REGISTRY
from services.bootstrap import Container
from services.commands_nats.app import serving_commands
from services.settings import Settings
from tests.conftest import KEYS, running_stack, tenant_nats, tenant_nats_settings
from tests.support import served

RATE, BURST = 1.0, 3  # tenant-a: 3 requests at once, then 1 a second (the margin of every test); tenant-b: no limit


@pytest.fixture(scope="module")
def settings(tmp_path_factory: pytest.TempPathFactory, pg_admin: str, s3_endpoint: str) -> Iterator[Settings]:
    tmp = tmp_path_factory.mktemp("limits-nats")
    limits = {"rate_limit": RATE, "rate_limit_burst": BURST, "rate_limits": {"tenant-b": 0}}
    with tenant_nats_settings(tmp, pg_admin, s3_endpoint, **limits) as s:
        yield s


@pytest.fixture(scope="module")
async def stack(settings: Settings) -> AsyncIterator[Container]:
    async with running_stack(settings) as c:
        yield c


@pytest.fixture
async def api(settings: Settings, stack: Container) -> AsyncIterator[str]:
    """A fresh API (fresh buckets) over real HTTP; its base URL."""
    async with served(build_app(settings, stack)) as url:
        yield url


def client(url: str, tenant: str) -> httpx.AsyncClient:
    return httpx.AsyncClient(base_url=url, headers={"Authorization": f"Bearer {KEYS[tenant]}"}, timeout=30)


def message(mid: str) -> dict[str, Any]:
    return {"id": mid, "role": "user", "parts": [{"type": "text", "text": f"text of {mid}"}]}


async def exhausted(http: httpx.AsyncClient) -> httpx.Response:
    """Requests until one is refused (at most the burst and what refills meanwhile); that answer."""
    for _ in range(BURST + 10):
        resp = await http.get("/v1/sessions")
        if resp.status_code == 429:
            return resp
        assert resp.status_code == 200, resp.text
    raise AssertionError("never refused")


async def test_a_tenant_over_its_limit_gets_429_with_retry_after_and_the_append_did_not_happen(api: str) -> None:
    sid = "s-" + uuid.uuid4().hex[:10]
    async with client(api, "tenant-a") as http:
        assert (await http.post("/v1/sessions", json={"id": sid})).status_code == 201
        seqs = []
        for mid in ("m1", "m2"):  # the burst's other two
            resp = await http.post(f"/v1/sessions/{sid}/messages", json={"message": message(mid)})
            assert resp.status_code == 201, resp.text
            seqs.append(resp.json()["seq"])

        refused = await http.post(f"/v1/sessions/{sid}/messages", json={"message": message("m3")})
        assert refused.status_code == 429, refused.text
        assert refused.headers["content-type"] == "application/problem+json"
        body = refused.json()
        assert body["code"] == "rate_limited"
        assert body["status"] == 429
        assert 0 < body["retry_after"] <= 1 / RATE
        assert refused.headers["retry-after"] == "1"  # whole seconds, rounded up
        assert "tenant-a" in body["detail"]

        await asyncio.sleep(
            body["retry_after"]
        )  # then one request is admitted: the same append, on the same connection
        again = await http.post(f"/v1/sessions/{sid}/messages", json={"message": message("m3")})
        assert again.status_code == 201, again.text
        assert again.json()["created"] is True  # the refused one stored nothing
        assert again.json()["seq"] > max(seqs)


def refused_over_http() -> float:
    """The HTTP requests the API refused as over a limit, from its registry's public samples."""
    return REGISTRY.get_sample_value("chronicle_rate_limited_requests_total", {"transport": "http"}) or 0.0


async def test_a_refused_tenant_does_not_slow_another_nor_the_tenantless_routes(api: str) -> None:
    before = refused_over_http()
    async with client(api, "tenant-a") as a, client(api, "tenant-b") as b:
        await exhausted(a)
        for _ in range(BURST * 4):  # tenant-b has no limit (rate_limits: 0)
            assert (await b.get("/v1/sessions")).status_code == 200
        assert (await a.get("/healthz")).status_code == 200  # no tenant: not counted
        assert (await a.get("/v1/sessions")).status_code == 429  # still over: nothing above refilled it
        metrics = (await a.get("/metrics")).text
    # exactly tenant-a's two refusals were counted; tenant-b's and /healthz's requests were not
    assert refused_over_http() - before == 2
    assert 'chronicle_rate_limited_requests_total{transport="http"}' in metrics


async def test_a_command_over_nats_over_its_limit_is_refused_with_the_same_problem(
    settings: Settings, stack: Container, api: str
) -> None:
    sids = ["s-" + uuid.uuid4().hex[:10] for _ in range(BURST + 1)]
    subject = settings.layout().command_subject("tenant-a", "session.create")
    nc = await tenant_nats(settings.nats_url, "tenant-a")
    try:
        async with serving_commands(settings, stack):  # its own buckets
            replies = []
            for data in [json.dumps({"id": sid}).encode() for sid in sids] + [b"{not json"]:
                msg = await nc.request(subject, data, timeout=15)
                replies.append((int((msg.headers or {})[STATUS_HEADER]), json.loads(msg.data)))
    finally:
        await nc.close()
    # over the limit, a body that is not even JSON is refused as over the limit: checked first
    assert [status for status, _ in replies] == [201] * BURST + [429, 429]
    refusal = replies[BURST][1]
    assert refusal["code"] == "rate_limited"
    assert 0 < refusal["retry_after"] <= 1 / RATE
    async with client(api, "tenant-a") as http:  # the API's buckets are its own
        admitted = await http.post("/v1/sessions", json={"id": sids[0]})
        assert admitted.status_code == 409
        assert admitted.json()["code"] == "session_exists"
        refused = await http.post("/v1/sessions", json={"id": sids[-1]})
        assert refused.status_code == 201, refused.text  # the refused command created nothing


async def test_the_sdk_waits_out_a_refusal_and_every_append_lands_once(api: str) -> None:
    before = refused_over_http()
    async with ChronicleClient(api, KEYS["tenant-a"]) as sdk:
        session = sdk.session("s-" + uuid.uuid4().hex[:10])
        texts = [f"message {i}" for i in range(BURST + 3)]  # past the burst: some answers are 429s
        for text in texts:
            await session.append_message(
                {"id": uuid.uuid4().hex, "role": "user", "parts": [{"type": "text", "text": text}]}
            )
        history = await session.get_history()
    assert refused_over_http() > before  # the server did refuse some
    assert [m["parts"][0]["text"] for m in history] == texts  # each exactly once, in order
