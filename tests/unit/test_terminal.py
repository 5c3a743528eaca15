"""What the CLI prints of the log's and tenants' values carries no control character: a tenant's
ESC, BEL, CSI or OSC sequence is printed escaped, never played on the operator's terminal."""

from __future__ import annotations

import base64
import json
import re
from datetime import UTC, datetime

from events.log import StoredEvent
from events.subjects import SubjectLayout
from services.audit.quarantine import _entry, format_entry
from services.audit.readers import format_table_row
from services.ops.audit_cli import DIFFERENCE_CHARS
from services.terminal import clipped, safe_json, safe_json_text, safe_text

LAYOUT = SubjectLayout()
EVIL = "\x1b[1A\x1b[2K\x1b]0;pwned\x07\x9b31m\x7f"
CONTROL = re.compile("[\x00-\x1f\x7f-\x9f]")


def test_control_characters_are_escaped_and_ordinary_unicode_kept() -> None:
    assert safe_text(EVIL) == "\\x1b[1A\\x1b[2K\\x1b]0;pwned\\x07\\x9b31m\\x7f"
    assert safe_text("line\nnext\r\t") == "line\\x0anext\\x0d\\x09"
    kept = "é 日本 \u2028 \u00a0 emoji \U0001f600"
    assert safe_text(kept) == kept


def test_json_keeps_its_value_without_a_raw_control_character() -> None:
    value = {"text": EVIL, "kept": "é 日本", EVIL: [1]}
    for ensure_ascii in (True, False):
        shown = safe_json(value, ensure_ascii=ensure_ascii, indent=2)
        assert not CONTROL.search(shown.replace("\n", ""))
        assert json.loads(shown) == value
    assert safe_json_text('{"a": "\x9b"}') == '{"a": "\\u009b"}'


def test_quarantine_list_prints_a_session_token_holding_escapes_escaped() -> None:
    """A tenant publishes on ``<prefix>.<tenant>.p000.~<base64>``, which its NATS permissions allow:
    the token decodes to a session id of any characters (the refusal says it is no valid id)."""
    token = "~" + base64.urlsafe_b64encode(EVIL.encode()).rstrip(b"=").decode()
    row = (42, f"chronicle.ev.acme.p000.{token}", "invalid", "session\x1b[2J: bad", "history", datetime.now(UTC), 10)
    line = format_entry(_entry(LAYOUT, row))
    assert not CONTROL.search(line)
    assert "acme/\\x1b[1A\\x1b[2K\\x1b]0;pwned\\x07" in line
    assert "session\\x1b[2J: bad" in line


def test_a_replay_table_row_of_a_refusal_naming_the_tenants_field_is_escaped() -> None:
    fields = {"id": "x", "type": "session.created", "version": 1, "tenant": "acme", "session": "s-1"}
    data = json.dumps({**fields, "occurred_at": "2026-01-01T00:00:00Z", "bad\x1b]0;x\x07": 1})
    row = format_table_row(StoredEvent(7, LAYOUT.session_subject("acme", "s-1"), data.encode()), LAYOUT, None)
    assert "REFUSED" in row
    assert not CONTROL.search(row)
    assert "bad\\x1b]0;x\\x07" in row


def test_a_verify_difference_of_a_large_row_is_one_bounded_line_saying_what_it_left_out() -> None:
    # verify printed a 500 KB message row whole (a restored log missing its claim-checked body)
    row = "live:    " + '{"id": "mid500", "content": "' + "y" * 500_000 + '"}' + EVIL
    shown = clipped(row, DIFFERENCE_CHARS)
    assert len(shown) < DIFFERENCE_CHARS + 40
    assert shown.startswith('live:    {"id": "mid500"')
    assert shown.endswith(f" … ({len(row) - DIFFERENCE_CHARS:,} more characters)")
    assert clipped("live:    short" + EVIL, DIFFERENCE_CHARS) == safe_text("live:    short" + EVIL)
    assert not CONTROL.search(clipped(EVIL * 500, DIFFERENCE_CHARS))
