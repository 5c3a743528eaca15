"""How a validation error reads in a problem's ``detail``: one line, ``loc: msg`` per error."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from pydantic import ValidationError


def validation_detail(
    errors: ValidationError | Iterable[Mapping[str, Any]], *, prefix: str = "", root: str = ""
) -> str:
    """``loc: msg`` for each error, joined with ``; ``. ``prefix`` names what was validated
    (``message.``); ``root`` stands for an empty location (an error of the whole value)."""
    items = errors.errors(include_url=False) if isinstance(errors, ValidationError) else errors
    return "; ".join(f"{prefix}{'.'.join(str(p) for p in e.get('loc', ())) or root}: {e.get('msg', '')}" for e in items)
