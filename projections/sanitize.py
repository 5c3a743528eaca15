"""Postgres refuses NUL in ``text`` and ``\\u0000`` in ``jsonb``. The API rejects NUL at the edge;
events from other publishers are made storable deterministically (NUL -> U+FFFD) so a single
event can never stop a projector, and a rebuild gives the same rows."""

from __future__ import annotations

from typing import Any

REPLACEMENT = "\ufffd"


def storable(value: Any) -> Any:
    if isinstance(value, str):
        return value.replace("\x00", REPLACEMENT) if "\x00" in value else value
    if isinstance(value, dict):
        return {storable(k): storable(v) for k, v in value.items()}
    if isinstance(value, list):
        return [storable(v) for v in value]
    return value


def has_nul(value: Any) -> bool:
    if isinstance(value, str):
        return "\x00" in value
    if isinstance(value, dict):
        return any(has_nul(k) or has_nul(v) for k, v in value.items())
    if isinstance(value, list):
        return any(has_nul(v) for v in value)
    return False
