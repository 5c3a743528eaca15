"""The reference's §6.1 Session behaviours (tree basics, branching, writes, search), through the SDK on the
real stack, on both append paths (HTTP and direct JetStream)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

from chronicle_sdk import (
    OMITTED,
    ChronicleClient,
    Conflict,
    InvalidRequest,
    MessageConflict,
    MessageNotFound,
    Session,
    SessionErased,
    SessionManager,
    SessionNotFound,
    Unauthorized,
    UnknownParent,
    Via,
)
from services.settings import Settings
from tests.e2e.sdk_support import VIAS, client_for, ids, open_client, sid, text, word


@pytest.fixture(params=VIAS)
async def sdk(request: pytest.FixtureRequest, api_url: str, api_settings: Settings) -> AsyncIterator[ChronicleClient]:
    """An SDK client whose appends go through ``request.param`` (HTTP or JetStream)."""
    via: Via = request.param
    async with open_client(api_url, api_settings, via=via) as c:
        yield c


# -- tree basics ---------------------------------------------------------------------------------


async def test_new_session_has_empty_history(sdk: ChronicleClient) -> None:
    s = Session.create(sdk, sid())
    assert await s.get_history() == []
    assert await s.get_latest_leaf() is None
    assert await s.get_path_length() == 0


async def test_a_session_never_written_has_the_empty_prompt_version_0_and_freezes_nothing(
    sdk: ChronicleClient,
) -> None:
    s = Session.create(sdk, sid())
    prompt = await s.get_system_prompt()
    assert (prompt.prompt, prompt.version, prompt.seq) == ("", 0, 0)
    assert await s.get_events() == []  # nothing frozen, nothing recorded
    await s.append_message(text("m1", "hello"))
    frozen = await s.get_system_prompt()
    assert frozen.version == 1
    assert [e["event"]["type"] for e in await s.get_events()].count("prompt.rendered") == 1


async def test_appends_come_back_in_order(sdk: ChronicleClient) -> None:
    s = Session.create(sdk, sid())
    for i in range(5):
        r = await s.append_message(text(f"m{i}", f"message {i}", "user" if i % 2 == 0 else "assistant"))
        assert r.id == f"m{i}"
        assert r.parent_id == (f"m{i - 1}" if i else None)
        assert r.created
    history = await s.get_history()
    assert ids(history) == ["m0", "m1", "m2", "m3", "m4"]
    assert history[3] == text("m3", "message 3", "assistant")


async def test_get_message_and_unknown(sdk: ChronicleClient) -> None:
    s = Session.create(sdk, sid())
    body = {**text("m1", "hello"), "metadata": {"source": "test"}, "createdAt": "2026-01-01T00:00:00Z"}
    await s.append_message(body)
    assert await s.get_message("m1") == body  # unknown fields round-trip
    assert await s.get_message("nope") is None


async def test_path_length_counts_the_path(sdk: ChronicleClient) -> None:
    s = Session.create(sdk, sid())
    for i in range(4):
        await s.append_message(text(f"p{i}", f"t{i}"))
    assert await s.get_path_length() == 4
    assert await s.get_path_length("p1") == 2


# -- branching -----------------------------------------------------------------------------------


async def test_branches_latest_leaf_and_branch_histories(sdk: ChronicleClient) -> None:
    s = Session.create(sdk, sid())
    await s.append_message(text("m1", "root"))
    await s.append_message(text("m2a", "first answer", "assistant"), "m1")
    await s.append_message(text("m2b", "second answer", "assistant"), "m1")
    assert ids(await s.get_branches("m1")) == ["m2a", "m2b"]
    leaf = await s.get_latest_leaf()
    assert leaf is not None
    assert leaf["id"] == "m2b"
    assert ids(await s.get_history("m2a")) == ["m1", "m2a"]
    assert ids(await s.get_history("m2b")) == ["m1", "m2b"]
    assert ids(await s.get_history()) == ["m1", "m2b"]
    assert await s.get_history("unknown") == []
    # an append to a branch makes it the tip
    await s.append_message(text("m3", "on a", "user"), "m2a")
    assert ids(await s.get_history()) == ["m1", "m2a", "m3"]


# -- writes --------------------------------------------------------------------------------------


async def test_update_replaces_the_parts(sdk: ChronicleClient) -> None:
    s = Session.create(sdk, sid())
    await s.append_message(text("m1", "before"))
    await s.update_message(text("m1", "after"))
    assert await s.get_message("m1") == text("m1", "after")
    with pytest.raises(MessageNotFound):
        await s.update_message(text("ghost", "x"))


async def test_clear_leaves_empty_history(sdk: ChronicleClient) -> None:
    s = Session.create(sdk, sid())
    await s.append_message(text("m1", "a"))
    await s.append_message(text("m2", "b"))
    await s.clear_messages()
    assert await s.get_history() == []
    assert await s.get_path_length() == 0
    assert await s.get_latest_leaf() is None


async def test_same_id_again_is_a_no_op_and_first_content_wins(sdk: ChronicleClient) -> None:
    s = Session.create(sdk, sid())
    first = await s.append_message(text("m1", "first"))
    await s.append_message(text("m2", "second"))
    again = await s.append_message(text("m1", "first"))
    assert not again.created
    assert (again.id, again.parent_id, again.seq) == (first.id, first.parent_id, first.seq)
    with pytest.raises(MessageConflict) as info:
        await s.append_message(text("m1", "different"))
    assert isinstance(info.value, Conflict)
    assert info.value.status == 409
    assert await s.get_message("m1") == text("m1", "first")
    assert ids(await s.get_history()) == ["m1", "m2"]


async def test_none_parent_makes_a_new_root_and_omitted_attaches_to_latest_leaf(sdk: ChronicleClient) -> None:
    s = Session.create(sdk, sid())
    await s.append_message(text("m1", "a"))
    await s.append_message(text("m2", "b"), OMITTED)
    r3 = await s.append_message(text("m3", "c"), None)
    assert r3.parent_id is None
    assert ids(await s.get_history("m3")) == ["m3"]
    assert ids(await s.get_branches("m2")) == []
    r4 = await s.append_message(text("m4", "d"))
    assert r4.parent_id == "m3"
    assert ids(await s.get_history()) == ["m3", "m4"]


async def test_delete_keeps_children_parent_and_is_scoped(sdk: ChronicleClient) -> None:
    s1 = Session.create(sdk, sid())
    s2 = Session.create(sdk, sid())
    for s in (s1, s2):
        await s.append_message(text("m1", "a"))
        await s.append_message(text("m2", "b"))
        await s.append_message(text("m3", "c"))
    assert await s1.delete_messages(["m2", "nope"]) == ["m2"]
    assert ids(await s1.get_history("m3")) == ["m3"]  # the path stops at the gap
    assert ids(await s2.get_history()) == ["m1", "m2", "m3"]


async def test_delete_names_an_id_holding_a_comma(sdk: ChronicleClient) -> None:
    s = Session.create(sdk, sid())
    for mid in ("a", "b", "a,b"):
        await s.append_message(text(mid, mid))
    assert await s.delete_messages(["a,b"]) == ["a,b"]
    assert ids(await s.get_history("b")) == ["a", "b"]


# -- errors --------------------------------------------------------------------------------------


async def test_unknown_parent_is_an_error_not_a_silent_root(sdk: ChronicleClient) -> None:
    s = Session.create(sdk, sid())
    await s.append_message(text("m1", "a"))
    with pytest.raises(UnknownParent) as info:
        await s.append_message(text("m2", "b"), "nope")
    assert info.value.code == "unknown_parent"
    assert isinstance(info.value, InvalidRequest)
    assert "nope" in info.value.detail
    assert ids(await s.get_history()) == ["m1"]


async def test_deleted_session_refuses_appends(sdk: ChronicleClient) -> None:
    manager = SessionManager(sdk)
    info = await manager.create("doomed")
    s = manager.get_session(info.id)
    await s.append_message(text("m1", "a"))
    await manager.delete(info.id)
    with pytest.raises(SessionNotFound):
        await s.append_message(text("m2", "b"))


def every_read(s: Session) -> dict[str, Callable[[], Awaitable[object]]]:
    """One call of each of a session's reads that a deleted or erased session refuses."""
    return {
        "get_history": lambda: s.get_history(),
        "get_recent_history": lambda: s.get_recent_history(1000),
        "get_history_row_stats": lambda: s.get_history_row_stats(),
        "get_latest_leaf": lambda: s.get_latest_leaf(),
        "get_path_length": lambda: s.get_path_length(),
        "get_message": lambda: s.get_message("m1"),
        "get_branches": lambda: s.get_branches("m1"),
        "search": lambda: s.search("a"),
        "get_compactions": lambda: s.get_compactions(),
        "get_context_blocks": lambda: s.get_context_blocks(),
        "tools": lambda: s.tools(),
        "get_system_prompt": lambda: s.get_system_prompt(),
    }


async def test_a_deleted_sessions_reads_raise_as_its_writes_do(sdk: ChronicleClient) -> None:
    manager = SessionManager(sdk)
    info = await manager.create("doomed")
    s = manager.get_session(info.id)
    await s.append_all([text("m1", "a"), text("m2", "b")])
    await s.compact()
    await manager.delete(info.id)
    reads = every_read(s)
    answered: dict[str, object] = {}
    for name, read in reads.items():
        try:
            answered[name] = await read()
        except SessionNotFound as exc:
            answered[name] = "deleted" if exc.deleted else exc
    assert answered == dict.fromkeys(reads, "deleted")
    with pytest.raises(SessionNotFound) as written:
        await s.append_message(text("m3", "c"))
    assert written.value.deleted
    with pytest.raises(SessionNotFound) as compacted:  # a write: not "nothing to compact"
        await s.compact()
    assert compacted.value.deleted
    never = Session.create(sdk, sid("never"))  # a session never written still reads as empty
    assert (await never.get_history(), await never.get_message("m1"), await never.get_context_blocks()) == (
        [],
        None,
        [],
    )
    assert (await never.get_system_prompt()).version == 0


async def test_an_erased_sessions_reads_raise_session_erased_as_its_writes_do(sdk: ChronicleClient) -> None:
    """(They answered as for a session never written: empty.) The SDK raises the writes' error."""
    manager = SessionManager(sdk)
    info = await manager.create("erased")
    s = manager.get_session(info.id)
    await s.append_all([text("m1", "a"), text("m2", "b")])
    await manager.erase(info.id)
    reads: dict[str, Callable[[], Awaitable[object]]] = {**every_read(s), "manager.get": lambda: manager.get(info.id)}
    answered: dict[str, object] = {}
    for name, read in reads.items():
        try:
            answered[name] = await read()
        except SessionErased as exc:
            answered[name] = (exc.status, exc.code)
    assert answered == dict.fromkeys(reads, (410, "session_erased"))
    with pytest.raises(SessionErased):
        await s.append_message(text("m3", "c"))
    assert (await s.get_events())[-1]["event"]["type"] == "session.erased"  # the log's audit read stays


async def test_invalid_message_is_refused_before_anything_is_written(sdk: ChronicleClient) -> None:
    s = Session.create(sdk, sid())
    with pytest.raises(InvalidRequest):
        await s.append_message({"id": "m1", "role": "user"})  # no parts
    assert await s.get_events() == []


async def test_bad_key_is_unauthorized(api_url: str, api_settings: Settings) -> None:
    async with client_for(api_url, api_settings) as good:
        bad = ChronicleClient(api_url, "not-a-key", retries=0)
        async with bad:
            with pytest.raises(Unauthorized) as info:
                await Session.create(bad, sid()).get_history()
        assert info.value.status == 401
        assert await Session.create(good, sid()).get_history() == []


# -- search, persistence, read-your-writes --------------------------------------------------------


async def test_search_finds_the_message(sdk: ChronicleClient) -> None:
    s = Session.create(sdk, sid())
    w = word()
    await s.append_message(text("m1", f"I love TypeScript and {w}"))
    await s.append_message(text("m2", "Something else entirely", "assistant"))
    [hit] = await s.search(f"typescript {w}")
    assert (hit.id, hit.role, hit.session_id) == ("m1", "user", s.id)
    assert w in hit.content
    assert await s.search("   ") == []


async def test_history_persists_across_session_instances(sdk: ChronicleClient, api_url: str) -> None:
    session_id = sid()
    await Session.create(sdk, session_id).append_message(text("m1", "kept"))
    assert ids(await Session.create(sdk, session_id).get_history()) == ["m1"]


async def test_read_your_writes_without_thinking(sdk: ChronicleClient) -> None:
    s = Session.create(sdk, sid())
    for i in range(25):
        await s.append_message(text(f"r{i}", f"turn {i}"))
        history = await s.get_history()
        assert history[-1]["id"] == f"r{i}"
        assert len(history) == i + 1


async def test_concurrent_writers_leave_one_chain(api_url: str, api_settings: Settings) -> None:
    """Implicit-parent appends from several clients and both paths: no message lost, one linear chain."""
    session_id = sid()
    clients = [client_for(api_url, api_settings, via=v) for v in ("http", "jetstream", "jetstream", "http")]
    try:

        async def writer(n: int, c: ChronicleClient) -> None:
            s = Session.create(c, session_id)
            for i in range(15):
                await s.append_message(text(f"w{n}-{i}", f"writer {n} message {i}"))

        await asyncio.gather(*(writer(n, c) for n, c in enumerate(clients)))
        history = await _settled_history(clients, session_id)
        assert len(history) == 60
        assert len(set(ids(history))) == 60
        for n in range(4):  # each writer's messages stay in its own order
            mine = [m for m in ids(history) if m.startswith(f"w{n}-")]
            assert mine == [f"w{n}-{i}" for i in range(15)]
    finally:
        for c in clients:
            await c.aclose()


async def _settled_history(clients: list[ChronicleClient], session_id: str) -> list[dict[str, object]]:
    """History read by a client that has seen every writer's last seq."""
    reader = clients[0]
    for c in clients[1:]:
        reader.note_seq(session_id, c.last_seq(session_id))
    return await Session.create(reader, session_id).get_history()


async def test_events_whose_text_holds_unicode_line_separators_are_read(sdk: ChronicleClient) -> None:
    """U+2028, U+2029 and U+0085 are written as they are inside the events' NDJSON lines (JSON
    needs no escape for them); the SDK splits the lines on newlines only (it broke them there)."""
    s = Session.create(sdk, sid())
    body = "para one\u2028para two\u2029three\x85four"
    await s.append_message(text("m1", body))
    [event] = await s.get_events()
    assert event["event"]["type"] == "message.appended"
    assert event["event"]["message"]["parts"][0]["text"] == body


@pytest.mark.parametrize("via", ["http", "nats"])
async def test_a_chain_failing_part_way_raises_with_what_it_stored(
    api_url: str, api_settings: Settings, via: Via, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``append_all`` is not atomic: a conflict at a chain's message raises with the messages
    stored before it (``written``) and its index (``failed_index``), counted across the chain's
    requests (two messages a request here), and reads wait for what was stored."""
    monkeypatch.setattr("chronicle_sdk.client._BATCH_LIMIT", 2)
    async with open_client(api_url, api_settings, via=via) as c:
        s = Session.create(c, sid())
        ex = await s.append_message(text("ex", "stored"))
        chain = [text("a", "a"), text("b", "b"), text("c", "c"), text("ex", "another body"), text("e", "e")]
        with pytest.raises(MessageConflict) as info:
            await s.append_all(chain, parent_id="ex")
        err = info.value
        assert err.failed_index == 3
        assert [(w.id, w.parent_id, w.created) for w in err.written] == [
            ("a", "ex", True),
            ("b", "a", True),
            ("c", "b", True),
        ]
        assert err.written[0].seq > ex.seq
        # the server's detail speaks of its request (2 messages); the message says what of the chain is stored
        assert "3 of the chain's 5 messages are stored" in str(err)
        assert "append_all(messages[3:], parent_id='c')" in str(err)
        assert ids(await s.get_history()) == ["ex", "a", "b", "c"]  # no min_seq given: the client waits

        # at the chain's first message: nothing written, and other errors carry nothing
        with pytest.raises(MessageConflict) as info:
            await s.append_all([text("ex", "another body"), text("f", "f")], parent_id="c")
        assert (info.value.failed_index, info.value.written) == (0, [])
        with pytest.raises(MessageConflict) as info:
            await s.append_message(text("ex", "another body"))
        assert (info.value.failed_index, info.value.written) == (None, [])
