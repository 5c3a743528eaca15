"""CHRONICLE_OPS_KEY: the operator routes (cross-tenant totals) need it; /healthz stays open."""

from __future__ import annotations

import httpx
import pytest

from services.api.app import build_app
from services.settings import Settings

OPS = "ops-secret-key"


def _client(ops_key: str | None) -> httpx.AsyncClient:
    app = build_app(Settings(ops_key=ops_key, api_keys=[]))
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://chronicle")


@pytest.mark.parametrize("path", ["/metrics", "/readyz", "/docs", "/redoc", "/openapi.json"])
async def test_operator_routes_need_the_ops_key(path: str) -> None:
    async with _client(OPS) as client:
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": OPS}):
            r = await client.get(path, headers=headers)
            assert r.status_code == 401, r.text
            assert r.json()["code"] == "unauthorized"
            assert r.headers["www-authenticate"] == "Bearer"


async def test_the_ops_key_opens_them_and_healthz_stays_open() -> None:
    async with _client(OPS) as client:
        r = await client.get("/openapi.json", headers={"Authorization": f"Bearer {OPS}"})
        assert r.status_code == 200
        assert (await client.get("/healthz")).json() == {"status": "ok"}


async def test_without_an_ops_key_they_are_open() -> None:
    async with _client(None) as client:
        assert (await client.get("/openapi.json")).status_code == 200


@pytest.mark.parametrize("second", [f"Bearer {OPS}", "Bearer wrong"], ids=["the-ops-key-twice", "a-wrong-key"])
async def test_more_than_one_authorization_header_is_401_on_the_operator_routes(second: str) -> None:
    """Whichever comes first, two credentials open nothing (a proxy appending its own)."""
    async with _client(OPS) as client:
        for pair in ([f"Bearer {OPS}", second], [second, f"Bearer {OPS}"]):
            r = await client.get("/metrics", headers=[("Authorization", value) for value in pair])
            assert r.status_code == 401, r.text
            assert r.json()["code"] == "ambiguous_credentials"
            assert r.headers["www-authenticate"] == "Bearer"
