"""How a tool result names a tool the session does not have: one wording for the server and the SDK.

The name comes from an LLM (or whoever calls ``POST …/tools/{name}``) and goes back to it in an
``Error: …`` result, never refused: a tool never raises (the reference, §2). It is shown as given
when it is a name an LLM could call (printable, at most :data:`MAX_SHOWN_TOOL_NAME` characters: the
tool-name limit of the OpenAI API, and neither ``"`` nor ``\\``); a longer one is cut there and
says how long it was. Inside the quotes it is escaped as a JSON string is, so that what is shown
reads back as one name: ``"`` and ``\\`` as ``\\"`` and ``\\\\``, and every character that is not
printable (Python's ``str.isprintable``: control and format characters, NUL, separators other
than the space, private-use and unassigned code points, lone surrogates) as its ``\\uXXXX``
escape, one above U+FFFF as the escapes of its two UTF-16 surrogates. Printable characters,
non-ASCII letters and emoji included, are shown as they are. The result stays a short, printable
line that JSON and a terminal take.
"""

from __future__ import annotations

MAX_SHOWN_TOOL_NAME = 64


def shown_tool_name(name: str) -> str:
    """``name`` as a tool result shows it (see the module)."""
    head = "".join(_escaped(c) for c in name[:MAX_SHOWN_TOOL_NAME])
    return head if len(name) <= MAX_SHOWN_TOOL_NAME else f"{head}… ({len(name)} characters)"


def _escaped(c: str) -> str:
    """``c`` itself, or its escape (see the module)."""
    if c in _QUOTING:
        return _QUOTING[c]
    if c.isprintable():  # a lone surrogate is not
        return c
    code = ord(c)
    if code <= 0xFFFF:
        return f"\\u{code:04x}"
    high, low = divmod(code - 0x10000, 0x400)
    return f"\\u{0xD800 + high:04x}\\u{0xDC00 + low:04x}"


_QUOTING = {'"': '\\"', "\\": "\\\\"}


def unavailable_tool(name: str) -> str:
    """The result of calling a tool named ``name`` that the session does not have."""
    return f'Error: tool "{shown_tool_name(name)}" is not available in this session'
