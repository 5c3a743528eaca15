"""A complete agent loop on Chronicle, against any OpenAI-compatible chat-completions endpoint.

Each user turn:

1. append the user message to the session;
2. freeze the system prompt (the same text all turn long, so the provider's prompt cache holds);
3. read the history and convert it to Chat Completions messages;
4. call the LLM with the session's tools (``set_context`` …) plus the manager's ``session_search``;
5. execute the tool calls on Chronicle and append them, with their results, as an assistant
   message of AI SDK tool parts; go back to 3 until the model answers in text;
6. append the answer, then refresh the system prompt so the next turn sees what was learned
   (a refresh that renders the same text keeps the prompt and its version; with a searchable
   history block, whose line counts the tenant's sessions, refresh only after a block write).

A service passes ``run_turn`` the id of the request it answers (``turn_id``): a turn that
failed part-way (Chronicle restarting past the SDK's retries, the LLM timing out) can then be
retried whole without a second user message or answer. ``turn_id`` becomes part of a message
id (``user-<turn_id>``), so the id rules apply to it (a ``/`` is refused); a retry is known by
its id alone, so one with a different text returns the first try's answer.

Run it with the project's Python (``.venv/bin/python``; Chronicle from ``make up``; any
OpenAI-compatible server: OpenAI, vLLM, Ollama, llama.cpp, or the offline stub that
``.venv/bin/python -m tests.e2e.stub_llm`` serves)::

    .venv/bin/python examples/agent_loop.py --base-url http://127.0.0.1:8080 --api-key "$(cat .chronicle/api-key)" \\
        --llm-base-url http://127.0.0.1:11434/v1 --model llama3.1 \\
        "Remember that my favourite colour is teal." "What is my favourite colour?"

With no prompts on the command line it reads one user turn per line from stdin. With
``--nats-url nats://127.0.0.1:4250`` appends are published straight to JetStream as the API key's
tenant (``--nats-creds FILE`` for an external NATS cluster with its own accounts).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import uuid
from collections.abc import Sequence
from typing import Any

import httpx

from chronicle_sdk import ChronicleClient, ChronicleError, Readonly, Session, SessionManager, Tools, to_openai_messages
from chronicle_sdk.tools import parse_arguments

SOUL = "You are a helpful assistant. Save durable facts about the user to the memory block with set_context."


class ChatCompletions:
    """The one LLM call the loop needs: ``POST {base_url}/chat/completions``."""

    def __init__(self, base_url: str, api_key: str | None, model: str, timeout_s: float = 120.0) -> None:
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.model = model
        self._http = httpx.AsyncClient(base_url=base_url.rstrip("/"), headers=headers, timeout=timeout_s)

    async def complete(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> dict[str, Any]:
        """The assistant message of the first choice."""
        body: dict[str, Any] = {"model": self.model, "messages": messages}
        if tools:
            body["tools"] = tools
            body["tool_choice"] = "auto"
        r = await self._http.post("/chat/completions", json=body)
        r.raise_for_status()
        message: dict[str, Any] = r.json()["choices"][0]["message"]
        return message

    async def aclose(self) -> None:
        await self._http.aclose()


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:16]}"


def stored_answer(history: Sequence[dict[str, Any]], user_id: str) -> str | None:
    """The text answer of the turn that the user message ``user_id`` opens in ``history``, if
    the turn got that far: the turn is the messages after it up to the next user message, and
    its last one is an assistant message of text parts only. None for a turn to go on with (no
    step yet, or a tool step last), or when ``user_id`` is not in ``history``."""
    ids = [m.get("id") for m in history]
    if user_id not in ids:
        return None
    turn: list[dict[str, Any]] = []
    for message in history[ids.index(user_id) + 1 :]:
        if message.get("role") == "user":
            break
        turn.append(message)
    if not turn:
        return None
    last = turn[-1]
    parts = last.get("parts") or []
    if last.get("role") != "assistant" or any(p.get("type") != "text" for p in parts):
        return None
    return "\n".join(str(p.get("text", "")) for p in parts)


async def run_turn(
    session: Session,
    manager: SessionManager,
    llm: ChatCompletions,
    user_text: str,
    max_steps: int = 8,
    *,
    turn_id: str | None = None,
) -> str:
    """One user turn, to the model's text answer (see the module docstring).

    ``turn_id`` (the id of the request this turn answers, say) makes the turn safe to retry
    after a failure part-way (Chronicle restarting past the SDK's retries, the LLM timing
    out): the user message's id is ``user-<turn_id>``, so appending it again is a replay
    (``created=False``), not a second user message; the loop then goes on from what the
    first try stored (its tool steps are in the history the model reads), and a turn that
    was already answered returns the stored answer without calling the model (the first try's,
    whatever ``user_text`` the retry passes). ``turn_id`` is part of a message id: one with a
    ``/`` is refused. Without it each call is a new turn with a new id."""
    user_id = f"user-{turn_id}" if turn_id is not None else new_id("user")
    appended = await session.append_message(
        {"id": user_id, "role": "user", "parts": [{"type": "text", "text": user_text}]}
    )
    prompt = await session.freeze_system_prompt()
    tools: Tools = await session.tools() + manager.tools()
    for _ in range(max_steps):
        history = await session.get_history()
        if not appended.created and (answer := stored_answer(history, user_id)) is not None:
            return answer  # a retried turn that its first try answered
        messages = to_openai_messages(history, prompt)
        reply = await llm.complete(messages, tools.openai())
        calls = reply.get("tool_calls") or []
        if not calls:
            answer = str(reply.get("content") or "")
            await session.append_message(
                {"id": new_id("assistant"), "role": "assistant", "parts": [{"type": "text", "text": answer}]}
            )
            return answer
        parts: list[dict[str, Any]] = [{"type": "step-start"}]
        if reply.get("content"):
            parts.append({"type": "text", "text": str(reply["content"])})
        for call in calls:
            name = str(call["function"]["name"])
            raw = call["function"].get("arguments") or "{}"
            result = await tools.execute(name, raw, tool_call_id=str(call["id"]))
            parsed = parse_arguments(raw)
            parts.append(
                {
                    "type": f"tool-{name}",
                    "toolCallId": str(call["id"]),
                    "state": "output-available",
                    "input": parsed if isinstance(parsed, dict) else {"raw": raw},
                    "output": result,
                }
            )
        await session.append_message({"id": new_id("assistant"), "role": "assistant", "parts": parts})
        tools = await session.tools() + manager.tools()  # descriptions follow loaded skills
    raise RuntimeError(f"no answer after {max_steps} model calls")


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("prompts", nargs="*", help="user turns (default: one per line from stdin)")
    p.add_argument("--base-url", default=os.environ.get("CHRONICLE_URL", "http://127.0.0.1:8080"))
    p.add_argument("--api-key", default=os.environ.get("CHRONICLE_API_KEY"))
    p.add_argument("--session", default=None, help="session id (default: a new one)")
    p.add_argument("--llm-base-url", default=os.environ.get("OPENAI_BASE_URL", "https://api.openai.com/v1"))
    p.add_argument("--llm-api-key", default=os.environ.get("OPENAI_API_KEY"))
    p.add_argument("--model", default=os.environ.get("OPENAI_MODEL", "gpt-4o-mini"))
    p.add_argument("--max-steps", type=int, default=8)
    p.add_argument(
        "--nats-url",
        default=None,
        help="append straight to JetStream, as the API key's tenant (its NATS credentials derive from the key)",
    )
    p.add_argument("--nats-creds", default=None, help="a .creds file for an external NATS cluster instead")
    p.add_argument("--json", action="store_true", help="print a JSON summary at the end")
    args = p.parse_args(argv)
    if not args.api_key:
        p.error("--api-key (or CHRONICLE_API_KEY) is required")
    return args


async def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    prompts: list[str] = list(args.prompts) or [line.strip() for line in sys.stdin if line.strip()]
    async with ChronicleClient(
        args.base_url,
        args.api_key,
        nats_url=args.nats_url,
        nats_credentials=args.nats_creds,
        append_via="jetstream" if args.nats_url else "http",
    ) as client:
        manager = SessionManager(client)
        session_id = args.session or new_id("agent")
        session = (
            manager.get_session(session_id)
            .with_context("soul", provider=Readonly(SOUL))
            .with_context("memory", description="Learned facts about the user", max_tokens=1100)
            .with_cached_prompt()
        )
        llm = ChatCompletions(args.llm_base_url, args.llm_api_key, args.model)
        answers: list[str] = []
        if not args.json:  # to go on with it later: --session <id>
            print(f"session {session_id}\n", flush=True)
        try:
            for text in prompts:
                answer = await run_turn(session, manager, llm, text, args.max_steps)
                answers.append(answer)
                if not args.json:
                    print(f"> {text}\n{answer}\n", flush=True)
                await session.refresh_system_prompt()  # the next turn sees what this one learned
        finally:
            await llm.aclose()
        if args.json:
            prompt = await session.get_system_prompt()
            summary = {"session": session_id, "answers": answers, "prompt_version": prompt.version}
            print(json.dumps(summary), flush=True)
    return 0


def run(argv: Sequence[str] | None = None) -> int:
    """:func:`main`, with a failure said in one line on stderr (exit 1) instead of a traceback."""
    try:
        return asyncio.run(main(argv))
    except ChronicleError as exc:  # a bad key, Chronicle unreachable (after the SDK's retries), …
        print(f"agent_loop: Chronicle: {exc.code}: {exc.detail}", file=sys.stderr)
    except httpx.HTTPError as exc:  # the LLM endpoint unreachable or refusing
        url = exc.request.url if isinstance(exc, httpx.RequestError | httpx.HTTPStatusError) else "?"
        print(f"agent_loop: the LLM at {url}: {type(exc).__name__}: {exc}", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(run())
