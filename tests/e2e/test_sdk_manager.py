"""The reference's SessionManager behaviours (§1.5, §6.3) through the SDK on the real stack."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from chronicle_sdk import (
    ChronicleClient,
    InvalidRequest,
    MessageNotFound,
    Readonly,
    SessionExists,
    SessionManager,
    SessionNotFound,
    Via,
)
from services.settings import Settings
from tests.e2e.sdk_support import VIAS, ids, open_client, sid, text, word


@pytest.fixture
async def sdk(api_url: str, api_settings: Settings) -> AsyncIterator[ChronicleClient]:
    async with open_client(api_url, api_settings) as c:
        yield c


@pytest.fixture
def manager(sdk: ChronicleClient) -> SessionManager:
    return SessionManager(sdk).with_context("memory", description="Learned facts", max_tokens=200)


async def test_create_get_and_unknown(manager: SessionManager) -> None:
    info = await manager.create("Planning", metadata={"owner": "ada"}, model="gpt-x", source="web")
    got = await manager.get(info.id)
    assert got == info
    assert got.name == "Planning"
    assert got.metadata == {"owner": "ada", "model": "gpt-x", "source": "web"}
    assert got.parent_session_id is None
    assert got.created_at is not None
    assert await manager.get(sid("unknown")) is None
    with pytest.raises(SessionExists):
        await manager.create("again", id=info.id)


async def test_list_rename_delete(manager: SessionManager) -> None:
    a = await manager.create("first")
    b = await manager.create("second")
    listed = {s.id: s for s in await manager.list()}
    assert {a.id, b.id} <= set(listed)
    order = [s.id for s in await manager.list()]
    assert order.index(b.id) < order.index(a.id)  # most recently active first
    await manager.rename(a.id, "renamed")
    assert {s.id: s.name for s in await manager.list()}[a.id] == "renamed"
    order = [s.id for s in await manager.list()]
    assert order.index(a.id) < order.index(b.id)  # the rename made a the most recent (the reference's updated_at)
    order = [s.id for s in await manager.list(order="created")]
    assert order.index(b.id) < order.index(a.id)  # newest created first
    await manager.delete(b.id)
    assert await manager.get(b.id) is None
    assert b.id not in {s.id for s in await manager.list()}
    assert len(await manager.list(limit=1)) == 1


@pytest.mark.parametrize("via", ["http", "nats"])
async def test_rename_refuses_what_the_server_refuses_and_takes_an_empty_name(
    api_url: str, api_settings: Settings, via: Via
) -> None:
    """An empty name is a name (``create``'s default, and the reference's ``rename`` takes it);
    a name over 512 characters, or holding NUL, is the server's ``422 invalid_request`` (over
    NATS too), raised as :class:`InvalidRequest`, and the name stays."""
    async with open_client(api_url, api_settings, via=via) as c:
        manager = SessionManager(c)
        info = await manager.create("first")
        for bad in ("x" * 513, "a\u0000b"):
            with pytest.raises(InvalidRequest) as refused:
                await manager.rename(info.id, bad)
            assert refused.value.code == "invalid_request"
            got = await manager.get(info.id)
            assert got is not None
            assert got.name == "first"
        await manager.rename(info.id, "")
        got = await manager.get(info.id)
        assert got is not None
        assert got.name == ""
        with pytest.raises(SessionNotFound):
            await manager.rename(sid("unknown"), "x")


async def test_cross_session_search(manager: SessionManager) -> None:
    w = word()
    one, two = await manager.create("one"), await manager.create("two")
    await manager.append(one.id, text("m1", f"I write TypeScript {w}"))
    await manager.append(two.id, text("m1", f"TypeScript again {w}", "assistant"))
    hits = await manager.search(f"typescript {w}")
    assert {(h.session_id, h.id) for h in hits} == {(one.id, "m1"), (two.id, "m1")}
    assert await manager.search("") == []


async def test_delete_messages_is_scoped_to_one_session(manager: SessionManager) -> None:
    one, two = await manager.create("one"), await manager.create("two")
    for s in (one, two):
        await manager.append_all(s.id, [text("a", "x"), text("b", "y")])
    assert await manager.delete_messages(one.id, ["b"]) == ["b"]
    assert ids(await manager.get_history(one.id)) == ["a"]
    assert ids(await manager.get_history(two.id)) == ["a", "b"]
    assert await manager.get_message_count(two.id) == 2
    await manager.clear_messages(two.id)
    assert await manager.get_message_count(two.id) == 0


async def test_fork_copies_the_branch(manager: SessionManager) -> None:
    src = await manager.create("source")
    for i in range(4):
        await manager.append(src.id, text(f"m{i}", f"turn {i}"))
    forked = await manager.fork(src.id, "m1", "fork")
    assert forked.parent_session_id == src.id
    assert forked.name == "fork"
    assert forked.created_at is not None
    assert forked.updated_at is not None
    assert forked.updated_at >= forked.created_at
    assert ids(await manager.get_history(forked.id)) == ["m0", "m1"]
    assert ids(await manager.get_history(src.id)) == ["m0", "m1", "m2", "m3"]
    # the fork is a session of its own
    await manager.append(forked.id, text("f2", "fork only"))
    assert ids(await manager.get_history(forked.id)) == ["m0", "m1", "f2"]
    assert ids(await manager.get_history(src.id)) == ["m0", "m1", "m2", "m3"]


async def test_a_fork_at_an_unknown_message_is_message_not_found_and_makes_no_session(
    manager: SessionManager,
) -> None:
    src = await manager.create("source")
    await manager.append(src.id, text("m0", "turn 0"))
    new_id = sid("fork-unknown")
    with pytest.raises(MessageNotFound) as caught:
        await manager.fork(src.id, "never-appended", "fork", id=new_id)
    assert (caught.value.status, caught.value.code) == (404, "message_not_found")
    assert await manager.get(new_id) is None
    assert ids(await manager.get_history(src.id)) == ["m0"]


async def test_session_tools_and_manager_tools(manager: SessionManager) -> None:
    info = await manager.create("tools")
    session = manager.get_session(info.id)
    session_tools = await session.tools()
    assert "set_context" in session_tools
    assert "session_search" not in session_tools
    manager_tools = manager.tools()
    assert manager_tools.names == ["session_search"]
    [definition] = manager_tools.anthropic()
    assert definition["description"] == "Search past conversations for relevant context. Searches across all sessions."
    assert definition["input_schema"]["required"] == ["query"]
    w = word()
    await session.append_message(text("m1", f"We deploy {w} to production on Fridays"))
    await session.append_message(text("m2", f"Production deploy {w} done", "assistant"))
    result = await manager_tools.execute("session_search", {"query": f"deploy production {w}"})
    parts = result.split("\n---\n")
    assert sorted(parts) == sorted(
        [f"[user] We deploy {w} to production on Fridays", f"[assistant] Production deploy {w} done"]
    )
    assert "deploy" in result
    assert await manager_tools.execute("session_search", {"query": word()}) == "No results found."
    assert (await manager_tools.execute("session_search", {})).startswith("Error: ")
    merged = session_tools + manager_tools
    assert merged.names == ["set_context", "session_search"]
    assert "Written to memory" in await merged.execute("set_context", {"label": "memory", "content": "x"})


async def test_searchable_history_gives_session_tools_search_context_only(sdk: ChronicleClient) -> None:
    """As the reference's ``withSearchableHistory``: the block makes ``session.tools()`` carry
    ``search_context`` over it, while ``session_search`` stays ``manager.tools()``'s alone."""
    manager = SessionManager(sdk).with_context("memory").with_searchable_history("history")
    session = manager.get_session((await manager.create("history tools")).id)
    session_tools = await session.tools()
    assert session_tools.names == ["set_context", "search_context"]
    assert "session_search" not in session_tools
    w = word()
    await session.append_message(text("m1", f"We deploy {w} on Fridays"))
    assert await session_tools.execute("search_context", {"label": "history", "query": w}) == (
        f"[user] We deploy {w} on Fridays"
    )
    merged = session_tools + manager.tools()
    assert merged.names == ["set_context", "search_context", "session_search"]
    assert await merged.execute("session_search", {"query": w}) == f"[user] We deploy {w} on Fridays"


async def test_get_session_is_cached_and_carries_the_template(manager: SessionManager) -> None:
    info = await manager.create("templated")
    session = manager.get_session(info.id)
    assert manager.get_session(info.id) is session
    assert [b.label for b in await session.get_context_blocks()] == ["memory"]
    await manager.delete(info.id)
    assert manager.get_session(info.id) is not session


async def test_manager_template_with_readonly_and_searchable_history(sdk: ChronicleClient) -> None:
    manager = SessionManager(sdk).with_context("soul", provider=Readonly("Hi")).with_searchable_history("past")
    info = await manager.create("x")
    blocks = await manager.get_session(info.id).get_context_blocks()
    assert [(b.label, b.kind) for b in blocks] == [("soul", "readonly"), ("past", "history")]


@pytest.mark.parametrize("via", VIAS)
async def test_append_all_starts_a_new_root_without_parent(manager: SessionManager, via: Via) -> None:
    info = await manager.create("bulk")
    await manager.append(info.id, text("old", "existing"), via=via)
    last = await manager.append_all(info.id, [text(f"b{i}", f"bulk {i}") for i in range(50)], via=via)
    assert last == "b49"
    history = await manager.get_history(info.id)
    assert ids(history) == [f"b{i}" for i in range(50)]  # not attached to "old"
    last = await manager.append_all(info.id, [text("c0", "x"), text("c1", "y")], "old", via=via)
    assert ids(await manager.get_history(info.id, last)) == ["old", "c0", "c1"]
    assert await manager.append_all(info.id, [], via=via) is None


async def test_upsert(manager: SessionManager) -> None:
    info = await manager.create("upsert")
    await manager.upsert(info.id, text("m1", "v1"))
    await manager.upsert(info.id, text("m1", "v2"))
    assert await manager.get_session(info.id).get_message("m1") == text("m1", "v2")
    assert await manager.get_message_count(info.id) == 1


@pytest.mark.parametrize("via", ["http", "nats"])
async def test_add_usage_adds_up_and_get_shows_the_sums(api_url: str, api_settings: Settings, via: Via) -> None:
    async with open_client(api_url, api_settings, via=via) as client:
        manager = SessionManager(client)
        info = await manager.create("metered")
        assert (info.input_tokens, info.output_tokens, info.estimated_cost, info.end_reason) == (0, 0, 0.0, None)
        await manager.add_usage(info.id, 1000, 200, 0.5)
        await manager.add_usage(info.id, input_tokens=24, cost=0.25)
        got = await manager.get(info.id)
        assert got is not None
        assert (got.input_tokens, got.output_tokens, got.estimated_cost) == (1024, 200, 0.75)
        with pytest.raises(SessionNotFound):
            await manager.add_usage(sid("unknown"), 1)
        with pytest.raises(InvalidRequest):
            await manager.add_usage(info.id, -1)


async def test_compact_and_split_continues_in_a_child_and_ends_the_old_session(manager: SessionManager) -> None:
    old = await manager.create("Support chat", model="gpt-x", source="web")
    await manager.append(old.id, text("m1", "the printer is on fire"))
    child = await manager.compact_and_split(old.id, "User reported a printer fire; we advised leaving.")
    assert child.parent_session_id == old.id
    assert (child.name, child.model, child.source) == ("Support chat", "gpt-x", "web")
    [first] = await manager.get_history(child.id)
    assert first["role"] == "assistant"
    assert first["parts"] == [
        {"type": "text", "text": "[Context from previous session]\n\nUser reported a printer fire; we advised leaving."}
    ]
    ended = await manager.get(old.id)
    assert ended is not None
    assert ended.end_reason == "compaction"
    assert [m["id"] for m in await manager.get_history(old.id)] == ["m1"]  # the old history stays

    named = await manager.compact_and_split(old.id, "again", "Part 3", id=sid("split"))
    again = await manager.compact_and_split(old.id, "again", "Part 3", id=named.id)  # a retry
    assert again.id == named.id
    assert again.name == "Part 3"
    assert len(await manager.get_history(named.id)) == 1
    with pytest.raises(SessionNotFound):
        await manager.compact_and_split(sid("unknown"), "summary")


async def test_compact_and_split_into_a_session_that_is_not_its_child_is_refused_untouched(
    manager: SessionManager,
) -> None:
    old = await manager.create("Support chat")
    stranger = await manager.create("Someone else's")
    await manager.append(stranger.id, text("s1", "theirs"))
    nephew = await manager.create("A child of the stranger", parent_session_id=stranger.id)
    gone = await manager.create("Deleted")
    await manager.delete(gone.id)
    for taken in (stranger.id, nephew.id, old.id, gone.id):
        with pytest.raises(SessionExists):
            await manager.compact_and_split(old.id, "summary", id=taken)
    assert [m["id"] for m in await manager.get_history(stranger.id)] == ["s1"]
    assert await manager.get_history(nephew.id) == []
    assert await manager.get_history(old.id) == []
    for untouched in (old.id, stranger.id, nephew.id):
        info = await manager.get(untouched)
        assert info is not None
        assert info.end_reason is None


async def test_erase_with_a_reason_is_listed_by_list_erasures(manager: SessionManager) -> None:
    a = await manager.create("to erase")
    b = await manager.create("to erase too")
    seq_a = await manager.erase(a.id, reason="ticket 42")
    await manager.erase(b.id)
    listed = {e.session_id: e for e in await manager.list_erasures()}
    assert (listed[a.id].reason, listed[a.id].seq) == ("ticket 42", seq_a)
    assert listed[b.id].reason is None
    assert (listed[a.id].requested_by or "").startswith("tenant:tenant-a key:")
    assert [e.session_id for e in await manager.list_erasures(limit=2)] == [b.id, a.id]
    c = await manager.create("kept")
    with pytest.raises(InvalidRequest):
        await manager.erase(c.id, reason="x" * 501)
    assert await manager.get(c.id) is not None
