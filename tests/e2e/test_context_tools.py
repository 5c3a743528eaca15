"""Generated tools over HTTP: which exist per block kind, their provider formats, and every
result and error string verbatim. Tools never fail the request: errors are ``Error: …`` results."""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

import httpx
import pytest

from services.context.entry_keys import hash36
from services.settings import Settings
from tests.e2e.context_support import (
    configure,
    context,
    events,
    new_bucket,
    pct,
    problem,
    sid,
    tokens,
    tool,
    tool_names,
)
from tests.e2e.helpers import append, msg

SOUL: dict[str, Any] = {"kind": "readonly", "label": "soul", "content": "You are helpful."}
MEMORY: dict[str, Any] = {"kind": "writable", "label": "memory", "description": "Learned facts", "max_tokens": 10}
KNOWLEDGE: dict[str, Any] = {"kind": "searchable", "label": "knowledge", "description": "Searchable docs"}


def skills(bucket: str) -> dict[str, Any]:
    return {"kind": "skills", "label": "skills", "description": "Loadable docs", "bucket": bucket, "prefix": "s/"}


async def full_session(client: httpx.AsyncClient, settings: Settings) -> str:
    s = sid()
    seq = await configure(client, s, {"blocks": [SOUL, MEMORY, KNOWLEDGE, skills(new_bucket(settings))]})
    await context(client, s, seq)  # applied: reads without min_seq see the config from here on
    return s


async def test_tools_per_block_kind(client: httpx.AsyncClient, api_settings: Settings) -> None:
    bucket = new_bucket(api_settings)
    cases: list[tuple[list[dict[str, Any]], str | None, list[str]]] = [
        ([], None, []),
        ([SOUL], None, []),
        ([SOUL, MEMORY], None, ["set_context"]),
        ([skills(bucket)], None, ["set_context", "load_context", "unload_context"]),
        ([KNOWLEDGE], None, ["set_context", "search_context"]),
        ([SOUL], "past", ["search_context", "session_search"]),
        (
            [SOUL, MEMORY, KNOWLEDGE, skills(bucket)],
            "past",
            ["set_context", "load_context", "unload_context", "search_context", "session_search"],
        ),
    ]
    for blocks, history, names in cases:
        s = sid()
        seq = await configure(client, s, {"blocks": blocks, "searchable_history": history})
        assert await tool_names(client, s, seq) == names, (blocks, history)


async def test_tools_of_an_unknown_session_are_404(client: httpx.AsyncClient) -> None:
    """Listing and running the tools of a session never written are both 404 (running one was a
    200 ``Error: tool … is not available`` result while the listing was 404); nothing recorded."""
    s = sid()
    problem(await client.get(f"/v1/sessions/{s}/tools"), 404, "session_not_found")
    problem(await client.get(f"/v1/sessions/{s}/config"), 404, "session_not_found")
    for name, args in [("set_context", {"label": "memory", "content": "x"}), ("nope", {})]:
        p = problem(await client.post(f"/v1/sessions/{s}/tools/{name}", json=args), 404, "session_not_found")
        assert "deleted" not in p
    assert await events(client, s) == []


async def test_tools_of_an_unconfigured_session(client: httpx.AsyncClient) -> None:
    s = sid()
    seq = (await append(client, s, msg("m1", "hello")))["seq"]
    r = await client.get(f"/v1/sessions/{s}/tools", params={"min_seq": seq})
    assert r.json() == {"format": "openai", "tools": []}
    r = await client.get(f"/v1/sessions/{s}/config", params={"min_seq": seq})
    assert r.json() == {"config": {"blocks": []}}
    res, _ = await tool(client, s, "set_context", {"label": "memory", "content": "x"})
    assert res == 'Error: tool "set_context" is not available in this session'


async def test_an_unknown_tool_name_is_echoed_short_and_printable(client: httpx.AsyncClient) -> None:
    """A name no tool has comes back in the result (200, as any unknown tool), but cut at 64
    characters with its length said, its NUL and control characters escaped; nothing recorded."""
    s = sid()
    await append(client, s, msg("m1", "hello"))
    before = await events(client, s)
    res, _ = await tool(client, s, "x" * 5_000, {})
    assert res == f'Error: tool "{"x" * 64}… (5000 characters)" is not available in this session'
    res, _ = await tool(client, s, quote("set\x00context\nnext"), {})  # %00, %0A
    assert res == 'Error: tool "set\\u0000context\\u000anext" is not available in this session'
    res, _ = await tool(client, s, "ツール_" + "y" * 60, {})  # a printable name of 64 characters: as given
    assert res == f'Error: tool "ツール_{"y" * 60}" is not available in this session'
    assert await events(client, s) == before


async def test_provider_formats(client: httpx.AsyncClient, api_settings: Settings) -> None:
    s = await full_session(client, api_settings)
    openai = (await client.get(f"/v1/sessions/{s}/tools", params={"format": "openai"})).json()
    anthropic = (await client.get(f"/v1/sessions/{s}/tools", params={"format": "anthropic"})).json()
    default = (await client.get(f"/v1/sessions/{s}/tools")).json()
    assert openai["format"] == "openai"
    assert default == openai
    assert anthropic["format"] == "anthropic"
    assert len(openai["tools"]) == len(anthropic["tools"]) == 4
    for o, a in zip(openai["tools"], anthropic["tools"], strict=True):
        assert set(o) == {"type", "function"}
        assert o["type"] == "function"
        assert set(o["function"]) == {"name", "description", "parameters"}
        assert set(a) == {"name", "description", "input_schema"}
        assert o["function"]["name"] == a["name"]
        assert o["function"]["description"] == a["description"]
        assert o["function"]["parameters"] == a["input_schema"]
    set_context = anthropic["tools"][0]
    assert set_context["name"] == "set_context"
    assert set_context["description"].split("\n")[1:4] == [
        '- "memory" (writable): Learned facts',
        '- "knowledge" (searchable, keyed entries): Searchable docs',
        '- "skills" (skill collection, keyed entries): Loadable docs',
    ]
    schema = set_context["input_schema"]
    assert schema["required"] == ["label", "content"]
    assert schema["properties"]["label"]["enum"] == ["memory", "knowledge", "skills"]
    assert schema["properties"]["action"]["enum"] == ["replace", "append"]
    assert set(schema["properties"]["metadata"]["properties"]) == {"title", "description"}
    problem(await client.get(f"/v1/sessions/{s}/tools", params={"format": "gemini"}), 422, "invalid_request")


async def test_set_context_says_truly_who_sees_a_write(client: httpx.AsyncClient, api_settings: Settings) -> None:
    """The reference's "Writes are durable and persist across sessions." is false here: writable
    and searchable blocks are the session's, skills the tenant's. The description says which."""
    bucket = new_bucket(api_settings)
    readonly_skills = {**skills(bucket), "writable": False}
    cases: list[tuple[list[dict[str, Any]], str]] = [
        ([MEMORY, KNOWLEDGE, readonly_skills], "Writes are durable and persist in this session only."),
        (
            [skills(bucket)],
            "Writes are durable. Skill collections are shared: other sessions list and load what is written to them.",
        ),
        (
            [MEMORY, skills(bucket)],
            "Writes are durable. Skill collections are shared: other sessions list and load what is written to "
            "them; the other blocks persist in this session only.",
        ),
    ]
    for blocks, expected in cases:
        s = sid()
        seq = await configure(client, s, {"blocks": blocks})
        r = await client.get(f"/v1/sessions/{s}/tools", params={"min_seq": seq})
        description = r.json()["tools"][0]["function"]["description"]
        assert description.split("\n\n")[1] == expected, blocks
        assert "across sessions" not in description


async def test_set_context_results(client: httpx.AsyncClient, api_settings: Settings) -> None:
    s = sid()
    scratch = {"kind": "writable", "label": "scratch"}
    await configure(client, s, {"blocks": [SOUL, MEMORY, scratch, KNOWLEDGE, skills(new_bucket(api_settings))]})

    res, _ = await tool(client, s, "set_context", {"label": "memory", "content": "fact1"})
    assert res == f"Written to memory. Usage: {pct(tokens('fact1'), 10)}% ({tokens('fact1')}/10 tokens)"
    res, seq = await tool(client, s, "set_context", {"label": "memory", "content": "\nfact2", "action": "append"})
    both = "fact1\nfact2"
    assert res == f"Written to memory. Usage: {pct(tokens(both), 10)}% ({tokens(both)}/10 tokens)"
    assert (await context(client, s, seq))["memory"]["content"] == both

    res, _ = await tool(client, s, "set_context", {"label": "scratch", "content": "anything goes"})
    assert res == f"Written to scratch. Usage: {tokens('anything goes')} tokens"
    res, seq = await tool(client, s, "set_context", {"label": "scratch", "content": "over", "action": "replace"})
    assert res == f"Written to scratch. Usage: {tokens('over')} tokens"
    assert (await context(client, s, seq))["scratch"]["content"] == "over"
    res, seq = await tool(client, s, "set_context", {"label": "scratch", "content": "again", "action": None})
    assert res == f"Written to scratch. Usage: {tokens('again')} tokens"  # a null action is the default

    res, _ = await tool(
        client,
        s,
        "set_context",
        {"label": "knowledge", "content": "Deploys on Friday", "metadata": {"title": "Deploy"}},
    )
    assert res == 'Indexed "deploy" in knowledge.'
    res, _ = await tool(client, s, "set_context", {"label": "knowledge", "content": "no key"})
    assert res.startswith('Indexed "no-key-')
    assert res.endswith('" in knowledge.')
    # action is ignored for keyed blocks; the extra ``key`` argument of old clients is ignored too
    res, _ = await tool(
        client,
        s,
        "set_context",
        {"label": "skills", "content": "Arr", "action": "append", "key": "x", "metadata": {"title": "Pirate style"}},
    )
    assert res == 'Indexed "pirate-style" in skills.'
    res, _ = await tool(
        client, s, "set_context", {"label": "knowledge", "content": "日本語", "metadata": {"title": "日本"}}
    )
    assert res == f'Indexed "entry-{hash36("日本")}" in knowledge.'


async def test_an_action_the_schema_does_not_name_is_refused_and_writes_nothing(
    client: httpx.AsyncClient, api_settings: Settings
) -> None:
    """The reference replaces the whole block for any action but ``append``: a small model's
    ``add``, ``delete`` or ``prepend`` wiped its memory. Each is an ``Error: …`` naming the valid
    actions, on every kind of block, and nothing is written."""
    s = await full_session(client, api_settings)
    res, seq = await tool(client, s, "set_context", {"label": "memory", "content": "fact"})
    assert res.startswith("Written to memory"), res
    before = await events(client, s)
    cases: list[tuple[str, Any, str]] = [
        ("memory", "add", '"add"'),
        ("memory", "delete", '"delete"'),
        ("memory", "prepend", '"prepend"'),
        ("memory", "Append", '"Append"'),
        ("memory", 5, "5"),
        ("memory", ["append"], '["append"]'),
        ("knowledge", "delete", '"delete"'),
        ("skills", "add", '"add"'),
    ]
    for label, action, shown in cases:
        args = {"label": label, "content": "new", "action": action, "metadata": {"title": "t"}}
        if label == "memory":
            del args["metadata"]
        res, _ = await tool(client, s, "set_context", args)
        assert res == (
            f'Error: argument \'action\' must be "replace" or "append" (got {shown}); nothing was written'
        ), (label, action)
    assert await events(client, s) == before
    assert (await context(client, s, seq))["memory"]["content"] == "fact"
    tools = (await client.get(f"/v1/sessions/{s}/tools")).json()["tools"]
    action = tools[0]["function"]["parameters"]["properties"]["action"]
    assert action["enum"] == ["replace", "append"]


async def test_non_latin_skill_title(client: httpx.AsyncClient, api_settings: Settings) -> None:
    s = await full_session(client, api_settings)
    res, _ = await tool(
        client, s, "set_context", {"label": "skills", "content": "日本語", "metadata": {"title": "日本"}}
    )
    assert res == f'Indexed "entry-{hash36("日本")}" in skills.'
    res, _ = await tool(client, s, "load_context", {"label": "skills", "key": f"entry-{hash36('日本')}"})
    assert res == "日本語"


async def test_error_strings(client: httpx.AsyncClient, api_settings: Settings) -> None:
    s = await full_session(client, api_settings)
    await tool(client, s, "set_context", {"label": "memory", "content": "fact"})
    before = await events(client, s)

    cases: list[tuple[str, dict[str, Any], str]] = [
        ("set_context", {"label": "x", "content": "a"}, 'Error: block "x" not found'),
        ("set_context", {"label": "soul", "content": "a"}, 'Error: Block "soul" is readonly'),
        ("load_context", {"label": "memory", "key": "a"}, 'Error: "memory" is not a skill block. Skill blocks: skills'),
        ("load_context", {"label": "x", "key": "a"}, 'Error: "x" is not a skill block. Skill blocks: skills'),
        ("unload_context", {"label": "soul", "key": "a"}, 'Error: "soul" is not a skill block. Skill blocks: skills'),
        (
            "search_context",
            {"label": "memory", "query": "a"},
            'Error: "memory" is not searchable. Searchable blocks: knowledge',
        ),
        ("search_context", {"label": "knowledge", "query": "nothing matches this"}, "No results found."),
        ("search_context", {"label": "knowledge", "query": "   "}, "No results found."),
        ("load_context", {"label": "skills", "key": "missing"}, "Not found: missing"),
        ("unload_context", {"label": "skills", "key": "pirate"}, 'Skill "pirate" is not currently loaded in "skills".'),
        ("session_search", {"query": "x"}, 'Error: tool "session_search" is not available in this session'),
        ("delete_everything", {}, 'Error: tool "delete_everything" is not available in this session'),
    ]
    for name, args, expected in cases:
        res, _ = await tool(client, s, name, args)
        assert res == expected, (name, args)

    long = "word " * 50
    res, _ = await tool(client, s, "set_context", {"label": "memory", "content": long})
    assert res == f'Error: Block "memory" exceeds maxTokens: {tokens(long)} > 10'
    res, _ = await tool(client, s, "set_context", {"label": "memory", "content": long, "action": "append"})
    assert res == f'Error: Block "memory" exceeds maxTokens: {tokens("fact" + chr(10) + long)} > 10'
    assert await events(client, s) == before


async def test_content_too_large_for_one_event_is_an_error_an_llm_can_act_on(
    client: httpx.AsyncClient, api_settings: Settings
) -> None:
    s = await full_session(client, api_settings)
    before = await events(client, s)
    res, _ = await tool(client, s, "set_context", {"label": "knowledge", "content": "word " * 220_000})
    assert res.startswith("Error: content too large to store (")
    assert res.endswith("); write a shorter text")
    assert await events(client, s) == before


BAD_ARGUMENTS: dict[str, tuple[str, Any, str]] = {
    "list": ("set_context", [1, 2], "Error: tool arguments must be a JSON object"),
    "string": ("set_context", "memory", "Error: tool arguments must be a JSON object"),
    "number": ("search_context", 5, "Error: tool arguments must be a JSON object"),
    "null": ("set_context", None, "Error: argument 'label' must be a string"),
    "missing-label": ("set_context", {"content": "a"}, "Error: argument 'label' must be a string"),
    "label-a-number": ("set_context", {"label": 3, "content": "a"}, "Error: argument 'label' must be a string"),
    "missing-content": ("set_context", {"label": "memory"}, "Error: argument 'content' must be a string"),
    "content-an-object": (
        "set_context",
        {"label": "memory", "content": {}},
        "Error: argument 'content' must be a string",
    ),
    "keyed-missing-content": ("set_context", {"label": "knowledge"}, "Error: argument 'content' must be a string"),
    "missing-key": ("load_context", {"label": "skills"}, "Error: argument 'key' must be a string"),
    "unload-key-null": ("unload_context", {"label": "skills", "key": None}, "Error: argument 'key' must be a string"),
    "missing-query": ("search_context", {"label": "knowledge"}, "Error: argument 'query' must be a string"),
    # a malformed metadata was ignored (a title that is not a string became a content-hash key)
    "metadata-a-string": (
        "set_context",
        {"label": "knowledge", "content": "a", "metadata": "x"},
        "Error: argument 'metadata' must be an object: {title, description}",
    ),
    "metadata-title-a-number": (
        "set_context",
        {"label": "skills", "content": "a", "metadata": {"title": 5}},
        "Error: argument 'metadata.title' must be a string",
    ),
    "metadata-description-a-list": (
        "set_context",
        {"label": "knowledge", "content": "a", "metadata": {"title": "t", "description": []}},
        "Error: argument 'metadata.description' must be a string",
    ),
}


@pytest.mark.parametrize("case", BAD_ARGUMENTS.values(), ids=BAD_ARGUMENTS.keys())
async def test_bad_arguments_are_error_results_and_write_nothing(
    client: httpx.AsyncClient, api_settings: Settings, case: tuple[str, Any, str]
) -> None:
    name, args, expected = case
    s = await full_session(client, api_settings)
    before = await events(client, s)
    r = await client.post(f"/v1/sessions/{s}/tools/{name}", json=args)
    assert r.status_code == 200, r.text
    assert r.json()["result"] == expected
    assert await events(client, s) == before
    assert (await context(client, s))["memory"]["content"] == ""


async def test_malformed_json_is_a_problem(client: httpx.AsyncClient, api_settings: Settings) -> None:
    s = await full_session(client, api_settings)
    before = await events(client, s)
    r = await client.post(
        f"/v1/sessions/{s}/tools/set_context", content=b'{"label": ', headers={"content-type": "application/json"}
    )
    problem(r, 400, "malformed_json")
    assert await events(client, s) == before
