"""Micro-compaction against the reference: its own test cases (compaction.test.ts, the ai-chat
row-size guard, provider.test.ts's ``getRecentHistory``), JavaScript's JSON rules, and goldens
produced by running the reference's code under Node (tests/fixtures/microcompact)."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from services.compaction.micro import (
    ROW_MAX_BYTES,
    enforce_row_size_limit,
    js_items,
    js_len,
    js_prefix,
    json_bytes,
    recent_window,
    stringify,
    tool_output_truncation,
    truncate_older_messages,
    truncate_tool_output,
    truncated_suffix,
)

GOLDENS = Path(__file__).parents[1] / "fixtures" / "microcompact" / "reference_goldens.json"
OMITTED_NOTE = "Tool output omitted because it was too large to preserve structurally."


def text_message(mid: str, text: str, role: str = "user") -> dict[str, Any]:
    return {"id": mid, "role": role, "parts": [{"type": "text", "text": text}]}


def tool_message(mid: str, output: Any) -> dict[str, Any]:
    return {
        "id": mid,
        "role": "assistant",
        "parts": [
            {
                "type": "tool-read",
                "toolCallId": f"tc-{mid}",
                "toolName": "read",
                "state": "output-available",
                "input": {"path": "/large.txt"},
                "output": output,
            }
        ],
    }


def big_tool_message(mid: str, call_id: str, output: Any) -> dict[str, Any]:
    part = {"type": "tool-bigTool", "toolCallId": call_id, "state": "output-available", "input": {}, "output": output}
    return {"id": mid, "role": "assistant", "parts": [part]}


def first_output(message: dict[str, Any]) -> Any:
    return message["parts"][0]["output"]


# -- compaction.test.ts: truncateOlderMessages -------------------------------------------


def test_older_object_tool_output_keeps_its_shape() -> None:
    large = "x" * 1000
    messages = [
        tool_message("old-tool", {"path": "/large.txt", "content": large, "totalLines": 1}),
        text_message("old-user", "next"),
        text_message("recent-1", "recent one"),
        text_message("recent-2", "recent two"),
    ]
    snapshot = copy.deepcopy(messages)

    truncated = truncate_older_messages(messages, keep_recent=2, max_tool_output_chars=100)
    output = first_output(truncated[0])

    assert isinstance(output, dict)
    assert output["path"] == "/large.txt"
    assert output["totalLines"] == 1
    assert "[truncated" in output["content"]
    assert len(output["content"]) < len(large)
    # Exactly the reference: content first cut to the 80-char child budget, then shrunk to 100/4,
    # so the second suffix counts the 80 chars of the first cut.
    assert output == {"path": "/large.txt", "content": "x... [truncated 80 chars]", "totalLines": 1}
    assert first_output(messages[0])["content"] == large
    assert messages == snapshot


def test_nested_arrays_under_a_small_budget_keep_a_marker_not_an_empty_string() -> None:
    messages = [
        tool_message("old-tool", {key: list(range(1000)) for key in "abcdefg"}),
        text_message("recent-1", "recent one"),
        text_message("recent-2", "recent two"),
    ]

    output = first_output(truncate_older_messages(messages, keep_recent=2, max_tool_output_chars=500)[0])

    assert len(output["a"]) == 1
    assert output["a"][0] != ""
    assert output["a"][0]["__truncated"] is True
    assert isinstance(output["a"][0]["__truncatedChars"], int)
    assert output == {key: [{"__truncated": True, "__truncatedChars": 3891}] for key in "abcdefg"}


def test_recent_tool_outputs_are_kept_by_identity() -> None:
    recent_output = {"path": "/recent.txt", "content": "y" * 1000, "totalLines": 1}
    messages = [text_message("old-1", "old"), text_message("old-2", "old"), tool_message("recent-tool", recent_output)]

    truncated = truncate_older_messages(messages, keep_recent=2, max_tool_output_chars=100)

    assert first_output(truncated[2]) is recent_output
    assert truncated[2] is messages[2]


def test_string_tool_outputs_stay_strings() -> None:
    messages = [
        tool_message("old-tool", "z" * 1000),
        text_message("recent-1", "recent one"),
        text_message("recent-2", "recent two"),
    ]

    output = first_output(truncate_older_messages(messages, keep_recent=2, max_tool_output_chars=100)[0])

    assert isinstance(output, str)
    assert "[truncated" in output
    assert output == "z" * 74 + "... [truncated 1000 chars]"


# -- truncateOlderMessages: the rest of its contract (§4.4) -------------------------------


def test_short_history_returns_the_same_list() -> None:
    messages = [text_message(f"m{i}", "t" * 20_000) for i in range(4)]
    assert truncate_older_messages(messages) is messages


def test_defaults_cut_older_text_and_keep_the_last_four() -> None:
    messages = [text_message(f"m{i}", "t" * 10_001) for i in range(6)]
    messages[1]["parts"][0]["text"] = "s" * 10_000
    snapshot = copy.deepcopy(messages)

    truncated = truncate_older_messages(messages)

    assert truncated is not messages
    assert truncated[0]["parts"][0]["text"] == "t" * 10_000 + "... [truncated 10001 chars]"
    assert truncated[0] is not messages[0]
    assert truncated[1] is messages[1]
    assert all(truncated[i] is messages[i] for i in range(2, 6))
    assert messages == snapshot


def test_reasoning_and_legacy_result_are_untouched() -> None:
    reasoning = {"type": "reasoning", "text": "r" * 30_000}
    legacy = {"type": "tool-old", "toolCallId": "t", "state": "output-available", "result": "x" * 5000}
    dynamic = {"type": "dynamic-tool", "toolCallId": "d", "output": "o" * 600}
    old = {"id": "a", "role": "assistant", "parts": [reasoning, legacy, dynamic]}

    truncated = truncate_older_messages([old, text_message("b", "recent")], keep_recent=1)
    parts = truncated[0]["parts"]

    assert parts[0] is reasoning
    assert parts[1] is legacy
    assert parts[2] == {**dynamic, "output": "o" * 475 + "... [truncated 600 chars]"}


def test_text_length_counts_utf16_code_units() -> None:
    text = "😀" * 6  # 12 code units in JavaScript
    truncated = truncate_older_messages(
        [text_message("a", text), text_message("b", "x")], keep_recent=1, max_text_chars=10
    )
    assert truncated[0]["parts"][0]["text"] == "😀" * 5 + "... [truncated 12 chars]"


# -- compaction.test.ts: enforceRowSizeLimit ---------------------------------------------


def test_oversized_object_tool_output_keeps_its_shape() -> None:
    large = "x" * 2_000_000
    message = tool_message("tool-big", {"path": "/large.txt", "content": large, "totalLines": 1})
    message["parts"][0]["toolCallId"] = "tc-1"

    result, changed = enforce_row_size_limit(message)
    output = first_output(result)

    assert changed
    assert output["path"] == "/large.txt"
    assert output["totalLines"] == 1
    assert "[truncated" in output["content"]
    assert len(output["content"]) < len(large)
    assert output["content"] == "x" * 304 + "... [truncated 2000000 chars]"
    assert result["metadata"] == {"compactedToolOutputs": ["tc-1"]}
    assert first_output(message)["content"] is large


def test_primitive_heavy_object_falls_back_to_a_compact_marker_that_fits() -> None:
    heavy = {f"key-{i}": i for i in range(140_000)}
    message = {
        "id": "tool-primitive-heavy",
        "role": "assistant",
        "parts": [
            {
                "type": "tool-map",
                "toolCallId": "tc-1",
                "toolName": "map",
                "state": "output-available",
                "input": {},
                "output": heavy,
            }
        ],
    }

    result, changed = enforce_row_size_limit(message)
    output = first_output(result)

    assert changed
    assert json_bytes(result) <= ROW_MAX_BYTES
    assert output["__truncated"] is True
    assert output["__truncatedChars"] > ROW_MAX_BYTES
    assert output == {"__truncated": True, "__truncatedChars": 2_577_781, "note": OMITTED_NOTE}


# -- ai-chat row-size-guard.test.ts, as pure calls ---------------------------------------


def test_messages_under_the_cap_pass_through_unchanged() -> None:
    message = big_tool_message("size-ok", "call_ok", "A" * 50_000)
    assert enforce_row_size_limit(message) == (message, False)
    assert enforce_row_size_limit(message)[0] is message


def test_messages_over_the_cap_have_tool_outputs_compacted() -> None:
    huge = "X" * 1_900_000
    result, changed = enforce_row_size_limit(big_tool_message("size-big", "call_huge", huge))
    output = first_output(result)
    assert changed
    assert "[truncated" in output
    assert "chars]" in output
    assert len(output) < len(huge)
    assert output == "X" * 971 + "... [truncated 1900000 chars]"


def test_compacted_messages_record_the_tool_call_ids() -> None:
    message = big_tool_message("meta-compact", "call_meta", "Y" * 1_900_000)
    message["metadata"] = {"source": "test"}
    result, _ = enforce_row_size_limit(message)
    assert result["metadata"] == {"source": "test", "compactedToolOutputs": ["call_meta"]}
    assert message["metadata"] == {"source": "test"}


def test_non_assistant_messages_get_their_text_truncated() -> None:
    large = "Z" * 1_900_000
    result, changed = enforce_row_size_limit(text_message("user-big", large))
    text = result["parts"][0]["text"]
    assert changed
    assert "truncated for storage" in text
    assert len(text) < len(large)
    assert text == f"[Text truncated for storage (1900000 chars). First 500 chars: {'Z' * 500}...]"
    assert result["metadata"] == {"compactedTextParts": [0]}


def test_multibyte_output_is_measured_in_utf8_bytes() -> None:
    cjk = "\u4e00" * 700_000  # 700,000 JavaScript chars but 2,100,000 UTF-8 bytes
    result, changed = enforce_row_size_limit(big_tool_message("unicode-test", "call_unicode", cjk))
    output = first_output(result)
    assert changed
    assert isinstance(output, str)
    assert len(output) < len(cjk)
    assert "[truncated" in output
    assert output == "\u4e00" * 972 + "... [truncated 700000 chars]"


def test_text_truncation_goes_oldest_first_and_stops_once_it_fits() -> None:
    parts = [{"type": "text", "text": c * 700_000} for c in "abcd"]
    message = {"id": "u", "role": "user", "parts": parts}

    result, changed = enforce_row_size_limit(message)

    assert changed
    assert result["metadata"] == {"compactedTextParts": [0, 1]}
    assert result["parts"][0]["text"].startswith("[Text truncated for storage (700000 chars). First 500 chars: aaa")
    assert result["parts"][2] is parts[2]
    assert result["parts"][3] is parts[3]
    assert json_bytes(result) <= ROW_MAX_BYTES


def test_nothing_to_cut_returns_the_input_still_over_the_cap() -> None:
    message = {"id": "a", "role": "assistant", "parts": [{"type": "reasoning", "text": "r" * 1_900_000}]}
    result, changed = enforce_row_size_limit(message)
    assert result is message
    assert not changed


def test_the_cap_is_a_parameter() -> None:
    message = big_tool_message("m", "c", "o" * 5000)
    result, changed = enforce_row_size_limit(message, max_bytes=2000)
    assert changed
    assert first_output(result) == "o" * 974 + "... [truncated 5000 chars]"


# -- provider.test.ts: getRecentHistory's window (§1.3, §6.1) ----------------------------


def rows_of(messages: list[dict[str, Any]]) -> list[tuple[str, int]]:
    return [(m["id"], json_bytes(m)) for m in messages]


def ten_kilobyte_rows() -> list[tuple[str, int]]:
    roles = ("user", "assistant")
    return rows_of([text_message(f"m{i}", "x" * 1024, roles[i % 2]) for i in range(10)])


def test_window_of_an_empty_path() -> None:
    assert recent_window([], 1024) == (0, False, 0)


def test_window_holds_everything_when_it_fits() -> None:
    rows = rows_of([text_message(f"m{i}", f"message {i}") for i in range(6)])
    start, truncated, total = recent_window(rows, 10 * 1024 * 1024)
    assert (start, truncated) == (0, False)
    assert total == sum(size for _, size in rows) > 0


def test_window_over_budget_is_a_suffix_ending_at_the_leaf() -> None:
    rows = ten_kilobyte_rows()
    assert [size for _, size in rows[:2]] == [1085, 1090]
    start, truncated, total = recent_window(rows, 3 * 1024)
    assert truncated
    assert start == 8  # [m8, m9]: 2175 bytes; m7 would make 3265
    assert total == 10_875


def test_window_always_includes_the_leaf() -> None:
    rows = rows_of([text_message("small", "hi"), text_message("huge", "y" * 50_000, "assistant")])
    start, truncated, _ = recent_window(rows, 1024)
    assert [row_id for row_id, _ in rows[start:]] == ["huge"]
    assert truncated


def test_window_total_is_the_sum_of_the_whole_path() -> None:
    rows = rows_of([text_message("small", "hi"), text_message("big", "z" * 10_000, "assistant")])
    assert rows[1][1] > rows[0][1] + 9000
    assert recent_window(rows, 1)[2] == rows[0][1] + rows[1][1]


def test_min_recent_floors_the_window_over_the_budget() -> None:
    rows = ten_kilobyte_rows()
    start, truncated, _ = recent_window(rows, 2 * 1024, 4)
    assert truncated
    assert [row_id for row_id, _ in rows[start:]] == ["m6", "m7", "m8", "m9"]


def test_min_recent_larger_than_the_path_returns_it_whole() -> None:
    rows = rows_of([text_message(f"m{i}", "x") for i in range(3)])
    assert recent_window(rows, 1, 10)[:2] == (0, False)


def test_window_extends_past_the_floor_while_rows_fit() -> None:
    assert recent_window([("a", 300), ("b", 200), ("c", 100)], 300) == (1, True, 600)
    assert recent_window([("a", 5), ("b", 5), ("c", 5), ("d", 5)], 10, 2) == (2, True, 20)
    assert recent_window([("a", 100), ("b", 100)], 0, 0) == (1, True, 200)


# -- JavaScript string and JSON rules ----------------------------------------------------


def test_stringify_escapes_like_json_stringify() -> None:
    value = 'q"b\\s/ \b\f\n\r\t\x00\x1f\x7f\u2028\u2029é中😀'
    assert stringify(value) == '"q\\"b\\\\s/ \\b\\f\\n\\r\\t\\u0000\\u001f\x7f\u2028\u2029é中😀"'


def test_stringify_escapes_lone_surrogates_and_joins_pairs() -> None:
    assert stringify(["\ud800", "a\udc00", "\ud83d\ude00"]) == '["\\ud800","a\\udc00","😀"]'


def test_stringify_formats_numbers_like_javascript() -> None:
    values = [0, -0.0, 1.0, -1.5, 1e21, 1e20, 1e-6, 1e-7, 1.5e-7, 1e16, float("nan"), float("inf"), True, None]
    assert (
        stringify(values)
        == "[0,0,1,-1.5,1e+21,100000000000000000000,0.000001,1e-7,1.5e-7,10000000000000000,null,null,true,null]"
    )


def test_stringify_puts_integer_like_keys_first() -> None:
    value = {"b": 1, "2": 2, "a": 3, "10": 4, "01": 5, "-1": 6, "4294967294": 7, "4294967295": 8}
    assert stringify(value) == '{"2":2,"10":4,"4294967294":7,"b":1,"a":3,"01":5,"-1":6,"4294967295":8}'
    assert [key for key, _ in js_items(value)][:3] == ["2", "10", "4294967294"]


def test_stringify_rejects_non_json_values() -> None:
    with pytest.raises(TypeError):
        stringify({"a": object()})


def test_lengths_and_slices_are_in_utf16_code_units() -> None:
    assert js_len("abc") == 3
    assert js_len("é中") == 2
    assert js_len("😀") == 2
    assert js_prefix("a😀b", 3) == "a😀"
    assert js_prefix("abcdef", -2) == "abcd"
    assert json_bytes("é") == 4


def test_truncated_suffix_and_result() -> None:
    assert truncated_suffix(42) == "... [truncated 42 chars]"
    result = tool_output_truncation({"a": 1}, 7)
    assert (result.truncated, result.original_length) == (False, 7)
    assert tool_output_truncation("abc", 2).original_length == 3


# -- deliberate differences from the reference (see the module docstring) ----------------


def test_a_cut_never_splits_a_surrogate_pair() -> None:
    # The reference keeps 25 code units, twelve emoji and half of the thirteenth ("\ud83d" in JSON).
    assert truncate_tool_output("😀" * 100, 50) == "😀" * 12 + "... [truncated 200 chars]"
    assert js_prefix("😀😀", 3) == "😀"
    result, _ = enforce_row_size_limit(text_message("u", "a" + "😀" * 1_000_000), max_bytes=10_000)
    assert (
        result["parts"][0]["text"]
        == "[Text truncated for storage (2000001 chars). First 500 chars: a" + "😀" * 249 + "...]"
    )
    json.dumps(result, ensure_ascii=False).encode("utf-8")  # no lone surrogate anywhere


def test_a_proto_key_survives_truncation() -> None:
    # The reference's copy assigns result["__proto__"], which sets no field: it returns {"b": 1}.
    output = truncate_tool_output({"__proto__": "p" * 300, "b": 1}, 100)
    assert output == {"__proto__": "p... [truncated 80 chars]", "b": 1}


def test_big_integers_are_written_exactly() -> None:
    assert stringify(2**64) == "18446744073709551616"


# -- goldens: the reference's own outputs under Node -------------------------------------


def key_order(value: Any) -> list[Any]:
    """Every object's keys in order, depth first (stringify alone would reorder them)."""
    if isinstance(value, dict):
        return [list(value), *(key_order(item) for item in value.values())]
    if isinstance(value, list):
        return [key_order(item) for item in value]
    return []


def load_goldens() -> list[dict[str, Any]]:
    cases: list[dict[str, Any]] = json.loads(GOLDENS.read_text(encoding="utf-8"))["cases"]
    return cases


@pytest.mark.parametrize("case", load_goldens(), ids=lambda case: str(case["name"]))
def test_matches_the_reference(case: dict[str, Any]) -> None:
    op, expected = case["op"], case["expected"]
    if op == "stringify":
        assert stringify(case["value"]) == expected
    elif op == "tool":
        snapshot = copy.deepcopy(case["value"])
        truncation = tool_output_truncation(case["value"], case["max"])
        assert (truncation.truncated, truncation.original_length) == (
            expected["truncated"],
            expected["originalLength"],
        )
        assert stringify(truncation.output) == stringify(expected["output"])
        if truncation.truncated:  # rebuilt containers follow JavaScript's key order too
            assert key_order(truncation.output) == key_order(expected["output"])
        else:
            assert truncation.output is case["value"]
        assert case["value"] == snapshot
    elif op == "older":
        messages = case["messages"]
        snapshot = copy.deepcopy(messages)
        options = case["opts"]
        result = truncate_older_messages(
            messages,
            keep_recent=options.get("keepRecent", 4),
            max_tool_output_chars=options.get("maxToolOutputChars", 500),
            max_text_chars=options.get("maxTextChars", 10_000),
        )
        assert (result is messages) == expected["same"]
        assert [out is inp for out, inp in zip(result, messages, strict=True)] == expected["identical"]
        for out, want in zip(result, expected["messages"], strict=True):
            if want is not None:
                assert stringify(out) == stringify(want)
        assert messages == snapshot
    elif op == "row":
        message = case["message"]
        snapshot = copy.deepcopy(message)
        row, changed = enforce_row_size_limit(message, case["max"])
        # The reference returns an equal copy when nothing could be cut; this returns the input.
        want = message if expected["same"] else expected["message"]
        assert stringify(row) == stringify(want)
        assert changed == (stringify(want) != stringify(snapshot))
        assert (row is message) == (not changed)
        assert message == snapshot
    elif op == "window":
        rows = [(str(i), size) for i, size in enumerate(case["bytes"])]
        assert list(recent_window(rows, case["max"], case["min"])) == expected
    else:
        pytest.fail(f"unknown op {op}")
