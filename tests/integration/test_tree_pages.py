"""A session's tree (``GET …/tree``) and a message's children (``GET …/messages/{mid}/children``)
are read a page at a time that ends early at its bytes budget, as the prompts, compactions and
compaction failures are (:data:`projections.pages.PAGE_BYTES`): a page holds at least one
message, its ``next_cursor`` continues where it stopped, the pages hold every message once, and
the bodies past the budget are never read from Postgres."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable

import httpx
import pytest

from chronicle_sdk import ChronicleClient
from projections import pages, queries
from services.api.app import build_app
from services.bootstrap import Container
from tests.conftest import KEYS
from tests.integration.helpers import all_pages, tenant_client, text_message

T = "tenant-a"
CHILDREN = 7
ROUTES = ["tree", "messages/r0/children"]
"""The tree holds r0 and its 7 children (8 messages); r0's children are 7."""


@pytest.fixture
async def http(stack: Container) -> AsyncIterator[httpx.AsyncClient]:
    async with tenant_client(build_app(stack.settings, stack), T) as client:
        yield client


async def _session(c: Container, sid: str) -> int:
    """A root r0 and its children c1 … c7, applied; the bytes of one stored body (all alike)."""
    await c.commands.append(T, sid, text_message("r0", "a message"), None)
    for i in range(1, CHILDREN + 1):
        await c.commands.append(T, sid, text_message(f"c{i}", "a message"), "r0")
    await c.commands.optimistic.catch_up(T, sid)
    async with c.pool.connection() as conn:
        cur = await conn.execute(
            "SELECT DISTINCT octet_length(content) FROM messages WHERE tenant = %s AND session_id = %s", (T, sid)
        )
        sizes = [int(r[0]) for r in await cur.fetchall()]
    assert len(sizes) == 1, sizes
    return sizes[0]


@pytest.mark.parametrize("route", ROUTES)
async def test_a_page_of_messages_ends_at_its_bytes_budget(
    stack: Container,
    http: httpx.AsyncClient,
    new_id: Callable[[str], str],
    monkeypatch: pytest.MonkeyPatch,
    route: str,
) -> None:
    """With a budget of two bodies and a byte, a page holds 3 (the third takes it past); the
    pages still hold every message once, in order, each next cursor the sequence of its page's
    last message."""
    sid = new_id("tree-budget")
    size = await _session(stack, sid)
    whole = (await http.get(f"/v1/sessions/{sid}/{route}")).json()
    assert whole["next_cursor"] is None
    count = len(whole["messages"])
    assert count == (CHILDREN + 1 if route == "tree" else CHILDREN)
    monkeypatch.setattr(pages, "PAGE_BYTES", 2 * size + 1)
    found = await all_pages(http, sid, route, "messages", {})
    assert [len(p["messages"]) for p in found] == [3, 3, count - 6]
    assert [m for p in found for m in p["messages"]] == whole["messages"]  # each once, in order
    if route == "tree":
        assert [p["next_cursor"] for p in found[:-1]] == [p["messages"][-1]["seq"] for p in found[:-1]]
        assert {p["leaf_id"] for p in found} == {whole["leaf_id"]}
    limited = await all_pages(http, sid, route, "messages", {"limit": 2})  # the limit first where it is less
    assert [len(p["messages"]) for p in limited] == [2] * (count // 2) + [1] * (count % 2)
    assert [m for p in limited for m in p["messages"]] == whole["messages"]
    monkeypatch.setattr(pages, "PAGE_BYTES", 1)  # a body past the whole budget: one a page, never none
    single = await all_pages(http, sid, route, "messages", {})
    assert [len(p["messages"]) for p in single] == [1] * count
    assert [m for p in single for m in p["messages"]] == whole["messages"]


async def test_the_sdk_reads_every_child_across_pages_cut_by_the_budget(
    stack: Container, new_id: Callable[[str], str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Pages of 3, 3 and 1 children: ``get_branches`` asks for each and returns all 7."""
    sid = new_id("tree-sdk")
    size = await _session(stack, sid)
    asked: list[str] = []

    class Counted(httpx.ASGITransport):
        async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
            if request.url.path.endswith("/children"):
                asked.append(request.url.params.get("cursor", ""))
            return await super().handle_async_request(request)

    async with ChronicleClient("http://c", KEYS[T], transport=Counted(app=build_app(stack.settings, stack))) as sdk:
        monkeypatch.setattr(pages, "PAGE_BYTES", 2 * size + 1)
        found = await sdk.session(sid).get_branches("r0")
    assert [m["id"] for m in found] == [f"c{i}" for i in range(1, CHILDREN + 1)]
    assert len(asked) == 3
    assert asked[0] == ""  # the first page, then the two next cursors


async def test_the_bodies_past_a_pages_budget_are_not_read(stack: Container, new_id: Callable[[str], str]) -> None:
    """The pages' queries return no body for the messages past the budget (NULL): the server
    never holds them, whatever their size."""
    sid = new_id("tree-unread")
    size = await _session(stack, sid)
    budget = {"budget": 2 * size + 1}
    async with stack.pool.connection() as conn:
        cur = await conn.execute(queries.TREE_PAGE, pages.page_params(T, sid, 0, 1000) | budget)
        tree = await cur.fetchall()
        cur = await conn.execute(queries.CHILDREN_PAGE, pages.page_params(T, sid, 0, 1000) | budget | {"m": "r0"})
        children = await cur.fetchall()
    assert [r[-1] is not None for r in tree] == [True] * 3 + [False] * 5
    assert [r[-1] is not None for r in children] == [True] * 3 + [False] * 4
    assert pages.cut(tree, 1000) == (tree[:3], True)
