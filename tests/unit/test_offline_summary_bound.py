"""The offline summarizer's summary is bounded whatever the size of what it summarises: its
budget (a fifth of the middle's tokens) grows with the session, and a summary over what an
overlay's event may store failed every compaction of a long session."""

from __future__ import annotations

from services.compaction.ranges import Message, Plan, plan_compaction
from services.compaction.summarizers import OFFLINE_SUMMARY_MAX_BYTES, OfflineSummarizer


def _plan(n: int, *, questions: bool = False) -> Plan:
    msgs: list[Message] = []
    for i in range(n):
        role = "user" if i % 2 == 0 else "assistant"
        text = f"turn {i} " + "deploy the cluster node and check the latency budget " * 4
        if questions and role == "user":
            text = text.rstrip() + " why?"
        msgs.append({"id": f"m{i}", "role": role, "parts": [{"type": "text", "text": text}]})
    plan = plan_compaction(msgs, lambda m: 50, overlays=(), protect_head=1, tail_token_budget=100, min_tail_messages=2)
    assert isinstance(plan, Plan), plan
    return plan


async def test_a_long_middles_summary_stays_within_the_bound_and_keeps_the_newest_points() -> None:
    plan = _plan(20_000)
    assert plan.budget * 4 > OFFLINE_SUMMARY_MAX_BYTES  # the budget alone would allow more
    summary = await OfflineSummarizer().summarize(plan)
    assert len(summary.encode()) <= OFFLINE_SUMMARY_MAX_BYTES
    for title in ("## Topic", "## Key Points", "## Current State", "## Open Items"):
        assert title in summary
    newest = str(plan.middle[-1]["id"]).removeprefix("m")
    assert f"turn {newest} " in summary  # the oldest points went first


async def test_open_items_of_a_long_middle_are_bounded_too() -> None:
    summary = await OfflineSummarizer().summarize(_plan(20_000, questions=True))
    assert len(summary.encode()) <= OFFLINE_SUMMARY_MAX_BYTES
    assert "## Open Items\n- turn" in summary


async def test_a_bound_that_cuts_a_multibyte_character_leaves_valid_text() -> None:
    plan = _plan(4)
    huge = Plan(
        [{"id": "x", "role": "user", "parts": [{"type": "text", "text": "é" * 10}]}],
        "## Topic\n" + "\n".join("é" * 199 + str(i) for i in range(2_000)),
        plan.budget,
        plan.prompt,
        plan.start,
        plan.end,
    )
    summary = await OfflineSummarizer().summarize(huge)
    assert len(summary.encode()) <= OFFLINE_SUMMARY_MAX_BYTES
