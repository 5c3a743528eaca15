"""System prompt rendering (pure): byte for byte against a hand-written golden file, and the
small strings around it (``set_context`` usage, block summaries, skill listings)."""

from __future__ import annotations

from pathlib import Path

import pytest

from services.context.prompt_text import (
    SEP,
    RenderedBlock,
    header,
    history_summary,
    render,
    round_half_up,
    search_summary,
    skill_listing,
    usage,
)

GOLDEN = Path(__file__).resolve().parent.parent / "fixtures" / "prompts" / "golden.txt"

# The blocks behind golden.txt. Token counts are given, not counted: render() only formats them.
GOLDEN_BLOCKS = [
    RenderedBlock("soul", "readonly", None, "You are a helpful assistant.\nAnswer briefly.", 11, None),
    RenderedBlock("notes", "readonly", "Empty read-only blocks are skipped", "", 0, None),
    RenderedBlock("memory", "writable", "Important facts", "User likes tea.\nUser lives in Kyoto.", 495, 1100),
    RenderedBlock("scratch", "writable", None, "", 0, 200),
    RenderedBlock("half", "writable", "Rounds half up", "x", 91, 200),  # 45.5% -> 46
    RenderedBlock("tiny", "writable", None, "y", 1, 200),  # 0.5% -> 1 (banker's rounding gives 0)
    RenderedBlock("low", "writable", None, "z", 89, 200),  # 44.5% -> 45 (banker's rounding gives 44)
    RenderedBlock("knowledge", "searchable", "Searchable docs", "12 entries indexed.", 4, None),
    RenderedBlock("archive", "searchable", None, "", 0, None),
    RenderedBlock(
        "skills",
        "skills",
        "Loadable docs",
        "- tax: Tax workflows\n- bank-reconciliation: Bank reconciliation",
        14,
        None,
    ),
    RenderedBlock("more_skills", "skills", None, "", 0, None),
    RenderedBlock("policy", "readonly", "Refund policy", "Refunds within 30 days.", 50, 200),
    RenderedBlock(
        "history", "history", "Cross-session conversation history", "3 sessions available for search.", 8, None
    ),
    RenderedBlock("trailing", "readonly", None, "", 0, None),
]


def test_render_matches_the_golden_file_byte_for_byte() -> None:
    expected = GOLDEN.read_bytes().decode("utf-8")
    assert render(GOLDEN_BLOCKS).encode("utf-8") == GOLDEN.read_bytes(), render(GOLDEN_BLOCKS)
    assert not expected.endswith("\n")
    assert "<context_block" not in expected


def test_golden_file_separators_are_46_box_drawing_characters() -> None:
    lines = GOLDEN.read_text(encoding="utf-8").split("\n")
    seps = [line for line in lines if "\u2550" in line]
    assert seps
    assert all(line == "\u2550" * 46 for line in seps)
    assert len(seps) == 2 * 12  # 14 blocks, 2 empty read-only ones skipped
    assert SEP == "\u2550" * 46


def test_one_block_layout() -> None:
    block = RenderedBlock("memory", "writable", "Important facts", "fact", 495, 1100)
    assert render([block]) == f"{SEP}\nMEMORY (Important facts) [45% \u2014 495/1100 tokens] [writable]\n{SEP}\nfact"


def test_no_blocks_and_only_empty_readonly_blocks_render_empty() -> None:
    assert render([]) == ""
    assert render([RenderedBlock("a", "readonly", None, "", 0, None)]) == ""


@pytest.mark.parametrize(
    ("kind", "tag"),
    [("readonly", "[readonly]"), ("writable", "[writable]"), ("searchable", "[searchable]"), ("skills", "[loadable]")],
)
def test_empty_blocks_are_shown_unless_readonly(kind: str, tag: str) -> None:
    block = RenderedBlock("b", kind, None, "", 0, None)  # type: ignore[arg-type]
    expected = "" if kind == "readonly" else f"{SEP}\nB {tag}\n{SEP}\n"
    assert render([block]) == expected


def test_history_block_is_tagged_searchable_not_readonly() -> None:
    # the reference's precedence: searchable before read-only (the history provider has no set)
    block = RenderedBlock("hist", "history", "Cross-session conversation history", "", 0, None)
    assert header(block) == "HIST (Cross-session conversation history) [searchable]"
    assert render([block]) == f"{SEP}\nHIST (Cross-session conversation history) [searchable]\n{SEP}\n"


def test_header_pieces() -> None:
    assert header(RenderedBlock("my-notes_2", "writable", None, "x", 1, None)) == "MY-NOTES_2 [writable]"
    # an empty description is falsy in the reference: no parentheses
    assert header(RenderedBlock("m", "writable", "", "x", 1, None)) == "M [writable]"
    # max_tokens 0 is falsy: no usage bracket
    assert header(RenderedBlock("m", "writable", None, "x", 1, 0)) == "M [writable]"
    # any kind with a budget shows usage, read-only included; over budget shows over 100%
    assert header(RenderedBlock("r", "readonly", None, "x", 25, 10)) == "R [250% \u2014 25/10 tokens] [readonly]"
    assert header(RenderedBlock("s", "skills", "D", "x", 3, 8)) == "S (D) [38% \u2014 3/8 tokens] [loadable]"
    assert header(RenderedBlock("lower", "searchable", None, "", 0, 3)) == "LOWER [0% \u2014 0/3 tokens] [searchable]"


@pytest.mark.parametrize(
    ("x", "expected"),
    [(0.0, 0), (0.49, 0), (0.5, 1), (1.5, 2), (2.5, 3), (44.5, 45), (45.5, 46), (99.5, 100), (33.333, 33)],
)
def test_round_half_up_is_javascript_math_round(x: float, expected: int) -> None:
    assert round_half_up(x) == expected


@pytest.mark.parametrize(
    ("tokens", "max_tokens", "expected"),
    [
        (3, 10, "Written to memory. Usage: 30% (3/10 tokens)"),
        (91, 200, "Written to memory. Usage: 46% (91/200 tokens)"),
        (89, 200, "Written to memory. Usage: 45% (89/200 tokens)"),
        (1, 200, "Written to memory. Usage: 1% (1/200 tokens)"),
        (0, 10, "Written to memory. Usage: 0% (0/10 tokens)"),
        (10, 10, "Written to memory. Usage: 100% (10/10 tokens)"),
        (7, None, "Written to memory. Usage: 7 tokens"),
        (0, None, "Written to memory. Usage: 0 tokens"),
        (7, 0, "Written to memory. Usage: 7 tokens"),
    ],
)
def test_usage_strings(tokens: int, max_tokens: int | None, expected: str) -> None:
    assert usage("memory", tokens, max_tokens) == expected


def test_summaries_and_listing() -> None:
    assert search_summary(0) == ""
    assert search_summary(1) == "1 entries indexed."
    assert search_summary(12) == "12 entries indexed."
    assert history_summary(0) == ""
    assert history_summary(1) == "1 session available for search."
    assert history_summary(2) == "2 sessions available for search."
    assert skill_listing([]) == ""
    assert skill_listing([("tax", "Tax workflows"), ("bank-reconciliation", "Bank reconciliation")]) == (
        "- tax: Tax workflows\n- bank-reconciliation: Bank reconciliation"
    )
    assert skill_listing([("tax", None), ("hidden", "")]) == "- tax\n- hidden"


def test_rendered_block_writable_flag() -> None:
    kinds = {"readonly": False, "writable": True, "searchable": True, "skills": True, "history": False}
    for kind, writable in kinds.items():
        assert RenderedBlock("b", kind, None, "", 0, None).writable is writable  # type: ignore[arg-type]
