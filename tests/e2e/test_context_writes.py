"""Block writes over HTTP: exact token budgets on replace and append for every writer, the
application write endpoint's problems, and nothing written on any error."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from services.settings import Settings
from tests.e2e.context_support import configure, context, events, new_bucket, problem, sid, tokens, tool

FIRST, SECOND, THIRD = "one two three", "four five", "six"
FIT = tokens(FIRST + "\n" + SECOND)  # the budget: exactly the first two joined


def config(bucket: str) -> dict[str, Any]:
    return {
        "blocks": [
            {"kind": "readonly", "label": "soul", "content": "Be kind."},
            {"kind": "writable", "label": "memory", "description": "Learned facts", "max_tokens": FIT},
            {"kind": "writable", "label": "free"},
            {"kind": "searchable", "label": "knowledge"},
            {"kind": "skills", "label": "skills", "bucket": bucket},
        ],
        "searchable_history": "past",
    }


async def session(client: httpx.AsyncClient, settings: Settings) -> str:
    s = sid()
    await configure(client, s, config(new_bucket(settings)))
    return s


async def put(client: httpx.AsyncClient, s: str, label: str, content: str, mode: str = "replace") -> httpx.Response:
    return await client.put(f"/v1/sessions/{s}/context/{label}", json={"content": content, "mode": mode})


async def test_budget_holds_for_tool_replace_and_append(client: httpx.AsyncClient, api_settings: Settings) -> None:
    s = await session(client, api_settings)
    assert tokens(FIRST + "\n" + SECOND + "\n" + THIRD) > FIT

    res, _ = await tool(client, s, "set_context", {"label": "memory", "content": FIRST})
    assert res == f"Written to memory. Usage: {round(100 * tokens(FIRST) / FIT + 1e-9)}% ({tokens(FIRST)}/{FIT} tokens)"
    res, seq = await tool(client, s, "set_context", {"label": "memory", "content": SECOND, "action": "append"})
    assert res == f"Written to memory. Usage: 100% ({FIT}/{FIT} tokens)"
    before = await events(client, s)

    over = FIRST + "\n" + SECOND + "\n" + THIRD
    res, _ = await tool(client, s, "set_context", {"label": "memory", "content": THIRD, "action": "append"})
    assert res == f'Error: Block "memory" exceeds maxTokens: {tokens(over)} > {FIT}'
    too_long = " ".join([FIRST] * 5)
    res, _ = await tool(client, s, "set_context", {"label": "memory", "content": too_long})
    assert res == f'Error: Block "memory" exceeds maxTokens: {tokens(too_long)} > {FIT}'

    assert await events(client, s) == before
    memory = (await context(client, s, seq))["memory"]
    assert (memory["content"], memory["tokens"]) == (FIRST + "\n" + SECOND, FIT)


async def test_budget_holds_for_application_writes(client: httpx.AsyncClient, api_settings: Settings) -> None:
    s = await session(client, api_settings)
    r = await put(client, s, "memory", FIRST)
    assert r.status_code == 200, r.text
    assert r.json() == {
        "label": "memory",
        "description": "Learned facts",
        "content": FIRST,
        "tokens": tokens(FIRST),
        "max_tokens": FIT,
        "seq": r.json()["seq"],
    }
    r = await put(client, s, "memory", "\n" + SECOND, "append")  # starts with "\n": no extra newline
    assert r.status_code == 200, r.text
    assert (r.json()["content"], r.json()["tokens"]) == (FIRST + "\n" + SECOND, FIT)
    before = await events(client, s)

    over = FIRST + "\n" + SECOND + "\n" + THIRD
    body = problem(await put(client, s, "memory", THIRD, "append"), 422, "budget_exceeded")
    assert body["detail"] == f'Block "memory" exceeds maxTokens: {tokens(over)} > {FIT}'
    body = problem(await put(client, s, "memory", over), 422, "budget_exceeded")
    assert body["detail"] == f'Block "memory" exceeds maxTokens: {tokens(over)} > {FIT}'

    assert await events(client, s) == before
    assert (await context(client, s))["memory"]["content"] == FIRST + "\n" + SECOND

    # replace with less always fits; an unbudgeted block takes anything
    r = await put(client, s, "memory", THIRD)
    assert r.json()["content"] == THIRD
    big = "lorem ipsum " * 2000
    r = await put(client, s, "free", big)
    assert r.status_code == 200, r.text
    assert r.json()["tokens"] == tokens(big)
    assert r.json()["max_tokens"] is None


async def test_append_rule(client: httpx.AsyncClient, api_settings: Settings) -> None:
    s = await session(client, api_settings)
    steps = [("a", "append", "a"), ("b", "append", "a\nb"), ("\nc", "append", "a\nb\nc"), ("", "append", "a\nb\nc\n")]
    for content, mode, expected in steps:
        r = await put(client, s, "free", content, mode)
        assert r.status_code == 200, r.text
        assert r.json()["content"] == expected
    r = await put(client, s, "free", "")
    assert r.json()["content"] == ""
    assert r.json()["tokens"] == 0
    written = [e["event"] for e in await events(client, s) if e["event"]["type"] == "context.written"]
    assert [(e["mode"], e["writer"], e["content"]) for e in written] == [
        ("append", "api", "a"),
        ("append", "api", "a\nb"),
        ("append", "api", "a\nb\nc"),
        ("append", "api", "a\nb\nc\n"),
        ("replace", "api", ""),
    ]


@pytest.mark.parametrize(
    ("label", "status", "code", "detail"),
    [
        ("soul", 409, "readonly_block", 'Block "soul" is readonly'),
        ("nope", 404, "block_not_found", 'Block "nope" not found'),
        (
            "knowledge",
            409,
            "keyed_block",
            'Block "knowledge" is a keyed provider. Use set_context with metadata instead.',
        ),
        ("skills", 409, "keyed_block", 'Block "skills" is a keyed provider. Use set_context with metadata instead.'),
        ("past", 409, "readonly_block", 'Block "past" is readonly'),
    ],
)
async def test_application_write_problems_write_nothing(
    client: httpx.AsyncClient, api_settings: Settings, label: str, status: int, code: str, detail: str | None
) -> None:
    s = await session(client, api_settings)
    await put(client, s, "memory", "kept")
    before = await events(client, s)
    blocks = await context(client, s, before[-1]["seq"])
    for mode in ("replace", "append"):
        body = problem(await put(client, s, label, "x", mode), status, code)
        if detail is not None:
            assert body["detail"] == detail
    assert await events(client, s) == before
    assert await context(client, s) == blocks


BAD_BODIES: dict[str, Any] = {
    "content-missing": {"mode": "replace"},
    "content-a-number": {"content": 5},
    "content-null": {"content": None},
    "mode-unknown": {"content": "x", "mode": "prepend"},
    "extra-field": {"content": "x", "label": "memory"},
    "body-a-list": ["x"],
    "body-a-string": "x",
}


@pytest.mark.parametrize("body", BAD_BODIES.values(), ids=BAD_BODIES.keys())
async def test_bad_application_write_bodies(client: httpx.AsyncClient, api_settings: Settings, body: Any) -> None:
    s = await session(client, api_settings)
    before = await events(client, s)
    problem(await client.put(f"/v1/sessions/{s}/context/memory", json=body), 422, "invalid_request")
    assert await events(client, s) == before


async def test_writes_to_a_deleted_session_are_refused(client: httpx.AsyncClient, api_settings: Settings) -> None:
    s = sid()
    assert (await client.post("/v1/sessions", json={"id": s})).status_code == 201
    await configure(client, s, config(new_bucket(api_settings)))
    assert (await client.delete(f"/v1/sessions/{s}")).status_code == 200
    before = await events(client, s)
    problem(await put(client, s, "memory", "x"), 404, "session_not_found")
    tool_call = await client.post(f"/v1/sessions/{s}/tools/set_context", json={"label": "memory", "content": "x"})
    problem(tool_call, 404, "session_not_found")  # a write like any other, not an `Error:` result
    problem(await client.put(f"/v1/sessions/{s}/config", json={"blocks": []}), 404, "session_not_found")
    problem(await client.get(f"/v1/sessions/{s}/system-prompt"), 404, "session_not_found")
    problem(await client.post(f"/v1/sessions/{s}/system-prompt:refresh"), 404, "session_not_found")
    assert await events(client, s) == before


async def test_tenants_do_not_share_blocks(
    client: httpx.AsyncClient, client_b: httpx.AsyncClient, api_settings: Settings
) -> None:
    s = await session(client, api_settings)
    r = await put(client, s, "memory", "tenant a only")
    assert r.status_code == 200, r.text
    problem(await client_b.put(f"/v1/sessions/{s}/context/memory", json={"content": "b"}), 404, "block_not_found")
    problem(await client_b.get(f"/v1/sessions/{s}/context"), 404, "session_not_found")
    assert (await context(client, s, r.json()["seq"]))["memory"]["content"] == "tenant a only"
