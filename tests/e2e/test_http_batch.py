from __future__ import annotations

import uuid

import httpx

from tests.e2e import helpers


def msg(mid: str) -> dict[str, object]:
    return {"id": mid, "role": "user", "parts": [{"type": "text", "text": f"text {mid}"}]}


async def test_batch_appends_a_chain(client: httpx.AsyncClient) -> None:
    sid = "batch-" + uuid.uuid4().hex[:8]
    r = await client.post(f"/v1/sessions/{sid}/messages", json={"message": msg("a")})
    assert r.status_code == 201
    r = await client.post(f"/v1/sessions/{sid}/messages:batch", json={"messages": [msg("b"), msg("c")]})
    assert r.status_code == 201, r.text
    assert [(m["id"], m["parent_id"]) for m in r.json()["messages"]] == [("b", "a"), ("c", "b")]
    r2 = await client.post(
        f"/v1/sessions/{sid}/messages:batch", json={"messages": [msg("x"), msg("y")], "parent_id": None}
    )
    assert r2.json()["messages"][0]["parent_id"] is None
    again = await client.post(f"/v1/sessions/{sid}/messages:batch", json={"messages": [msg("b"), msg("c")]})
    assert [m["created"] for m in again.json()["messages"]] == [False, False]
    h = await client.get(f"/v1/sessions/{sid}/history", params={"leaf_id": "c", "min_seq": r2.json()["seq"]})
    assert [m["id"] for m in h.json()["messages"]] == ["a", "b", "c"]
    bad = await client.post(f"/v1/sessions/{sid}/messages:batch", json={"messages": [msg("z"), msg("z")]})
    assert bad.status_code == 422
    assert bad.json()["code"] == "invalid_request"
    empty = await client.post(f"/v1/sessions/{sid}/messages:batch", json={"messages": []})
    assert empty.status_code == 422


async def test_history_as_of_a_sequence(client: httpx.AsyncClient) -> None:
    sid = "asof-" + uuid.uuid4().hex[:8]
    first = (await client.post(f"/v1/sessions/{sid}/messages", json={"message": msg("a")})).json()
    await client.post(f"/v1/sessions/{sid}/messages", json={"message": msg("b")})
    edited = {"id": "a", "role": "user", "parts": [{"type": "text", "text": "edited"}]}
    last = (await client.put(f"/v1/sessions/{sid}/messages/a", json={"message": edited})).json()
    then = (await client.get(f"/v1/sessions/{sid}/history", params={"as_of_seq": first["seq"]})).json()
    assert [m["id"] for m in then["messages"]] == ["a"]
    assert then["messages"][0]["parts"][0]["text"] == "text a"
    now = (await client.get(f"/v1/sessions/{sid}/history", params={"min_seq": last["seq"]})).json()
    assert [m["id"] for m in now["messages"]] == ["a", "b"]
    assert now["messages"][0]["parts"][0]["text"] == "edited"
    metrics = (await client.get("/metrics")).text
    assert "chronicle_compaction_failures" in metrics


async def test_lone_surrogate_is_refused(client: httpx.AsyncClient) -> None:
    sid = "sur-" + uuid.uuid4().hex[:8]
    raw = '{"message": {"id": "s1", "role": "user", "parts": [{"type": "text", "text": "bad \\ud800 here"}]}}'
    r = await client.post(
        f"/v1/sessions/{sid}/messages", content=raw.encode(), headers={"content-type": "application/json"}
    )
    assert r.status_code == 422
    assert r.json()["code"] == "invalid_request"


async def test_history_as_of_applies_the_overlays_and_windows_of_then(client: httpx.AsyncClient) -> None:
    """``as_of_seq`` serves the view the read models served then: overlays recorded by then
    (not later ones), ``compacted=false``, and the ``max_bytes`` window."""
    sid = "asof-ov-" + uuid.uuid4().hex[:8]
    config = {"compaction": {"protect_head": 1, "tail_token_budget": 10, "min_tail_messages": 2}}
    assert (await client.put(f"/v1/sessions/{sid}/config", json=config)).status_code == 200
    long = [helpers.msg(f"m{i}", f"text m{i}{helpers.PROSE}") for i in range(8)]
    r = await client.post(f"/v1/sessions/{sid}/messages:batch", json={"messages": long})
    before = r.json()["seq"]
    compacted = (await client.post(f"/v1/sessions/{sid}/compact", json={})).json()
    assert compacted["compacted"] is True, compacted
    after = compacted["seq"]

    async def ids(**params: str | int) -> list[str]:
        r = await client.get(f"/v1/sessions/{sid}/history", params={"min_seq": after, **params})
        assert r.status_code == 200, r.text
        return [m["id"] for m in r.json()["messages"]]

    assert await ids(as_of_seq=before) == [f"m{i}" for i in range(8)]
    then = await ids(as_of_seq=after)
    assert then == await ids()  # the compacted view, as served live
    assert then[:2] == ["m0", compacted["overlay"]["message_id"]]
    assert await ids(as_of_seq=after, compacted="false") == [f"m{i}" for i in range(8)]
    window = (
        await client.get(f"/v1/sessions/{sid}/history", params={"as_of_seq": before, "max_bytes": 1, "min_recent": 2})
    ).json()
    assert [m["id"] for m in window["messages"]] == ["m6", "m7"]
    assert window["truncated"] is True
    assert window["as_of_seq"] == before
