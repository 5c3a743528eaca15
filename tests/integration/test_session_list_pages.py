"""A session's prompt versions, compactions and compaction failures are read a page at a time
(``limit``, ``cursor``, ``next_cursor``, as the tree), a page ending early at its text budget;
and a history read that applies overlays loads the summaries of the overlays it shows only."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

import httpx
import pytest

from events.catalog import CompactionFailed, CompactionRecorded, PromptRendered
from projections import overlays, pages
from services.api import history
from services.api.app import build_app
from services.bootstrap import Container
from tests.integration.helpers import all_pages, summary_recorded, tenant_client, text_message

T = "tenant-a"
ROUTES = [
    ("prompts", "prompts", "version"),
    ("compactions", "compactions", "seq"),
    ("compaction-failures", "failures", "seq"),
]


@pytest.fixture
async def http(stack: Container) -> AsyncIterator[httpx.AsyncClient]:
    async with tenant_client(build_app(stack.settings, stack), T) as client:
        yield client


async def _session_with_lists(c: Container, sid: str, n: int, text: Callable[[int], str]) -> None:
    """A session with one message and ``n`` prompt versions, overlays and failures (their texts
    ``text(i)``), applied."""
    await c.commands.append(T, sid, text_message("m0", "hello"), None)
    for i in range(1, n + 1):
        await c.publisher.publish(
            PromptRendered(tenant=T, session=sid, text=text(i), tokens=1, version_no=i, reason="refresh")
        )
        await c.publisher.publish(replace_id(summary_recorded(T, sid, "m0", "m0", text(i)), i))
        await c.publisher.publish(
            CompactionFailed(tenant=T, session=sid, leaf_id="m0", summarizer="test", error=text(i), attempt=i)
        )
    await c.commands.optimistic.catch_up(T, sid)


def replace_id(event: CompactionRecorded, i: int) -> CompactionRecorded:
    """The overlay under an id of its own (the helper derives one from its span, and these share one)."""
    oid = f"{event.overlay_id}-{i}"
    return event.model_copy(update={"id": oid, "overlay_id": oid})


def _text(i: int) -> str:
    return f"text {i:02d}"  # 7 bytes


@pytest.mark.parametrize(("route", "key", "cursor_of"), ROUTES)
async def test_a_session_list_is_read_a_page_at_a_time(
    stack: Container, http: httpx.AsyncClient, new_id: Callable[[str], str], route: str, key: str, cursor_of: str
) -> None:
    sid = new_id("pages")
    await _session_with_lists(stack, sid, 5, _text)
    whole = (await http.get(f"/v1/sessions/{sid}/{route}")).json()
    assert whole["next_cursor"] is None  # the default page (1,000) holds them all
    assert len(whole[key]) == 5
    found = await all_pages(http, sid, route, key, {"limit": 2})
    assert [len(p[key]) for p in found] == [2, 2, 1]
    assert [p["next_cursor"] for p in found] == [found[0][key][-1][cursor_of], found[1][key][-1][cursor_of], None]
    assert [item for p in found for item in p[key]] == whole[key]  # each once, in order
    exact = await all_pages(http, sid, route, key, {"limit": 5})  # exactly full: the last page says so
    assert [(len(p[key]), p["next_cursor"]) for p in exact] == [(5, None)]
    past = (await http.get(f"/v1/sessions/{sid}/{route}", params={"cursor": 2**63 - 1})).json()
    assert (past[key], past["next_cursor"]) == ([], None)


@pytest.mark.parametrize(("route", "key", "cursor_of"), ROUTES)
async def test_a_page_ends_at_its_text_budget(
    stack: Container,
    http: httpx.AsyncClient,
    new_id: Callable[[str], str],
    monkeypatch: pytest.MonkeyPatch,
    route: str,
    key: str,
    cursor_of: str,
) -> None:
    """With a budget of 20 bytes and texts of 7, a page holds 3 (the third takes it past); the
    chain still holds every item once, in order."""
    sid = new_id("budget")
    await _session_with_lists(stack, sid, 7, _text)
    whole = (await http.get(f"/v1/sessions/{sid}/{route}")).json()[key]
    monkeypatch.setattr(pages, "PAGE_BYTES", 20)
    found = await all_pages(http, sid, route, key, {})
    assert [len(p[key]) for p in found] == [3, 3, 1]
    assert [item for p in found for item in p[key]] == whole
    limited = await all_pages(http, sid, route, key, {"limit": 2})  # the limit first where it is less
    assert [len(p[key]) for p in limited] == [2, 2, 2, 1]


async def test_prompt_versions_numbered_zero_or_below_are_listed_first(
    stack: Container, http: httpx.AsyncClient, new_id: Callable[[str], str]
) -> None:
    """A publisher writing straight to the log may number a version 0 or below: the list starts
    at the first version whatever its number (a prompts cursor may be below 0; the others'
    sequences may not), as it listed them all."""
    sid = new_id("low")
    await stack.commands.append(T, sid, text_message("m0", "hello"), None)
    for version in (-(2**31), -5, 0, 1):
        await stack.publisher.publish(
            PromptRendered(tenant=T, session=sid, text=_text(version), tokens=1, version_no=version, reason="refresh")
        )
    await stack.commands.optimistic.catch_up(T, sid)
    whole = (await http.get(f"/v1/sessions/{sid}/prompts")).json()
    assert ([p["version"] for p in whole["prompts"]], whole["next_cursor"]) == ([-(2**31), -5, 0, 1], None)
    found = await all_pages(http, sid, "prompts", "prompts", {"limit": 1})
    assert [p["next_cursor"] for p in found] == [-(2**31), -5, 0, None]
    for route in ("compactions", "compaction-failures"):
        r = await http.get(f"/v1/sessions/{sid}/{route}", params={"cursor": -1})
        assert (r.status_code, r.json()["code"]) == (422, "invalid_request")


async def test_the_texts_past_a_pages_budget_are_not_read(stack: Container, new_id: Callable[[str], str]) -> None:
    """The page's query returns no text for the rows past the budget (NULL): the server never
    holds them, whatever their size."""
    sid = new_id("unread")
    await _session_with_lists(stack, sid, 4, lambda i: str(i) * 100_000)
    params = pages.page_params(T, sid, 0, 1000) | {"budget": 150_000}
    async with stack.pool.connection() as conn:
        cur = await conn.execute(pages.page_sql("version", "text", "prompts", "version"), params)
        rows = await cur.fetchall()
    assert [(v, None if t is None else len(t)) for v, t in rows] == [(1, 100_000), (2, 100_000), (3, None), (4, None)]
    assert pages.cut(rows, 1000) == (rows[:2], True)


@pytest.mark.parametrize("route", [r for r, _, _ in ROUTES])
@pytest.mark.parametrize(
    "params", [{"limit": 0}, {"limit": 1001}, {"cursor": -(2**31) - 1}, {"cursor": 2**63}, {"limit": "x"}]
)
async def test_bad_paging_of_a_session_list_is_refused(
    stack: Container, http: httpx.AsyncClient, new_id: Callable[[str], str], route: str, params: dict[str, Any]
) -> None:
    sid = new_id("bad")
    await stack.commands.append(T, sid, text_message("m0", "hello"), None)
    await stack.commands.optimistic.catch_up(T, sid)
    r = await http.get(f"/v1/sessions/{sid}/{route}", params=params)
    assert (r.status_code, r.json()["code"]) == (422, "invalid_request"), r.text
    assert r.json()["errors"][0]["loc"] == ["query", next(iter(params))]
    assert (await http.get(f"/v1/sessions/{sid}/{route}", params={"limit": 1000})).status_code == 200


async def test_a_history_read_loads_only_the_summaries_it_shows(
    stack: Container, http: httpx.AsyncClient, new_id: Callable[[str], str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """a-b-c-d, and x under b: the overlay b..c is in force on d's path; b..b (narrower, same
    start) is superseded there and b..x is another branch's. A read of d's path that applies
    overlays (``max_bytes`` or ``truncate_older``: not the one-statement read) asks for the
    summary of b..c only, and answers it in place."""
    sid = new_id("shown")
    for mid, parent in (("a", None), ("b", "a"), ("c", "b"), ("d", "c"), ("x", "b")):
        await stack.commands.append(T, sid, text_message(mid, f"message {mid}"), parent)
    ids = {}
    for first, last in (("b", "b"), ("b", "c"), ("b", "x")):
        event = summary_recorded(T, sid, first, last, f"summary {first}..{last}")
        ids[last] = event.overlay_id
        await stack.publisher.publish(event)
    await stack.commands.optimistic.catch_up(T, sid)
    asked: list[list[str]] = []
    real = overlays.summaries

    async def spy(conn: Any, tenant: str, session: str, ids: Sequence[str]) -> Any:
        asked.append(list(ids))
        return await real(conn, tenant, session, ids)

    monkeypatch.setattr(history, "summaries", spy)
    reads: list[dict[str, str | int]] = [{"leaf_id": "d", "max_bytes": 10**6}, {"leaf_id": "d", "truncate_older": 1}]
    for params in reads:
        r = await http.get(f"/v1/sessions/{sid}/history", params=params)
        assert r.status_code == 200, r.text
        shown = r.json()["messages"]
        assert [m["id"] for m in shown] == ["a", "compaction_" + ids["c"], "d"]
        assert shown[1]["parts"] == [{"type": "text", "text": "summary b..c"}]
    assert asked == [[ids["c"]], [ids["c"]]]
    r = await http.get(f"/v1/sessions/{sid}/history", params={"leaf_id": "x", "max_bytes": 10**6})
    assert [m["id"] for m in r.json()["messages"]] == ["a", "compaction_" + ids["x"]]
    assert asked[-1] == [ids["x"]]
