"""The reference's §6.3 behaviours through the SDK: builder, tools, frozen prompt, context proxies, compaction."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator

import pytest

from bench.support import settings_env
from chronicle_sdk import (
    BlockNotFound,
    BudgetExceeded,
    ChronicleClient,
    Conflict,
    InvalidConfig,
    KeyedBlock,
    ObjectSource,
    Readonly,
    ReadOnlyBlock,
    Searchable,
    Session,
    Skills,
    Writable,
)
from events.catalog import CompactionFailed
from events.publisher import Publisher
from services.settings import Settings
from tests.conftest import operator_nats
from tests.e2e.context_support import SEP, new_bucket, put_object
from tests.e2e.sdk_support import ids, open_client, sid, text, word


@pytest.fixture
async def sdk(api_url: str, api_settings: Settings) -> AsyncIterator[ChronicleClient]:
    async with open_client(api_url, api_settings) as c:
        yield c


def memory_session(sdk: ChronicleClient, session_id: str | None = None) -> Session:
    return (
        Session.create(sdk, session_id or sid())
        .with_context("soul", provider=Readonly("You are a helpful assistant."))
        .with_context("memory", description="Learned facts", max_tokens=100)
        .with_cached_prompt()
    )


async def configured_events(s: Session) -> int:
    return sum(1 for e in await s.get_events() if e["event"]["type"] == "session.configured")


# -- builder ------------------------------------------------------------------------------------


async def test_create_is_usable_without_build_and_sends_the_config_once(sdk: ChronicleClient) -> None:
    s = memory_session(sdk)
    await s.append_message(text("m1", "hi"))
    assert ids(await s.get_history()) == ["m1"]
    await s.get_context_blocks()
    await s.freeze_system_prompt()
    assert await configured_events(s) == 1
    config = (await sdk.request("GET", f"/v1/sessions/{s.id}/config", session=s.id))["config"]
    assert config["blocks"] == [
        {"label": "soul", "kind": "readonly", "content": "You are a helpful assistant."},
        {"label": "memory", "kind": "writable", "description": "Learned facts", "max_tokens": 100},
    ]
    # another instance with the same config sends nothing; a different one replaces it
    await memory_session(sdk, s.id).get_history()
    assert await configured_events(s) == 1
    await memory_session(sdk, s.id).with_context("notes", provider=Writable()).get_history()
    assert await configured_events(s) == 2
    # builder calls after the first data call are sent with the next one (the reference ignored them)
    s.compact_after(5000)
    await s.get_history()
    assert await configured_events(s) == 3


async def test_a_session_that_does_not_exist_yet_reads_as_empty_and_records_nothing(sdk: ChronicleClient) -> None:
    """The reference's sessions exist implicitly: the SDK reads an unknown one as empty (the server
    answers 404 and freezes no prompt for it)."""
    s = Session.create(sdk, sid())
    assert await s.freeze_system_prompt() == ""
    assert len(await s.tools()) == 0
    assert await s.get_context_blocks() == []
    assert await s.get_events() == []
    assert await s.compact() is None  # the server answers 404 session_not_found
    assert s.last_compact_reason == "no messages"


async def test_a_session_without_builder_calls_keeps_the_servers_config(sdk: ChronicleClient) -> None:
    s = memory_session(sdk)
    await s.get_history()
    plain = Session.create(sdk, s.id)
    assert [b.label for b in await plain.get_context_blocks()] == ["soul", "memory"]
    assert await configured_events(s) == 1


async def test_invalid_config_is_refused_client_side(sdk: ChronicleClient) -> None:
    s = Session.create(sdk, sid()).with_context("bad label!", provider=Writable())
    with pytest.raises(InvalidConfig, match=r"label: must be 1 to 64 characters, each an ASCII letter, a digit"):
        await s.get_history()


# -- tools --------------------------------------------------------------------------------------


async def test_tools_execute_writes_and_appends(sdk: ChronicleClient) -> None:
    s = memory_session(sdk)
    tools = await s.tools()
    assert tools.names == ["set_context"]
    assert "session_search" not in tools
    result = await tools.execute("set_context", {"label": "memory", "content": "fact1"})
    assert "Written to memory" in result
    assert "tokens" in result
    await tools.execute("set_context", '{"label": "memory", "content": "\\nfact2", "action": "append"}')
    block = await s.get_context_block("memory")
    assert block is not None
    assert block.content == "fact1\nfact2"
    assert block.writable
    bad = await tools.execute("set_context", "{not json")
    assert bad.startswith("Error: ")
    forced = await tools.execute("set_context", {"label": "soul", "content": "evil"})
    assert "Error" in forced
    assert "readonly" in forced
    over = await tools.execute("set_context", {"label": "memory", "content": "word " * 300})
    assert over.startswith('Error: Block "memory" exceeds maxTokens: ')
    missing = await tools.execute("load_context", {"label": "skills", "key": "x"})
    assert missing.startswith("Error: ")


async def test_tools_execute_answers_arguments_the_server_refuses_with_error_results(sdk: ChronicleClient) -> None:
    """The trial's arguments, as an LLM may produce them: each is an ``Error: …`` result, never an
    exception, and nothing is written."""
    s = memory_session(sdk).with_context("knowledge", description="Docs", provider=Searchable())
    tools = await s.tools()
    assert (await tools.execute("set_context", {"label": "memory", "content": "kept"})).startswith("Written to memory")
    bad_chars = "Error: tool arguments must not contain NUL characters or lone surrogates"
    deep = '{"label": "memory", "content": "x", "deep": ' + "[" * 64 + "]" * 64 + "}"
    for name, arguments, expected in [
        ("set_context", '{"label":"memory","content":"\\ud800"}', bad_chars),
        ("set_context", '{"label":"memory","content":"a\\u0000b"}', bad_chars),
        ("search_context", {"label": "knowledge", "query": "\u0000"}, bad_chars),
        ("set_context", deep, "Error: tool arguments are nested deeper than 64 levels"),
    ]:
        assert await tools.execute(name, arguments) == expected
    # one the server refuses (its 422 for a tool call id over 256 characters): an Error result too
    refused = await tools.execute("set_context", {"label": "memory", "content": "x"}, tool_call_id="c" * 257)
    assert refused.startswith("Error: "), refused
    assert "tool_call_id" in refused
    block = await s.get_context_block("memory")
    assert block is not None
    assert block.content == "kept"


async def test_a_tool_run_on_a_session_never_written_is_not_available_over_http_and_nats(
    sdk: ChronicleClient, api_url: str, api_settings: Settings
) -> None:
    """The server answers a tool call on a session never written ``404 session_not_found``; the
    SDK reads such a session as empty (no tools), so the call is the reference's ``Error: tool …
    is not available`` result, never an exception, and writes nothing."""
    async with open_client(api_url, api_settings, via="nats") as over_nats:
        for client in (sdk, over_nats):
            s = Session.create(client, sid())
            res = await s.execute_tool("set_context", {"label": "memory", "content": "x"})
            assert res == 'Error: tool "set_context" is not available in this session'
            assert await s.get_events() == []


async def test_tool_calls_with_their_ids_answer_the_same_over_nats_as_over_http(
    sdk: ChronicleClient, api_url: str, api_settings: Settings
) -> None:
    """Over NATS the tool call id went into the command's path, which names the tool: every call
    with an id answered 'tool "set_context?tool_call_id=…" is not available in this session'."""
    async with open_client(api_url, api_settings, via="nats") as over_nats:
        answers: dict[str, list[str]] = {}
        for via, client in (("http", sdk), ("nats", over_nats)):
            s = memory_session(client)
            tools = await s.tools()
            answers[via] = [
                await tools.execute("set_context", {"label": "memory", "content": "a fact"}, tool_call_id="c1"),
                await tools.execute("set_context", {"label": "memory", "content": "x"}, tool_call_id="c" * 257),
            ]
            block = await s.get_context_block("memory")
            assert block is not None
            assert block.content == "a fact"
            path = f"/v1/sessions/{s.id}/tools/set_context?tool_call_id=c2"  # a query in the path, over NATS too
            raw = await client.request("POST", path, body={"label": "memory", "content": "y"})
            assert str(raw["result"]).startswith("Written to memory"), raw
        assert answers["nats"][0] == answers["http"][0]
        assert answers["nats"][0].startswith("Written to memory")
        for refused in (answers["http"][1], answers["nats"][1]):  # the field is the query's or the command's
            assert refused.startswith("Error: ")
            assert refused.endswith("tool_call_id: String should have at most 256 characters")


async def test_definitions_for_openai_and_anthropic(sdk: ChronicleClient) -> None:
    tools = await memory_session(sdk).tools()
    [openai] = tools.openai()
    [anthropic] = tools.anthropic()
    assert openai["type"] == "function"
    assert openai["function"]["name"] == anthropic["name"] == "set_context"
    assert openai["function"]["description"] == anthropic["description"]
    assert openai["function"]["parameters"] == anthropic["input_schema"]
    assert anthropic["input_schema"]["required"] == ["label", "content"]
    assert anthropic["input_schema"]["properties"]["label"]["enum"] == ["memory"]


async def test_only_readonly_blocks_give_no_tools_but_render(sdk: ChronicleClient) -> None:
    s = Session.create(sdk, sid()).with_context("soul", provider=Readonly("Be kind."))
    tools = await s.tools()
    assert not tools
    assert len(tools) == 0
    assert tools.openai() == []
    assert tools.anthropic() == []
    prompt = await s.freeze_system_prompt()
    assert prompt == f"{SEP}\nSOUL [readonly]\n{SEP}\nBe kind."


async def test_kind_labels_and_keyed_blocks(sdk: ChronicleClient, api_settings: Settings) -> None:
    bucket = new_bucket(api_settings)
    s = (
        Session.create(sdk, sid())
        .with_context("memory", description="Learned facts")
        .with_context("skills", description="Loadable docs", provider=Skills(bucket, prefix="skills/"))
        .with_context("knowledge", description="Searchable docs", provider=Searchable())
    )
    tools = await s.tools()
    assert tools.names == ["set_context", "load_context", "unload_context", "search_context"]
    definition = tools.get("set_context")
    assert definition is not None
    desc = definition.description
    assert '- "memory" (writable): Learned facts' in desc
    assert '- "skills" (skill collection, keyed entries): Loadable docs' in desc
    assert '- "knowledge" (searchable, keyed entries): Searchable docs' in desc
    assert "metadata: { title, description }" in desc
    prompt = await s.freeze_system_prompt()
    assert "═" in prompt
    assert "<context_block" not in prompt
    assert "SKILLS (Loadable docs) [loadable]" in prompt
    # keyed writes: index, search, replace by title
    w = word()
    indexed = await tools.execute(
        "set_context", {"label": "knowledge", "content": f"Deploys {w} on Friday", "metadata": {"title": "deploy"}}
    )
    assert indexed == 'Indexed "deploy" in knowledge.'
    assert await tools.execute("search_context", {"label": "knowledge", "query": w}) == (
        f"[deploy]\nDeploys {w} on Friday"
    )
    replaced = {"label": "knowledge", "content": "Now Thursday", "metadata": {"title": "deploy"}}
    await tools.execute("set_context", replaced)
    assert await tools.execute("search_context", {"label": "knowledge", "query": w}) == "No results found."
    with pytest.raises(KeyedBlock):
        await s.replace_context_block("knowledge", "x")
    # skills: write, load, unload
    put = await tools.execute(
        "set_context",
        {"label": "skills", "content": "Arr matey", "metadata": {"title": "Pirate", "description": "Talk like one"}},
    )
    assert put == 'Indexed "pirate" in skills.'
    assert await tools.execute("load_context", {"label": "skills", "key": "pirate"}) == "Arr matey"
    unload = (await s.tools()).get("unload_context")
    assert unload is not None
    assert "Currently loaded: skills:pirate." in unload.description
    assert await tools.execute("unload_context", {"label": "skills", "key": "pirate"}) == (
        'Unloaded "pirate" from skills. Context reclaimed.'
    )


async def test_skills_allowlist_and_object_source(sdk: ChronicleClient, api_settings: Settings) -> None:
    bucket = new_bucket(api_settings)
    put_object(api_settings, bucket, "docs/api-ref", "API docs", "API Reference documentation")
    put_object(api_settings, bucket, "docs/secret", "nope")
    put_object(api_settings, bucket, "soul.txt", "I am read from S3.")
    s = (
        Session.create(sdk, sid())
        .with_context("soul", provider=ObjectSource(bucket, "soul.txt"))
        .with_context("skills", provider=Skills(bucket, prefix="docs/", keys=["api-ref"]))
    )
    blocks = {b.label: b for b in await s.get_context_blocks()}
    assert blocks["soul"].content == "I am read from S3."
    assert not blocks["soul"].writable
    assert blocks["skills"].is_skill
    tools = await s.tools()
    assert await tools.execute("load_context", {"label": "skills", "key": "secret"}) == "Not found: secret"


async def test_skills_not_writable_are_loadable_and_not_written_by_the_tools(
    sdk: ChronicleClient, api_settings: Settings
) -> None:
    """``Skills(…, writable=False)``: the block reads as not writable, the tools hold no
    ``set_context`` (the reference's skill provider without ``set``) and a forced one writes
    nothing; loading still works."""
    bucket = new_bucket(api_settings)
    put_object(api_settings, bucket, "docs/api-ref", "API docs", "API Reference documentation")
    s = Session.create(sdk, sid()).with_context("skills", provider=Skills(bucket, prefix="docs/", writable=False))
    blocks = {b.label: b for b in await s.get_context_blocks()}
    assert blocks["skills"].is_skill
    assert not blocks["skills"].writable
    tools = await s.tools()
    assert [d.name for d in tools.definitions] == ["load_context", "unload_context"]
    forced = await s.execute_tool("set_context", {"label": "skills", "content": "x", "metadata": {"title": "api ref"}})
    assert forced == 'Error: tool "set_context" is not available in this session'
    assert await tools.execute("load_context", {"label": "skills", "key": "api-ref"}) == "API docs"


# -- context proxies ----------------------------------------------------------------------------


async def test_replace_and_append_context_blocks(sdk: ChronicleClient) -> None:
    s = memory_session(sdk)
    await s.replace_context_block("memory", "alpha")
    block = await s.append_context_block("memory", "beta")
    assert block.content == "alpha\nbeta"
    assert block.max_tokens == 100
    assert block.tokens > 0
    with pytest.raises(BudgetExceeded) as over:
        await s.replace_context_block("memory", "word " * 300)
    assert "exceeds maxTokens: " in over.value.detail
    with pytest.raises(ReadOnlyBlock) as ro:
        await s.replace_context_block("soul", "x")
    assert isinstance(ro.value, Conflict)
    assert ro.value.detail == 'Block "soul" is readonly'
    with pytest.raises(BlockNotFound) as nf:
        await s.append_context_block("nope", "x")
    assert nf.value.detail == 'Block "nope" not found'
    assert [b.label for b in await s.get_context_blocks()] == ["soul", "memory"]


async def test_context_block_writes_return_the_blocks_description(sdk: ChronicleClient) -> None:
    s = memory_session(sdk)
    assert (await s.replace_context_block("memory", "alpha")).description == "Learned facts"
    assert (await s.append_context_block("memory", "beta")).description == "Learned facts"
    (block,) = [b for b in await s.get_context_blocks() if b.label == "memory"]
    assert block.description == "Learned facts"


async def test_get_message_original_is_the_untruncated_message_of_a_capped_one(sdk: ChronicleClient) -> None:
    s = Session.create(sdk, sid())
    big = "word " * 400_000  # 2,000,000 characters: over the stack's row cap (1,800,000 bytes)
    await s.append_message({"id": "big", "role": "user", "parts": [{"type": "text", "text": big}]})
    await s.append_message(text("small", "hello"))
    capped, original = await s.get_message("big"), await s.get_message("big", original=True)
    assert capped is not None
    assert original is not None
    assert len(capped["parts"][0]["text"]) < len(big)
    assert original["parts"][0]["text"] == big
    assert await s.get_message("small", original=True) == await s.get_message("small")
    assert await s.get_message("nope", original=True) is None


async def test_get_compaction_failures_lists_the_recorded_failures(
    sdk: ChronicleClient, api_settings: Settings
) -> None:
    s = Session.create(sdk, sid())
    await s.append_message(text("m1", "hello"))
    assert await s.get_compaction_failures() == []
    nc = await operator_nats(api_settings.nats_url)
    try:
        failed = CompactionFailed(
            tenant="tenant-a", session=s.id, leaf_id="m1", summarizer="openai-compatible", error="HTTP 503", attempt=2
        )
        done = await Publisher(nc.jetstream(), api_settings.layout()).publish(failed)
    finally:
        await nc.close()
    sdk.note_seq(s.id, done.seq)
    (found,) = await s.get_compaction_failures()
    assert (found.seq, found.leaf_id, found.summarizer, found.error, found.attempt) == (
        done.seq,
        "m1",
        "openai-compatible",
        "HTTP 503",
        2,
    )
    assert found.created_at == failed.occurred_at


async def test_add_and_remove_context_at_runtime(sdk: ChronicleClient) -> None:
    s = memory_session(sdk)
    await s.add_context("notes", description="Scratch")
    with pytest.raises(InvalidConfig):
        await s.add_context("memory")
    assert [b.label for b in await s.get_context_blocks()] == ["soul", "memory", "notes"]
    assert await s.remove_context("notes")
    assert not await s.remove_context("notes")
    assert [b.label for b in await s.get_context_blocks()] == ["soul", "memory"]


async def test_a_runtime_block_is_undone_by_an_instance_with_another_builder(sdk: ChronicleClient) -> None:
    """What the docs warn of: the config is the last writer's. A replica (or a restart) built
    without the runtime block PUTs its builder config on its first call; one built identically
    (the runtime block included) keeps it."""
    s = memory_session(sdk)
    await s.add_context("notes", description="Scratch")
    same = memory_session(sdk, s.id).with_context("notes", description="Scratch")
    assert [b.label for b in await same.get_context_blocks()] == ["soul", "memory", "notes"]
    replica = memory_session(sdk, s.id)
    assert [b.label for b in await replica.get_context_blocks()] == ["soul", "memory"]
    assert [b.label for b in await s.get_context_blocks()] == ["soul", "memory"]


# -- frozen prompt ------------------------------------------------------------------------------


async def test_frozen_prompt_is_stable_until_refreshed(sdk: ChronicleClient) -> None:
    s = memory_session(sdk)
    first = await s.freeze_system_prompt()
    assert first.startswith(f"{SEP}\nSOUL [readonly]\n{SEP}\nYou are a helpful assistant.")
    assert "MEMORY (Learned facts) [0% — 0/100 tokens] [writable]" in first
    assert await s.freeze_system_prompt() == first
    await s.replace_context_block("memory", "The user likes tea")
    assert await s.freeze_system_prompt() == first
    v1 = await s.get_system_prompt()
    assert v1.version == 1
    refreshed = await s.refresh_system_prompt()
    assert "The user likes tea" in refreshed
    v2 = await s.get_system_prompt()
    assert (v2.prompt, v2.version) == (refreshed, 2)
    assert v2.tokens > v1.tokens
    await s.replace_context_block("memory", "changed again")
    assert await s.freeze_system_prompt() == refreshed


async def test_frozen_prompt_persists_across_instances(sdk: ChronicleClient) -> None:
    s = memory_session(sdk)
    prompt = await s.freeze_system_prompt()
    await s.replace_context_block("memory", "later")
    assert await memory_session(sdk, s.id).freeze_system_prompt() == prompt


async def test_searchable_history_block(sdk: ChronicleClient) -> None:
    w = word()
    other = Session.create(sdk, sid())
    await other.append_message(text("m1", f"We deploy {w} to production"))
    s = Session.create(sdk, sid()).with_searchable_history("history")
    blocks = {b.label: b for b in await s.get_context_blocks()}
    assert blocks["history"].is_searchable
    assert blocks["history"].description == "Cross-session conversation history"
    tools = await s.tools()
    assert await tools.execute("search_context", {"label": "history", "query": w}) == (
        f"[user] We deploy {w} to production"
    )


# -- compaction ---------------------------------------------------------------------------------


async def test_compaction_options_and_manual_compact(sdk: ChronicleClient) -> None:
    s = (
        Session.create(sdk, sid())
        .with_context("memory")
        .compact_after(1_000_000)
        .on_compaction(protect_head=1, tail_token_budget=10, min_tail_messages=2)
    )
    await s.append_message(text("m0", "short"))
    assert await s.compact() is None
    assert s.last_compact_reason
    config = (await sdk.request("GET", f"/v1/sessions/{s.id}/config", session=s.id))["config"]
    assert config["compaction"] == {
        "compact_after": 1_000_000,
        "protect_head": 1,
        "tail_token_budget": 10,
        "min_tail_messages": 2,
    }
    for i in range(1, 20):
        await s.append_message(text(f"m{i}", f"message number {i} about the deployment plan", "user"))
    overlay = await s.compact()
    assert overlay is not None
    assert overlay.from_message_id == "m1"
    assert overlay.summary
    history = await s.get_history()
    assert history[0]["id"] == "m0"
    assert history[1]["id"].startswith("compaction_")
    assert history[1]["parts"] == [{"type": "text", "text": overlay.summary}]
    assert history[-1]["id"] == "m19"
    assert ids(await s.get_history(compacted=False)) == [f"m{i}" for i in range(20)]
    [stored] = await s.get_compactions()
    assert stored.id == overlay.id
    assert stored.to_message_id == overlay.to_message_id


async def test_clear_only_affects_its_own_session(sdk: ChronicleClient) -> None:
    a, b = memory_session(sdk), memory_session(sdk)
    for s in (a, b):
        await s.append_message(text("m1", "x"))
    await a.clear_messages()
    assert await a.get_history() == []
    assert ids(await b.get_history()) == ["m1"]


async def test_freeze_right_after_a_clear_is_the_re_rendered_prompt(sdk: ChronicleClient) -> None:
    """The reference's ``clearMessages`` refreshes the frozen prompt before it returns: the next
    ``freeze_system_prompt`` is the new text, with no wait (the clear's answer covers the render)."""
    for _ in range(5):  # the render raced the read: each round once showed the old prompt
        s = memory_session(sdk)
        await s.replace_context_block("memory", "before freeze")
        frozen = await s.freeze_system_prompt()
        await s.append_context_block("memory", "after freeze")
        await s.append_message(text("m1", "x"))
        assert await s.freeze_system_prompt() == frozen
        await s.clear_messages()
        after = await s.freeze_system_prompt()
        assert after.endswith("before freeze\nafter freeze")
        assert after == await s.refresh_system_prompt()


async def test_compact_after_lets_the_compactor_compact(sdk: ChronicleClient, api_settings: Settings) -> None:
    """``compact_after`` + ``on_compaction`` from the builder drive a running ``chronicle compactor``."""
    env = {**settings_env(api_settings), "CHRONICLE_COMPACTOR_NAME": f"compactor-{uuid.uuid4().hex[:8]}"}
    proc = subprocess.Popen([sys.executable, "-m", "services.ops.cli", "compactor"], env=env)
    try:
        s = (
            Session.create(sdk, sid())
            .compact_after(300)
            .on_compaction(protect_head=1, tail_token_budget=40, min_tail_messages=2)
        )
        for i in range(30):
            await s.append_message(text(f"m{i}", f"message {i}: we talked about the rollout plan and its risks"))
        deadline = time.monotonic() + 60
        while not await s.get_compactions():
            assert time.monotonic() < deadline, "the compactor did not compact"
            await asyncio.sleep(0.2)
        history = await s.get_history()
        assert history[0]["id"] == "m0"
        assert history[1]["id"].startswith("compaction_")
        assert history[-1]["id"] == "m29"
        assert len(history) < 30
    finally:
        proc.terminate()
        proc.wait(timeout=20)
