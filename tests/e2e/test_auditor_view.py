"""The auditor's view at /audit/ in a real headless browser (Debian's chromium driven by
Playwright): sign in, the sessions list, a branched and compacted session's tree, the time slider,
the prompt, context, compaction and quarantine panels, a 1,000-message session, and the erasures
list with an erased session's tombstones."""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime
from pathlib import Path

import httpx
import pytest
from playwright.async_api import Browser, Locator, Page, Route, async_playwright, expect

from bench.support import settings_env
from events.catalog import MessagesDeleted
from events.publisher import Publisher
from services.ops.localstack import free_port, wait_for_port
from services.settings import Settings, api_key_entry
from tests.conftest import KEYS, READ_ONLY_KEY, operator_nats
from tests.e2e.auditor_data import (
    BIG_TEXT_CHARS,
    ERASER,
    ERASER_READ_ONLY,
    LOAD_OUTPUT,
    MEMORY,
    QUIET,
    Seeded,
    erase,
    live_session,
    seed,
)
from tests.e2e.browser_support import ensure_chromium
from tests.e2e.helpers import msg, new_sid
from tests.integration.helpers import logged_message

pytestmark = [pytest.mark.browser, pytest.mark.timeout(300)]  # the first test may install chromium
DASH = "\N{EN DASH}"
SCREENSHOT = "CHRONICLE_AUDITOR_SCREENSHOT"
"""When set, the main view's screenshot is also copied to this path (docs/img/auditor.png)."""


@pytest.fixture(scope="module")
def view_api(api_settings: Settings, api_url: str) -> Iterator[tuple[str, Settings]]:
    """A second `chronicle api` on the e2e stack (its projector and database), with a 20,000-byte
    row cap so that a test message is stored capped, and the keys of two tenants of its own (the
    erasure tests')."""
    keys = [
        *api_settings.api_keys,
        api_key_entry(*ERASER),
        api_key_entry(ERASER[0], ERASER_READ_ONLY, read_only=True),
        api_key_entry(*QUIET, read_only=True),
    ]
    settings = api_settings.model_copy(update={"api_port": free_port(), "row_cap_bytes": 20_000, "api_keys": keys})
    proc = subprocess.Popen([sys.executable, "-m", "services.ops.cli", "api"], env=settings_env(settings))
    try:
        wait_for_port("127.0.0.1", settings.api_port, proc, "chronicle api", timeout=60)
        yield f"http://127.0.0.1:{settings.api_port}", settings
    finally:
        proc.terminate()
        proc.wait(timeout=20)


@pytest.fixture(scope="module")
async def view_client(view_api: tuple[str, Settings]) -> AsyncIterator[httpx.AsyncClient]:
    headers = {"Authorization": f"Bearer {KEYS['tenant-a']}"}
    async with httpx.AsyncClient(base_url=view_api[0], headers=headers, timeout=60) as c:
        yield c


@pytest.fixture(scope="module")
async def eraser(view_api: tuple[str, Settings]) -> AsyncIterator[httpx.AsyncClient]:
    """ERASER's full key: the erasure tests' sessions, and their erasures."""
    async with httpx.AsyncClient(
        base_url=view_api[0], headers={"Authorization": f"Bearer {ERASER[1]}"}, timeout=60
    ) as c:
        yield c


@pytest.fixture(scope="module")
async def seeded(view_client: httpx.AsyncClient, view_api: tuple[str, Settings]) -> Seeded:
    return await seed(view_client, view_api[1])


@pytest.fixture(scope="module")
async def other_tenant_sid(view_api: tuple[str, Settings]) -> str:
    sid = new_sid("audit-b")
    headers = {"Authorization": f"Bearer {KEYS['tenant-b']}"}
    async with httpx.AsyncClient(base_url=view_api[0], headers=headers, timeout=30) as c:
        r = await c.post("/v1/sessions", json={"id": sid, "name": "tenant b"})
        assert r.status_code == 201, r.text
    return sid


@pytest.fixture(scope="session")
async def browser() -> AsyncIterator[Browser]:
    path = ensure_chromium()
    async with async_playwright() as pw:
        b = await pw.chromium.launch(executable_path=str(path), args=["--no-sandbox", "--disable-gpu"])
        yield b
        await b.close()


@pytest.fixture
async def page(browser: Browser, view_api: tuple[str, Settings]) -> AsyncIterator[Page]:
    """A fresh tab (its own session storage); fails the test on any uncaught script error."""
    context = await browser.new_context(base_url=view_api[0], viewport={"width": 1440, "height": 1000})
    tab = await context.new_page()
    errors: list[str] = []
    tab.on("pageerror", lambda e: errors.append(str(e)))
    tab.on(
        "console",
        lambda m: errors.append(m.text) if m.type == "error" and "Failed to load resource" not in m.text else None,
    )
    yield tab
    await context.close()
    assert not errors, errors


async def sign_in(page: Page, key: str = KEYS["tenant-a"]) -> None:
    await page.goto("/audit/")
    await page.get_by_test_id("api-key").fill(key)
    await page.get_by_test_id("sign-in").click()


async def open_session(page: Page, sid: str) -> None:
    await sign_in(page)
    await page.get_by_test_id("session-filter").fill(sid)
    await page.locator(f'[data-testid="session-item"][data-sid="{sid}"] button').click()
    await expect(page.get_by_test_id("session-title")).to_have_text("Release audit")


def path_ids(page: Page) -> Locator:
    return page.locator('#path > [data-testid="message"]')


async def test_a_read_only_key_is_shown_its_tenant(page: Page, seeded: Seeded) -> None:
    """The key the README recommends for auditors: the view names its tenant (it asked GET
    /v1/nats, which refuses read-only keys, and showed only "signed in")."""
    await sign_in(page, READ_ONLY_KEY)
    await expect(page.get_by_test_id("session-item").first).to_be_visible()
    await expect(page.get_by_test_id("tenant-note")).to_have_text("tenant tenant-a (read-only key)")


async def test_sign_in_shows_only_the_tenants_sessions_newest_first_with_search(
    page: Page, seeded: Seeded, other_tenant_sid: str
) -> None:
    await sign_in(page, "not-a-key")
    await expect(page.get_by_test_id("signin-error")).to_have_text("That key was refused.")
    await expect(page.get_by_test_id("session-list")).to_be_hidden()
    await sign_in(page)
    items = page.get_by_test_id("session-item")
    await expect(items.first).to_be_visible()
    await expect(page.get_by_test_id("signin")).to_be_hidden()
    await expect(page.get_by_test_id("tenant-note")).to_have_text("tenant tenant-a")
    listed = [await i.get_attribute("data-sid") for i in await items.all()]
    assert {seeded.sid, seeded.older_sid} <= set(listed)
    assert listed.index(seeded.sid) < listed.index(seeded.older_sid)  # newest first
    assert other_tenant_sid not in listed  # another tenant's session is never shown
    assert await page.evaluate("sessionStorage.getItem('chronicle.apiKey')") == KEYS["tenant-a"]

    await page.get_by_test_id("session-filter").fill(seeded.older_sid)
    await expect(items).to_have_count(1)
    await expect(items.first).to_have_attribute("data-sid", seeded.older_sid)

    await page.get_by_test_id("session-filter").fill(seeded.word)  # a word of one message
    await page.get_by_test_id("session-filter").press("Enter")
    await expect(page.get_by_test_id("search-note")).to_contain_text("1 messages match")
    await expect(items).to_have_count(1)
    await expect(items.first).to_have_attribute("data-sid", seeded.sid)

    await page.reload()  # the key stays for this tab's session
    await expect(page.get_by_test_id("session-item").first).to_be_visible()
    await page.get_by_test_id("sign-out").click()
    await expect(page.get_by_test_id("signin")).to_be_visible()
    await expect(page.get_by_test_id("session-list")).to_be_hidden()
    assert await page.evaluate("sessionStorage.getItem('chronicle.apiKey')") is None


async def test_a_session_deleted_after_listing_shows_the_problem(page: Page, view_client: httpx.AsyncClient) -> None:
    sid = new_sid("audit-gone")
    r = await view_client.post("/v1/sessions", json={"id": sid, "name": "soon gone"})
    assert r.status_code == 201, r.text
    await sign_in(page)
    await page.get_by_test_id("session-filter").fill(sid)
    item = page.locator(f'[data-testid="session-item"][data-sid="{sid}"] button')
    await expect(item).to_be_visible()
    gone = await view_client.delete(f"/v1/sessions/{sid}")
    assert gone.status_code == 200, gone.text
    await view_client.get("/v1/sessions", params={"min_seq": gone.json()["seq"], "limit": 1})
    await item.click()
    await expect(page.get_by_test_id("session-error")).to_contain_text("404 session_not_found")
    await expect(page.get_by_test_id("path")).to_be_hidden()


async def test_a_branched_compacted_session_shows_its_tree_overlay_and_markers(
    page: Page, seeded: Seeded, tmp_path: Path
) -> None:
    await open_session(page, seeded.sid)
    branches = page.get_by_test_id("branch")
    await expect(branches).to_have_count(2)
    assert [await b.get_attribute("data-leaf") for b in await branches.all()] == ["m8", "m3b"]  # newest first
    await expect(page.locator('[data-testid="branch"][aria-pressed="true"]')).to_have_attribute("data-leaf", "m8")

    # the latest branch: the head, the overlay over the range it replaces, the tail
    await expect(path_ids(page)).to_have_count(4)
    assert [await m.get_attribute("data-id") for m in await path_ids(page).all()] == ["m0", "m6", "m7", "m8"]
    overlay = page.get_by_test_id("overlay")
    await expect(overlay).to_have_count(1)
    await expect(overlay).to_have_attribute("data-overlay", seeded.overlay_id)
    await expect(overlay).to_contain_text("replaces 5 messages, m1 … m5")
    assert (await overlay.get_by_test_id("summary").inner_text()).strip()
    assert await page.locator("#path > li").evaluate_all("els => els.map(e => e.dataset.id || 'overlay')") == [
        "m0",
        "overlay",
        "m6",
        "m7",
        "m8",
    ]

    covered = overlay.get_by_test_id("covered")
    await expect(covered).to_be_hidden()
    await overlay.get_by_test_id("toggle-covered").click()
    await expect(covered.get_by_test_id("message")).to_have_count(5)
    # m1's tool call: its output was unloaded, the marker stands in for it
    m1 = covered.locator('[data-id="m1"]')
    await expect(m1.get_by_test_id("unload-marker")).to_have_text("[skill unloaded: deploy.md]")
    await expect(m1).to_contain_text("skill unloaded: deploy.md")
    await expect(m1).not_to_contain_text(LOAD_OUTPUT)
    await expect(m1).to_contain_text("load_context")
    # text is shown as text, never as markup
    m2 = covered.locator('[data-id="m2"]')
    await expect(m2).to_contain_text("<b>bold?</b>")
    await expect(m2.locator("b", has_text="bold?")).to_have_count(0)
    # the turns under each prompt version
    await expect(page.locator('#path [data-id="m0"] .badge')).to_have_count(0)  # before the first freeze
    await expect(m1).to_contain_text("prompt v1")
    await expect(page.locator('#path > [data-id="m8"]')).to_contain_text("prompt v3")  # re-rendered on compaction

    # the capped message links to its original
    m8 = page.locator('#path > [data-id="m8"]')
    await expect(m8.get_by_test_id("capped")).to_be_visible()
    await m8.get_by_test_id("show-original").click()
    await expect(m8.get_by_test_id("original")).to_contain_text("x" * 1000)
    original = await m8.get_by_test_id("original").inner_text()
    assert original.count("x") >= BIG_TEXT_CHARS

    shot = tmp_path / "auditor.png"
    await page.get_by_test_id("branch").first.click()  # collapse the covered list again for the picture
    await page.get_by_test_id("session-filter").fill("")  # and list every session
    await page.screenshot(path=str(shot), full_page=False)
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    if os.environ.get(SCREENSHOT):
        shutil.copyfile(shot, os.environ[SCREENSHOT])

    # switch to the other branch: its own path, and the overlay of the first does not apply
    await page.locator('[data-testid="branch"][data-leaf="m3b"]').click()
    await expect(page.locator('[data-testid="branch"][aria-pressed="true"]')).to_have_attribute("data-leaf", "m3b")
    await expect(path_ids(page)).to_have_count(4)
    assert [await m.get_attribute("data-id") for m in await path_ids(page).all()] == ["m0", "m1", "m2", "m3b"]
    await expect(page.get_by_test_id("overlay")).to_have_count(0)
    # and back through the switch at the fork
    switch = page.locator('#path > [data-id="m3b"]').get_by_test_id("branch-switch")
    await expect(switch).to_contain_text("branch 1/2")
    await switch.get_by_test_id("branch-next").click()
    await expect(page.locator('[data-testid="branch"][aria-pressed="true"]')).to_have_attribute("data-leaf", "m8")
    await expect(page.get_by_test_id("overlay")).to_have_count(1)


async def asof_ids(page: Page, seq: int) -> list[str]:
    await expect(page.get_by_test_id("asof")).to_have_attribute("data-seq", str(seq))
    await expect(page.get_by_test_id("asof")).to_have_attribute("aria-busy", "false")
    ids: list[str] = await page.get_by_test_id("asof-message").evaluate_all("els => els.map(e => e.dataset.id)")
    return ids


async def test_the_time_slider_shows_history_context_and_prompt_as_of_a_sequence(page: Page, seeded: Seeded) -> None:
    await open_session(page, seeded.sid)
    await page.get_by_test_id("tab-timeline").click()
    rows = page.get_by_test_id("event")
    await expect(rows).to_have_count(seeded.events)
    await expect(rows.last).to_contain_text("refused: not_json")  # the quarantined event, in its place

    # now: the compacted latest branch, the written block, the refreshed prompt
    now = await asof_ids(page, seeded.seq_last)
    assert [now[0], now[1][: len("compaction_")], now[-1]] == ["m0", "compaction_", "m8"]
    memory = page.get_by_test_id("asof-context").locator('[data-label="memory"]')
    await expect(memory).to_contain_text(MEMORY)
    await expect(memory.get_by_test_id("budget")).to_contain_text("/ 200 tokens")
    await expect(page.get_by_test_id("asof-prompt")).to_contain_text("v3 (seq")
    await expect(page.get_by_test_id("asof-prompt")).to_contain_text(MEMORY)

    # the sequence box: right after m7, before the block write, the refresh and the compaction
    await page.get_by_test_id("asof-seq").fill(str(seeded.seq_m7))
    await page.get_by_test_id("asof-seq").press("Tab")
    assert await asof_ids(page, seeded.seq_m7) == ["m0", "m1", "m2", "m3", "m4", "m5", "m6", "m7"]
    await expect(memory).not_to_contain_text(MEMORY)
    await expect(memory.get_by_test_id("budget")).to_contain_text("0 / 200 tokens")
    await expect(page.get_by_test_id("asof-prompt")).to_contain_text("v1 (seq")
    await expect(page.get_by_test_id("asof-prompt")).not_to_contain_text(MEMORY)
    current = page.locator(f'[data-testid="event"][data-seq="{seeded.seq_m7}"]')
    await expect(current).to_have_class(re.compile("current"))
    await expect(current).to_contain_text("message.appended")
    await expect(current).to_contain_text("assistant")  # who: the message's role
    await expect(current).to_contain_text("m7 ← m6")  # what: the message and its parent
    cells: list[str | re.Pattern[str]] = [
        str(seeded.seq_m7),
        "message.appended",
        re.compile(r"^\d{4}-\d\d-\d\d "),
        "assistant",
        "m7 ← m6",
    ]
    await expect(current.locator("td")).to_have_text(cells)  # each under its heading
    event = json.loads(await page.get_by_test_id("asof-event").text_content() or "")
    assert (event["seq"], logged_message(event["event"]).message_id) == (seeded.seq_m7, "m7")
    later = page.locator('[data-testid="event"].after')
    assert await later.count() > 0  # events after the position are greyed

    # the slider: its first event (the session's creation), then one step on (the configuration)
    slider = page.get_by_test_id("asof-slider")
    await slider.focus()
    await slider.press("Home")
    assert await asof_ids(page, seeded.seq_created) == []
    await expect(page.get_by_test_id("asof-prompt")).to_have_text("(no prompt recorded yet)")
    await expect(page.get_by_test_id("asof-context").get_by_test_id("block")).to_have_count(0)
    await slider.press("ArrowRight")
    await expect(page.get_by_test_id("asof-note")).to_contain_text("event 2 of")
    await expect(page.get_by_test_id("asof-note")).to_contain_text("session.configured")
    await expect(page.get_by_test_id("asof-context").get_by_test_id("block")).to_have_count(2)
    await slider.press("End")
    assert (await asof_ids(page, seeded.seq_last))[1].startswith("compaction_")


async def test_the_timeline_shows_when_the_log_stored_each_event_not_the_time_its_publisher_wrote(
    page: Page, view_client: httpx.AsyncClient, view_api: tuple[str, Settings]
) -> None:
    """A tenant publishing straight to the stream writes any ``occurred_at`` (docs/http-api.md, the
    log): the time column is the log's ``stored_at``, with the publisher's time beside it when they
    are far apart (it showed the publisher's 2001 date as the event's time, and the log's nowhere)."""
    sid = new_sid("audit-clock")
    r = await view_client.post("/v1/sessions", json={"id": sid, "name": "Backdated"})
    assert r.status_code == 201, r.text
    nc = await operator_nats(view_api[1].nats_url)
    try:
        backdated = datetime(2001, 2, 3, 4, 5, 6, tzinfo=UTC)
        ack = await Publisher(nc.jetstream(), view_api[1].layout()).publish(
            MessagesDeleted(tenant="tenant-a", session=sid, message_ids=["none"], occurred_at=backdated)
        )
    finally:
        await nc.close()
    lines = [json.loads(x) for x in (await view_client.get(f"/v1/sessions/{sid}/events")).text.splitlines() if x]
    stored = {line["seq"]: line["stored_at"] for line in lines}
    assert lines[-1]["event"]["occurred_at"].startswith("2001-02-03")

    await sign_in(page)
    await page.get_by_test_id("session-filter").fill(sid)
    await page.locator(f'[data-testid="session-item"][data-sid="{sid}"] button').click()
    await expect(page.get_by_test_id("session-title")).to_have_text("Backdated")  # open before its tab is chosen
    await page.get_by_test_id("tab-timeline").click()
    forged = page.locator(f'[data-testid="event"][data-seq="{ack.seq}"]').get_by_test_id("event-time")
    stored_at = stored[ack.seq].replace("T", " ").split(".")[0]
    await expect(forged).to_contain_text(stored_at)
    await expect(forged.get_by_test_id("event-occurred")).to_have_text("publisher says 2001-02-03 04:05:06Z")
    created = page.locator(f'[data-testid="event"][data-seq="{r.json()["seq"]}"]').get_by_test_id("event-time")
    await expect(created).to_contain_text(stored[r.json()["seq"]].replace("T", " ").split(".")[0])
    await expect(created.get_by_test_id("event-occurred")).to_have_count(0)  # the API's own: the same clock
    await expect(page.get_by_test_id("asof-note")).to_contain_text(f"stored {stored_at}")


async def test_prompt_context_compaction_and_quarantine_panels(page: Page, seeded: Seeded) -> None:
    await open_session(page, seeded.sid)
    await page.get_by_test_id("tab-prompts").click()
    versions = page.get_by_test_id("prompt-version")
    await expect(versions).to_have_count(3)
    # v1 (the freeze) was in force for m1 … m7 on both branches; v2 (the refresh after the block
    # write) for none; v3 (re-rendered by the compaction) for m8
    await expect(versions.nth(0)).to_contain_text("freeze")
    await expect(versions.nth(0).get_by_test_id("prompt-turns")).to_contain_text("In force for 8 turns")
    await expect(versions.nth(0).get_by_test_id("prompt-turns")).to_contain_text("assistant:m3b")
    await expect(versions.nth(1)).to_contain_text("refresh")
    await expect(versions.nth(1).get_by_test_id("prompt-turns")).to_have_text("In force for no turns yet.")
    await expect(versions.nth(2)).to_contain_text("compaction")
    await expect(versions.nth(2).get_by_test_id("prompt-turns")).to_have_text("In force for 1 turn: assistant:m8 ")

    await page.get_by_test_id("tab-context").click()
    memory = page.get_by_test_id("context").locator('[data-label="memory"]')
    await expect(memory).to_contain_text(MEMORY)
    await expect(memory.get_by_test_id("budget")).to_contain_text(re.compile(r"\d+ / 200 tokens \(\d+%\)"))
    await expect(page.get_by_test_id("context").locator('[data-label="soul"]')).to_contain_text("readonly")

    await page.get_by_test_id("tab-compactions").click()
    await expect(page.get_by_test_id("overlay-table").locator("tbody tr")).to_have_count(1)
    await expect(page.get_by_test_id("overlay-table")).to_contain_text("m1 … m5")
    failures = page.get_by_test_id("failure-table").locator("tbody tr")
    await expect(failures).to_have_count(1)
    await expect(failures.first).to_contain_text("HTTP 503")

    await page.get_by_test_id("tab-quarantine").click()
    rows = page.get_by_test_id("quarantine-table").locator("tbody tr")
    await expect(rows).to_have_count(1)
    await expect(rows.first).to_contain_text("not_json")
    await expect(rows.first).to_contain_text(str(seeded.seq_last))


OUTAGE = "503 unavailable: the API is restarting"


async def answer_503(route: Route) -> None:
    body = json.dumps({"code": "unavailable", "detail": "the API is restarting"})
    await route.fulfill(status=503, content_type="application/problem+json", body=body)


async def test_a_list_that_fails_to_load_shows_the_failure_never_none(page: Page, seeded: Seeded) -> None:
    """The compactions and compaction failures answer 503, and the prompts' first page (one
    version) comes but the next one answers 503: each panel shows the failure, never "None." or
    "No system prompt", and the prompt version that came stays shown with the failure after it."""

    async def one_page_then_503(route: Route) -> None:
        if "cursor=" in route.request.url:
            await answer_503(route)
        else:
            await route.continue_(url=route.request.url + ("&" if "?" in route.request.url else "?") + "limit=1")

    await page.route("**/v1/sessions/*/prompts*", one_page_then_503)
    await page.route("**/v1/sessions/*/compactions*", answer_503)
    await page.route("**/v1/sessions/*/compaction-failures*", answer_503)
    await open_session(page, seeded.sid)
    meta = page.get_by_test_id("session-meta")
    await expect(meta).to_contain_text("0 overlays (not all loaded)")
    await expect(meta).to_contain_text("1 prompt version (not all loaded)")

    await page.get_by_test_id("tab-prompts").click()
    await expect(page.get_by_test_id("prompt-version")).to_have_count(1)
    await expect(page.get_by_test_id("prompt-version").first).to_contain_text("freeze")
    await expect(page.get_by_test_id("prompts-error")).to_have_text(
        f"\N{HORIZONTAL ELLIPSIS} and loading more failed: {OUTAGE}"
    )
    await expect(page.get_by_test_id("prompts")).not_to_contain_text("No system prompt")

    await page.get_by_test_id("tab-compactions").click()
    await expect(page.get_by_test_id("overlays-error")).to_have_text(f"Could not load the compactions: {OUTAGE}")
    await expect(page.get_by_test_id("failures-error")).to_have_text(
        f"Could not load the compaction failures: {OUTAGE}"
    )
    for panel in ("overlays", "failures"):
        await expect(page.get_by_test_id(panel)).not_to_contain_text("None.")


async def test_a_thousand_message_session_is_paged(page: Page, view_client: httpx.AsyncClient) -> None:
    sid = new_sid("audit-big")
    last = 0
    for start in (0, 500):
        batch = [
            msg(f"b{i}", f"message {i} " + "words " * 30, "user" if i % 2 else "assistant")
            for i in range(start, start + 500)
        ]
        r = await view_client.post(f"/v1/sessions/{sid}/messages:batch", json={"messages": batch})
        assert r.status_code == 201, r.text
        last = r.json()["seq"]
    r = await view_client.get(f"/v1/sessions/{sid}/tree", params={"min_seq": last, "limit": 1})
    assert r.status_code == 200, r.text

    await sign_in(page)
    await page.get_by_test_id("session-filter").fill(sid)
    began = time.monotonic()
    await page.locator(f'[data-testid="session-item"][data-sid="{sid}"] button').click()
    await expect(page.get_by_test_id("path-range")).to_have_text(f"1{DASH}100 of 1000")
    opened = time.monotonic() - began
    await expect(path_ids(page)).to_have_count(100)  # one page in the document, not a thousand
    assert opened < 15, f"opening a 1,000-message session took {opened:.1f} s"
    await page.get_by_test_id("path-last").click()
    await expect(page.get_by_test_id("path-range")).to_have_text(f"901{DASH}1000 of 1000")
    await expect(path_ids(page).last).to_have_attribute("data-id", "b999")

    await page.get_by_test_id("tab-timeline").click()
    await expect(page.get_by_test_id("events-range")).to_have_text(f"901{DASH}1000 of 1000")  # the page of "now"
    await expect(page.get_by_test_id("event")).to_have_count(100)
    await expect(page.get_by_test_id("asof-history-note")).to_contain_text(
        "1000 messages on the latest branch, the last 50 shown"
    )
    await expect(page.get_by_test_id("asof-message")).to_have_count(50)


async def test_a_session_erased_after_opening_shows_its_events_as_tombstones_on_the_timeline(
    page: Page, view_client: httpx.AsyncClient
) -> None:
    """(A tombstone line, neither an event nor a refusal, made the timeline throw.)"""
    sid = new_sid("audit-erased")
    r = await view_client.post("/v1/sessions", json={"id": sid, "name": "soon erased"})
    assert r.status_code == 201, r.text
    r = await view_client.post(f"/v1/sessions/{sid}/messages", json={"message": msg("m1", "erased text")})
    assert r.status_code == 201, r.text
    await sign_in(page)
    await page.get_by_test_id("session-filter").fill(sid)
    await page.locator(f'[data-testid="session-item"][data-sid="{sid}"] button').click()
    await expect(page.get_by_test_id("session-title")).to_have_text("soon erased")
    erased = await view_client.post(f"/v1/sessions/{sid}:erase")
    assert erased.status_code == 200, erased.text
    await page.get_by_test_id("tab-timeline").click()
    rows = page.get_by_test_id("event")
    await expect(rows).to_have_count(3)  # created, appended (tombstones), then session.erased itself
    await expect(rows.nth(0)).to_contain_text("erased: session.created")
    await expect(rows.nth(1)).to_contain_text("erased: message.appended")
    await expect(rows.nth(1)).not_to_contain_text("erased text")
    await expect(rows.nth(2)).to_contain_text("session.erased")


ERASURES_PAGE = 50
"""The erasures the view lists at once (app.js's ERASURES_PAGE)."""
PUBLISH_AT_ONCE = 8


async def show_erasures(page: Page, key: str = ERASER_READ_ONLY) -> Locator:
    """Sign in with ``key`` (by default ERASER's read-only key, as an auditor) and open the
    erasures list: its rows."""
    await sign_in(page, key)
    await expect(page.get_by_test_id("signin")).to_be_hidden()
    await page.get_by_test_id("show-erasures").click()
    await expect(page.get_by_test_id("erasures-view")).to_be_visible()
    await expect(page.get_by_test_id("session")).to_be_hidden()
    return page.get_by_test_id("erasure")


async def listed_erasures(client: httpx.AsyncClient) -> list[dict[str, object]]:
    """Every erasure of the client's tenant, as the API lists them (newest first)."""
    out: list[dict[str, object]] = []
    cursor = None
    while True:
        r = await client.get("/v1/erasures", params={"limit": 500, **({"cursor": cursor} if cursor else {})})
        assert r.status_code == 200, r.text
        out += r.json()["erasures"]
        cursor = r.json()["next_cursor"]
        if cursor is None:
            return out


async def listed_session(page: Page, sid: str) -> Locator:
    """Signed in with ERASER's read-only key, the sessions list filtered to ``sid``: its button."""
    await sign_in(page, ERASER_READ_ONLY)
    await page.get_by_test_id("session-filter").fill(sid)
    item = page.locator(f'[data-testid="session-item"][data-sid="{sid}"] button')
    await expect(item).to_be_visible()
    return item


async def expect_erased_timeline(page: Page, sid: str, seq: int, reason: str) -> None:
    """The erased session's page: the note (who, why), the timeline alone, its tombstones, and the
    position at its session.erased event."""
    await expect(page.get_by_test_id("session")).to_be_visible()
    await expect(page.get_by_test_id("session-title")).to_have_text(sid)
    note = page.get_by_test_id("session-erased")
    await expect(note).to_be_visible()
    await expect(note).to_contain_text(f"requested by tenant:{ERASER[0]} key:")
    await expect(note.get_by_test_id("erased-reason")).to_have_text(reason)
    await expect(page.get_by_test_id("session-error")).to_have_text("")
    await expect(page.get_by_test_id("tab-timeline")).to_have_attribute("aria-selected", "true")
    for tab in ("messages", "prompts", "context", "compactions", "quarantine"):
        await expect(page.get_by_test_id(f"tab-{tab}")).to_be_disabled()
    rows = page.get_by_test_id("event")
    await expect(rows.nth(0)).to_contain_text("erased: session.created")
    await expect(rows.nth(1)).to_contain_text("erased: message.appended")
    current = page.locator(f'[data-testid="event"][data-seq="{seq}"]')
    await expect(current).to_have_class(re.compile("current"))
    await expect(current).to_contain_text("session.erased")
    await expect(current).to_contain_text(f"tenant:{ERASER[0]} key:")  # who: who asked
    await expect(current).to_contain_text(reason)  # what: why
    await expect(page.get_by_test_id("asof")).to_have_attribute("data-seq", str(seq))
    await expect(page.get_by_test_id("asof-history-note")).to_contain_text("erased")
    assert json.loads(await page.get_by_test_id("asof-event").text_content() or "")["seq"] == seq
    await expect(page.locator("body")).not_to_contain_text("soon erased text")  # nothing of its content


async def test_the_erasures_list_shows_who_erased_what_when_and_why_newest_first(
    page: Page, eraser: httpx.AsyncClient
) -> None:
    sids = [await live_session(eraser, new_sid("audit-erase")) for _ in range(3)]
    seqs = [
        await erase(eraser, sids[0], "ticket OPS-1"),
        await erase(eraser, sids[1]),  # no reason given
        await erase(eraser, sids[2], "retention policy"),
    ]
    listed = {str(x["session_id"]): x for x in await listed_erasures(eraser)}
    rows = await show_erasures(page)
    await expect(rows.first).to_be_visible()
    assert [await r.get_attribute("data-sid") for r in (await rows.all())[:3]] == sids[::-1]  # newest first
    for sid, seq, reason in zip(sids, seqs, ["ticket OPS-1", "not recorded", "retention policy"], strict=True):
        row = page.locator(f'[data-testid="erasure"][data-sid="{sid}"]')
        requested_by = str(listed[sid]["requested_by"])
        assert requested_by.startswith(f"tenant:{ERASER[0]} key:")
        await expect(row.get_by_test_id("erasure-sid")).to_have_text(sid)
        await expect(row).to_contain_text(requested_by)
        await expect(row.get_by_test_id("erasure-reason")).to_have_text(reason)
        await expect(row.get_by_test_id("erasure-seq")).to_have_text(str(seq))
        erased_at = str(listed[sid]["erased_at"])
        await expect(row).to_contain_text(erased_at[:10])  # its date (the time, to the second, in UTC)
    await expect(page.locator(f'[data-sid="{sids[1]}"] .not-recorded')).to_have_count(1)  # only its reason

    # a seq shows the session's session.erased event among its tombstones on its timeline
    await page.locator(f'[data-testid="erasure"][data-sid="{sids[2]}"]').get_by_test_id("erasure-seq").click()
    await expect_erased_timeline(page, sids[2], seqs[2], "retention policy")
    # and back: the list as it was
    await page.get_by_test_id("show-erasures").click()
    await expect(page.get_by_test_id("show-erasures")).to_have_attribute("aria-pressed", "true")
    await expect(rows.first).to_have_attribute("data-sid", sids[2])


async def test_an_erased_session_picked_from_the_sessions_list_says_it_is_erased(
    page: Page, eraser: httpx.AsyncClient
) -> None:
    sid = await live_session(eraser, new_sid("audit-picked"))
    item = await listed_session(page, sid)
    seq = await erase(eraser, sid, "user request")  # after the list was loaded
    await item.click()
    await expect_erased_timeline(page, sid, seq, "user request")
    await expect(page.get_by_test_id("event")).to_have_count(3)  # created, appended (tombstones), erased


async def test_an_erased_session_with_an_event_after_its_erasure_still_shows_its_record(
    page: Page, eraser: httpx.AsyncClient, view_api: tuple[str, Settings]
) -> None:
    """The session's newest event is not its session.erased event (something was published on its
    subject later): the view finds its record in the erasures list."""
    sid = await live_session(eraser, new_sid("audit-after"))
    item = await listed_session(page, sid)
    seq = await erase(eraser, sid, "after the fact")
    settings = view_api[1]
    nc = await operator_nats(settings.nats_url)
    try:
        subject = settings.layout().session_subject(ERASER[0], sid)
        later = await nc.jetstream().publish(subject, b"published after the erasure", stream=settings.stream)
    finally:
        await nc.close()
    r = await eraser.get(f"/v1/sessions/{sid}/last-seq")
    assert r.json()["seq"] == later.seq > seq
    await item.click()
    await expect_erased_timeline(page, sid, seq, "after the fact")
    later_row = page.locator(f'[data-testid="event"][data-seq="{later.seq}"]')
    await expect(later_row).to_contain_text("erased: event")  # a tombstone too
    await expect(later_row).to_have_class(re.compile("after"))


async def test_erasures_are_paged_with_more_and_a_failed_page_can_be_asked_again(
    page: Page, eraser: httpx.AsyncClient
) -> None:
    slots = asyncio.Semaphore(PUBLISH_AT_ONCE)

    async def one(i: int) -> None:
        async with slots:
            sid = await live_session(eraser, new_sid(f"audit-page{i}"))
            await erase(eraser, sid, f"batch {i}")

    await asyncio.gather(*(one(i) for i in range(ERASURES_PAGE + 2)))
    expected = [str(x["session_id"]) for x in await listed_erasures(eraser)]
    assert len(expected) > ERASURES_PAGE

    rows = await show_erasures(page)
    await expect(rows).to_have_count(ERASURES_PAGE)
    await expect(page.get_by_test_id("erasures-note")).to_have_text(f"{ERASURES_PAGE} erasures shown, more to load")
    more = page.get_by_test_id("more-erasures")
    await expect(more).to_be_visible()

    # the next page fails (the key was revoked meanwhile): the problem, the rows kept, "more" again
    await page.evaluate("sessionStorage.setItem('chronicle.apiKey', 'revoked-key')")
    await more.click()
    await expect(page.get_by_test_id("erasures-error")).to_contain_text("401")
    await expect(rows).to_have_count(ERASURES_PAGE)
    await expect(more).to_be_enabled()
    await page.evaluate(f"sessionStorage.setItem('chronicle.apiKey', {json.dumps(ERASER_READ_ONLY)})")

    while len(expected) > await rows.count():
        shown = await rows.count()
        await more.click()
        await expect(rows).to_have_count(min(len(expected), shown + ERASURES_PAGE))
    await expect(page.get_by_test_id("erasures-error")).to_have_text("")
    await expect(more).to_be_hidden()
    await expect(page.get_by_test_id("erasures-note")).to_have_text(f"{len(expected)} erasures shown")
    assert await rows.evaluate_all("els => els.map(e => e.dataset.sid)") == expected


async def test_erasure_reasons_and_session_ids_are_shown_as_text_never_as_markup(
    page: Page, eraser: httpx.AsyncClient
) -> None:
    sid = "<img src=x onerror=window.__pwned=1> " + new_sid("audit-markup")
    reason = '<img src=x onerror="window.__pwned=2"><b>bold?</b>'
    seq = await erase(eraser, await live_session(eraser, sid), reason)
    rows = await show_erasures(page)
    first = rows.first
    await expect(first).to_have_attribute("data-sid", sid)
    await expect(first.get_by_test_id("erasure-sid")).to_have_text(sid)
    await expect(first.get_by_test_id("erasure-reason")).to_have_text(reason)
    await expect(page.locator("img")).to_have_count(0)  # no element was made of either
    await expect(page.locator("#erasures b", has_text="bold?")).to_have_count(0)

    await first.get_by_test_id("erasure-seq").click()
    await expect_erased_timeline(page, sid, seq, reason)
    await expect(page.locator("img")).to_have_count(0)
    await expect(page.locator("#session b", has_text="bold?")).to_have_count(0)
    assert await page.evaluate("window.__pwned") is None


async def test_a_tenant_without_erasures_sees_an_empty_list(page: Page) -> None:
    rows = await show_erasures(page, QUIET[1])
    await expect(page.get_by_test_id("erasure-table")).to_have_text("No erasures recorded for this tenant.")
    await expect(rows).to_have_count(0)
    await expect(page.get_by_test_id("more-erasures")).to_be_hidden()
    await expect(page.get_by_test_id("erasures-note")).to_have_text("")
    await expect(page.get_by_test_id("erasures-error")).to_have_text("")


async def test_an_erasures_list_the_api_refuses_shows_the_problem_and_reloads(page: Page) -> None:
    await sign_in(page, ERASER_READ_ONLY)
    await expect(page.get_by_test_id("signin")).to_be_hidden()
    await page.evaluate("sessionStorage.setItem('chronicle.apiKey', 'revoked-key')")
    await page.get_by_test_id("show-erasures").click()
    await expect(page.get_by_test_id("erasures-error")).to_contain_text("401")
    await expect(page.get_by_test_id("erasure-table")).to_have_count(0)
    await page.evaluate(f"sessionStorage.setItem('chronicle.apiKey', {json.dumps(ERASER_READ_ONLY)})")
    await page.get_by_test_id("reload-erasures").click()
    await expect(page.get_by_test_id("erasure-table")).to_be_visible()
    await expect(page.get_by_test_id("erasures-error")).to_have_text("")
