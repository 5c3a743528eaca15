"""The seed's tree scenarios over HTTP: chains, branches, leaves, children, path length, roots."""

from __future__ import annotations

from typing import Any

import httpx

from tests.e2e.helpers import append, assert_problem, chain, history, history_ids, msg, new_sid


async def test_new_session_has_empty_history(client: httpx.AsyncClient) -> None:
    sid = new_sid()
    for path in ("history", "leaf", "path-length"):  # never created: not found
        assert_problem(await client.get(f"/v1/sessions/{sid}/{path}"), 404, "session_not_found")
    seq = (await client.post("/v1/sessions", json={"id": sid})).json()["seq"]
    h = await history(client, sid, min_seq=seq)
    assert h == {"leaf_id": None, "messages": []}
    r = await client.get(f"/v1/sessions/{sid}/leaf")
    assert r.status_code == 200, r.text
    assert r.json() == {"leaf_id": None, "message": None}
    r = await client.get(f"/v1/sessions/{sid}/path-length")
    assert r.status_code == 200, r.text
    assert r.json() == {"leaf_id": None, "length": 0}


async def test_linear_chain(client: httpx.AsyncClient) -> None:
    sid = new_sid()
    first = await append(client, sid, msg("m1", "hello"))
    assert first["id"] == "m1"
    assert first["parent_id"] is None
    assert first["created"] is True
    second = await append(client, sid, msg("m2", "hi there", role="assistant"))
    assert second["parent_id"] == "m1"
    third = await append(client, sid, msg("m3", "how are you"))
    assert third["parent_id"] == "m2"
    assert first["seq"] < second["seq"] < third["seq"]

    h = await history(client, sid, min_seq=third["seq"])
    assert h["leaf_id"] == "m3"
    assert h["messages"] == [msg("m1", "hello"), msg("m2", "hi there", role="assistant"), msg("m3", "how are you")]


async def test_branch_and_history_of_each_branch(client: httpx.AsyncClient) -> None:
    sid = new_sid()
    await chain(client, sid, ["u1", "a1", "u2", "a2"])
    # u2 already has a child (a2): appending to it explicitly opens a second branch.
    alt = await append(client, sid, msg("a2-alt", "another answer", role="assistant"), "u2")
    assert alt["parent_id"] == "u2"
    seq = (await append(client, sid, msg("u3-alt", "follow-up on the alternative"), "a2-alt"))["seq"]

    assert await history_ids(client, sid, min_seq=seq, leaf_id="a2") == ["u1", "a1", "u2", "a2"]
    assert await history_ids(client, sid, min_seq=seq, leaf_id="u3-alt") == ["u1", "a1", "u2", "a2-alt", "u3-alt"]
    assert await history_ids(client, sid, min_seq=seq, leaf_id="u2") == ["u1", "a1", "u2"]
    h = await history(client, sid, min_seq=seq, leaf_id="a2")
    assert h["leaf_id"] == "a2"
    # Without leaf_id: the latest leaf's branch.
    assert await history_ids(client, sid, min_seq=seq) == ["u1", "a1", "u2", "a2-alt", "u3-alt"]


async def test_latest_leaf_after_appending_to_an_older_branch(client: httpx.AsyncClient) -> None:
    sid = new_sid()
    await chain(client, sid, ["m1", "m2", "m3"])
    await append(client, sid, msg("b1", "branch from m1"), "m1")
    seq = (await append(client, sid, msg("c1", "newest, on the older m2 branch"), "m2"))["seq"]

    r = await client.get(f"/v1/sessions/{sid}/leaf", params={"min_seq": seq})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["leaf_id"] == "c1"
    assert body["message"] == msg("c1", "newest, on the older m2 branch")
    assert await history_ids(client, sid, min_seq=seq) == ["m1", "m2", "c1"]

    # An omitted parent now attaches to c1, the latest leaf, not to m3.
    nxt = await append(client, sid, msg("d1", "next"))
    assert nxt["parent_id"] == "c1"


async def test_children_ordered_by_creation(client: httpx.AsyncClient) -> None:
    sid = new_sid()
    await append(client, sid, msg("root", "root"))
    for name in ["k3", "k1", "k2"]:  # creation order, deliberately not lexical
        seq = (await append(client, sid, msg(name, f"child {name}"), "root"))["seq"]
    await append(client, sid, msg("grandchild", "under k1"), "k1")

    r = await client.get(f"/v1/sessions/{sid}/messages/root/children", params={"min_seq": seq})
    assert r.status_code == 200, r.text
    assert [m["id"] for m in r.json()["messages"]] == ["k3", "k1", "k2"]

    r = await client.get(f"/v1/sessions/{sid}/messages/k2/children", params={"min_seq": seq})
    assert r.status_code == 200, r.text
    assert r.json()["messages"] == []
    r = await client.get(f"/v1/sessions/{sid}/messages/no-such-message/children", params={"min_seq": seq})
    assert r.status_code == 200, r.text
    assert r.json()["messages"] == []


async def test_path_length(client: httpx.AsyncClient) -> None:
    sid = new_sid()
    seq = await chain(client, sid, ["p1", "p2", "p3", "p4"])
    seq = (await append(client, sid, msg("q3", "branch"), "p2"))["seq"]

    r = await client.get(f"/v1/sessions/{sid}/path-length", params={"min_seq": seq})
    assert r.status_code == 200, r.text
    assert r.json() == {"leaf_id": "q3", "length": 3}
    r = await client.get(f"/v1/sessions/{sid}/path-length", params={"min_seq": seq, "leaf_id": "p4"})
    assert r.json() == {"leaf_id": "p4", "length": 4}
    r = await client.get(f"/v1/sessions/{sid}/path-length", params={"min_seq": seq, "leaf_id": "p1"})
    assert r.json() == {"leaf_id": "p1", "length": 1}
    r = await client.get(f"/v1/sessions/{sid}/path-length", params={"min_seq": seq, "leaf_id": "nope"})
    assert r.status_code == 200, r.text
    assert r.json()["length"] == 0


async def test_null_parent_creates_a_new_root(client: httpx.AsyncClient) -> None:
    sid = new_sid()
    await chain(client, sid, ["m1", "m2"])
    root2 = await append(client, sid, msg("r2", "a fresh start"), None)
    assert root2["parent_id"] is None
    seq = root2["seq"]

    assert await history_ids(client, sid, min_seq=seq, leaf_id="r2") == ["r2"]
    # The new root has no children and is the newest message: it is the latest leaf.
    assert await history_ids(client, sid, min_seq=seq) == ["r2"]
    assert await history_ids(client, sid, min_seq=seq, leaf_id="m2") == ["m1", "m2"]
    # An omitted parent attaches to the latest leaf, which is now the new root.
    nxt = await append(client, sid, msg("r2-child", "continues the new root"))
    assert nxt["parent_id"] == "r2"
    assert await history_ids(client, sid, min_seq=nxt["seq"]) == ["r2", "r2-child"]


async def test_omitted_parent_attaches_to_latest_leaf(client: httpx.AsyncClient) -> None:
    sid = new_sid()
    first = await append(client, sid, msg("a", "first"))
    assert first["parent_id"] is None  # empty session: the first message is a root
    b = await append(client, sid, msg("b", "second"))
    assert b["parent_id"] == "a"
    await append(client, sid, msg("x", "branch off a"), "a")
    c = await append(client, sid, msg("c", "third"))
    assert c["parent_id"] == "x"  # x is the newest message without children
    assert await history_ids(client, sid, min_seq=c["seq"]) == ["a", "x", "c"]


async def test_unknown_leaf_gives_empty_history(client: httpx.AsyncClient) -> None:
    sid = new_sid()
    seq = await chain(client, sid, ["m1", "m2"])
    h = await history(client, sid, min_seq=seq, leaf_id="does-not-exist")
    assert h["messages"] == []
    assert h["leaf_id"] is None


async def test_get_message_and_unknown_message(client: httpx.AsyncClient) -> None:
    sid = new_sid()
    body = {
        "id": "rich",
        "role": "assistant",
        "parts": [
            {"type": "text", "text": "answer", "providerMetadata": {"x": 1}},
            {"type": "reasoning", "text": "thinking", "state": "done"},
            {
                "type": "tool-weather",
                "toolCallId": "call-1",
                "input": {"city": "Oslo"},
                "output": {"temp": -3},
                "state": "output-available",
            },
        ],
        "metadata": {"model": "m", "nested": {"list": [1, 2, {"a": None}]}},
        "customField": "kept untouched",
    }
    seq = (await append(client, sid, body))["seq"]
    r = await client.get(f"/v1/sessions/{sid}/messages/rich", params={"min_seq": seq})
    assert r.status_code == 200, r.text
    assert r.json() == body  # unknown fields round-trip

    r = await client.get(f"/v1/sessions/{sid}/messages/missing", params={"min_seq": seq})
    assert_problem(r, 404, "message_not_found")
    r = await client.get(f"/v1/sessions/{new_sid()}/messages/rich")
    assert_problem(r, 404, "session_not_found")


async def test_message_ids_are_per_session(client: httpx.AsyncClient) -> None:
    s1, s2 = new_sid(), new_sid()
    a = await append(client, s1, msg("same", "in session one"))
    b = await append(client, s2, msg("same", "in session two"))
    assert a["created"] is True
    assert b["created"] is True
    r1 = await client.get(f"/v1/sessions/{s1}/messages/same", params={"min_seq": a["seq"]})
    r2 = await client.get(f"/v1/sessions/{s2}/messages/same", params={"min_seq": b["seq"]})
    assert r1.json()["parts"][0]["text"] == "in session one"
    assert r2.json()["parts"][0]["text"] == "in session two"


async def test_history_limit_keeps_the_recent_end_and_says_truncated(client: httpx.AsyncClient) -> None:
    sid = new_sid()
    r = await client.post(
        f"/v1/sessions/{sid}/messages:batch", json={"messages": [msg(f"m{i}", "x") for i in range(6)]}
    )
    seq = r.json()["seq"]

    async def read(**params: str | int) -> dict[str, Any]:
        r = await client.get(f"/v1/sessions/{sid}/history", params={"min_seq": seq, **params})
        assert r.status_code == 200, r.text
        out: dict[str, Any] = r.json()
        return out

    cut = await read(limit=2)
    assert [m["id"] for m in cut["messages"]] == ["m4", "m5"]
    assert cut["truncated"] is True
    assert cut["leaf_id"] == "m5"
    for limit in (6, 7, None):  # the whole path (the default is far above it): no flag, as before
        whole = await read(**({"limit": limit} if limit else {}))
        assert [m["id"] for m in whole["messages"]] == [f"m{i}" for i in range(6)]
        assert "truncated" not in whole
    both = await read(limit=3, max_bytes=10**6)  # the byte window holds all; the limit still cuts
    assert [m["id"] for m in both["messages"]] == ["m3", "m4", "m5"]
    assert both["truncated"] is True
    for bad in (0, 100_001):
        assert_problem(await client.get(f"/v1/sessions/{sid}/history", params={"limit": bad}), 422, "invalid_request")


async def test_messages_exists_answers_which_listed_ids_the_session_holds_in_one_read(
    client: httpx.AsyncClient,
) -> None:
    sid = new_sid()
    await chain(client, sid, ["a", "b,c"])
    seq = (await append(client, sid, msg("d", "last")))["seq"]
    r = await client.post(
        f"/v1/sessions/{sid}/messages:exists", params={"min_seq": seq}, json={"ids": ["d", "nope", "b,c", "d", "a"]}
    )
    assert r.status_code == 200, r.text
    assert r.json() == {"existing": ["d", "b,c", "a"]}  # in the order given, each once; any id as it is
    none = await client.post(f"/v1/sessions/{sid}/messages:exists", json={"ids": ["x"]})
    assert none.status_code == 200, none.text
    assert none.json() == {"existing": []}
    unknown = await client.post(f"/v1/sessions/{new_sid()}/messages:exists", json={"ids": ["a"]})
    assert_problem(unknown, 404, "session_not_found")
    bad: list[dict[str, Any]] = [{"ids": []}, {"ids": [f"m{i}" for i in range(1001)]}, {}, {"ids": ["a"], "o": 1}]
    for body in bad:
        assert_problem(await client.post(f"/v1/sessions/{sid}/messages:exists", json=body), 422, "invalid_request")
    assert_problem(await client.post(f"/v1/sessions/{sid}/messages:exists", json={"ids": [" a"]}), 422, "invalid_id")
