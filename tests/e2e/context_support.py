"""Helpers for the context-memory end-to-end tests (no fixtures here; see conftest.py)."""

from __future__ import annotations

import asyncio
import io
import json
import math
import uuid
from typing import Any

import httpx
from minio import Minio

from services.settings import Settings
from services.tokens import TokenCounter

PROBLEM = "application/problem+json"
SEP = "\u2550" * 46
COUNTER = TokenCounter("cl100k_base")


def sid(prefix: str = "ctx") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


def tokens(text: str) -> int:
    return COUNTER.count(text)


def pct(used: int, budget: int) -> int:
    """``Math.round(used / budget * 100)``: half up."""
    return math.floor(used / budget * 100 + 0.5)


def block(header: str, content: str) -> str:
    return f"{SEP}\n{header}\n{SEP}\n{content}"


def minio(settings: Settings) -> Minio:
    return Minio(settings.s3_endpoint, "testing", "testing", secure=False, region="us-east-1")


def new_bucket(settings: Settings) -> str:
    name = "sk-" + uuid.uuid4().hex[:16]
    minio(settings).make_bucket(name)
    return name


def tenant_key(key: str, tenant: str = "tenant-a") -> str:
    """Where the server keeps a tenant's objects (services.context.service.object_key)."""
    return f"tenants/{tenant}/{key}"


def put_object(
    settings: Settings, bucket: str, key: str, text: str, description: str | None = None, tenant: str = "tenant-a"
) -> None:
    data = text.encode()
    meta: dict[str, str | list[str] | tuple[str]] | None = {"description": description} if description else None
    minio(settings).put_object(bucket, tenant_key(key, tenant), io.BytesIO(data), len(data), metadata=meta)


async def configure(client: httpx.AsyncClient, session: str, config: dict[str, Any]) -> int:
    r = await client.put(f"/v1/sessions/{session}/config", json=config)
    assert r.status_code == 200, r.text
    seq: int = r.json()["seq"]
    return seq


async def tool(client: httpx.AsyncClient, session: str, name: str, args: Any) -> tuple[str, int]:
    """Run a tool; every outcome is a 200 with a string result."""
    r = await client.post(f"/v1/sessions/{session}/tools/{name}", json=args)
    assert r.status_code == 200, r.text
    body = r.json()
    assert isinstance(body["result"], str), body
    return body["result"], int(body["seq"])


async def tool_names(client: httpx.AsyncClient, session: str, min_seq: int = 0) -> list[str]:
    r = await client.get(f"/v1/sessions/{session}/tools", params={"format": "anthropic", "min_seq": min_seq})
    assert r.status_code == 200, r.text
    return [t["name"] for t in r.json()["tools"]]


async def context(client: httpx.AsyncClient, session: str, min_seq: int = 0) -> dict[str, dict[str, Any]]:
    r = await client.get(f"/v1/sessions/{session}/context", params={"min_seq": min_seq})
    assert r.status_code == 200, r.text
    return {b["label"]: b for b in r.json()["blocks"]}


async def events(client: httpx.AsyncClient, session: str) -> list[dict[str, Any]]:
    r = await client.get(f"/v1/sessions/{session}/events")
    assert r.status_code == 200, r.text
    return [json.loads(line) for line in r.text.splitlines() if line.strip()]


async def last_seq(client: httpx.AsyncClient, session: str) -> int:
    evs = await events(client, session)
    return int(evs[-1]["seq"]) if evs else 0


async def prompt(client: httpx.AsyncClient, session: str, **params: int) -> dict[str, Any]:
    r = await client.get(f"/v1/sessions/{session}/system-prompt", params=params)
    assert r.status_code == 200, r.text
    out: dict[str, Any] = r.json()
    return out


async def refresh(client: httpx.AsyncClient, session: str) -> dict[str, Any]:
    r = await client.post(f"/v1/sessions/{session}/system-prompt:refresh")
    assert r.status_code == 200, r.text
    out: dict[str, Any] = r.json()
    return out


def problem(r: httpx.Response, status: int, code: str) -> dict[str, Any]:
    assert r.status_code == status, r.text
    assert r.headers["content-type"].startswith(PROBLEM), r.headers
    body: dict[str, Any] = r.json()
    assert body["code"] == code, body
    assert body["status"] == status, body
    return body


async def listed(client: httpx.AsyncClient, session: str, label: str, content: str, timeout_s: float = 10.0) -> None:
    """Wait until block ``label`` shows ``content``.

    The skills index is tenant-scoped (``session == ""``) and projected asynchronously: a skill
    recorded by ``set_context``, ``chronicle skills put`` or ``sync`` reaches the listing a moment
    after the call returns, and no ``min_seq`` of the session covers it.
    """
    deadline = asyncio.get_running_loop().time() + timeout_s
    while True:
        got = (await context(client, session)).get(label, {}).get("content")
        if got == content:
            return
        assert asyncio.get_running_loop().time() < deadline, f"{label!r} still shows {got!r}, not {content!r}"
        await asyncio.sleep(0.02)
