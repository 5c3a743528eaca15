"""The message shape (AI SDK ``UIMessage``) and the pure helpers both sides need.

Messages are stored as the client sent them: unknown fields round-trip untouched.

Reference: the Cloudflare Agents SDK Session API, §5 of docs/reference.md.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from events.ids import MAX_MESSAGE_ID_LEN, MESSAGE_ID_SCHEMA, check_message_id

JsonObject = dict[str, Any]


class Part(BaseModel):
    """One part; only ``type`` is required, everything else is kept as sent."""

    model_config = ConfigDict(extra="allow")

    type: str = Field(min_length=1, max_length=128)


class UIMessage(BaseModel):
    """``{id, role, parts, ...}``; ``role`` is a free string, as in the reference."""

    model_config = ConfigDict(extra="allow")

    id: str = Field(min_length=1, max_length=MAX_MESSAGE_ID_LEN, json_schema_extra=MESSAGE_ID_SCHEMA)
    role: str = Field(min_length=1, max_length=64)
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
