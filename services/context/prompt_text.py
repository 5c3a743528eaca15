"""System prompt rendering, byte for byte in the reference's format (pure).

Each rendered block is ``SEP\\nHEADER\\nSEP\\ncontent`` with SEP = 46 x U+2550; blocks are joined
by a blank line; no trailing newline. The header is ``LABEL`` + `` (description)`` +
`` [pct% — used/max tokens]`` (when a budget exists; half-up rounding) + one tag. Empty read-only
blocks are skipped; empty writable, searchable and skill blocks are still shown.

Reference: the Cloudflare Agents SDK Session API, §3.1 of docs/reference.md.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

SEP = "\u2550" * 46
Kind = Literal["readonly", "writable", "searchable", "skills", "history"]
TAGS: dict[str, str] = {
    "searchable": "[searchable]",
    "history": "[searchable]",
    "skills": "[loadable]",
    "readonly": "[readonly]",
    "writable": "[writable]",
}


@dataclass(frozen=True, slots=True)
class RenderedBlock:
    """A block as the prompt and the context API see it."""

    label: str
    kind: Kind
    description: str | None
    content: str
    tokens: int
    max_tokens: int | None
    writes: bool = True
    """False for a skills block whose ``writable`` is false (no ``set_context`` writes)."""

    @property
    def writable(self) -> bool:
        return self.kind in ("writable", "searchable", "skills") and self.writes


def round_half_up(x: float) -> int:
    """JavaScript's ``Math.round`` (Python's ``round`` is banker's rounding)."""
    return math.floor(x + 0.5)


def header(block: RenderedBlock) -> str:
    out = block.label.upper()
    if block.description:
        out += f" ({block.description})"
    if block.max_tokens:
        pct = round_half_up(block.tokens / block.max_tokens * 100)
        out += f" [{pct}% \u2014 {block.tokens}/{block.max_tokens} tokens]"
    return out + " " + TAGS[block.kind]


def render(blocks: list[RenderedBlock]) -> str:
    parts = [f"{SEP}\n{header(b)}\n{SEP}\n{b.content}" for b in blocks if b.content or b.kind != "readonly"]
    return "\n\n".join(parts)


def usage(label: str, tokens: int, max_tokens: int | None) -> str:
    """The ``set_context`` success string."""
    if max_tokens:
        pct = round_half_up(tokens / max_tokens * 100)
        return f"Written to {label}. Usage: {pct}% ({tokens}/{max_tokens} tokens)"
    return f"Written to {label}. Usage: {tokens} tokens"


def search_summary(entries: int) -> str:
    return f"{entries} entries indexed." if entries else ""


def history_summary(sessions: int) -> str:
    """The reference's words (manager.ts: ``session`` for one, else ``sessions``; none: no text)."""
    if not sessions:
        return ""
    return f"{sessions} session{'' if sessions == 1 else 's'} available for search."


def skill_listing(entries: list[tuple[str, str | None]]) -> str:
    """``- key: description`` per allowed key, in listing order (description optional)."""
    return "\n".join(f"- {key}: {desc}" if desc else f"- {key}" for key, desc in entries)
