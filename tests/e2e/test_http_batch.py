from __future__ import annotations

import uuid

import httpx

from tests.e2e import helpers
from tests.integration.helpers import logged_message


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


# -- a batch that fails part-way --------------------------------------------------------------------


def bare(mid: str) -> dict[str, object]:
    return {"id": mid, "role": "user", "parts": []}


async def test_a_batch_failing_at_a_cycle_says_what_it_wrote(client: httpx.AsyncClient) -> None:
    """The outside-in trial's form: cy1 (deleted, its child cy2 stored), then a batch cy3 under
    cy2 and cy1 again under cy3, which would be its own ancestor. cy3 is stored: the problem
    says so (``written``, ``failed_index``) and never that nothing was written."""
    sid = helpers.new_sid("batch-cycle")
    path = f"/v1/sessions/{sid}/messages:batch"
    r = await client.post(path, json={"parent_id": None, "messages": [bare("cy1"), bare("cy2")]})
    assert r.status_code == 201, r.text
    r = await client.post(f"/v1/sessions/{sid}/messages:delete", json={"ids": ["cy1"]})
    assert r.status_code == 200, r.text
    before = await helpers.events(client, sid)

    r = await client.post(path, json={"parent_id": "cy2", "messages": [bare("cy3"), bare("cy1")]})
    problem = helpers.assert_problem(r, 409, "parent_cycle")
    assert problem["failed_index"] == 1
    [written] = problem["written"]
    assert (written["id"], written["parent_id"], written["created"]) == ("cy3", "cy2", True)
    assert "nothing was written" not in problem["detail"].lower(), problem["detail"]
    assert "message 1 of the batch ('cy1')" in problem["detail"]
    assert "message 0 ('cy3') was stored before it" in problem["detail"]
    after = await helpers.events(client, sid)
    assert [e["seq"] for e in after[len(before) :]] == [written["seq"]]  # cy3's append, nothing else
    assert logged_message(after[-1]["event"]).message_id == "cy3"
    tree = await client.get(f"/v1/sessions/{sid}/tree", params={"min_seq": written["seq"]})
    assert {m["id"] for m in tree.json()["messages"]} == {"cy2", "cy3"}

    # the whole batch again: cy3 replays (created false) and cy1 fails as before
    r = await client.post(path, json={"parent_id": "cy2", "messages": [bare("cy3"), bare("cy1")]})
    again = helpers.assert_problem(r, 409, "parent_cycle")
    assert again["written"] == [{**written, "created": False}]
    assert await helpers.events(client, sid) == after


async def test_a_batch_failing_at_a_conflict_says_what_it_wrote(client: httpx.AsyncClient) -> None:
    """An existing message ``ex``, then a batch n1, ex with another body, n3: n1 is stored (the
    latest leaf now), ex and n3 are not, and the problem lists n1."""
    sid = helpers.new_sid("batch-conflict")
    ex = await helpers.append(client, sid, msg("ex"))
    r = await client.post(
        f"/v1/sessions/{sid}/messages:batch",
        json={"messages": [msg("n1"), helpers.msg("ex", "another body"), msg("n3")]},
    )
    problem = helpers.assert_problem(r, 409, "message_conflict")
    assert problem["failed_index"] == 1
    assert [(w["id"], w["parent_id"], w["created"]) for w in problem["written"]] == [("n1", "ex", True)]
    assert problem["written"][0]["seq"] > ex["seq"]
    assert problem["detail"].startswith("a message with this id and a different body exists.")
    assert "It was message 1 of the batch ('ex')" in problem["detail"]
    seq = problem["written"][0]["seq"]
    assert await helpers.history_ids(client, sid, min_seq=seq) == ["ex", "n1"]
    leaf = await client.get(f"/v1/sessions/{sid}/leaf", params={"min_seq": seq})
    assert leaf.json()["leaf_id"] == "n1"
    gone = await client.get(f"/v1/sessions/{sid}/messages/n3", params={"min_seq": seq})
    helpers.assert_problem(gone, 404, "message_not_found")


async def test_a_batch_failing_at_its_first_message_says_nothing_was_written(client: httpx.AsyncClient) -> None:
    sid = helpers.new_sid("batch-first")
    await helpers.append(client, sid, msg("ex"))
    before = await helpers.events(client, sid)
    r = await client.post(
        f"/v1/sessions/{sid}/messages:batch", json={"messages": [helpers.msg("ex", "another body"), msg("n2")]}
    )
    problem = helpers.assert_problem(r, 409, "message_conflict")
    assert (problem["failed_index"], problem["written"]) == (0, [])
    assert problem["detail"].endswith("It was message 0 of the batch ('ex'); nothing of the batch was written.")
    r = await client.post(f"/v1/sessions/{sid}/messages:batch", json={"messages": [msg("n1")], "parent_id": "nope"})
    problem = helpers.assert_problem(r, 422, "unknown_parent")
    assert (problem["failed_index"], problem["written"]) == (0, [])
    assert await helpers.events(client, sid) == before
    # a refusal of the request itself (ids not distinct) is no batch failure: nothing to list
    r = await client.post(f"/v1/sessions/{sid}/messages:batch", json={"messages": [msg("z"), msg("z")]})
    problem = helpers.assert_problem(r, 422, "invalid_request")
    assert "failed_index" not in problem
    assert "written" not in problem
