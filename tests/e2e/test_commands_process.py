"""`chronicle commands` as a real process next to `chronicle api` (the e2e stack runs one): a
tenant's append over NATS is read back over HTTP, the AsyncAPI document the API serves names this
server's command subjects, and SIGTERM stops a command process cleanly."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import time
import uuid

import httpx
import nats
import nats.errors
import yaml
from nats.aio.client import Client as NatsClient

from bench.support import settings_env
from events.catalog import MessageAppended
from events.commands import STATUS_HEADER
from events.credentials import tenant_inbox_prefix, tenant_nkey_seed
from services.settings import Settings
from tests.conftest import KEYS, OPERATOR_SEED


def _append(sid: str) -> bytes:
    message = {"id": "m1", "role": "user", "parts": [{"type": "text", "text": "hi"}]}
    return json.dumps({"session_id": sid, "message": message}).encode()


async def _answered(nc: NatsClient, subject: str, data: bytes, proc: subprocess.Popen[bytes] | None = None) -> bytes:
    """The reply, once a command process answers on ``subject`` (they start next to the API)."""
    deadline = time.monotonic() + 30
    while True:
        try:
            reply = await nc.request(subject, data, timeout=5)
            assert (reply.headers or {})[STATUS_HEADER] == "201", reply.data
            return reply.data
        except nats.errors.NoRespondersError:
            assert proc is None or proc.poll() is None, "chronicle commands exited"
            assert time.monotonic() < deadline, "no command process answered"
            await asyncio.sleep(0.2)


async def test_a_tenant_appends_over_nats_and_reads_over_http(
    api_settings: Settings, client: httpx.AsyncClient
) -> None:
    nc = await nats.connect(
        api_settings.nats_url,
        nkeys_seed_str=tenant_nkey_seed(KEYS["tenant-a"]),
        inbox_prefix=tenant_inbox_prefix("tenant-a"),
    )
    try:
        sid = "cmd-" + uuid.uuid4().hex[:8]
        assert (await client.post("/v1/sessions", json={"id": sid})).status_code == 201
        reply = await _answered(nc, api_settings.layout().command_subject("tenant-a", "append"), _append(sid))
        history = await client.get(f"/v1/sessions/{sid}/history", params={"min_seq": json.loads(reply)["seq"]})
        assert [m["id"] for m in history.json()["messages"]] == ["m1"]
    finally:
        await nc.close()

    served = await client.get("/asyncapi.yaml")
    assert served.status_code == 200
    assert served.headers["content-type"].startswith("application/yaml")
    doc = yaml.safe_load(served.text)
    assert doc["channels"]["cmd.append"]["address"] == f"{api_settings.command_prefix}.{{tenant}}.append"
    appended = doc["channels"][f"message.appended.v{MessageAppended.VERSION}"]
    assert appended["address"].startswith(api_settings.subject_prefix + ".")


async def test_sigterm_stops_a_command_process_cleanly(api_settings: Settings, client: httpx.AsyncClient) -> None:
    own = api_settings.model_copy(update={"command_prefix": f"own{uuid.uuid4().hex[:6]}.cmd"})
    proc = subprocess.Popen([sys.executable, "-m", "services.ops.cli", "commands"], env=settings_env(own))
    nc = await nats.connect(api_settings.nats_url, nkeys_seed_str=OPERATOR_SEED)  # own prefix: no tenant may use it
    try:
        sid = "cmd-" + uuid.uuid4().hex[:8]
        await _answered(
            nc, own.layout().command_subject("tenant-a", "session.create"), json.dumps({"id": sid}).encode(), proc
        )
    finally:
        await nc.close()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 0
