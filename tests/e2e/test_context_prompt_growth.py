"""What a change other than a block write does to a system prompt that could not be stored:
(a) a config PUT (blocks added, a description, a read-only source pointing at a large object, a
skills block whose listing is rendered), (b) an object behind a read-only source that grows in
storage, (c) a skill put with ``set_context`` whose line in the listing tips the prompt over.

As of this commit each is taken, and every freeze or refresh afterwards is a ``413
payload_too_large`` whose detail names no block ("N bytes, more than the M an event may have");
a compaction is recorded and answered with that 413 all the same."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from chronicle_sdk import ObjectSource, PayloadTooLarge, Session
from events.admission import MAX_WRITTEN_BYTES
from services.settings import Settings
from tests.e2e.context_support import configure, events, new_bucket, problem, prompt, put_object, sid, tool
from tests.e2e.helpers import PROSE, msg
from tests.e2e.sdk_support import open_client
from tests.e2e.test_context_prompt_size import HALF, refusal, two_blocks

OPAQUE = f"more than the {MAX_WRITTEN_BYTES} an event may have"
AB = [{"kind": "writable", "label": "a"}, {"kind": "writable", "label": "b"}]


async def full(client: httpx.AsyncClient, extra: list[dict[str, Any]] | None = None, spare: int = 20) -> str:
    """A session whose blocks ``a`` and ``b`` leave its prompt about ``spare`` characters of room."""
    s = await two_blocks(client, extra)
    res, _ = await tool(client, s, "set_context", {"label": "a", "content": HALF})
    assert res.startswith("Written to a."), res
    res, _ = await tool(client, s, "set_context", {"label": "b", "content": HALF})
    room = refusal(res)[3]
    res, _ = await tool(client, s, "set_context", {"label": "b", "content": "y" * (room - spare)})
    assert res.startswith("Written to b."), res
    return s


async def unstorable_today(client: httpx.AsyncClient, s: str) -> None:
    """Freezing and refreshing the prompt are a 413 that names no block."""
    for r in (
        await client.get(f"/v1/sessions/{s}/system-prompt"),
        await client.post(f"/v1/sessions/{s}/system-prompt:refresh"),
    ):
        body = problem(r, 413, "payload_too_large")
        assert body["title"] == "The request would make an event the log refuses"
        assert body["detail"].endswith(OPAQUE), body


async def test_a_config_adding_an_inline_block_is_taken_and_the_prompt_cannot_be_frozen(
    client: httpx.AsyncClient,
) -> None:
    s = await two_blocks(client)
    await tool(client, s, "set_context", {"label": "a", "content": HALF})
    r = await client.put(
        f"/v1/sessions/{s}/config", json={"blocks": [*AB, {"kind": "readonly", "label": "big", "content": HALF}]}
    )
    assert r.status_code == 200, r.text
    await unstorable_today(client, s)


async def test_a_config_adding_a_large_source_is_taken(client: httpx.AsyncClient, api_settings: Settings) -> None:
    bucket = new_bucket(api_settings)
    put_object(api_settings, bucket, "big.md", "x" * 600_000)
    s = await two_blocks(client)
    await tool(client, s, "set_context", {"label": "a", "content": HALF})
    source = {"kind": "readonly", "label": "big", "source": {"bucket": bucket, "key": "big.md"}}
    await configure(client, s, {"blocks": [*AB, source]})
    await unstorable_today(client, s)


async def test_a_config_adding_a_description_is_taken(client: httpx.AsyncClient) -> None:
    s = await full(client)
    await configure(client, s, {"blocks": [{**AB[0], "description": "d" * 2000}, AB[1]]})
    await unstorable_today(client, s)


async def test_a_config_adding_a_skills_block_is_taken(client: httpx.AsyncClient, api_settings: Settings) -> None:
    bucket = new_bucket(api_settings)
    other = await two_blocks(client, [{"kind": "skills", "label": "skills", "bucket": bucket}])
    meta = {"title": "tax", "description": "d" * 1500}
    res, _ = await tool(client, other, "set_context", {"label": "skills", "content": "doc", "metadata": meta})
    assert res == 'Indexed "tax" in skills.', res
    s = await full(client)
    await configure(client, s, {"blocks": [*AB, {"kind": "skills", "label": "skills", "bucket": bucket}]})
    await unstorable_today(client, s)


async def test_c_a_skill_put_whose_line_tips_the_prompt_over_is_taken(
    client: httpx.AsyncClient, api_settings: Settings
) -> None:
    bucket = new_bucket(api_settings)
    s = await full(client, [{"kind": "skills", "label": "skills", "bucket": bucket}])
    frozen = await prompt(client, s)
    meta = {"title": "tax", "description": "d" * 1500}
    res, _ = await tool(client, s, "set_context", {"label": "skills", "content": "doc", "metadata": meta})
    assert res == 'Indexed "tax" in skills.', res
    r = await client.post(f"/v1/sessions/{s}/system-prompt:refresh")
    assert problem(r, 413, "payload_too_large")["detail"].endswith(OPAQUE)
    assert await prompt(client, s) == frozen  # the frozen one stays in force


async def test_b_an_object_that_grows_makes_freezing_refreshing_and_compacting_a_413(
    client: httpx.AsyncClient, api_settings: Settings
) -> None:
    bucket = new_bucket(api_settings)
    put_object(api_settings, bucket, "big.md", "x" * 1000)
    s = sid("grow")
    big = {"kind": "readonly", "label": "big", "source": {"bucket": bucket, "key": "big.md"}}
    compaction = {"protect_head": 1, "tail_token_budget": 10, "min_tail_messages": 2}
    await configure(client, s, {"blocks": [*AB, big], "compaction": compaction})
    r = await client.post(
        f"/v1/sessions/{s}/messages:batch", json={"messages": [msg(f"m{i}", f"m{i}{PROSE}") for i in range(8)]}
    )
    assert r.status_code == 201, r.text
    frozen = await prompt(client, s)
    put_object(api_settings, bucket, "big.md", "x" * (MAX_WRITTEN_BYTES + 1))

    r = await client.post(f"/v1/sessions/{s}/system-prompt:refresh")
    assert problem(r, 413, "payload_too_large")["detail"].endswith(OPAQUE)
    res, _ = await tool(client, s, "set_context", {"label": "a", "content": "note"})
    assert refusal(res)[3] == 0  # the tool already says there is no room
    r = await client.post(f"/v1/sessions/{s}/compact", json={})
    problem(r, 413, "payload_too_large")  # although the compaction is recorded
    assert (await events(client, s))[-1]["event"]["type"] == "compaction.recorded"
    assert await prompt(client, s) == frozen

    fresh = sid("grow")  # a session that has not frozen its prompt yet cannot freeze one
    await configure(client, fresh, {"blocks": [big]})
    await unstorable_today(client, fresh)


async def test_b_the_sdk_sees_payload_too_large(api_url: str, api_settings: Settings) -> None:
    bucket = new_bucket(api_settings)
    put_object(api_settings, bucket, "big.md", "x" * (MAX_WRITTEN_BYTES + 1))
    async with open_client(api_url, api_settings) as c:
        s = Session.create(c, sid("grow")).with_context("big", provider=ObjectSource(bucket, "big.md"))
        with pytest.raises(PayloadTooLarge) as raised:
            await s.get_system_prompt()
        assert raised.value.detail.endswith(OPAQUE), raised.value.detail
