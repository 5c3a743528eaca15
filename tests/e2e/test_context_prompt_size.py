"""A block write that would make the session's system prompt too large to store (more than one
event may be, sealed when the stack seals) is refused where it is decided, and nothing is
written: the tool answers an ``Error: …`` that says the room left, the application write a
``413 payload_too_large``; the prompt can still be frozen and refreshed afterwards."""

from __future__ import annotations

import re
from typing import Any

import httpx

from events.admission import MAX_WRITTEN_BYTES
from services.settings import Settings
from tests.conftest import SEALING
from tests.e2e.context_support import configure, events, new_bucket, problem, prompt, put_object, refresh, sid, tool

HALF = "word " * 110_000  # 550,000 characters: two of them make a prompt over the limit
REFUSED = re.compile(
    r'^Error: Block "(\w+)" would make the system prompt too large to store: (\d+) > (\d+) bytes\. '
    r"The block has room for about (\d+) characters \(it holds (\d+)\); write a shorter text, or shorten another block$"
)


async def two_blocks(client: httpx.AsyncClient, extra: list[dict[str, Any]] | None = None) -> str:
    s = sid("size")
    blocks = [{"kind": "writable", "label": "a"}, {"kind": "writable", "label": "b"}, *(extra or [])]
    await configure(client, s, {"blocks": blocks})
    return s


def refusal(result: str) -> tuple[str, int, int, int, int]:
    found = REFUSED.match(result)
    assert found is not None, result[:400]
    label, size, limit, room, holds = found.groups()
    return label, int(size), int(limit), int(room), int(holds)


async def test_a_tool_write_that_would_make_the_prompt_unstorable_is_refused_and_writes_nothing(
    client: httpx.AsyncClient,
) -> None:
    s = await two_blocks(client)
    res, _ = await tool(client, s, "set_context", {"label": "a", "content": HALF})
    assert res.startswith("Written to a."), res
    before = await events(client, s)

    res, _ = await tool(client, s, "set_context", {"label": "b", "content": HALF})
    label, size, limit, room, holds = refusal(res)
    assert (label, limit, holds) == ("b", MAX_WRITTEN_BYTES, 0)
    assert size > MAX_WRITTEN_BYTES
    assert 0 < room < len(HALF)
    res, _ = await tool(client, s, "set_context", {"label": "b", "content": "word", "action": "append"})
    assert res.startswith("Written to b."), res  # a short write still fits
    res, _ = await tool(client, s, "set_context", {"label": "b", "content": HALF, "action": "append"})
    assert refusal(res)[4] == len("word")
    assert len(await events(client, s)) == len(before) + 1  # only the short write

    frozen = await prompt(client, s)  # the session still runs: its prompt is frozen, and refreshed
    assert HALF in frozen["prompt"]
    assert (await refresh(client, s))["version"] == frozen["version"]


async def test_the_room_a_refusal_names_is_room_the_block_has(client: httpx.AsyncClient) -> None:
    s = await two_blocks(client)
    await tool(client, s, "set_context", {"label": "a", "content": HALF})
    res, _ = await tool(client, s, "set_context", {"label": "b", "content": HALF})
    room = refusal(res)[3]
    fits = ("word " * room)[:room]
    res, _ = await tool(client, s, "set_context", {"label": "b", "content": fits})
    assert res.startswith("Written to b."), res
    assert fits in (await refresh(client, s))["prompt"]  # and the prompt after it is stored


async def test_an_application_write_that_would_make_the_prompt_unstorable_is_a_413(
    client: httpx.AsyncClient,
) -> None:
    s = await two_blocks(client)
    r = await client.put(f"/v1/sessions/{s}/context/a", json={"content": HALF, "mode": "replace"})
    assert r.status_code == 200, r.text
    before = await events(client, s)
    for mode in ("replace", "append"):
        r = await client.put(f"/v1/sessions/{s}/context/b", json={"content": HALF, "mode": mode})
        body = problem(r, 413, "payload_too_large")
        assert body["title"] == "The write would make the system prompt too large to store"
        assert refusal("Error: " + body["detail"])[0] == "b"
    assert await events(client, s) == before
    await refresh(client, s)


async def test_over_the_limit_already_a_write_may_shorten_a_block_but_not_lengthen_one(
    client: httpx.AsyncClient, api_settings: Settings
) -> None:
    """A read-only source in object storage too large for the prompt: every write that lengthens
    a block is refused with no room left; a write that shortens one (the way out) is not."""
    bucket = new_bucket(api_settings)
    put_object(api_settings, bucket, "big.md", "x" * (MAX_WRITTEN_BYTES // 2))
    s = await two_blocks(client)
    res, _ = await tool(client, s, "set_context", {"label": "a", "content": "notes " * 1000})
    assert res.startswith("Written to a."), res
    await configure(
        client,
        s,
        {
            "blocks": [
                {"kind": "writable", "label": "a"},
                {"kind": "writable", "label": "b"},
                {"kind": "readonly", "label": "big", "source": {"bucket": bucket, "key": "big.md"}},
            ]
        },
    )
    put_object(api_settings, bucket, "big.md", "x" * (MAX_WRITTEN_BYTES + 1))  # grew in storage
    res, _ = await tool(client, s, "set_context", {"label": "b", "content": "more"})
    assert refusal(res)[3] == 0
    res, _ = await tool(client, s, "set_context", {"label": "a", "content": "notes"})
    assert res.startswith("Written to a."), res


async def test_the_limit_counts_the_prompt_as_it_is_stored(client: httpx.AsyncClient) -> None:
    """Sealed, the prompt's text is stored base64 of its ciphertext, a third larger: two blocks
    of 420,000 characters fit in a plain prompt and not in a sealed one."""
    s = await two_blocks(client)
    part = "word " * 84_000
    await tool(client, s, "set_context", {"label": "a", "content": part})
    res, _ = await tool(client, s, "set_context", {"label": "b", "content": part})
    if SEALING:
        assert refusal(res)[1] > MAX_WRITTEN_BYTES
    else:
        assert res.startswith("Written to b."), res
        assert len((await refresh(client, s))["prompt"]) > 2 * len(part)
