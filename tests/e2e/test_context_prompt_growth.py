"""Changes other than a block write that would make the system prompt too large to store:
(a) a config PUT (a block added inline, a read-only source pointing at a large object, a
description, a skills block whose listing is rendered) and (c) a skill put with ``set_context``
whose line in the listing would tip the prompt over are refused as a block write is (``413
payload_too_large``, the tool's ``Error: …``), nothing written, the detail saying the room left;
one that shortens the prompt is always taken, even over the limit. (b) An object behind a
read-only source that grows in storage is what no write decides: every freeze and refresh is
then ``409 prompt_unstorable``, naming the prompt's largest block and by how much it is over; a
clear or a compaction still happens, the prompt in force staying.

Before these refusals each change was taken, and every freeze or refresh afterwards was a ``413
payload_too_large`` whose detail named no block ("N bytes, more than the M an event may have");
a compaction was recorded and answered with that 413 all the same."""

from __future__ import annotations

import re
from typing import Any

import httpx
import pytest
from minio.error import S3Error

from chronicle_sdk import ObjectSource, PayloadTooLarge, PromptUnstorable, Readonly, Session
from events.admission import MAX_WRITTEN_BYTES
from services.settings import Settings
from tests.e2e.context_support import (
    configure,
    context,
    events,
    minio,
    new_bucket,
    problem,
    prompt,
    put_object,
    refresh,
    sid,
    tenant_key,
    tool,
)
from tests.e2e.helpers import PROSE, msg
from tests.e2e.sdk_support import open_client
from tests.e2e.test_context_prompt_size import HALF, refusal, two_blocks

AB = [{"kind": "writable", "label": "a"}, {"kind": "writable", "label": "b"}]
CONFIG_REFUSED = re.compile(
    r"^The config would make the system prompt too large to store: (\d+) > (\d+) bytes\. "
    r"The prompt has room for about (\d+) more characters \(it is (\d+) bytes stored with the config in force\); "
    r'block "(\w+)" lengthens it most, by (\d+) characters: '
    r"leave blocks out, shorten them, or point read-only blocks at smaller objects$"
)
SKILL_REFUSED = re.compile(
    r'^Error: Skill "(\w+)" in block "(\w+)" would make the system prompt too large to store: (\d+) > (\d+) bytes\. '
    r"The block has room for about (\d+) characters \(it holds (\d+)\); "
    r"give the skill a shorter description, or shorten another block$"
)
UNSTORABLE = re.compile(
    r"^The system prompt is too large to store: (\d+) > (\d+) bytes \((\d+) over\)\. "
    r'Its largest block, "(\w+)", has room for about (\d+) characters \(it holds (\d+)\): '
    r"upload a smaller object, or PUT a config that shortens the block or leaves it out$"
)


def source(bucket: str, label: str = "big") -> dict[str, Any]:
    return {"kind": "readonly", "label": label, "source": {"bucket": bucket, "key": "big.md"}}


def skills(bucket: str) -> dict[str, Any]:
    return {"kind": "skills", "label": "skills", "bucket": bucket}


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


async def refused_config(client: httpx.AsyncClient, s: str, config: dict[str, Any]) -> tuple[int, int, int, str, int]:
    """PUT ``config``, refused with nothing written: (size, room, size before, block, by)."""
    before = await events(client, s)
    r = await client.put(f"/v1/sessions/{s}/config", json=config)
    body = problem(r, 413, "payload_too_large")
    assert body["title"] == "The write would make the system prompt too large to store"
    found = CONFIG_REFUSED.match(body["detail"])
    assert found is not None, body["detail"]
    size, limit, room, was, label, by = found.groups()
    assert int(limit) == MAX_WRITTEN_BYTES
    assert int(size) > MAX_WRITTEN_BYTES
    assert await events(client, s) == before
    return int(size), int(room), int(was), label, int(by)


def unstorable(body: dict[str, Any]) -> tuple[str, int, int]:
    """The block a ``409 prompt_unstorable`` names, the bytes over (stored) and the room it says the
    block has (characters)."""
    assert body["title"] == "The system prompt is too large to store; shorten or leave out a block"
    found = UNSTORABLE.match(body["detail"])
    assert found is not None, body["detail"]
    size, limit, over, label, room, holds = map(str, found.groups())
    assert (body["block"], body["size"], body["limit"]) == (label, int(size), MAX_WRITTEN_BYTES)
    assert int(limit) == MAX_WRITTEN_BYTES
    assert int(over) == int(size) - MAX_WRITTEN_BYTES > 0
    assert int(room) < int(holds)
    return label, int(over), int(room)


# -- (a) a config PUT -----------------------------------------------------------------------------


async def test_a_config_adding_an_inline_block_that_would_make_the_prompt_unstorable_is_refused(
    client: httpx.AsyncClient,
) -> None:
    s = await two_blocks(client)
    await tool(client, s, "set_context", {"label": "a", "content": HALF})
    inline = {"kind": "readonly", "label": "big", "content": HALF}
    size, room, was, label, by = await refused_config(client, s, {"blocks": [*AB, inline]})
    assert label == "big"
    assert 0 < room <= MAX_WRITTEN_BYTES - was  # characters: each costs a stored byte or more (sealed: more)
    assert by > len(HALF)  # its header too
    assert size > was + len(HALF)
    r = await client.get(f"/v1/sessions/{s}/config")
    assert r.json()["config"]["blocks"] == AB
    assert HALF in (await prompt(client, s))["prompt"]  # the session's prompt is frozen as before

    shorter = {**inline, "content": HALF[: room - 200]}  # the room it named, less the block's header, is taken
    await configure(client, s, {"blocks": [*AB, shorter]})
    assert shorter["content"] in (await refresh(client, s))["prompt"]


async def test_a_config_adding_a_large_source_is_refused(client: httpx.AsyncClient, api_settings: Settings) -> None:
    bucket = new_bucket(api_settings)
    put_object(api_settings, bucket, "big.md", "x" * 600_000)
    s = await two_blocks(client)
    await tool(client, s, "set_context", {"label": "a", "content": HALF})
    assert (await refused_config(client, s, {"blocks": [*AB, source(bucket)]}))[3] == "big"
    await refresh(client, s)


async def test_a_config_adding_a_description_to_a_full_prompt_is_refused(client: httpx.AsyncClient) -> None:
    s = await full(client)
    description = "d" * 2000
    _, room, _, label, by = await refused_config(client, s, {"blocks": [{**AB[0], "description": description}, AB[1]]})
    assert (label, by) == ("a", len(f" ({description})"))
    assert 0 < room < 2000
    await configure(client, s, {"blocks": [{**AB[0], "description": "d" * (room // 4)}, AB[1]]})
    await refresh(client, s)


async def test_a_config_adding_a_skills_block_whose_listing_tips_the_prompt_over_is_refused(
    client: httpx.AsyncClient, api_settings: Settings
) -> None:
    bucket = new_bucket(api_settings)
    other = await two_blocks(client, [skills(bucket)])  # the tenant's index has a skill with a long description
    meta = {"title": "tax", "description": "d" * 1500}
    res, _ = await tool(client, other, "set_context", {"label": "skills", "content": "doc", "metadata": meta})
    assert res == 'Indexed "tax" in skills.', res
    s = await full(client)
    _, _, _, label, by = await refused_config(client, s, {"blocks": [*AB, skills(bucket)]})
    assert label == "skills"
    assert by > 1500
    assert "SKILLS" not in (await refresh(client, s))["prompt"]


async def test_over_the_limit_already_a_config_may_shorten_the_prompt_but_not_lengthen_it(
    client: httpx.AsyncClient, api_settings: Settings
) -> None:
    """An object in storage grown past the limit: a config that lengthens the prompt is refused
    with no room left; one that shortens it is taken (the way out) even while the prompt is still
    over the limit, and one without the block makes it storable again."""
    bucket = new_bucket(api_settings)
    put_object(api_settings, bucket, "big.md", "x" * 1000)
    s = await two_blocks(client, [source(bucket)])
    res, _ = await tool(client, s, "set_context", {"label": "a", "content": "notes " * 1000})
    assert res.startswith("Written to a."), res
    put_object(api_settings, bucket, "big.md", "x" * (MAX_WRITTEN_BYTES + 1))

    _, room, was, label, by = await refused_config(
        client, s, {"blocks": [{**AB[0], "description": "more"}, AB[1], source(bucket)]}
    )
    assert (room, label, by) == (0, "a", len(" (more)"))
    assert was > MAX_WRITTEN_BYTES
    await configure(client, s, {"blocks": [AB[1], source(bucket)]})  # still over the limit, but shorter
    unstorable(problem(await client.post(f"/v1/sessions/{s}/system-prompt:refresh"), 409, "prompt_unstorable"))
    await configure(client, s, {"blocks": AB})
    assert (await refresh(client, s))["prompt"].endswith("B [writable]\n" + "\u2550" * 46 + "\n")


# -- (c) a skill put ------------------------------------------------------------------------------


async def test_c_a_skill_put_that_would_make_the_prompt_unstorable_is_refused_and_stores_nothing(
    client: httpx.AsyncClient, api_settings: Settings
) -> None:
    bucket = new_bucket(api_settings)
    s = await full(client, [skills(bucket)])
    meta = {"title": "tax", "description": "d" * 1500}
    res, _ = await tool(client, s, "set_context", {"label": "skills", "content": "doc", "metadata": meta})
    found = SKILL_REFUSED.match(res)
    assert found is not None, res
    key, label, size, limit, room, holds = found.groups()
    assert (key, label, int(limit), int(holds)) == ("tax", "skills", MAX_WRITTEN_BYTES, 0)
    assert int(size) > MAX_WRITTEN_BYTES
    assert 0 < int(room) < len("- tax: " + meta["description"])
    with pytest.raises(S3Error):  # nothing stored
        minio(api_settings).stat_object(bucket, tenant_key("tax"))
    assert (await context(client, s))["skills"]["content"] == ""

    res, _ = await tool(client, s, "set_context", {"label": "skills", "content": "doc", "metadata": {"title": "tax"}})
    assert res == 'Indexed "tax" in skills.', res  # a line that fits is taken
    assert (await refresh(client, s))["prompt"].endswith("SKILLS [loadable]\n" + "\u2550" * 46 + "\n- tax: tax")


async def test_c_over_the_limit_already_a_skill_put_may_shorten_the_listing_but_not_lengthen_it(
    client: httpx.AsyncClient, api_settings: Settings
) -> None:
    bucket = new_bucket(api_settings)
    put_object(api_settings, bucket, "big.md", "x" * 1000)
    s = await two_blocks(client, [skills(bucket), source(bucket)])
    meta = {"title": "tax", "description": "Tax workflows, " * 10}
    res, _ = await tool(client, s, "set_context", {"label": "skills", "content": "doc", "metadata": meta})
    assert res == 'Indexed "tax" in skills.', res
    put_object(api_settings, bucket, "big.md", "x" * (MAX_WRITTEN_BYTES + 1))

    res, _ = await tool(client, s, "set_context", {"label": "skills", "content": "doc", "metadata": {"title": "bank"}})
    found = SKILL_REFUSED.match(res)
    assert found is not None, res
    assert (found.group(1), found.group(5)) == ("bank", "0")
    short = {"title": "tax", "description": "Tax"}
    res, _ = await tool(client, s, "set_context", {"label": "skills", "content": "doc", "metadata": short})
    assert res == 'Indexed "tax" in skills.', res
    assert (await context(client, s))["skills"]["content"] == "- tax: Tax"


# -- (b) an object that grows in storage ----------------------------------------------------------


async def test_b_an_object_grown_past_the_limit_makes_freezing_and_refreshing_name_the_block(
    client: httpx.AsyncClient, api_settings: Settings
) -> None:
    bucket = new_bucket(api_settings)
    put_object(api_settings, bucket, "big.md", "x" * 1000)
    s = sid("grow")
    compaction = {"protect_head": 1, "tail_token_budget": 10, "min_tail_messages": 2}
    await configure(client, s, {"blocks": [*AB, source(bucket)], "compaction": compaction})
    r = await client.post(
        f"/v1/sessions/{s}/messages:batch", json={"messages": [msg(f"m{i}", f"m{i}{PROSE}") for i in range(8)]}
    )
    assert r.status_code == 201, r.text
    frozen = await prompt(client, s)
    put_object(api_settings, bucket, "big.md", "x" * (MAX_WRITTEN_BYTES + 1))

    label, _, room = unstorable(
        problem(await client.post(f"/v1/sessions/{s}/system-prompt:refresh"), 409, "prompt_unstorable")
    )
    assert label == "big"
    res, _ = await tool(client, s, "set_context", {"label": "a", "content": "note"})
    assert refusal(res)[3] == 0  # the agent's tool says there is no room

    r = await client.post(f"/v1/sessions/{s}/compact", json={})  # a compaction is recorded and answered
    assert r.status_code == 200, r.text
    assert r.json()["compacted"] is True, r.json()
    r = await client.post(f"/v1/sessions/{s}/messages:clear")  # and so is a clear
    assert r.status_code == 200, r.text
    assert await prompt(client, s) == frozen  # the prompt in force stays
    rendered = [e for e in await events(client, s) if e["event"]["type"] == "prompt.rendered"]
    assert len(rendered) == 1

    put_object(api_settings, bucket, "big.md", "x" * room)  # the room it named is room the block has
    assert (await refresh(client, s))["version"] == 2


async def test_b_a_session_whose_object_grew_before_its_first_freeze_freezes_none(
    client: httpx.AsyncClient, api_settings: Settings
) -> None:
    bucket = new_bucket(api_settings)
    put_object(api_settings, bucket, "big.md", "x" * 1000)
    s = sid("grow")
    await configure(client, s, {"blocks": [source(bucket)]})
    put_object(api_settings, bucket, "big.md", "x" * (MAX_WRITTEN_BYTES + 1))
    r = await client.get(f"/v1/sessions/{s}/system-prompt")
    assert unstorable(problem(r, 409, "prompt_unstorable"))[0] == "big"
    assert not [e for e in await events(client, s) if e["event"]["type"] == "prompt.rendered"]


async def test_b_the_sdk_raises_prompt_unstorable_and_payload_too_large(api_url: str, api_settings: Settings) -> None:
    bucket = new_bucket(api_settings)
    put_object(api_settings, bucket, "big.md", "x" * 600_000)
    async with open_client(api_url, api_settings) as c:
        refused = Session.create(c, sid("grow")).with_context("a", provider=Readonly(HALF))
        refused.with_context("big", provider=ObjectSource(bucket, "big.md"))
        with pytest.raises(PayloadTooLarge) as too_large:  # the builder's config is sent first
            await refused.get_system_prompt()
        assert CONFIG_REFUSED.match(too_large.value.detail), too_large.value.detail

        s = Session.create(c, sid("grow")).with_context("big", provider=ObjectSource(bucket, "big.md"))
        assert "x" * 600_000 in await s.freeze_system_prompt()
        put_object(api_settings, bucket, "big.md", "x" * (MAX_WRITTEN_BYTES + 1))
        with pytest.raises(PromptUnstorable) as raised:
            await s.refresh_system_prompt()
        assert (raised.value.status, raised.value.block, raised.value.limit) == (409, "big", MAX_WRITTEN_BYTES)
        assert raised.value.size is not None
        assert raised.value.size > MAX_WRITTEN_BYTES
        assert UNSTORABLE.match(raised.value.detail), raised.value.detail
