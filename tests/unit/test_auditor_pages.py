"""The auditor's view reads a session's prompt versions, compactions and compaction failures
page after page (the API pages them): every item once, in order, each page asked for by the
previous one's ``next_cursor``."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

API_JS = Path(__file__).resolve().parents[2] / "services" / "api" / "auditor_static" / "api.js"

# A fake fetch that answers three pages of a list (the cursor selects the page) and records the
# URLs asked for; then the view's reader of a whole list.
SCRIPT = """
globalThis.location = { origin: "http://chronicle.test" };
globalThis.sessionStorage = { getItem: () => "key" };
const asked = [];
const pages = { "": [[1, 2], 2], "2": [[3, 4], 4], "4": [[5], null] };
globalThis.fetch = async (url) => {
  asked.push(url.pathname + url.search);
  const [items, next] = pages[url.searchParams.get("cursor") ?? ""];
  return { ok: true, json: async () => ({ prompts: items.map((version) => ({ version })), next_cursor: next }) };
};
const { everyItem } = await import(%s);
const items = await everyItem("/v1/sessions/s1/prompts", "prompts");
console.log(JSON.stringify({ items: items.map((p) => p.version), asked }));
"""


@pytest.mark.skipif(shutil.which("node") is None, reason="no node to run the auditor view's script")
def test_the_view_reads_every_page_of_a_sessions_list() -> None:
    script = SCRIPT % json.dumps(API_JS.as_uri())
    out = subprocess.run(
        ["node", "--input-type=module", "-e", script], capture_output=True, text=True, check=True, timeout=30
    )
    assert json.loads(out.stdout) == {
        "items": [1, 2, 3, 4, 5],
        "asked": ["/v1/sessions/s1/prompts", "/v1/sessions/s1/prompts?cursor=2", "/v1/sessions/s1/prompts?cursor=4"],
    }


def test_the_view_reads_these_lists_with_that_reader() -> None:
    """app.js reads the three lists with :func:`everyItem`, never a single ``get`` (one page)."""
    app = (API_JS.parent / "app.js").read_text()
    for route, key in (("compactions", "compactions"), ("prompts", "prompts"), ("compaction-failures", "failures")):
        assert re.search(r"everyItem\(`\$\{(S\.)?base\}/" + route + '`, "' + key + '"\\)', app), route
        assert not re.search(r"\bget\(`\$\{(S\.)?base\}/" + route + "`", app), route


# The second page answers 503: the reader throws the API's error, with the first page's items.
FAILING = """
globalThis.location = { origin: "http://chronicle.test" };
globalThis.sessionStorage = { getItem: () => "key" };
globalThis.fetch = async (url) => url.searchParams.get("cursor") === null
  ? { ok: true, json: async () => ({ prompts: [{ version: 1 }, { version: 2 }], next_cursor: 2 }) }
  : { ok: false, status: 503, json: async () => ({ code: "unavailable", detail: "restarting" }) };
const { ApiError, everyItem } = await import(%s);
try {
  await everyItem("/v1/sessions/s1/prompts", "prompts");
  console.log(JSON.stringify({ threw: false }));
} catch (e) {
  const loaded = e.loaded.map((p) => p.version);
  console.log(JSON.stringify({ api: e instanceof ApiError, status: e.status, code: e.code, loaded }));
}
"""


@pytest.mark.skipif(shutil.which("node") is None, reason="no node to run the auditor view's script")
def test_a_later_page_that_fails_throws_its_error_with_the_items_loaded_before() -> None:
    script = FAILING % json.dumps(API_JS.as_uri())
    out = subprocess.run(
        ["node", "--input-type=module", "-e", script], capture_output=True, text=True, check=True, timeout=30
    )
    assert json.loads(out.stdout) == {"api": True, "status": 503, "code": "unavailable", "loaded": [1, 2]}
