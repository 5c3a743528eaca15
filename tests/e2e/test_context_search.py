"""Searchable blocks and searchable history over HTTP: keyed entries upserted by key, FTS with
all words required (stop words too), phrases and prefixes, and the tenant-wide ``session_search``."""

from __future__ import annotations

import uuid
from typing import Any

import httpx

from chronicle_sdk import SessionManager
from projections.search_query import MAX_QUERY_CHARS
from services.settings import Settings
from tests.e2e.context_support import block, configure, context, events, prompt, refresh, sid, tool
from tests.e2e.sdk_support import open_client

KNOWLEDGE: dict[str, Any] = {"kind": "searchable", "label": "knowledge", "description": "Searchable docs"}


def word() -> str:
    """A random all-letter word no other test uses (one plain token for the English parser)."""
    return "zq" + "".join(chr(ord("a") + int(c, 16)) for c in uuid.uuid4().hex[:12])


async def index(client: httpx.AsyncClient, s: str, content: str, title: str | None = None) -> str:
    args: dict[str, Any] = {"label": "knowledge", "content": content}
    if title is not None:
        args["metadata"] = {"title": title}
    res, _ = await tool(client, s, "set_context", args)
    return res


async def search(client: httpx.AsyncClient, s: str, query: str, label: str = "knowledge") -> str:
    res, _ = await tool(client, s, "search_context", {"label": label, "query": query})
    return res


async def test_search_entries(client: httpx.AsyncClient) -> None:
    s = sid()
    await configure(client, s, {"blocks": [KNOWLEDGE]})
    assert (await prompt(client, s))["prompt"] == block("KNOWLEDGE (Searchable docs) [searchable]", "")

    assert (
        await index(client, s, "The deploy happens on Friday afternoon", "deploy") == 'Indexed "deploy" in knowledge.'
    )
    assert await index(client, s, "Kim is on call for the database", "Oncall") == 'Indexed "oncall" in knowledge.'
    res = await index(client, s, "Backups run nightly at 02:00")
    assert res.startswith('Indexed "backups-run-nightly-at-02-00-')

    assert await search(client, s, "friday") == "[deploy]\nThe deploy happens on Friday afternoon"
    # every word must match, in any order, stemmed
    assert await search(client, s, "afternoon deploys") == "[deploy]\nThe deploy happens on Friday afternoon"
    assert await search(client, s, "friday database") == "No results found."
    assert await search(client, s, "nothing-like-this") == "No results found."
    assert await search(client, s, "") == "No results found."
    assert await search(client, s, "'\"&|!():*") == "No results found."  # FTS operators are plain text
    # common words are words: nothing is dropped as a stop word
    assert await search(client, s, "the deploy") == "[deploy]\nThe deploy happens on Friday afternoon"
    assert await search(client, s, "is on") == "[oncall]\nKim is on call for the database"
    assert await search(client, s, '"on call"') == "[oncall]\nKim is on call for the database"
    assert await search(client, s, '"call on"') == "No results found."  # a phrase keeps its order
    nightly = await search(client, s, "nigh*")  # a prefix
    assert nightly.startswith("[backups-run-nightly-at-02-00-")
    assert nightly.endswith("]\nBackups run nightly at 02:00")

    p = await refresh(client, s)
    assert p["prompt"] == block("KNOWLEDGE (Searchable docs) [searchable]", "3 entries indexed.")
    assert (await context(client, s))["knowledge"]["content"] == "3 entries indexed."


async def test_same_title_replaces_the_entry(client: httpx.AsyncClient) -> None:
    s = sid()
    await configure(client, s, {"blocks": [KNOWLEDGE]})
    old, new = word(), word()
    assert await index(client, s, f"Deploys use the {old} pipeline", "Deploy") == 'Indexed "deploy" in knowledge.'
    assert await index(client, s, f"Deploys use the {new} pipeline", "deploy!") == 'Indexed "deploy" in knowledge.'
    assert await search(client, s, old) == "No results found."
    assert await search(client, s, new) == f"[deploy]\nDeploys use the {new} pipeline"
    assert (await context(client, s))["knowledge"]["content"] == "1 entries indexed."
    indexed = [e["event"] for e in await events(client, s) if e["event"]["type"] == "search_entry.indexed"]
    assert [(e["label"], e["key"]) for e in indexed] == [("knowledge", "deploy"), ("knowledge", "deploy")]


async def test_results_are_ranked_and_limited_to_ten(client: httpx.AsyncClient) -> None:
    s = sid()
    await configure(client, s, {"blocks": [KNOWLEDGE]})
    w = word()
    for i in range(12):
        await index(client, s, f"entry {i} mentions {w}", f"e{i}")
    await index(client, s, f"{w} {w} {w} {w} heavy", "heavy")
    hits = (await search(client, s, w)).split("\n\n")
    assert len(hits) == 10
    assert hits[0] == f"[heavy]\n{w} {w} {w} {w} heavy"


async def test_searchable_blocks_are_per_session_and_label(client: httpx.AsyncClient) -> None:
    s1, s2 = sid(), sid()
    both = {"blocks": [KNOWLEDGE, {"kind": "searchable", "label": "other"}]}
    await configure(client, s1, both)
    await configure(client, s2, both)
    w = word()
    await index(client, s1, f"{w} in session one", "one")
    assert await search(client, s1, w) == f"[one]\n{w} in session one"
    assert await search(client, s1, w, "other") == "No results found."
    assert await search(client, s2, w) == "No results found."


async def live_sessions(client: httpx.AsyncClient) -> int:
    n, cursor = 0, None
    while True:
        params: dict[str, int] = {"limit": 500} if cursor is None else {"limit": 500, "cursor": cursor}
        page = (await client.get("/v1/sessions", params=params)).json()
        n += len(page["sessions"])
        cursor = page["next_cursor"]
        if cursor is None:
            return n


async def post_message(client: httpx.AsyncClient, s: str, mid: str, role: str, text: str) -> None:
    message = {"id": mid, "role": role, "parts": [{"type": "text", "text": text}]}
    r = await client.post(f"/v1/sessions/{s}/messages", json={"message": message})
    assert r.status_code == 201, r.text


async def test_searchable_history_spans_the_tenants_sessions(
    client: httpx.AsyncClient, client_b: httpx.AsyncClient
) -> None:
    s, other, foreign = sid(), sid(), sid()
    w = word()
    await post_message(client, other, "m1", "user", f"How do we deploy {w} to production?")
    await post_message(client, other, "m2", "assistant", f"Run the {w} deploy script.")
    await post_message(client_b, foreign, "m1", "user", f"tenant b also says {w} deploy")
    await configure(client, s, {"blocks": [KNOWLEDGE], "searchable_history": "past"})

    seq = (await events(client, s))[-1]["seq"]
    blocks = await context(client, s, seq)
    assert list(blocks) == ["knowledge", "past"]
    assert blocks["past"]["kind"] == "history"
    assert blocks["past"]["writable"] is False
    live = await live_sessions(client)
    assert live >= 3  # other, s, and whatever earlier tests left behind
    sessions = f"{live} session{'' if live == 1 else 's'} available for search."
    assert blocks["past"]["content"] == sessions
    p = await prompt(client, s)
    assert p["prompt"] == (
        block("KNOWLEDGE (Searchable docs) [searchable]", "")
        + "\n\n"
        + block("PAST (Cross-session conversation history) [searchable]", sessions)
    )

    expected = f"[assistant] Run the {w} deploy script.\n---\n[user] How do we deploy {w} to production?"
    hits = await search(client, s, f"{w} deploy", "past")
    assert sorted(hits.split("\n---\n")) == sorted(expected.split("\n---\n"))
    res, _ = await tool(client, s, "session_search", {"query": f"deploy {w}"})
    assert sorted(res.split("\n---\n")) == sorted(expected.split("\n---\n"))
    res, _ = await tool(client, s, "session_search", {"query": f"{w} production"})
    assert res == f"[user] How do we deploy {w} to production?"
    # stop words are searched like any word
    res, _ = await tool(client, s, "session_search", {"query": f"how do we {w}"})
    assert res == f"[user] How do we deploy {w} to production?"
    assert await search(client, s, f'"the {w}"', "past") == f"[assistant] Run the {w} deploy script."
    res, _ = await tool(client, s, "session_search", {"query": word()})
    assert res == "No results found."
    res, _ = await tool(client, s, "session_search", {"query": "  "})
    assert res == "No results found."
    assert await search(client, s, word(), "past") == "No results found."
    # the history block is read-only
    res, _ = await tool(client, s, "set_context", {"label": "past", "content": "x"})
    assert res == 'Error: Block "past" does not support writes'


async def test_a_query_longer_than_the_search_routes_take_finds_nothing_in_every_tool(
    client: httpx.AsyncClient, api_url: str, api_settings: Settings
) -> None:
    """``search_context`` (entries and history) and ``session_search`` (the server's and the
    SDK's) answer a query over 1,000 characters alike: ``No results found.``, as the reference's
    ``session_search`` turns a failed search into no results; one of 1,000 still searches."""
    s, other, w = sid(), sid(), word()
    await post_message(client, other, "m1", "user", f"deploy {w}")
    await configure(client, s, {"blocks": [KNOWLEDGE], "searchable_history": "past"})
    await index(client, s, f"deploy {w}", "deploy")
    fits = f"deploy {w}" + " deploy" * ((MAX_QUERY_CHARS - len(w) - 7) // 7)  # repeats count once
    fits += " " * (MAX_QUERY_CHARS - len(fits))
    over = fits + " "
    assert (len(fits), len(over)) == (MAX_QUERY_CHARS, MAX_QUERY_CHARS + 1)

    async with open_client(api_url, api_settings) as sdk:
        sdk_tools = SessionManager(sdk).tools()
        for query, entry, history in (
            (fits, f"[deploy]\ndeploy {w}", f"[user] deploy {w}"),
            (over, "No results found.", "No results found."),
        ):
            assert await search(client, s, query) == entry
            assert await search(client, s, query, "past") == history
            assert (await tool(client, s, "session_search", {"query": query}))[0] == history
            assert await sdk_tools.execute("session_search", {"query": query}) == history
    r = await client.get("/v1/search", params={"q": over})
    assert r.status_code == 422, r.text
    assert r.json()["code"] == "invalid_request"
