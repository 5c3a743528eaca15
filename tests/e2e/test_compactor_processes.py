"""`chronicle compactor` as real processes: two on one stream record an overlay once; one killed
(SIGKILL) while its summarizer is answering, then restarted, records it once."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import uuid

import httpx
import pytest

from bench.support import settings_env
from services.settings import Settings
from tests.e2e.stub_llm import StubLLM

CONFIG = {"compaction": {"compact_after": 300, "protect_head": 1, "tail_token_budget": 50, "min_tail_messages": 2}}


def _compactor(settings: Settings, name: str, llm: StubLLM) -> subprocess.Popen[bytes]:
    env = settings_env(settings)
    env.update(
        CHRONICLE_COMPACTOR_NAME=name,
        CHRONICLE_SUMMARIZER="openai",
        CHRONICLE_SUMMARIZER_BASE_URL=llm.base_url,
        CHRONICLE_SUMMARIZER_MODEL="stub",
        CHRONICLE_SUMMARIZER_ATTEMPTS="1",
    )
    return subprocess.Popen([sys.executable, "-m", "services.ops.cli", "compactor"], env=env, stderr=subprocess.DEVNULL)


async def _session_with_history(client: httpx.AsyncClient) -> str:
    sid = "cp-" + uuid.uuid4().hex[:8]
    assert (await client.put(f"/v1/sessions/{sid}/config", json=CONFIG)).status_code == 200
    for i in range(12):
        msg = {"id": f"m{i}", "role": "user", "parts": [{"type": "text", "text": f"turn {i} " + "lorem " * 30}]}
        assert (await client.post(f"/v1/sessions/{sid}/messages", json={"message": msg})).status_code == 201
    return sid


async def _overlays(client: httpx.AsyncClient, sid: str, want: int = 1, seconds: float = 30) -> list[dict[str, object]]:
    found: list[dict[str, object]] = []
    for _ in range(int(seconds * 10)):
        found = (await client.get(f"/v1/sessions/{sid}/compactions")).json()["compactions"]
        if len(found) >= want:
            break
        await asyncio.sleep(0.1)
    return found


@pytest.mark.timing  # "nothing more happened" is checked after a fixed wait (no signal marks it)
async def test_two_compactor_processes_record_once(client: httpx.AsyncClient, api_settings: Settings) -> None:
    sid = await _session_with_history(client)
    with StubLLM([], fallback="## Topic\nthe same summary") as llm:
        procs = [_compactor(api_settings, f"cmp-a-{sid}", llm), _compactor(api_settings, f"cmp-b-{sid}", llm)]
        try:
            assert len(await _overlays(client, sid)) == 1
            await asyncio.sleep(2.0)  # both have had time to act
            assert len(await _overlays(client, sid)) == 1
        finally:
            for p in procs:
                p.send_signal(signal.SIGTERM)
            for p in procs:
                p.wait(timeout=20)


@pytest.mark.timing  # "nothing more happened" is checked after a fixed wait (no signal marks it)
async def test_compactor_killed_mid_compaction_records_once(client: httpx.AsyncClient, api_settings: Settings) -> None:
    sid = await _session_with_history(client)
    name = f"cmp-k-{sid}"
    with StubLLM([StubLLM.slow("## Topic\nlate", 30.0)], fallback="## Topic\nafter restart") as llm:
        proc = _compactor(api_settings, name, llm)
        for _ in range(300):  # until the summarizer has been asked
            if llm.requests:
                break
            await asyncio.sleep(0.1)
        assert llm.requests, "the compactor never called the summarizer"
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        assert await _overlays(client, sid, seconds=0.5) == []
        proc = _compactor(api_settings, name, llm)
        try:
            found = await _overlays(client, sid)
            assert len(found) == 1
            await asyncio.sleep(2.0)
            assert len(await _overlays(client, sid)) == 1
            assert found[0]["summary"] == "## Topic\nafter restart"
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=20)
