"""examples/agent_loop.py's ``stored_answer``: which answer a retried turn returns."""

from __future__ import annotations

import runpy
from pathlib import Path
from typing import Any

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "agent_loop.py"


stored_answer = runpy.run_path(str(EXAMPLE), run_name="agent_loop_example_unit")["stored_answer"]


def user(turn: str) -> dict[str, Any]:
    return {"id": f"user-{turn}", "role": "user", "parts": [{"type": "text", "text": f"question {turn}"}]}


def answer(text: str) -> dict[str, Any]:
    return {"id": f"a-{text}", "role": "assistant", "parts": [{"type": "text", "text": text}]}


def tool_step() -> dict[str, Any]:
    part = {"type": "tool-set_context", "toolCallId": "c1", "state": "output-available", "input": {}, "output": "ok"}
    return {"id": "step", "role": "assistant", "parts": [part]}


def test_an_answered_turn_retried_after_a_later_turn_returns_its_own_answer() -> None:
    history = [user("t1"), answer("a1"), user("t2"), answer("a2")]
    assert stored_answer(history, "user-t1") == "a1"
    assert stored_answer(history, "user-t2") == "a2"


def test_an_unanswered_turn_followed_by_an_answered_one_goes_on() -> None:
    history = [user("t1"), user("t2"), answer("a2")]
    assert stored_answer(history, "user-t1") is None


def test_a_turn_whose_last_stored_message_is_a_tool_step_goes_on() -> None:
    history = [user("t1"), tool_step(), user("t2"), answer("a2")]
    assert stored_answer(history, "user-t1") is None
    assert stored_answer([user("t1"), answer("a1"), tool_step()], "user-t1") is None


def test_a_turn_with_nothing_after_it_or_not_in_the_history_goes_on() -> None:
    assert stored_answer([answer("a0"), user("t1")], "user-t1") is None
    assert stored_answer([user("t2"), answer("a2")], "user-t1") is None


def test_a_turn_answered_after_tool_steps_returns_the_final_answer() -> None:
    assert stored_answer([user("t1"), tool_step(), answer("a1"), user("t2")], "user-t1") == "a1"
