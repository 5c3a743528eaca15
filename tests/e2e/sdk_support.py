"""Helpers for the SDK end-to-end tests: an SDK client on the real stack (no fixtures here)."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncIterator
from typing import Any

from chronicle_sdk import ChronicleClient, Via
from services.settings import Settings
from tests.conftest import KEYS

VIAS: tuple[Via, ...] = ("http", "nats", "jetstream")
"""HTTP; every write as a NATS command; appends published straight to JetStream (chains) or as
commands (single messages)."""


def sid(prefix: str = "sdk") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


def word() -> str:
    """A random letters-only word (one plain token for the English text-search parser)."""
    return "zq" + "".join(chr(ord("a") + int(c, 16)) for c in uuid.uuid4().hex[:12])


def text(mid: str, content: str, role: str = "user") -> dict[str, Any]:
    return {"id": mid, "role": role, "parts": [{"type": "text", "text": content}]}


def client_for(
    api_url: str, settings: Settings, *, tenant: str = "tenant-a", via: Via = "http", **kw: Any
) -> ChronicleClient:
    """An SDK client with ``tenant``'s API key, able to publish straight to the stack's JetStream
    and to send commands (as that tenant: its NATS credentials are derived from the key).
    ``via="nats"`` sends every write as a command; ``"jetstream"`` publishes appends directly."""
    if via == "nats":
        return ChronicleClient(api_url, KEYS[tenant], nats_url=settings.nats_url, via="nats", **kw)
    return ChronicleClient(api_url, KEYS[tenant], nats_url=settings.nats_url, append_via=via, **kw)


@contextlib.asynccontextmanager
async def open_client(api_url: str, settings: Settings, **kw: Any) -> AsyncIterator[ChronicleClient]:
    async with client_for(api_url, settings, **kw) as c:
        yield c


def ids(messages: list[dict[str, Any]]) -> list[str]:
    return [str(m["id"]) for m in messages]
