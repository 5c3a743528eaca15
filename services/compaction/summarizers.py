"""Summarizers: a built-in offline one (deterministic, no network; the default) and an
OpenAI-compatible chat-completions client (OpenAI, vLLM, Ollama, llama.cpp's server).

Reference: the Cloudflare Agents SDK Session API, §4.3 of docs/reference.md."""

from __future__ import annotations

import asyncio
import random
import re
from dataclasses import dataclass
from typing import Any, Protocol

import httpx

from events.admission import MAX_WRITTEN_BYTES
from services.compaction.ranges import Message, Plan, _parts, is_tool_part

NOT_A_COMPLETION = "the answer is not a chat completion"


def completion_text(answer: Any) -> str:
    """The text of an OpenAI-compatible chat completion's first choice; :class:`SummarizerError`
    for any other JSON (a wrong shape is the summarizer's failure, never this process's: retried
    like a 5xx, then recorded)."""
    try:
        content = answer["choices"][0]["message"]["content"]
    except (KeyError, IndexError, TypeError):
        raise SummarizerError(f"{NOT_A_COMPLETION} (no choices[0].message.content)") from None
    if not isinstance(content, str):
        raise SummarizerError("the response has no text content")
    return content


def describe(exc: BaseException | None, timeout_s: float) -> str:
    """A failure in words: its message, else its kind (httpx's timeouts say nothing)."""
    if isinstance(exc, httpx.TimeoutException | TimeoutError):
        return f"{type(exc).__name__}: no answer within {timeout_s:g} s"
    if exc is None:
        return "no attempt was made"
    return str(exc) or type(exc).__name__


class SummarizerError(Exception):
    """The summarizer could not produce a summary (after its retries)."""


class Summarizer(Protocol):
    name: str
    model: str | None

    async def summarize(self, plan: Plan) -> str: ...


def _text(msg: Message) -> str:
    return " ".join(str(p.get("text", "")) for p in _parts(msg) if p.get("type") == "text").strip()


def _clip(text: str, n: int) -> str:
    text = re.sub(r"\s+", " ", text).strip()
    return text if len(text) <= n else text[: n - 1].rstrip() + "\u2026"


def _section(previous: str | None, title: str) -> list[str]:
    """The lines of every ``## title`` section of the previous summary, in order, once each (the
    previous summary joins every overlay the new one replaces, each with its own sections)."""
    if not previous:
        return []
    lines = [
        line
        for m in re.finditer(rf"## {title}\n(.*?)(?=\n## |\Z)", previous, re.S)
        for line in m.group(1).strip().splitlines()
        if line.strip()
    ]
    return list(dict.fromkeys(lines))


def _sections(topic: list[str], points: list[str], state: str, open_items: list[str]) -> str:
    """The reference's four sections."""
    return "\n".join(
        [
            "## Topic",
            *topic,
            "",
            "## Key Points",
            *points,
            "",
            "## Current State",
            state,
            "",
            "## Open Items",
            *open_items,
        ]
    )


class OfflineSummarizer:
    """Deterministic extractive summary in the reference's four sections; extends the previous one."""

    name = "offline"
    model: str | None = None

    async def summarize(self, plan: Plan) -> str:
        """The summary, made in a worker thread: it reads every summarised message (a
        50,000-message middle ~1 s), and the process's event loop serves every tenant."""
        return await asyncio.to_thread(self._summary, plan)

    def _summary(self, plan: Plan) -> str:
        budget_chars = max(400, plan.budget * 4)
        turns = [(str(m.get("role")), _text(m)) for m in plan.middle]
        turns = [(r, t) for r, t in turns if t]
        topic = _section(plan.previous_summary, "Topic") or [
            _clip(next((t for r, t in turns if r == "user"), turns[0][1] if turns else "Conversation"), 200)
        ]
        points = _section(plan.previous_summary, "Key Points")
        per_line = max(60, budget_chars // max(4, len(turns) + len(points) + 4))
        points += [f"- [{role}] {_clip(text, per_line)}" for role, text in turns]
        state = _clip(turns[-1][1], 300) if turns else "No text in the summarised turns."
        tools = sorted(
            {
                str(p.get("toolName") or str(p.get("type", ""))[5:] or "unknown")
                for m in plan.middle
                for p in _parts(m)
                if is_tool_part(p)
            }
        )
        if tools:
            state += f" Tools used: {', '.join(tools)}."
        questions = [f"- {_clip(t, 200)}" for r, t in turns if r == "user" and t.rstrip().endswith("?")]
        open_items = _section(plan.previous_summary, "Open Items")
        open_items = [x for x in open_items if x != "- None recorded."] + questions or ["- None recorded."]
        # the oldest points, then the oldest open items, go first when over the budget or the
        # bound; counted line by line (re-rendering the body after each drop was quadratic: a
        # 50,000-message middle took 34 s)
        points = _drop_oldest(topic, points, state, open_items, budget_chars)
        open_items = _drop_oldest(
            topic, points, state, open_items, MAX_WRITTEN_BYTES, trim_open=True
        )  # the bound alone
        body = _sections(topic, points, state, open_items)
        if len(body.encode()) > OFFLINE_SUMMARY_MAX_BYTES:  # topic and state alone over it
            body = body.encode()[:OFFLINE_SUMMARY_MAX_BYTES].decode(errors="ignore")
        return body


OFFLINE_SUMMARY_MAX_BYTES = MAX_WRITTEN_BYTES // 8
"""The most UTF-8 bytes of an offline summary, whatever its budget (a fifth of the middle's tokens
grows with the session: a 50,000-message middle asked for ~2 MB, over what an overlay's event may
store, so the compaction of a long session always failed). An eighth of what an event stores
leaves room for JSON escapes (a control character is 6 bytes) and sealing's base64."""


def _drop_oldest(
    topic: list[str],
    points: list[str],
    state: str,
    open_items: list[str],
    budget_chars: int,
    *,
    trim_open: bool = False,
) -> list[str]:
    """``points`` (``open_items`` with ``trim_open``) without their oldest lines, as few as make
    :func:`_sections` of them fit ``budget_chars`` characters and
    :data:`OFFLINE_SUMMARY_MAX_BYTES` bytes; at least one line is kept."""
    lines = open_items if trim_open else points
    body = _sections(topic, points, state, open_items)
    chars, size = len(body), len(body.encode())
    drop = 0
    while drop < len(lines) - 1 and (chars > budget_chars or size > OFFLINE_SUMMARY_MAX_BYTES):
        chars -= len(lines[drop]) + 1
        size -= len(lines[drop].encode()) + 1
        drop += 1
    return lines[drop:]


@dataclass
class OpenAISummarizer:
    """Chat completions against any OpenAI-compatible server, with bounded retries and backoff."""

    base_url: str
    model: str | None
    api_key: str | None = None
    timeout_s: float = 60.0
    attempts: int = 3
    backoff_s: float = 0.5
    name: str = "openai-compatible"

    async def summarize(self, plan: Plan) -> str:
        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        body: dict[str, Any] = {
            "model": self.model or "default",
            "messages": [{"role": "user", "content": plan.prompt}],
            "max_tokens": max(256, plan.budget * 2),
            "temperature": 0,
        }
        url = self.base_url.rstrip("/") + "/chat/completions"
        last: Exception | None = None
        async with httpx.AsyncClient(timeout=self.timeout_s) as client:
            for attempt in range(self.attempts):
                try:
                    # httpx's timeout bounds each read, not the answer: one sent a byte at a time
                    # would hold the summary (and a manual compaction's lease) for as long as it sends
                    async with asyncio.timeout(self.timeout_s):
                        resp = await client.post(url, json=body, headers=headers)
                    if resp.status_code == 429 or resp.status_code >= 500:
                        raise SummarizerError(f"HTTP {resp.status_code}: {resp.text[:200]}")
                    if resp.status_code >= 400:
                        raise SummarizerError(f"HTTP {resp.status_code}: {resp.text[:200]}")  # not retried
                    return completion_text(resp.json())
                except SummarizerError as exc:
                    last = exc
                    if not str(exc).startswith(("HTTP 429", "HTTP 5", NOT_A_COMPLETION)):
                        raise
                except (httpx.TransportError, httpx.TimeoutException, TimeoutError, ValueError) as exc:
                    last = exc
                await asyncio.sleep(self.backoff_s * (2**attempt) * (0.5 + random.random()))  # noqa: S311
        raise SummarizerError(f"summarizer failed after {self.attempts} attempts: {describe(last, self.timeout_s)}")
