"""The example agent loop, run as a program against the real stack and the scripted stub LLM."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from chronicle_sdk import ChronicleClient, Session, SessionManager
from services.settings import Settings
from tests.conftest import KEYS
from tests.e2e.sdk_support import open_client, sid, word
from tests.e2e.stub_llm import DEFAULT_FACT, StubLLM

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "agent_loop.py"


@pytest.fixture
async def sdk(api_url: str, api_settings: Settings) -> AsyncIterator[ChronicleClient]:
    async with open_client(api_url, api_settings) as c:
        yield c


def run_example(api_url: str, llm: StubLLM, session_id: str, *prompts: str, extra: list[str] | None = None) -> Any:
    cmd = [
        sys.executable,
        str(EXAMPLE),
        "--base-url",
        api_url,
        "--api-key",
        KEYS["tenant-a"],
        "--llm-base-url",
        llm.base_url,
        "--llm-api-key",
        "stub-key",
        "--model",
        "stub-model",
        "--session",
        session_id,
        "--json",
        *(extra or []),
        *prompts,
    ]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=90, check=False)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


async def prompt_events(s: Session) -> list[dict[str, Any]]:
    return [e["event"] for e in await s.get_events() if e["event"]["type"] == "prompt.rendered"]


async def test_agent_loop_end_to_end(api_url: str, sdk: ChronicleClient) -> None:
    session_id = sid("agent")
    with StubLLM() as llm:
        summary = run_example(api_url, llm, session_id, "My favourite colour is teal. Remember it.")
    assert summary == {
        "session": session_id,
        "answers": ["Noted: your favourite colour is teal."],
        "prompt_version": 2,
    }
    s = Session.create(sdk, session_id)

    # history: user turn, assistant tool call with its output, final answer
    user, tool_turn, final = await s.get_history()
    assert user["role"] == "user"
    assert user["parts"] == [{"type": "text", "text": "My favourite colour is teal. Remember it."}]
    assert tool_turn["role"] == "assistant"
    step, part = tool_turn["parts"]
    assert step == {"type": "step-start"}
    assert part["type"] == "tool-set_context"
    assert part["state"] == "output-available"
    assert part["toolCallId"] == "call_1_0"
    assert part["input"] == {"label": "memory", "content": DEFAULT_FACT}
    assert part["output"].startswith("Written to memory. Usage: ")
    assert final["role"] == "assistant"
    assert final["parts"] == [{"type": "text", "text": "Noted: your favourite colour is teal."}]

    # the memory block holds the fact
    memory = await s.get_context_block("memory")
    assert memory is not None
    assert memory.content == DEFAULT_FACT

    # prompts: frozen v1 (without the fact) for the whole turn, refreshed v2 (with it) after
    v1, v2 = await prompt_events(s)
    assert (v1["version_no"], v1["reason"], v2["version_no"], v2["reason"]) == (1, "freeze", 2, "refresh")
    assert DEFAULT_FACT not in v1["text"]
    assert "MEMORY (Learned facts about the user)" in v1["text"]
    assert DEFAULT_FACT in v2["text"]
    current = await s.get_system_prompt()
    assert (current.version, current.prompt) == (2, v2["text"])

    # what the LLM saw: the frozen prompt, the tools, then the tool result on the second call
    first, second = llm.requests
    for request in (first, second):
        assert request["model"] == "stub-model"
        assert request["messages"][0] == {"role": "system", "content": v1["text"]}
        assert [t["function"]["name"] for t in request["tools"]] == ["set_context", "session_search"]
    assert first["messages"][1:] == [{"role": "user", "content": "My favourite colour is teal. Remember it."}]
    assistant, tool = second["messages"][2:]
    assert assistant["tool_calls"][0]["function"]["name"] == "set_context"
    assert json.loads(assistant["tool_calls"][0]["function"]["arguments"]) == {
        "label": "memory",
        "content": DEFAULT_FACT,
    }
    assert tool["role"] == "tool"
    assert tool["tool_call_id"] == "call_1_0"
    assert tool["content"] == part["output"]


async def test_the_next_turn_sees_what_was_learned(api_url: str, api_settings: Settings, sdk: ChronicleClient) -> None:
    """Two turns, appending straight to JetStream: turn two's prompt is the refreshed one."""
    session_id = sid("agent")
    w = word()
    script = [
        StubLLM.call("set_context", {"label": "memory", "content": DEFAULT_FACT}),
        StubLLM.say("Noted."),
        StubLLM.call("session_search", {"query": w}),
        StubLLM.say("Teal."),
    ]
    direct = ["--nats-url", api_settings.nats_url]
    with StubLLM(script) as llm:
        summary = run_example(api_url, llm, session_id, f"Remember {w}: teal.", "What is my colour?", extra=direct)
    assert summary["answers"] == ["Noted.", "Teal."]
    # turn two learned nothing: the refresh after it renders the same text, so no new version
    assert summary["prompt_version"] == 2
    s = Session.create(sdk, session_id)
    versions = [(e["version_no"], e["reason"]) for e in await prompt_events(s)]
    assert versions == [(1, "freeze"), (2, "refresh")]
    turn_two = llm.requests[2]
    assert DEFAULT_FACT in turn_two["messages"][0]["content"]
    search_result = llm.requests[3]["messages"][-1]
    assert search_result["role"] == "tool"
    assert search_result["content"] == f"[user] Remember {w}: teal."
    roles = [m["role"] for m in await s.get_history()]
    assert roles == ["user", "assistant", "assistant", "user", "assistant", "assistant"]


@pytest.mark.parametrize(
    ("key", "llm_url", "said"),
    [
        ("chr_not-a-key", "http://127.0.0.1:9/v1", "agent_loop: Chronicle: unauthorized: unknown API key"),
        (KEYS["tenant-a"], "http://127.0.0.1:9/v1", "agent_loop: the LLM at http://127.0.0.1:9/v1/chat/completions: "),
    ],
    ids=["bad-api-key", "llm-unreachable"],
)
def test_a_failure_is_one_line_on_stderr_and_exit_1(api_url: str, key: str, llm_url: str, said: str) -> None:
    cmd = [sys.executable, str(EXAMPLE), "--base-url", api_url, "--api-key", key, "--llm-base-url", llm_url, "hi"]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=90, check=False)
    assert done.returncode == 1
    assert len(done.stderr.splitlines()) == 1, done.stderr  # no traceback
    assert done.stderr.startswith(said), done.stderr


def load_example() -> Any:
    """examples/agent_loop.py as a module (it is a script, not a package)."""
    spec = importlib.util.spec_from_file_location("agent_loop_example", EXAMPLE)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


async def test_a_turn_retried_with_its_turn_id_appends_nothing_twice(sdk: ChronicleClient) -> None:
    """The LLM fails after the turn's tool step is stored; the turn retried with the same
    ``turn_id`` replays the user message and goes on from the stored step; a third try of the
    answered turn returns the stored answer without calling the model."""
    example = load_example()
    script = [
        StubLLM.call("set_context", {"label": "memory", "content": DEFAULT_FACT}),
        StubLLM.fail(503),
        StubLLM.say("Noted."),
    ]
    session = Session.create(sdk, sid("agent")).with_context("memory", description="Facts", max_tokens=200)
    manager = SessionManager(sdk)
    with StubLLM(script) as stub:
        llm = example.ChatCompletions(stub.base_url, "stub-key", "stub-model")
        try:
            with pytest.raises(httpx.HTTPStatusError):
                await example.run_turn(session, manager, llm, "Remember teal.", turn_id="t1")
            assert await example.run_turn(session, manager, llm, "Remember teal.", turn_id="t1") == "Noted."
            assert await example.run_turn(session, manager, llm, "Remember teal.", turn_id="t1") == "Noted."
        finally:
            await llm.aclose()
        assert len(stub.requests) == 3  # the answered turn's third try called no model
    history = await session.get_history()
    assert [m["role"] for m in history] == ["user", "assistant", "assistant"]
    assert history[0]["id"] == "user-t1"
    assert history[1]["parts"][1]["type"] == "tool-set_context"
    assert history[2]["parts"] == [{"type": "text", "text": "Noted."}]
    memory = await session.get_context_block("memory")
    assert memory is not None
    assert memory.content == DEFAULT_FACT
