"""The LLM tools of a session: definitions (pure) in the reference's wording and schemas, and the
provider-specific shapes (OpenAI function calling, Anthropic tool use).

Reference: the Cloudflare Agents SDK Session API, §2 of docs/reference.md."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from events.context import SessionConfig
from services.context.rules import tool_writable

Format = Literal["openai", "anthropic"]
SET_CONTEXT_ACTIONS = ("replace", "append")
"""``set_context``'s actions, as its schema names them (any other is refused: services/context/tools.py)."""


@dataclass(frozen=True, slots=True)
class ToolSpec:
    name: str
    description: str
    parameters: dict[str, Any]

    def to(self, fmt: Format) -> dict[str, Any]:
        if fmt == "anthropic":
            return {"name": self.name, "description": self.description, "input_schema": self.parameters}
        return {
            "type": "function",
            "function": {"name": self.name, "description": self.description, "parameters": self.parameters},
        }


@dataclass(frozen=True, slots=True)
class BlockInfo:
    label: str
    kind: str  # readonly | writable | searchable | skills | history
    description: str | None
    writable: bool
    """``set_context`` writes it (a writable or searchable block, a skills block unless its
    ``writable`` is false)."""


def blocks_of(config: SessionConfig) -> list[BlockInfo]:
    out = [BlockInfo(b.label, b.kind, b.description, tool_writable(b)) for b in config.blocks]
    if config.searchable_history:
        out.append(BlockInfo(config.searchable_history, "history", "Cross-session conversation history", False))
    return out


def _quoted(labels: list[str]) -> str:
    return ", ".join(f'"{x}"' for x in labels)


def _described(description: str | None) -> str:
    """The reference's ``description ?? "no description"``: an empty description stays empty."""
    return description if description is not None else "no description"


def _reach(writable: list[BlockInfo]) -> str:
    """Who sees a write, said truly (the reference says "Writes are durable and persist across
    sessions.", true of its Durable Object's blocks; here writable and searchable blocks are the
    session's and only skills are shared, by every session of the tenant)."""
    shared = any(b.kind == "skills" for b in writable)
    own = any(b.kind != "skills" for b in writable)
    if not shared:
        return "Writes are durable and persist in this session only."
    out = "Writes are durable. Skill collections are shared: other sessions list and load what is written to them"
    return out + ("; the other blocks persist in this session only." if own else ".")


def _set_context(writable: list[BlockInfo]) -> ToolSpec:
    kinds = {"skills": "skill collection, keyed entries", "searchable": "searchable, keyed entries"}
    lines = [f'- "{b.label}" ({kinds.get(b.kind, "writable")}): {_described(b.description)}' for b in writable]
    keyed = [b.label for b in writable if b.kind in ("skills", "searchable")]
    properties: dict[str, Any] = {
        "label": {"type": "string", "enum": [b.label for b in writable], "description": "Block label to write to"},
        "content": {"type": "string", "description": "The main content to write to the block."},
        "action": {
            "type": "string",
            "enum": list(SET_CONTEXT_ACTIONS),
            "description": "replace (default) or append",
        },
    }
    hint = ""
    if keyed:
        properties["metadata"] = {
            "type": "object",
            "description": (
                "Optional metadata for keyed entries (skill collections, searchable blocks: "
                + _quoted(keyed)
                + "). Short content doesn't need metadata; longer loadable entries (skills) "
                "benefit from a title and description so the model can pick the right one without loading it."
            ),
            "properties": {
                "title": {
                    "type": "string",
                    "description": "Short title. Used as a stable identifier \u2014 entries with the same title are "
                    "updated in place, different titles create new entries.",
                },
                "description": {
                    "type": "string",
                    "description": "One-line summary shown alongside the title in the system prompt so the model "
                    "can decide when to load the entry.",
                },
            },
        }
        hint = (
            "\n\nFor keyed blocks (skill collections / searchable), pass `metadata: { title, description }` "
            "\u2014 title stabilises updates, description helps the model pick entries. Metadata is optional; "
            "short content rarely needs it, long loadable entries benefit most."
        )
    description = "Write to a context block. Available blocks:\n" + "\n".join(lines) + "\n\n" + _reach(writable) + hint
    schema = {"type": "object", "properties": properties, "required": ["label", "content"]}
    return ToolSpec("set_context", description, schema)


def _label_key(labels: list[str], what: str, key_desc: str) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {
            "label": {"type": "string", "enum": labels, "description": what},
            "key": {"type": "string", "description": key_desc},
        },
        "required": ["label", "key"],
    }


def tool_specs(config: SessionConfig, loaded: list[str]) -> list[ToolSpec]:
    """Tools generated for the blocks that exist (``loaded``: ``label:key`` currently loaded)."""
    blocks = blocks_of(config)
    specs: list[ToolSpec] = []
    writable = [b for b in blocks if b.writable]
    if writable:
        specs.append(_set_context(writable))
    skills = [b.label for b in blocks if b.kind == "skills"]
    if skills:
        specs.append(
            ToolSpec(
                "load_context",
                "Load a document from a skill block by key. Available skill blocks: "
                + _quoted(skills)
                + ". Check the system prompt for available keys.",
                _label_key(skills, "Skill block label", "Skill key to load"),
            )
        )
        now = " Currently loaded: " + ", ".join(loaded) + "." if loaded else " No skills currently loaded."
        specs.append(
            ToolSpec(
                "unload_context",
                "Unload a previously loaded skill to free context space. The skill remains available for re-loading."
                + now,
                _label_key(skills, "Skill block label", "Skill key to unload"),
            )
        )
    searchable = [b.label for b in blocks if b.kind in ("searchable", "history")]
    if searchable:
        specs.append(
            ToolSpec(
                "search_context",
                "Search for information in a searchable context block. ONLY these blocks are searchable: "
                + _quoted(searchable)
                + ". Other blocks cannot be searched.",
                {
                    "type": "object",
                    "properties": {
                        "label": {"type": "string", "enum": searchable, "description": "Searchable block label"},
                        "query": {"type": "string", "description": "Search query"},
                    },
                    "required": ["label", "query"],
                },
            )
        )
    if config.searchable_history:
        specs.append(
            ToolSpec(
                "session_search",
                "Search past conversations for relevant context. Searches across all sessions.",
                {
                    "type": "object",
                    "properties": {"query": {"type": "string", "description": "Search query"}},
                    "required": ["query"],
                },
            )
        )
    return specs
