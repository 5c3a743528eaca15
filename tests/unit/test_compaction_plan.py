"""The compaction plan, pure: every overlay the new one will hide is carried into the summary
prompt, in path order."""

from __future__ import annotations

from services.compaction.ranges import Message, Plan, plan_compaction, transcript


def _msg(mid: str, text: str) -> Message:
    return {"id": mid, "role": "user", "parts": [{"type": "text", "text": text}]}


def test_the_plan_carries_every_overlay_it_hides_in_path_order() -> None:
    view = [
        _msg("m0", "head"),
        _msg("compaction_one", "SUMMARY ONE"),
        _msg("compaction_two", "SUMMARY TWO"),
        *[_msg(f"m{i}", f"turn {i}") for i in range(13, 17)],
    ]
    plan = plan_compaction(
        view, lambda m: 50, overlays={1, 2}, protect_head=1, tail_token_budget=100, min_tail_messages=2
    )
    assert isinstance(plan, Plan), plan
    assert (plan.start, plan.end) == (1, 5)  # both overlays and m13, m14: the new overlay hides them
    assert [m["id"] for m in plan.middle] == ["m13", "m14"]
    assert plan.previous_summary == "SUMMARY ONE\n\nSUMMARY TWO"
    assert plan.prompt.index("SUMMARY ONE") < plan.prompt.index("SUMMARY TWO") < plan.prompt.index("turn 13")


def test_a_message_whose_id_starts_like_an_overlays_is_a_message() -> None:
    """Overlays are the positions the view says, never ids starting with ``compaction_``: such a
    stored message in the head stays protected, and in the middle it is summarised."""
    view = [_msg("compaction_mine", "mine"), *[_msg(f"m{i}", f"turn {i}") for i in range(1, 8)]]
    plan = plan_compaction(view, lambda m: 50, overlays=(), protect_head=1, tail_token_budget=100, min_tail_messages=2)
    assert isinstance(plan, Plan), plan
    assert (plan.start, plan.end) == (1, 6)
    assert plan.previous_summary is None
    plan = plan_compaction(view, lambda m: 50, overlays=(), protect_head=0, tail_token_budget=100, min_tail_messages=2)
    assert isinstance(plan, Plan), plan
    assert [m["id"] for m in plan.middle] == ["compaction_mine", "m1", "m2", "m3", "m4", "m5"]
    assert plan.previous_summary is None


def test_the_transcript_renders_tool_parts_as_the_reference_does() -> None:
    """``buildSummaryPrompt``'s transcript, byte for byte (the expected text is the reference's
    code run on these messages): ``toolName ?? "unknown"`` (an empty name stays empty), input
    and output only when truthy (``{}`` is), ``String(output)`` (``[object Object]``, arrays
    joined with ``,``), reasoning left out."""
    messages: list[Message] = [
        {
            "id": "a",
            "role": "assistant",
            "parts": [
                {"type": "reasoning", "text": "hidden"},
                {"type": "text", "text": "Looking."},
                {
                    "type": "dynamic-tool",
                    "toolName": "",
                    "toolCallId": "c1",
                    "input": {"q": "é"},
                    "output": {"rows": 2},
                },
                {"type": "tool-search", "toolCallId": "c2", "input": {}, "output": 0},
                {
                    "type": "tool-list",
                    "toolCallId": "c3",
                    "toolName": None,
                    "input": "",
                    "output": [1, None, "a", True],
                },
            ],
        },
        {"id": "b", "role": "user", "parts": [{"type": "text", "text": "one"}, {"type": "text", "text": "two"}]},
    ]
    assert transcript(messages) == (
        '[assistant]\nLooking.\n[Tool: ]\nInput: {"q":"é"}\nOutput: [object Object]\n[Tool: unknown]\nInput: {}\n'
        "[Tool: unknown]\nOutput: 1,,a,true\n\n---\n\n[user]\none\ntwo"
    )


def test_the_transcript_writes_every_tool_input_as_json_stringify_does() -> None:
    # buildSummaryPrompt: ``Input: ${JSON.stringify(tp.input).slice(0, 500)}`` (a string input
    # is quoted and escaped; numbers as JavaScript writes them), ``Output: ${String(tp.output)}``
    part = {"type": "dynamic-tool", "toolCallId": "c1", "toolName": "shell"}
    messages: list[Message] = [
        {"id": "a", "role": "assistant", "parts": [{**part, "input": 'ls "my dir"\nwc', "output": 1e-7}]},
        {"id": "b", "role": "assistant", "parts": [{**part, "input": {"n": 1.0, "x": 2.5e-7}, "output": 1.0}]},
    ]
    assert transcript(messages) == (
        '[assistant]\n\n[Tool: shell]\nInput: "ls \\"my dir\\"\\nwc"\nOutput: 1e-7\n\n---\n\n'
        '[assistant]\n\n[Tool: shell]\nInput: {"n":1,"x":2.5e-7}\nOutput: 1'
    )
