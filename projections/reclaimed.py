"""How unloaded skills' tool outputs read: ``[skill unloaded: <key>]`` in place of the output, on
every read of a stored message (history, one message, time travel) and in the copies a fork makes.
Pure: the rows come from :func:`projections.context_queries.reclaimed`."""

from __future__ import annotations

import json
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Reclaimed:
    """Unloaded skills' tool outputs: by message, and by tool call alone (message not known)."""

    by_message: dict[str, dict[str, str]]
    by_call: dict[str, str]

    @property
    def empty(self) -> bool:
        """No unloaded output anywhere: every stored message reads as it is."""
        return not self.by_message and not self.by_call

    def outputs(self, message_id: str, content: str) -> dict[str, str]:
        """{tool call id: skill key} to show as unloaded in this stored message."""
        found = dict(self.by_message.get(message_id, {}))
        for call, key in self.by_call.items():
            if f'"toolCallId":{json.dumps(call, ensure_ascii=False)}' in content:  # stored compact JSON
                found.setdefault(call, key)
        return found


def reclaimed_in(rows: dict[tuple[str, str], str]) -> Reclaimed:
    """:func:`projections.context_queries.reclaimed` rows, grouped for history reads."""
    by_message: dict[str, dict[str, str]] = {}
    by_call: dict[str, str] = {}
    for (mid, call), key in rows.items():
        if mid:
            by_message.setdefault(mid, {})[call] = key
        else:
            by_call[call] = key
    return Reclaimed(by_message, by_call)


def reclaim(content: str, outputs: dict[str, str]) -> str:
    """Stored message JSON with unloaded skills' tool outputs shown as ``[skill unloaded: key]``.

    Only a part whose ``toolCallId`` is a string names a call: a part of another type keeps any
    JSON there (a list, an object), and a message published straight to the log may have
    ``parts`` that is no list at all; both read as stored."""
    body = json.loads(content)
    parts = body.get("parts")
    for part in parts if isinstance(parts, list) else []:
        call = part.get("toolCallId") if isinstance(part, dict) else None
        if isinstance(call, str) and call in outputs:
            part["output"] = f"[skill unloaded: {outputs[call]}]"
    return json.dumps(body, ensure_ascii=False, separators=(",", ":"))
