"""How a validation error reads in a problem's ``detail``: one line, ``loc: msg`` per error."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from pydantic import ValidationError

from events.context import LABEL_RE, LABEL_RULE

NO_NUL_PATTERN = r"^[^\x00]*$"
"""A text that holds no NUL character (Postgres text cannot)."""
PRINTABLE_ASCII_PATTERN = r"^[!-~]+$"
"""Printable ASCII without spaces (header values such as ``Idempotency-Key``)."""

_PATTERN_MEANINGS = {
    NO_NUL_PATTERN: "must not contain NUL characters",
    PRINTABLE_ASCII_PATTERN: "must be printable ASCII characters without spaces",
    LABEL_RE: LABEL_RULE,  # a context block's label
}


def _message(error: Mapping[str, Any]) -> str:
    """The error's message; a pattern mismatch says what the pattern means, not the expression."""
    pattern = (error.get("ctx") or {}).get("pattern")
    if error.get("type") == "string_pattern_mismatch" and pattern is not None:
        return _PATTERN_MEANINGS.get(str(pattern), "is not in the form this field takes")
    return str(error.get("msg", ""))


def error_items(errors: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """``{loc, msg, type}`` of each error (a problem's ``errors``), worded as in its ``detail``."""
    return [
        {"loc": [str(p) for p in e.get("loc", ())], "msg": _message(e), "type": str(e.get("type", ""))} for e in errors
    ]


def validation_detail(
    errors: ValidationError | Iterable[Mapping[str, Any]], *, prefix: str = "", root: str = ""
) -> str:
    """``loc: msg`` for each error, joined with ``; ``. ``prefix`` names what was validated
    (``message.``); ``root`` stands for an empty location (an error of the whole value)."""
    items = errors.errors(include_url=False) if isinstance(errors, ValidationError) else errors
    return "; ".join(f"{prefix}{'.'.join(str(p) for p in e.get('loc', ())) or root}: {_message(e)}" for e in items)
