"""Tenants over HTTP: nothing of tenant-a is visible to or writable by tenant-b."""

from __future__ import annotations

import httpx

from tests.e2e.helpers import (
    append,
    append_body,
    assert_problem,
    events,
    history,
    history_ids,
    msg,
    new_sid,
    unique_word,
)
from tests.integration.helpers import logged_message


async def test_other_tenant_sees_nothing(client: httpx.AsyncClient, client_b: httpx.AsyncClient) -> None:
    sid = new_sid()
    word = unique_word()
    r = await client.post("/v1/sessions", json={"id": sid, "name": "private"})
    assert r.status_code == 201, r.text
    await append(client, sid, msg("m1", f"tenant a secret {word}"))
    seq = (await append(client, sid, msg("m2", "more")))["seq"]
    # tenant-a sees its own data (so the checks below are not vacuous).
    assert await history_ids(client, sid, min_seq=seq) == ["m1", "m2"]
    assert len(await events(client, sid)) == 3

    assert_problem(await client_b.get(f"/v1/sessions/{sid}", params={"min_seq": seq}), 404, "session_not_found")
    r = await client_b.get("/v1/sessions", params={"limit": 500, "min_seq": seq})
    assert sid not in [s["id"] for s in r.json()["sessions"]]
    r = await client_b.get(f"/v1/sessions/{sid}/messages/m1", params={"min_seq": seq})
    assert_problem(r, 404, "session_not_found")
    # per-session reads: the session does not exist for tenant-b
    for path, params in [
        ("/history", {}),
        ("/history", {"leaf_id": "m2"}),
        ("/history", {"max_bytes": "1024"}),
        ("/history/stats", {}),
        ("/history/stats", {"leaf_id": "m2"}),
        ("/leaf", {}),
        ("/messages/m1/children", {}),
        ("/path-length", {"leaf_id": "m2"}),
        ("/search", {"q": word}),
        ("/compactions", {}),
        ("/context", {}),
    ]:
        r = await client_b.get(f"/v1/sessions/{sid}{path}", params={**params, "min_seq": seq})
        assert_problem(r, 404, "session_not_found")
    r = await client_b.get("/v1/search", params={"q": word, "min_seq": seq})
    assert r.json()["results"] == []
    assert await events(client_b, sid) == []


async def test_other_tenant_cannot_change_anything(client: httpx.AsyncClient, client_b: httpx.AsyncClient) -> None:
    sid = new_sid()
    r = await client.post("/v1/sessions", json={"id": sid, "name": "mine"})
    assert r.status_code == 201, r.text
    seq = (await append(client, sid, msg("m1", "original")))["seq"]
    before = await events(client, sid)

    assert_problem(await client_b.patch(f"/v1/sessions/{sid}", json={"name": "stolen"}), 404, "session_not_found")
    assert_problem(await client_b.delete(f"/v1/sessions/{sid}"), 404, "session_not_found")
    r = await client_b.put(f"/v1/sessions/{sid}/messages/m1", json={"message": msg("m1", "hijacked")})
    assert_problem(r, 404, "message_not_found")
    r = await client_b.post(f"/v1/sessions/{sid}/messages", json=append_body(msg("m2", "child"), "m1"))
    assert_problem(r, 422, "unknown_parent")
    r = await client_b.delete(f"/v1/sessions/{sid}/messages", params={"ids": "m1"})
    assert r.status_code == 200, r.text
    assert r.json()["deleted"] == []
    r = await client_b.post(f"/v1/sessions/{sid}/messages:clear")  # clears tenant-b's own (empty) session
    assert r.status_code == 200, r.text
    r = await client_b.post(
        f"/v1/sessions/{sid}/usage", json={"input_tokens": 9, "cost": 1.0}, headers={"Idempotency-Key": "k"}
    )
    assert_problem(r, 404, "session_not_found")
    assert_problem(await client_b.post(f"/v1/sessions/{sid}:end", json={"reason": "stolen"}), 404, "session_not_found")
    assert [e["event"]["type"] for e in await events(client_b, sid)] == []  # nothing in tenant-b's log either

    assert await events(client, sid) == before
    r = await client.get(f"/v1/sessions/{sid}", params={"min_seq": seq})
    assert r.json()["name"] == "mine"
    assert (r.json()["input_tokens"], r.json()["estimated_cost"], r.json()["end_reason"]) == (0, 0.0, None)
    h = await history(client, sid, min_seq=seq)
    assert h["messages"] == [msg("m1", "original")]


async def test_same_session_id_in_two_tenants_is_two_histories(
    client: httpx.AsyncClient, client_b: httpx.AsyncClient
) -> None:
    sid = new_sid()
    a1 = await append(client, sid, msg("m1", "tenant a says hi"))
    b1 = await append(client_b, sid, msg("m1", "tenant b says something else"))
    assert a1["created"] is True
    assert b1["created"] is True  # same message id, other tenant: not a conflict
    a2 = await append(client, sid, msg("a2", "a again"))
    b2 = await append(client_b, sid, msg("b2", "b again"))
    assert a2["parent_id"] == "m1"
    assert b2["parent_id"] == "m1"

    ha = await history(client, sid, min_seq=a2["seq"])
    hb = await history(client_b, sid, min_seq=b2["seq"])
    assert ha["messages"] == [msg("m1", "tenant a says hi"), msg("a2", "a again")]
    assert hb["messages"] == [msg("m1", "tenant b says something else"), msg("b2", "b again")]
    ea = await events(client, sid)
    eb = await events(client_b, sid)
    assert [logged_message(e["event"]).message_id for e in ea] == ["m1", "a2"]
    assert [logged_message(e["event"]).message_id for e in eb] == ["m1", "b2"]
    assert {e["event"]["tenant"] for e in ea} == {"tenant-a"}
    assert {e["event"]["tenant"] for e in eb} == {"tenant-b"}

    # Clearing one tenant's session leaves the other's alone.
    r = await client_b.post(f"/v1/sessions/{sid}/messages:clear")
    assert r.status_code == 200, r.text
    assert await history_ids(client_b, sid, min_seq=r.json()["seq"]) == []
    assert await history_ids(client, sid, min_seq=a2["seq"]) == ["m1", "a2"]


async def test_tenant_wide_search_stays_in_the_tenant(client: httpx.AsyncClient, client_b: httpx.AsyncClient) -> None:
    word = unique_word()
    sa, sb = new_sid(), new_sid()
    a = await append(client, sa, msg("a", f"{word} from a"))
    b = await append(client_b, sb, msg("b", f"{word} from b"))
    ra = await client.get("/v1/search", params={"q": word, "min_seq": max(a["seq"], b["seq"])})
    rb = await client_b.get("/v1/search", params={"q": word, "min_seq": max(a["seq"], b["seq"])})
    assert [(h["session_id"], h["id"]) for h in ra.json()["results"]] == [(sa, "a")]
    assert [(h["session_id"], h["id"]) for h in rb.json()["results"]] == [(sb, "b")]
