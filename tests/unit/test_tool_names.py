"""events/tool_names.py: how a tool result shows a name the session has no tool of."""

from __future__ import annotations

import json

import pytest

from events.tool_names import shown_tool_name, unavailable_tool


@pytest.mark.parametrize("name", ["set_context", "café", "工具", "tool 🙂", "a-b.c:d", "x" * 64])
def test_a_printable_name_is_shown_as_given(name: str) -> None:
    assert shown_tool_name(name) == name
    assert unavailable_tool(name) == f'Error: tool "{name}" is not available in this session'


@pytest.mark.parametrize(
    ("name", "shown"),
    [
        ('say "hi"', 'say \\"hi\\"'),
        ("back\\slash", "back\\\\slash"),
        ("\\u0000", "\\\\u0000"),  # the six characters, not a NUL
        ("nul\x00", "nul\\u0000"),
        ("zwj\u200d", "zwj\\u200d"),
        ("tag\U000e0001", "tag\\udb40\\udc01"),  # above U+FFFF: its two surrogates' escapes
        ("priv\U000f0000", "priv\\udb80\\udc00"),
        ("lone\udc00", "lone\\udc00"),
        ("nbsp\u00a0", "nbsp\\u00a0"),
    ],
)
def test_quotes_backslashes_and_unprintable_characters_are_escaped_as_json_escapes_them(name: str, shown: str) -> None:
    """Each shown name reads back as the name it shows (a JSON string's escapes), so a ``"`` ends
    no quoting early and a name spelling ``\\u0000`` is told from one holding a NUL."""
    assert shown_tool_name(name) == shown
    assert json.loads(f'"{shown}"') == name


def test_a_long_name_is_cut_after_escaping_nothing_twice() -> None:
    assert shown_tool_name('"' * 65) == '\\"' * 64 + "… (65 characters)"
