"""How a tool result names a tool the session does not have: one wording for the server and the SDK.

The name comes from an LLM (or whoever calls ``POST …/tools/{name}``) and goes back to it in an
``Error: …`` result, never refused: a tool never raises (the reference, §2). It is shown as given
when it is a name an LLM could call (printable, at most :data:`MAX_SHOWN_TOOL_NAME` characters: the
tool-name limit of the OpenAI API); a longer one is cut there and says how long it was, and a
control character, NUL or lone surrogate in it is shown as its ``\\uXXXX`` escape, so that the
result stays a short, printable line that JSON and a terminal take.
"""

from __future__ import annotations

MAX_SHOWN_TOOL_NAME = 64


def shown_tool_name(name: str) -> str:
    """``name`` as a tool result shows it (see the module)."""
    head = "".join(_escaped(c) for c in name[:MAX_SHOWN_TOOL_NAME])
    return head if len(name) <= MAX_SHOWN_TOOL_NAME else f"{head}… ({len(name)} characters)"


def _escaped(c: str) -> str:
    """``c`` itself, or its escape when it is no printable character."""
    if c.isprintable() and not "\ud800" <= c <= "\udfff":
        return c
    return f"\\u{ord(c):04x}" if ord(c) <= 0xFFFF else f"\\U{ord(c):08x}"


def unavailable_tool(name: str) -> str:
    """The result of calling a tool named ``name`` that the session does not have."""
    return f'Error: tool "{shown_tool_name(name)}" is not available in this session'
