"""Small helpers shared by the HTTP end-to-end tests (no fixtures here; see conftest.py)."""

from __future__ import annotations

import json
import re
import uuid
from typing import Any, Final

import httpx

PROBLEM = "application/problem+json"


class _Omit:
    def __repr__(self) -> str:
        return "OMIT"


OMIT: Final = _Omit()
"""Leave ``parent_id`` out of the append body (the server then attaches to the latest leaf)."""


def new_sid(prefix: str = "e2e") -> str:
    """A fresh session id, never shared between tests."""
    return f"{prefix}-{uuid.uuid4().hex}"


def unique_word() -> str:
    """A random word of letters only (one plain ``asciiword`` token for the English parser)."""
    return "zq" + "".join(chr(ord("a") + int(c, 16)) for c in uuid.uuid4().hex[:12])


PROSE: Final = " we discussed the quarterly deployment plan and its rollout steps" * 6
"""Padding for messages a test compacts: a few of them are longer than the offline summarizer's
summary of them (a compaction that would not shrink the context is not recorded)."""


def msg(mid: str, text: str, role: str = "user") -> dict[str, Any]:
    return {"id": mid, "role": role, "parts": [{"type": "text", "text": text}]}


def append_body(message: dict[str, Any], parent: str | _Omit | None = OMIT) -> dict[str, Any]:
    body: dict[str, Any] = {"message": message}
    if not isinstance(parent, _Omit):
        body["parent_id"] = parent
    return body


async def append(
    client: httpx.AsyncClient,
    sid: str,
    message: dict[str, Any],
    parent: str | _Omit | None = OMIT,
    *,
    expect: int = 201,
) -> dict[str, Any]:
    """POST one message and check the status; returns the JSON answer ``{id, parent_id, seq, created}``."""
    r = await client.post(f"/v1/sessions/{sid}/messages", json=append_body(message, parent))
    assert r.status_code == expect, r.text
    out: dict[str, Any] = r.json()
    assert isinstance(out["seq"], int)
    return out


async def chain(client: httpx.AsyncClient, sid: str, mids: list[str]) -> int:
    """Append ``mids`` as one linear chain (omitted parents); returns the last seq."""
    seq = 0
    for mid in mids:
        seq = (await append(client, sid, msg(mid, f"text of {mid}")))["seq"]
    return seq


async def history(
    client: httpx.AsyncClient, sid: str, *, min_seq: int | None = None, leaf_id: str | None = None
) -> dict[str, Any]:
    params: dict[str, Any] = {}
    if min_seq is not None:
        params["min_seq"] = min_seq
    if leaf_id is not None:
        params["leaf_id"] = leaf_id
    r = await client.get(f"/v1/sessions/{sid}/history", params=params)
    assert r.status_code == 200, r.text
    out: dict[str, Any] = r.json()
    return out


async def history_ids(
    client: httpx.AsyncClient, sid: str, *, min_seq: int | None = None, leaf_id: str | None = None
) -> list[str]:
    h = await history(client, sid, min_seq=min_seq, leaf_id=leaf_id)
    return [m["id"] for m in h["messages"]]


async def events(client: httpx.AsyncClient, sid: str, **params: int) -> list[dict[str, Any]]:
    """The session's raw events, parsed from the NDJSON answer."""
    r = await client.get(f"/v1/sessions/{sid}/events", params=params)
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("application/x-ndjson")
    return [json.loads(line) for line in r.text.splitlines() if line.strip()]


async def stream_last_seq(client: httpx.AsyncClient) -> int:
    """The stream's last sequence as /metrics reports it: a global 'nothing was written' probe."""
    r = await client.get("/metrics")
    assert r.status_code == 200, r.text
    m = re.search(r"^chronicle_stream_last_seq (\S+)$", r.text, re.MULTILINE)
    assert m, r.text
    return int(float(m.group(1)))


def assert_problem(r: httpx.Response, status: int, code: str) -> dict[str, Any]:
    """An RFC 9457 problem with the given status and stable ``code``."""
    assert r.status_code == status, r.text
    assert r.headers["content-type"].startswith(PROBLEM), r.headers
    body: dict[str, Any] = r.json()
    assert body["code"] == code, body
    assert body["status"] == status, body
    assert isinstance(body.get("title"), str), body
    assert isinstance(body.get("type"), str), body
    return body


async def assert_full_last_page_is_last(client: httpx.AsyncClient, path: str, member: str, **params: Any) -> None:
    """Walk a paged list (``member``: its array) to its last page, then read that page again with
    ``limit`` its size: exactly full, it still says it is the last (``next_cursor`` null), where
    it named a next page that was empty."""
    cursor: Any = None
    while True:
        query = {**params, "limit": 500, **({"cursor": cursor} if cursor is not None else {})}
        r = await client.get(path, params=query)
        assert r.status_code == 200, r.text
        last = r.json()
        if last["next_cursor"] is None:
            break
        cursor = last["next_cursor"]
    assert last[member], "the walk needs a non-empty last page"
    query = {**params, "limit": len(last[member]), **({"cursor": cursor} if cursor is not None else {})}
    r = await client.get(path, params=query)
    assert r.status_code == 200, r.text
    again = r.json()
    assert again[member] == last[member]
    assert again["next_cursor"] is None
