"""What context memory decides without I/O: where a tenant's objects live, how an append joins,
which configured keys are unsafe, which skills a block allows, and how unloaded skills' outputs
show in stored messages."""

from __future__ import annotations

import json
from dataclasses import dataclass

from events.context import ReadonlyBlock, SearchableBlock, SessionConfig, SkillsBlock, WritableBlock
from services.context.entry_keys import unsafe_object_key, unsafe_prefix
from services.errors import UnsafeStoredConfig

Sources = dict[tuple[str, str], str]
"""Object-storage texts of read-only blocks by (bucket, key)."""


def object_key(tenant: str, key: str) -> str:
    """Where a tenant's objects live in a bucket: ``tenants/<tenant>/<key>``.

    Every tenant's reads and writes go through the server's S3 credentials, so each tenant is
    confined to its own key space; one tenant cannot name another's objects.
    """
    return f"tenants/{tenant}/{key}"


def joined(current: str, addition: str) -> str:
    """Append as the reference does: a newline between, unless empty or already starting with one."""
    sep = "\n" if current and not addition.startswith("\n") else ""
    return current + sep + addition


def unsafe_keys(config: SessionConfig) -> str | None:
    """Why ``config`` names an object outside its tenant's space (the first block that does), or
    None. Object keys are relative to ``tenants/<tenant>/`` (see :func:`object_key`)."""
    for b in config.blocks:
        found: list[tuple[str, str, str | None]] = []
        if isinstance(b, ReadonlyBlock) and b.source is not None:
            found.append(("source.key", b.source.key, unsafe_object_key(b.source.key)))
        if isinstance(b, SkillsBlock):
            found.append(("prefix", b.prefix, unsafe_prefix(b.prefix)))
            found.extend(("keys", k, unsafe_object_key(b.prefix + k)) for k in b.keys or [])
        for field, value, why in found:
            if why is not None:
                return f"block {b.label!r}: {field} {value[:200]!r} is not a safe object key: {why}"
    return None


def refuse_unsafe(config: SessionConfig) -> None:
    """A configuration stored before keys were checked is refused where it would be rendered."""
    problem = unsafe_keys(config)
    if problem is not None:
        raise UnsafeStoredConfig(problem)


def allowed(block: SkillsBlock, listing: list[tuple[str, str | None]]) -> list[tuple[str, str | None]]:
    """(key relative to the block's prefix, description) of the listed skills the block allows."""
    entries: list[tuple[str, str | None]] = []
    for key, desc in listing:
        rel = key[len(block.prefix) :]
        if rel and (not block.keys or rel in block.keys):
            entries.append((rel, desc))
    return entries


def find_block(
    config: SessionConfig, label: str
) -> ReadonlyBlock | WritableBlock | SearchableBlock | SkillsBlock | None:
    return next((b for b in config.blocks if b.label == label), None)


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
    """Stored message JSON with unloaded skills' tool outputs shown as ``[skill unloaded: key]``."""
    body = json.loads(content)
    for part in body.get("parts") or []:
        if isinstance(part, dict) and part.get("toolCallId") in outputs:
            part["output"] = f"[skill unloaded: {outputs[part['toolCallId']]}]"
    return json.dumps(body, ensure_ascii=False, separators=(",", ":"))
