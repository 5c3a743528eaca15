"""The bound on a session's prompt size and the words of a refusal (services/context/prompt_size.py): pure."""

from __future__ import annotations

from events.admission import MAX_WRITTEN_BYTES
from services.context.prompt_size import bounding_event, too_large
from services.context.prompt_text import RenderedBlock, render
from services.tokens import TokenCounter


def test_the_bounding_event_is_no_shorter_than_the_one_a_refresh_records() -> None:
    counter = TokenCounter()
    contents = {"a": "héllo wörld " * 50, "b": "plain words " * 80}
    exact = [RenderedBlock(k, "writable", "d", v, counter.count(v), 10_000) for k, v in contents.items()]
    bound = [RenderedBlock(k, "writable", "d", v, len(v.encode()), 10_000) for k, v in contents.items()]
    recorded = bounding_event("t", "s", exact).model_copy(
        update={"tokens": counter.count(render(exact)), "version_no": 7, "reason": "refresh"}
    )
    assert len(bounding_event("t", "s", bound).to_json()) >= len(recorded.to_json())


def test_a_refusal_names_the_sizes_and_the_room_left() -> None:
    # the prompt is 1,000 bytes with the block empty, one byte per character more with text in it
    words = too_large("b", MAX_WRITTEN_BYTES + 1000, 1000, "x" * (MAX_WRITTEN_BYTES), "xy")
    assert words == (
        f'Block "b" would make the system prompt too large to store: {MAX_WRITTEN_BYTES + 1000} > '
        f"{MAX_WRITTEN_BYTES} bytes. The block has room for about {MAX_WRITTEN_BYTES - 1000} characters "
        "(it holds 2); write a shorter text, or shorten another block"
    )


def test_no_room_is_left_when_the_rest_of_the_prompt_is_over_the_limit_already() -> None:
    assert "room for about 0 characters" in too_large("b", MAX_WRITTEN_BYTES + 10, MAX_WRITTEN_BYTES + 5, "abc", "")
