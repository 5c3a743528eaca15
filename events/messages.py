"""The message shape (AI SDK ``UIMessage``) and the pure helpers both sides need.

Messages are stored as the client sent them: unknown fields round-trip untouched.

Reference: the Cloudflare Agents SDK Session API, §5 of docs/reference.md.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from events.ids import MAX_MESSAGE_ID_LEN, NEW_MESSAGE_ID_SCHEMA, check_message_id
from events.limits import MAX_ROLE

JsonObject = dict[str, Any]

_TOOL_STRINGS = ("toolCallId", "toolName", "state", "errorText")
PART_STRINGS: dict[str, tuple[str, ...]] = {
    "text": ("text", "state"),
    "reasoning": ("text", "reasoning", "state"),
    "file": ("mediaType", "url", "filename"),
    "source-url": ("sourceId", "url", "title"),
    "source-document": ("sourceId", "mediaType", "title", "filename"),
    "dynamic-tool": _TOOL_STRINGS,
}
"""The fields that are strings in the AI SDK part of each type (``UIMessage`` parts, and AI SDK
4's ``reasoning`` field of a reasoning part): one a part carries must be a string. A tool part
(``tool-<name>``) is checked as ``dynamic-tool``; its ``input`` and ``output``, a data part's
``data``, ``providerMetadata`` and any part type not listed are arbitrary JSON, kept as sent."""


def _part_rules() -> dict[str, Any]:
    """The part rules :class:`Part` checks, as JSON Schema (``if``/``then`` per part type), so that
    the published schema describes exactly what the API takes."""
    rules: list[dict[str, Any]] = []
    for kind, names in PART_STRINGS.items():
        when: dict[str, Any] = {"pattern": "^tool-"} if kind == "dynamic-tool" else {"const": kind}
        then: dict[str, Any] = {"properties": {name: {"type": "string"} for name in names}}
        if kind == "text":
            then["required"] = ["text"]
        rules.append({"if": {"properties": {"type": when}, "required": ["type"]}, "then": then})
        if kind == "dynamic-tool":  # the type itself and tool-<name> alike
            rules.append({"if": {"properties": {"type": {"const": kind}}, "required": ["type"]}, "then": then})
    return {"allOf": rules}


class Part(BaseModel):
    """One part; ``type`` is required, a text part's ``text`` too, and the fields of
    :data:`PART_STRINGS` must be strings; everything else is kept as sent."""

    model_config = ConfigDict(extra="allow", json_schema_extra=_part_rules())

    type: str = Field(min_length=1, max_length=128)

    @model_validator(mode="after")
    def _strings(self) -> Part:
        kind = self.type
        strings = PART_STRINGS.get("dynamic-tool" if kind.startswith("tool-") else kind)
        if strings is None:
            return self
        extra = self.__pydantic_extra__ or {}
        if kind == "text" and "text" not in extra:
            raise ValueError("a text part needs text (a string)")
        for name in strings:
            if name in extra and not isinstance(extra[name], str):
                raise ValueError(f"a {kind} part's {name} must be a string")
        return self


class UIMessage(BaseModel):
    """``{id, role, parts, ...}``; ``role`` is a free string, as in the reference."""

    model_config = ConfigDict(extra="allow")

    id: str = Field(min_length=1, max_length=MAX_MESSAGE_ID_LEN, json_schema_extra=NEW_MESSAGE_ID_SCHEMA)
    role: str = Field(min_length=1, max_length=MAX_ROLE)
    parts: list[Part]

    @field_validator("id")
    @classmethod
    def _id_rules(cls, value: str) -> str:
        return check_message_id(value)


def canonical_json(body: JsonObject) -> bytes:
    """Stable serialisation used for hashing and storage."""
    return json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def stored_json(body: JsonObject) -> str:
    """How a body is stored: the client's JSON, key order kept, unicode unescaped."""
    return json.dumps(body, ensure_ascii=False, separators=(",", ":"))


def body_hash(body: JsonObject) -> str:
    return hashlib.sha256(canonical_json(body)).hexdigest()


def text_of(body: JsonObject) -> str:
    """The indexed text: only ``text`` parts, joined with a newline (as the reference's Postgres)."""
    parts = body.get("parts")
    if not isinstance(parts, list):
        return ""
    texts = [
        p["text"] for p in parts if isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
    ]
    return "\n".join(texts)
