"""Summarizers: the offline one (deterministic, four sections, iterative) and the OpenAI-compatible
client against a local stub server (retries on 5xx, gives up with SummarizerError)."""

from __future__ import annotations

import time

import pytest

from services.compaction.ranges import Message, Plan, plan_compaction
from services.compaction.summarizers import OfflineSummarizer, OpenAISummarizer, SummarizerError
from tests.e2e.stub_llm import StubLLM


def _msgs(n: int) -> list[Message]:
    out: list[Message] = []
    for i in range(n):
        role = "user" if i % 2 == 0 else "assistant"
        text = f"Question {i} about deployments?" if role == "user" else f"Answer {i}: deploy on Friday."
        out.append({"id": f"m{i}", "role": role, "parts": [{"type": "text", "text": text}]})
    return out


def _plan(messages: list[Message], overlays: tuple[int, ...] = ()) -> Plan:
    plan = plan_compaction(
        messages, lambda m: 50, overlays=overlays, protect_head=1, tail_token_budget=100, min_tail_messages=2
    )
    assert isinstance(plan, Plan), plan  # not a Skip
    return plan


async def test_offline_summary_is_deterministic_with_four_sections() -> None:
    plan = _plan(_msgs(12))
    a = await OfflineSummarizer().summarize(plan)
    b = await OfflineSummarizer().summarize(plan)
    assert a == b
    for section in ("## Topic", "## Key Points", "## Current State", "## Open Items"):
        assert section in a
    assert "Question 2 about deployments?" in a


async def test_offline_summary_extends_the_previous_one() -> None:
    first = await OfflineSummarizer().summarize(_plan(_msgs(8)))
    msgs = _msgs(14)
    overlay: Message = {"id": "compaction_x", "role": "assistant", "parts": [{"type": "text", "text": first}]}
    view = [msgs[0], overlay, *msgs[8:]]
    second = await OfflineSummarizer().summarize(_plan(view, overlays=(1,)))
    assert "Question 2 about deployments?" in second  # kept from the previous summary
    assert "Answer 9" in second  # added


async def test_openai_compatible_summarizer_retries_then_succeeds() -> None:
    with StubLLM([StubLLM.fail(503), StubLLM.say("## Topic\nfrom the model")]) as llm:
        s = OpenAISummarizer(base_url=llm.base_url, model="m", api_key="k", backoff_s=0.01)
        assert await s.summarize(_plan(_msgs(10))) == "## Topic\nfrom the model"
        assert len(llm.requests) == 2
        assert llm.requests[0]["messages"][0]["content"].startswith("Create a concise summary")


async def test_openai_compatible_summarizer_gives_up() -> None:
    with StubLLM([StubLLM.fail(500)] * 3) as llm:
        s = OpenAISummarizer(base_url=llm.base_url, model="m", attempts=3, backoff_s=0.01)
        with pytest.raises(SummarizerError):
            await s.summarize(_plan(_msgs(10)))
        assert len(llm.requests) == 3
    with StubLLM([StubLLM.fail(400)]) as llm:
        s = OpenAISummarizer(base_url=llm.base_url, model="m", attempts=3, backoff_s=0.01)
        with pytest.raises(SummarizerError):
            await s.summarize(_plan(_msgs(10)))
        assert len(llm.requests) == 1  # a client error is not retried


@pytest.mark.parametrize(
    "body",
    [{"choices": None}, [1, 2, 3], {"choices": "nope"}, {"choices": []}, {"choices": [{"message": None}]}, "text"],
    ids=["choices-null", "a-list", "choices-a-string", "no-choice", "message-null", "a-string"],
)
async def test_an_answer_that_is_not_a_chat_completion_is_the_summarizers_failure(body: object) -> None:
    """JSON of the wrong shape was a TypeError: a 500 for a manual compaction, recorded as a
    Python error. It is a summarizer failure, retried as a 5xx and then said in words."""
    with StubLLM([StubLLM.answer(body)] * 2) as llm:
        s = OpenAISummarizer(base_url=llm.base_url, model="m", attempts=2, backoff_s=0.01)
        with pytest.raises(SummarizerError, match="after 2 attempts: the answer is not a chat completion"):
            await s.summarize(_plan(_msgs(10)))
        assert len(llm.requests) == 2


async def test_a_summarizer_that_times_out_is_named_with_its_timeout() -> None:
    """httpx's timeouts have no message: the recorded failure said nothing after its colon."""
    with StubLLM([StubLLM.slow("too late", 2.0)]) as llm:
        s = OpenAISummarizer(base_url=llm.base_url, model="m", attempts=1, backoff_s=0.01, timeout_s=0.2)
        timed_out = r"after 1 attempts: (ReadTimeout|TimeoutError): no answer within 0\.2 s$"
        with pytest.raises(SummarizerError, match=timed_out):
            await s.summarize(_plan(_msgs(10)))


async def test_an_answer_that_trickles_in_is_cut_at_the_timeout_of_the_whole_attempt() -> None:
    """httpx's timeout bounds each read, not the answer: a server sending a byte at a time, each
    within the timeout, held the summary (and, for a manual compaction, the session's lease) for as
    long as it kept sending."""
    with StubLLM([StubLLM.trickle("too late", pad=40, every_s=0.1)]) as llm:
        s = OpenAISummarizer(base_url=llm.base_url, model="m", attempts=1, backoff_s=0.01, timeout_s=0.5)
        started = time.monotonic()
        with pytest.raises(SummarizerError, match=r"after 1 attempts: TimeoutError: no answer within 0\.5 s$"):
            await s.summarize(_plan(_msgs(10)))
        assert time.monotonic() - started < 2.0  # the answer would have taken 4 s
