"""Session config over HTTP: round trip, replacement, and every invalid config refused with a
problem+json and nothing written."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from services.settings import Settings
from tests.e2e.context_support import configure, context, events, new_bucket, problem, sid

INVALID: dict[str, tuple[Any, str]] = {
    "duplicate-labels": (
        {"blocks": [{"kind": "writable", "label": "memory"}, {"kind": "searchable", "label": "memory"}]},
        "duplicate block labels: memory",
    ),
    "duplicate-history-label": (
        {"blocks": [{"kind": "writable", "label": "past"}], "searchable_history": "past"},
        "duplicate block labels: past",
    ),
    "unknown-kind": ({"blocks": [{"kind": "episodic", "label": "x"}]}, "blocks.0"),
    "missing-kind": ({"blocks": [{"label": "x"}]}, "blocks.0"),
    "negative-budget": ({"blocks": [{"kind": "writable", "label": "m", "max_tokens": -1}]}, "max_tokens"),
    "zero-budget": ({"blocks": [{"kind": "writable", "label": "m", "max_tokens": 0}]}, "max_tokens"),
    "budget-not-a-number": ({"blocks": [{"kind": "writable", "label": "m", "max_tokens": "lots"}]}, "max_tokens"),
    "missing-bucket": ({"blocks": [{"kind": "skills", "label": "skills"}]}, "bucket"),
    "invalid-bucket-name": ({"blocks": [{"kind": "skills", "label": "skills", "bucket": "No_Such"}]}, "bucket"),
    # found by schemathesis: a source's bucket went unchecked to the S3 client, which raised (500)
    "invalid-source-bucket-name": (
        {"blocks": [{"kind": "readonly", "label": "r", "source": {"bucket": "A\u00b5\u00e3\u00a3", "key": "k"}}]},
        "invalid bucket name",
    ),
    "content-and-source": (
        {
            "blocks": [
                {"kind": "readonly", "label": "r", "content": "a", "source": {"bucket": "docs-bucket", "key": "k"}}
            ]
        },
        "either content or source",
    ),
    "bad-label": (
        {"blocks": [{"kind": "writable", "label": "two words"}]},
        "blocks.0.writable.label: must be 1 to 64 characters, each an ASCII letter, a digit, '_' or '-'",
    ),
    "bad-searchable-history-label": (
        {"blocks": [], "searchable_history": "-history"},
        "searchable_history: must be 1 to 64 characters, each an ASCII letter, a digit, '_' or '-'",
    ),
    "unknown-field": ({"blocks": [{"kind": "writable", "label": "m", "size": 3}]}, "size"),
    "unknown-top-level-field": ({"blocks": [], "blokcs": []}, "blokcs"),
    "blocks-not-a-list": ({"blocks": {"kind": "writable", "label": "m"}}, "blocks"),
    "bad-compaction": ({"blocks": [], "compaction": {"protect_head": -1}}, "protect_head"),
    # the compaction state keeps it as an integer: 2**31 was acknowledged and then quarantined
    "compact-after-past-int32": ({"blocks": [], "compaction": {"compact_after": 2**31}}, "compact_after"),
}


@pytest.mark.parametrize("case", INVALID.values(), ids=INVALID.keys())
async def test_invalid_configs(client: httpx.AsyncClient, case: tuple[Any, str]) -> None:
    body, needle = case
    s = sid()
    r = await client.put(f"/v1/sessions/{s}/config", json=body)
    detail = problem(r, 422, "invalid_config")["detail"]
    assert needle in detail
    assert await events(client, s) == []
    problem(await client.get(f"/v1/sessions/{s}/config"), 404, "session_not_found")  # nothing was made


@pytest.mark.parametrize("body", [[], "blocks", 3, None], ids=["list", "string", "number", "null"])
async def test_config_body_must_be_an_object(client: httpx.AsyncClient, body: Any) -> None:
    s = sid()
    r = await client.put(f"/v1/sessions/{s}/config", json=body)
    assert 400 <= r.status_code < 500, r.text
    assert r.headers["content-type"].startswith("application/problem+json")
    assert await events(client, s) == []


async def test_bucket_must_exist(client: httpx.AsyncClient, api_settings: Settings) -> None:
    s = sid()
    missing = "no-such-bucket-" + s[-12:]
    body = {"blocks": [{"kind": "skills", "label": "skills", "bucket": missing}]}
    detail = problem(await client.put(f"/v1/sessions/{s}/config", json=body), 422, "invalid_config")["detail"]
    assert detail == f"bucket {missing!r} does not exist"
    assert await events(client, s) == []
    body["blocks"][0]["bucket"] = new_bucket(api_settings)
    await configure(client, s, body)


async def test_the_largest_compact_after_takes_effect(client: httpx.AsyncClient) -> None:
    """2**31 - 1, the largest admitted, is applied (the read at the write's sequence shows it)."""
    s = sid()
    r = await client.put(f"/v1/sessions/{s}/config", json={"blocks": [], "compaction": {"compact_after": 2**31 - 1}})
    assert r.status_code == 200, r.text
    got = await client.get(f"/v1/sessions/{s}/config", params={"min_seq": r.json()["seq"]})
    assert got.status_code == 200, got.text
    assert got.json()["config"]["compaction"]["compact_after"] == 2**31 - 1


async def test_config_round_trip_and_replacement(client: httpx.AsyncClient, api_settings: Settings) -> None:
    s = sid()
    bucket = new_bucket(api_settings)
    config = {
        "blocks": [
            {"kind": "readonly", "label": "soul", "content": "Be kind."},
            {"kind": "writable", "label": "memory", "description": "Learned facts", "max_tokens": 1100},
            {"kind": "searchable", "label": "knowledge"},
            {"kind": "skills", "label": "skills", "bucket": bucket, "prefix": "skills/", "keys": ["tax"]},
        ],
        "compaction": {"compact_after": 50000},
        "searchable_history": "past",
    }
    r = await client.put(f"/v1/sessions/{s}/config", json=config)
    assert r.status_code == 200, r.text
    stored = r.json()["config"]
    assert stored["blocks"][0] == {"kind": "readonly", "label": "soul", "content": "Be kind."}
    assert stored["blocks"][3] == {
        "kind": "skills",
        "label": "skills",
        "bucket": bucket,
        "prefix": "skills/",
        "keys": ["tax"],
    }
    assert stored["compaction"] == {
        "compact_after": 50000,
        "protect_head": 3,
        "tail_token_budget": 20000,
        "min_tail_messages": 2,
    }
    got = await client.get(f"/v1/sessions/{s}/config", params={"min_seq": r.json()["seq"]})
    assert got.json() == {"config": stored}
    [configured] = [e["event"] for e in await events(client, s)]
    assert configured["type"] == "session.configured"
    assert configured["config"]["blocks"][1]["max_tokens"] == 1100

    # a new config replaces the old one whole; a block's content survives while its label does
    await client.put(f"/v1/sessions/{s}/context/memory", json={"content": "kept"})
    seq = await configure(client, s, {"blocks": [{"kind": "writable", "label": "memory", "max_tokens": 5}]})
    blocks = await context(client, s, seq)
    assert list(blocks) == ["memory"]
    assert (blocks["memory"]["content"], blocks["memory"]["max_tokens"]) == ("kept", 5)
