"""`chronicle commands` as a real process next to `chronicle api`: a tenant's append over NATS is
read back over HTTP, the AsyncAPI document the API serves names this server's command subjects, and
SIGTERM stops the process cleanly."""

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

from bench.support import settings_env
from events.commands import STATUS_HEADER
from events.credentials import tenant_inbox_prefix, tenant_nkey_seed
from services.settings import Settings
from tests.conftest import KEYS


async def test_a_tenant_appends_over_nats_and_reads_over_http(
    api_settings: Settings, client: httpx.AsyncClient
) -> None:
    proc = subprocess.Popen([sys.executable, "-m", "services.ops.cli", "commands"], env=settings_env(api_settings))
    nc = await nats.connect(
        api_settings.nats_url,
        nkeys_seed_str=tenant_nkey_seed(KEYS["tenant-a"]),
        inbox_prefix=tenant_inbox_prefix("tenant-a"),
    )
    try:
        sid = "cmd-" + uuid.uuid4().hex[:8]
        assert (await client.post("/v1/sessions", json={"id": sid})).status_code == 201
        subject = api_settings.layout().command_subject("tenant-a", "append")
        body = {"session_id": sid, "message": {"id": "m1", "role": "user", "parts": [{"type": "text", "text": "hi"}]}}
        deadline = time.monotonic() + 30
        while True:  # until the process subscribes
            try:
                reply = await nc.request(subject, json.dumps(body).encode(), timeout=5)
                break
            except nats.errors.NoRespondersError:
                assert proc.poll() is None, "chronicle commands exited"
                assert time.monotonic() < deadline, "chronicle commands did not start answering"
                await asyncio.sleep(0.2)
        assert (reply.headers or {})[STATUS_HEADER] == "201"
        seq = json.loads(reply.data)["seq"]
        history = await client.get(f"/v1/sessions/{sid}/history", params={"min_seq": seq})
        assert [m["id"] for m in history.json()["messages"]] == ["m1"]

        served = await client.get("/asyncapi.yaml")
        assert served.status_code == 200
        assert served.headers["content-type"].startswith("application/yaml")
        doc = yaml.safe_load(served.text)
        assert doc["channels"]["cmd.append"]["address"] == f"{api_settings.command_prefix}.{{tenant}}.append"
        assert doc["channels"]["message.appended.v2"]["address"].startswith(api_settings.subject_prefix + ".")
    finally:
        await nc.close()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 0
