"""Macro compaction, pure: which range to summarise and the summary prompt (the reference's
``createCompactFunction``), with exact tiktoken counts instead of its heuristic.

Improvements over the reference: when the branch already has an overlay, the middle starts no
later than that overlay, and the new overlay covers exactly the range summarised (from its first
message, not the old overlay's), so it never hides a message that was not summarised nor leaves
a summarised one visible (its §7.6.8 head-alignment drift); and every overlay in that range, not
only the first, is carried into the summary prompt.

Reference: the Cloudflare Agents SDK Session API, §4.1 and §4.3 of docs/reference.md.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Any

from services.compaction.micro import stringify

Message = dict[str, Any]
Counter = Callable[[str], int]
TOKENS_PER_MESSAGE = 4


def _parts(msg: Message) -> list[dict[str, Any]]:
    parts = msg.get("parts")
    return [p for p in parts if isinstance(p, dict)] if isinstance(parts, list) else []


def is_tool_part(part: dict[str, Any]) -> bool:
    kind = str(part.get("type", ""))
    return kind.startswith("tool-") or kind == "dynamic-tool"


def _js_string(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def message_tokens(msg: Message, count: Counter) -> int:
    """Tokens of one message: 4 + text/reasoning + tool input and output (JSON when not text)."""
    total = TOKENS_PER_MESSAGE
    for p in _parts(msg):
        if p.get("type") in ("text", "reasoning"):
            text = p.get("text") if p.get("text") is not None else p.get("reasoning")
            total += count(text) if isinstance(text, str) else 0
        elif is_tool_part(p):
            if p.get("input") is not None:
                total += count(_js_string(p["input"]))
            out = p.get("output") if p.get("output") is not None else p.get("result")
            if out is not None:
                total += count(_js_string(out))
        elif isinstance(p.get("text"), str):
            total += count(p["text"])
        elif p.get("result") is not None:
            total += count(_js_string(p["result"]))
    return total


def _has_tool_calls(msg: Message) -> bool:
    return any(is_tool_part(p) for p in _parts(msg))


def _call_ids(msg: Message) -> set[str]:
    return {str(p["toolCallId"]) for p in _parts(msg) if is_tool_part(p) and "toolCallId" in p}


def _results_for(msg: Message, ids: set[str]) -> bool:
    return bool(_call_ids(msg) & ids)


def align_forward(msgs: Sequence[Message], idx: int) -> int:
    """Move a head boundary past the results of a tool call just before it."""
    if idx <= 0 or idx >= len(msgs):
        return idx
    prev = msgs[idx - 1]
    if prev.get("role") == "assistant" and _has_tool_calls(prev):
        ids = _call_ids(prev)
        while idx < len(msgs) and _results_for(msgs[idx], ids):
            idx += 1
    return idx


def align_backward(msgs: Sequence[Message], idx: int) -> int:
    """Move a tail boundary back so a tool result never starts the tail without its call."""
    if idx <= 0 or idx >= len(msgs):
        return idx
    while idx > 0:
        msg = msgs[idx]
        if msg.get("role") == "assistant" and _has_tool_calls(msg):
            break
        prev = msgs[idx - 1]
        if prev.get("role") == "assistant" and _has_tool_calls(prev) and _results_for(msg, _call_ids(prev)):
            idx -= 1
            continue
        break
    return idx


def tail_cut(
    msgs: Sequence[Message], head_end: int, budget: int, min_tail: int, tokens: Callable[[Message], int]
) -> int:
    n = len(msgs)
    acc = 0
    cut = n
    for i in range(n - 1, head_end - 1, -1):
        t = tokens(msgs[i])
        if acc + t > budget and cut < n:
            break
        acc += t
        cut = i
    min_cut = n - min_tail
    cut = min(cut, min_cut) if min_cut >= head_end else cut
    return align_backward(msgs, cut)


def summary_budget(middle: Sequence[Message], tokens: Callable[[Message], int]) -> int:
    return max(100, int(sum(tokens(m) for m in middle) * 0.2))


_STRUCTURE = """## Topic
[What the conversation is about]

## Key Points
[Important information, decisions, and conclusions from the conversation]

## Current State
[Where things stand now \u2014 what has been done, what is in progress]

## Open Items
[Unresolved questions, pending tasks, or next steps discussed]"""

_CLOSING = (
    "Target ~{budget} tokens. Be factual \u2014 only include information that was explicitly discussed in the "
    "conversation. Do NOT invent file paths, commands, or details that were not mentioned. Write only the summary body."
)


def _js_truthy(value: Any) -> bool:
    """JavaScript truthiness: empty objects and arrays are true; "", 0, null, false are not."""
    if isinstance(value, dict | list):
        return True
    return bool(value)


def _js_to_string(value: Any) -> str:
    """JavaScript ``String(value)`` for JSON values."""
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, dict):
        return "[object Object]"
    if isinstance(value, list):
        return ",".join("" if v is None else _js_to_string(v) for v in value)
    if isinstance(value, int | float):
        return stringify(value)  # a finite number: ``String(n)`` is ``JSON.stringify(n)``
    return str(value)


def _js_slice(text: str, n: int) -> str:
    return text.encode("utf-16-le")[: 2 * n].decode("utf-16-le", errors="ignore")


def transcript(messages: Sequence[Message]) -> str:
    blocks = []
    for msg in messages:
        texts = "\n".join(str(p.get("text", "")) for p in _parts(msg) if p.get("type") == "text")
        tools = []
        for p in _parts(msg):
            if not is_tool_part(p):
                continue
            name = p.get("toolName")
            lines = [f"[Tool: {'unknown' if name is None else _js_to_string(name)}]"]  # ``toolName ?? "unknown"``
            if _js_truthy(p.get("input")):
                lines.append(f"Input: {_js_slice(stringify(p['input']), 500)}")  # ``JSON.stringify(input)``
            if _js_truthy(p.get("output")):
                lines.append(f"Output: {_js_slice(_js_to_string(p['output']), 500)}")
            tools.append("\n".join(lines))
        tool_text = "\n".join(tools)
        blocks.append(f"[{msg.get('role')}]\n{texts}" + ("\n" + tool_text if tool_text else ""))
    return "\n\n---\n\n".join(blocks)


def summary_prompt(middle: Sequence[Message], previous: str | None, budget: int) -> str:
    content = transcript(middle)
    closing = _CLOSING.format(budget=budget)
    if previous:
        return (
            "You are updating a conversation summary. A previous summary exists below. New conversation turns have "
            "occurred since then and need to be incorporated.\n\n"
            f"PREVIOUS SUMMARY:\n{previous}\n\nNEW TURNS TO INCORPORATE:\n{content}\n\n"
            "Update the summary. PRESERVE existing information that is still relevant. ADD new information. "
            f"Remove information only if it is clearly obsolete.\n\n{_STRUCTURE}\n\n{closing}"
        )
    return (
        "Create a concise summary of this conversation that preserves the important information for future "
        f"context.\n\nCONVERSATION TO SUMMARIZE:\n{content}\n\nUse this structure:\n\n{_STRUCTURE}\n\n{closing}"
    )


@dataclass(frozen=True, slots=True)
class Plan:
    """What to summarise: ``messages[start:end]`` of the view is what the new overlay replaces;
    its middle (overlay messages excluded), the summaries of the overlays in that range (joined
    in path order: the previous summary the new one extends), the prompt and its budget."""

    middle: list[Message]
    previous_summary: str | None
    budget: int
    prompt: str
    start: int
    end: int


@dataclass(frozen=True, slots=True)
class Skip:
    reason: str


def summary_text(msg: Message) -> str:
    return "\n".join(str(p.get("text", "")) for p in _parts(msg) if p.get("type") == "text")


def plan_compaction(
    messages: Sequence[Message],
    tokens: Callable[[Message], int],
    *,
    overlays: Collection[int],
    protect_head: int = 3,
    tail_token_budget: int = 20_000,
    min_tail_messages: int = 2,
) -> Plan | Skip:
    """The range to compact in a compacted history view, or why there is nothing to do.

    ``overlays``: the positions in ``messages`` of the overlays in force (read as messages), told
    by what they are, never by their id: a stored message may have an id that starts as an
    overlay's does (``compaction_…``) and is compacted as any other message.

    Every overlay message inside the range is carried into the prompt as the previous summary
    (all of them, in path order, not only the first as the reference does): the new overlay
    hides them, so what they summarised must reach the summarizer.
    """
    if len(messages) <= protect_head + min_tail_messages:
        return Skip("too few messages")
    start = align_forward(messages, protect_head)
    if overlays:
        start = min(start, min(overlays))
    end = tail_cut(messages, start, tail_token_budget, min_tail_messages, tokens)
    if end <= start:
        return Skip("the tail already fits the budget")
    middle = [m for i, m in enumerate(messages[start:end], start) if i not in overlays]
    if not middle:
        return Skip("nothing new to summarise")
    summaries = [summary_text(m) for i, m in enumerate(messages[start:end], start) if i in overlays]
    previous = "\n\n".join(summaries) if summaries else None
    budget = summary_budget(middle, tokens)
    return Plan(middle, previous, budget, summary_prompt(middle, previous, budget), start, end)
