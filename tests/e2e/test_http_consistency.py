"""Read-your-writes with ``min_seq``, and the raw event log as NDJSON."""

from __future__ import annotations

import httpx

from tests.e2e.helpers import append, chain, events, history, history_ids, msg, new_sid, unique_word
from tests.integration.helpers import logged_message


async def test_read_your_writes_append_then_read(client: httpx.AsyncClient) -> None:
    sid = new_sid()
    expected: list[str] = []
    last_seq = 0
    for i in range(20):
        out = await append(client, sid, msg(f"m{i}", f"message number {i}"))
        assert out["seq"] > last_seq
        last_seq = out["seq"]
        expected.append(f"m{i}")
        # Each read is issued immediately after the write; min_seq must make it see the write.
        assert await history_ids(client, sid, min_seq=out["seq"]) == expected
        r = await client.get(f"/v1/sessions/{sid}/messages/m{i}", params={"min_seq": out["seq"]})
        assert r.status_code == 200, r.text
        r = await client.get(f"/v1/sessions/{sid}/leaf", params={"min_seq": out["seq"]})
        assert r.json()["leaf_id"] == f"m{i}"


async def test_read_your_writes_for_every_write_kind(client: httpx.AsyncClient) -> None:
    sid = new_sid()
    word = unique_word()
    r = await client.post("/v1/sessions", json={"id": sid, "name": "v1"})
    seq = r.json()["seq"]
    assert (await client.get(f"/v1/sessions/{sid}", params={"min_seq": seq})).json()["name"] == "v1"

    r = await client.patch(f"/v1/sessions/{sid}", json={"name": "v2"})
    seq = r.json()["seq"]
    assert (await client.get(f"/v1/sessions/{sid}", params={"min_seq": seq})).json()["name"] == "v2"

    seq = (await append(client, sid, msg("m1", f"about {word}")))["seq"]
    r = await client.get(f"/v1/sessions/{sid}/search", params={"q": word, "min_seq": seq})
    assert [h["id"] for h in r.json()["results"]] == ["m1"]
    r = await client.get("/v1/search", params={"q": word, "min_seq": seq})
    assert [h["id"] for h in r.json()["results"]] == ["m1"]
    r = await client.get("/v1/sessions", params={"min_seq": seq, "limit": 500})
    assert sid in [s["id"] for s in r.json()["sessions"]]

    seq = (await append(client, sid, msg("m2", "child")))["seq"]
    r = await client.get(f"/v1/sessions/{sid}/messages/m1/children", params={"min_seq": seq})
    assert [m["id"] for m in r.json()["messages"]] == ["m2"]
    r = await client.get(f"/v1/sessions/{sid}/path-length", params={"min_seq": seq})
    assert r.json()["length"] == 2

    r = await client.put(f"/v1/sessions/{sid}/messages/m1", json={"message": msg("m1", "edited")})
    seq = r.json()["seq"]
    r = await client.get(f"/v1/sessions/{sid}/messages/m1", params={"min_seq": seq})
    assert r.json()["parts"][0]["text"] == "edited"

    r = await client.delete(f"/v1/sessions/{sid}/messages", params={"ids": "m2"})
    seq = r.json()["seq"]
    assert await history_ids(client, sid, min_seq=seq) == ["m1"]

    r = await client.post(f"/v1/sessions/{sid}/messages:clear")
    seq = r.json()["seq"]
    assert await history_ids(client, sid, min_seq=seq) == []

    r = await client.delete(f"/v1/sessions/{sid}")
    seq = r.json()["seq"]
    assert (await client.get(f"/v1/sessions/{sid}", params={"min_seq": seq})).status_code == 404


async def test_min_seq_beyond_the_session_does_not_hang(client: httpx.AsyncClient) -> None:
    """A min_seq from another session's write (larger than this session's last event) is satisfied."""
    s1, s2 = new_sid(), new_sid()
    a = await append(client, s1, msg("a", "first"))
    b = await append(client, s2, msg("b", "second"))
    assert b["seq"] > a["seq"]
    assert await history_ids(client, s1, min_seq=b["seq"]) == ["a"]
    r = await client.get(f"/v1/sessions/{new_sid()}/history", params={"min_seq": b["seq"]})
    assert (r.status_code, r.json()["code"]) == (404, "session_not_found")


async def test_events_are_ndjson_in_order(client: httpx.AsyncClient) -> None:
    sid = new_sid()
    other = new_sid()
    created = (await client.post("/v1/sessions", json={"id": sid, "name": "audited"})).json()
    m1 = await append(client, sid, msg("m1", "one"))
    await append(client, other, msg("x", "interleaved write to another session"))
    m2 = await append(client, sid, msg("m2", "two", role="narrator"))
    up = (await client.put(f"/v1/sessions/{sid}/messages/m1", json={"message": msg("m1", "uno")})).json()
    dl = (await client.delete(f"/v1/sessions/{sid}/messages", params={"ids": "m2"})).json()
    rn = (await client.patch(f"/v1/sessions/{sid}", json={"name": "renamed"})).json()
    cl = (await client.post(f"/v1/sessions/{sid}/messages:clear")).json()

    r = await client.get(f"/v1/sessions/{sid}/events")
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("application/x-ndjson")
    assert r.text.endswith("\n")
    evs = await events(client, sid)
    seqs = [e["seq"] for e in evs]
    assert seqs == [created["seq"], m1["seq"], m2["seq"], up["seq"], dl["seq"], rn["seq"], cl["seq"]]
    assert seqs == sorted(seqs)
    assert [e["event"]["type"] for e in evs] == [
        "session.created",
        "message.appended",
        "message.appended",
        "message.updated",
        "messages.deleted",
        "session.renamed",
        "messages.cleared",
    ]
    for e in evs:
        ev = e["event"]
        assert ev["tenant"] == "tenant-a"
        assert ev["session"] == sid
        assert ev["version"] == {"message.appended": 3, "message.updated": 2}.get(ev["type"], 1)
        assert ev["id"]
        assert ev["occurred_at"]
    assert len({e["event"]["id"] for e in evs}) == len(evs)
    appended = evs[1]["event"]
    assert logged_message(appended).message_id == "m1"
    assert appended["parent_id"] is None
    assert appended["message"] == msg("m1", "one")
    # The resolved parent is in the event (never "latest leaf").
    assert evs[2]["event"]["parent_id"] == "m1"
    assert logged_message(evs[2]["event"]).role == "narrator"
    assert evs[3]["event"]["message"] == msg("m1", "uno")
    assert evs[4]["event"]["message_ids"] == ["m2"]
    assert evs[5]["event"]["name"] == "renamed"


async def test_events_from_and_to_seq(client: httpx.AsyncClient) -> None:
    sid, other = new_sid(), new_sid()
    await append(client, other, msg("x", "so that this session does not start at sequence 1"))
    for i in range(6):
        await append(client, sid, msg(f"m{i}", f"text {i}"))
        await append(client, other, msg(f"y{i}", "interleaved"))  # gaps between this session's seqs
    evs = await events(client, sid)
    seqs = [e["seq"] for e in evs]
    assert len(seqs) == 6

    assert [e["seq"] for e in await events(client, sid, from_seq=seqs[2])] == seqs[2:]
    assert [e["seq"] for e in await events(client, sid, to_seq=seqs[3])] == seqs[:4]
    assert [e["seq"] for e in await events(client, sid, from_seq=seqs[1], to_seq=seqs[4])] == seqs[1:5]
    assert [e["seq"] for e in await events(client, sid, from_seq=seqs[2], to_seq=seqs[2])] == [seqs[2]]
    # Bounds between this session's events (other sessions' sequences) still filter correctly.
    assert [e["seq"] for e in await events(client, sid, from_seq=seqs[-1] + 1)] == []
    assert await events(client, sid, to_seq=seqs[0] - 1) == []
    assert [e["seq"] for e in await events(client, sid, from_seq=seqs[1] - 1, to_seq=seqs[3] + 1)] == seqs[1:4]
    backwards = await client.get(f"/v1/sessions/{sid}/events", params={"from_seq": seqs[4], "to_seq": seqs[1]})
    assert (backwards.status_code, backwards.json()["code"]) == (422, "invalid_request")  # not an empty answer
    assert await events(client, new_sid()) == []


async def test_events_keep_what_the_read_model_dropped(client: httpx.AsyncClient) -> None:
    sid = new_sid()
    await chain(client, sid, ["m1", "m2"])
    r = await client.post(f"/v1/sessions/{sid}/messages:clear")
    assert (await history(client, sid, min_seq=r.json()["seq"]))["messages"] == []
    evs = await events(client, sid)
    assert [logged_message(e["event"]).message_id for e in evs[:2]] == ["m1", "m2"]


async def test_a_history_read_ahead_of_the_read_model_waits_and_reads_again(client: httpx.AsyncClient) -> None:
    """``min_seq`` past everything applied: the read's own check finds its state stale, it waits
    (capped to the session's last event) and reads again."""
    sid = new_sid()
    out = await append(client, sid, msg("m1", "hello"))
    ids = await history_ids(client, sid, min_seq=out["seq"] + 1_000_000)
    assert ids == ["m1"]
