"""A summary too large to store (its overlay event over what an event may be, sealed when the stack
seals) is the summarizer's failure: ``POST …/compact`` answers ``502 summarizer_failed`` and
records ``compaction.failed`` with the reason in words, the compactor's work queue records each
attempt's failure and gives up after its attempts, as for any other summarizer failure; no
overlay is recorded. The summarizer is a stub LLM answering 1.1 million characters."""

from __future__ import annotations

import asyncio
import re
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from bench.support import settings_env
from events.admission import MAX_WRITTEN_BYTES
from services.ops.localstack import free_port, wait_for_port
from services.settings import Settings
from tests.conftest import KEYS
from tests.e2e.stub_llm import StubLLM

HUGE = "summary " * 140_000  # 1,120,000 characters: over the limit sealed or not
TOO_LARGE = re.compile(rf"^the summary is too large to store: (\d+) bytes, at most {MAX_WRITTEN_BYTES}$")
LONG = "lorem " * 20_000  # nine of them summarised: the huge summary would still shrink the context
CONFIG = {"compaction": {"protect_head": 1, "tail_token_budget": 50, "min_tail_messages": 2}}


def _env(settings: Settings, llm: StubLLM) -> dict[str, str]:
    env = settings_env(settings)
    env.update(
        CHRONICLE_SUMMARIZER="openai",
        CHRONICLE_SUMMARIZER_BASE_URL=llm.base_url,
        CHRONICLE_SUMMARIZER_MODEL="stub",
        CHRONICLE_SUMMARIZER_ATTEMPTS="1",
    )
    return env


@pytest.fixture
def llm() -> Iterator[StubLLM]:
    with StubLLM([], fallback=HUGE) as stub:
        yield stub


async def _session(client: httpx.AsyncClient, config: dict[str, Any]) -> str:
    sid = "big-" + uuid.uuid4().hex[:8]
    assert (await client.put(f"/v1/sessions/{sid}/config", json=config)).status_code == 200
    for i in range(12):
        msg = {"id": f"m{i}", "role": "user", "parts": [{"type": "text", "text": f"turn {i} " + LONG}]}
        assert (await client.post(f"/v1/sessions/{sid}/messages", json={"message": msg})).status_code == 201
    return sid


async def _failures(client: httpx.AsyncClient, sid: str) -> list[dict[str, Any]]:
    r = await client.get(f"/v1/sessions/{sid}/compaction-failures")
    assert r.status_code == 200, r.text
    found: list[dict[str, Any]] = r.json()["failures"]
    return found


async def _overlays(client: httpx.AsyncClient, sid: str) -> list[dict[str, Any]]:
    r = await client.get(f"/v1/sessions/{sid}/compactions")
    assert r.status_code == 200, r.text
    found: list[dict[str, Any]] = r.json()["compactions"]
    return found


def _reason(error: str) -> int:
    """The stored size a recorded failure names (its error: ``SummarizerError: <reason>``)."""
    kind, _, reason = error.partition(": ")
    assert kind == "SummarizerError", error
    found = TOO_LARGE.match(reason)
    assert found is not None, error
    return int(found.group(1))


async def test_a_manual_compaction_whose_summary_is_too_large_is_summarizer_failed(
    client: httpx.AsyncClient, api_settings: Settings, llm: StubLLM
) -> None:
    port = free_port()
    env = _env(api_settings, llm) | {"CHRONICLE_API_PORT": str(port)}
    api = subprocess.Popen([sys.executable, "-m", "services.ops.cli", "api"], env=env)
    try:
        wait_for_port("127.0.0.1", port, api, "chronicle api", timeout=30)
        headers = {"Authorization": f"Bearer {KEYS['tenant-a']}"}
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", headers=headers, timeout=60) as stubbed:
            sid = await _session(stubbed, CONFIG)
            r = await stubbed.post(f"/v1/sessions/{sid}/compact", json={})
            assert r.status_code == 502, r.text
            assert r.json()["code"] == "summarizer_failed"
            assert _reason("SummarizerError: " + r.json()["detail"]) > MAX_WRITTEN_BYTES
            assert len(llm.requests) == 1
    finally:
        api.terminate()
        api.wait(timeout=20)
    (failure,) = await _failures(client, sid)
    assert _reason(failure["error"]) > MAX_WRITTEN_BYTES
    assert failure["attempt"] == 1
    assert await _overlays(client, sid) == []
    r = await client.get(f"/v1/sessions/{sid}/events")
    assert "compaction.recorded" not in r.text


@pytest.mark.timing  # "nothing more happened" is checked after a fixed wait (no signal marks it)
async def test_the_work_queue_records_each_attempt_and_gives_up(
    client: httpx.AsyncClient, api_settings: Settings, llm: StubLLM
) -> None:
    """As for any summarizer failure: a ``compaction.failed`` per attempt (numbered), redelivered
    after the backoff, given up after ``CHRONICLE_COMPACTION_ATTEMPTS``; then held (the session
    is asked for again only after growth)."""
    sid = await _session(client, {"compaction": {**CONFIG["compaction"], "compact_after": 300}})
    env = _env(api_settings, llm) | {"CHRONICLE_COMPACTOR_NAME": f"cmp-{sid}"}
    proc = subprocess.Popen([sys.executable, "-m", "services.ops.cli", "compactor"], env=env)
    try:
        attempts = api_settings.compaction_attempts
        failures: list[dict[str, Any]] = []
        for _ in range(600):
            failures = await _failures(client, sid)
            if len(failures) >= attempts:
                break
            await asyncio.sleep(0.1)
        assert [f["attempt"] for f in failures] == list(range(1, attempts + 1))
        assert all(_reason(f["error"]) > MAX_WRITTEN_BYTES for f in failures)
        asked = len(llm.requests)
        await asyncio.sleep(2.0)  # past the backoff: nothing more is tried
        assert len(await _failures(client, sid)) == attempts
        assert len(llm.requests) == asked == attempts
        assert await _overlays(client, sid) == []
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=20)
