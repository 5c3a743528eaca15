"""What the CLI prints of values from the log or a tenant, made harmless to a terminal.

A tenant publishing straight to the stream chooses the bytes of its events and the tokens of its
subjects (a session token decodes to any string), so a value an operator's command prints may hold
ESC, BEL, CSI or OSC sequences that move the cursor, rewrite lines, set the window title or write
the clipboard. Every C0 and C1 control character, and DEL, is printed as an escape instead;
ordinary Unicode is kept.
"""

from __future__ import annotations

import json
import re
from typing import Any

_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f]")
_C1_AND_DEL = re.compile("[\x7f-\x9f]")  # JSON text holds C0 escaped already (but for whitespace)


def safe_text(text: str) -> str:
    """``text`` with each control character as ``\\xNN`` (ESC as ``\\x1b``, a newline as ``\\x0a``:
    one value, one line)."""
    return _CONTROL.sub(lambda found: f"\\x{ord(found.group()):02x}", text)


def clipped(text: str, limit: int) -> str:
    """:func:`safe_text` of ``text``'s first ``limit`` characters, and how many more it had: one row of
    a read model may hold megabytes (a message's whole body), which one printed line must not."""
    if len(text) <= limit:
        return safe_text(text)
    return f"{safe_text(text[:limit])} … ({len(text) - limit:,} more characters)"


def safe_json_text(text: str) -> str:
    """JSON text (``json.dumps``'s, a stored message's) with DEL and the C1 control characters as
    ``\\u00NN`` escapes: the same JSON value, since they can only stand inside its strings (JSON
    writers escape C0 there themselves; json.dumps with ``ensure_ascii=False``, and Postgres,
    leave these as they are)."""
    return _C1_AND_DEL.sub(lambda found: f"\\u{ord(found.group()):04x}", text)


def safe_json(value: Any, **dumps: Any) -> str:
    """``json.dumps(value, **dumps)``, made :func:`safe_json_text`."""
    return safe_json_text(json.dumps(value, **dumps))
