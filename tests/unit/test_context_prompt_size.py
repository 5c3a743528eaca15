"""The bound on a session's prompt size and the words of a refusal (services/context/prompt_size.py), the
listings a skill put would leave (services/context/rules.py) and the problem of a prompt too large to store: pure."""

from __future__ import annotations

from events.admission import MAX_WRITTEN_BYTES
from services.context.prompt_size import (
    SHORTER_SKILL,
    bounding_event,
    config_too_large,
    most_grown,
    too_large,
    unstorable,
)
from services.context.prompt_text import RenderedBlock, render
from services.context.rules import with_skill
from services.errors import PromptUnstorable
from services.requests.problems import problem_of
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


def test_a_skill_refusal_names_the_skill_its_block_and_the_room_in_the_listing() -> None:
    words = too_large(
        "skills", MAX_WRITTEN_BYTES + 10, MAX_WRITTEN_BYTES - 20, "- tax: " + "d" * 23, "",
        subject='Skill "tax" in block "skills"', advice=SHORTER_SKILL,
    )  # fmt: skip
    assert words == (
        f'Skill "tax" in block "skills" would make the system prompt too large to store: {MAX_WRITTEN_BYTES + 10} > '
        f"{MAX_WRITTEN_BYTES} bytes. The block has room for about 20 characters (it holds 0); "
        "give the skill a shorter description, or shorten another block"
    )


def block(label: str, content: str, description: str | None = None) -> RenderedBlock:
    return RenderedBlock(label, "readonly", description, content, len(content.encode()), None)


def test_the_block_a_config_lengthens_most_is_named_with_by_how_much() -> None:
    before = [block("a", "x" * 100), block("b", "y" * 10)]
    after = [block("a", "x" * 100, "d" * 200), block("b", "y" * 10), block("c", "z" * 40)]
    assert most_grown(after, before) == (after[0], len(" (" + "d" * 200 + ")"))
    assert most_grown(after, []) == (after[0], len(render([after[0]])))  # nothing renders in force: all is new
    words = config_too_large(MAX_WRITTEN_BYTES + 5, MAX_WRITTEN_BYTES - 30, after[2], 75)
    assert words == (
        f"The config would make the system prompt too large to store: {MAX_WRITTEN_BYTES + 5} > {MAX_WRITTEN_BYTES} "
        "bytes. The prompt has room for about 63 more characters "
        f"(it is {MAX_WRITTEN_BYTES - 30} bytes stored with the config in force); "
        'block "c" lengthens it most, by 75 characters: '
        "leave blocks out, shorten them, or point read-only blocks at smaller objects"
    )
    assert "room for about 0 more characters" in config_too_large(
        MAX_WRITTEN_BYTES + 9, MAX_WRITTEN_BYTES + 5, after[2], 4
    )


def test_an_unstorable_prompt_names_its_largest_block_by_how_much_and_the_way_out() -> None:
    big = block("big", "x" * 2001)
    # 1,000 bytes with one character in the block, one byte per character more
    words = unstorable(MAX_WRITTEN_BYTES + 1000, big, MAX_WRITTEN_BYTES - 1000)
    assert words == (
        f"The system prompt is too large to store: {MAX_WRITTEN_BYTES + 1000} > {MAX_WRITTEN_BYTES} bytes "
        '(1000 over). Its largest block, "big", has room for about 1001 characters (it holds 2001): '
        "upload a smaller object, or PUT a config that shortens the block or leaves it out"
    )
    assert "room for about 0 characters" in unstorable(MAX_WRITTEN_BYTES + 9, big, MAX_WRITTEN_BYTES + 1)
    writable = RenderedBlock("notes", "writable", None, "n" * 10, 10, None)
    assert unstorable(MAX_WRITTEN_BYTES + 9, writable, MAX_WRITTEN_BYTES).endswith(
        "write a shorter text to it (a write that shortens a block is always taken)"
    )


def test_an_unstorable_prompt_is_a_409_problem_naming_the_block_and_the_sizes() -> None:
    found = problem_of(PromptUnstorable("too large", "big", MAX_WRITTEN_BYTES + 3, MAX_WRITTEN_BYTES))
    assert found is not None
    assert (found["status"], found["code"], found["detail"]) == (409, "prompt_unstorable", "too large")
    assert (found["block"], found["size"], found["limit"]) == ("big", MAX_WRITTEN_BYTES + 3, MAX_WRITTEN_BYTES)


def test_a_skill_put_adds_or_replaces_its_line_in_each_listing_it_falls_in() -> None:
    listings: dict[tuple[str, str], list[tuple[str, str | None]]] = {
        ("docs", "skills/"): [("skills/bank", "Bank"), ("skills/tax", "Tax")],
        ("docs", ""): [("other", None), ("skills/bank", "Bank"), ("skills/tax", "Tax")],
        ("docs", "elsewhere/"): [],
        ("more", "skills/"): [],
    }
    grown = with_skill(listings, "docs", "skills/audit", "Audits")
    assert grown[("docs", "skills/")] == [("skills/audit", "Audits"), ("skills/bank", "Bank"), ("skills/tax", "Tax")]
    assert grown[("docs", "")][0] == ("other", None)
    assert grown[("docs", "")][1] == ("skills/audit", "Audits")
    assert grown[("docs", "elsewhere/")] == grown[("more", "skills/")] == []
    replaced = with_skill(listings, "docs", "skills/tax", None)
    assert replaced[("docs", "skills/")] == [("skills/bank", "Bank"), ("skills/tax", None)]
    assert listings[("docs", "skills/")] == [("skills/bank", "Bank"), ("skills/tax", "Tax")]  # left as it was
