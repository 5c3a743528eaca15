"""Append idempotency and parent errors; update, delete and clear over HTTP."""

from __future__ import annotations

import asyncio

import httpx

from tests.e2e.helpers import (
    append,
    append_body,
    assert_problem,
    chain,
    events,
    history,
    history_ids,
    msg,
    new_sid,
    stream_last_seq,
)
from tests.integration.helpers import logged_message

# -- idempotent append ---------------------------------------------------------------------------


async def test_same_id_same_body_answers_as_the_first_time(client: httpx.AsyncClient) -> None:
    sid = new_sid()
    first = await append(client, sid, msg("m1", "hello"))
    second = await append(client, sid, msg("m2", "world"))
    # m2 is now the latest leaf; replaying m1 must not re-parent it or append anything.
    n_events = len(await events(client, sid))
    again = await append(client, sid, msg("m1", "hello"), expect=200)
    assert again == {"id": "m1", "parent_id": None, "seq": first["seq"], "created": False}
    again2 = await append(client, sid, msg("m2", "world"), expect=200)
    assert again2 == {"id": "m2", "parent_id": "m1", "seq": second["seq"], "created": False}

    assert len(await events(client, sid)) == n_events
    assert await history_ids(client, sid, min_seq=second["seq"]) == ["m1", "m2"]


async def test_a_retry_with_the_same_idempotency_key_answers_created(client: httpx.AsyncClient) -> None:
    """A client whose first attempt was stored but whose answer was lost retries with the same key:
    it is told it created the message (once in the log); another key, or none, is a repeat."""
    sid = new_sid()
    path = f"/v1/sessions/{sid}/messages"
    body = append_body(msg("m1", "hello"))
    first = await client.post(path, json=body, headers={"Idempotency-Key": "try-1"})
    assert first.status_code == 201, first.text
    retry = await client.post(path, json=body, headers={"Idempotency-Key": "try-1"})
    assert (retry.status_code, retry.json()) == (201, first.json())  # the first answer, again
    other = await client.post(path, json=body, headers={"Idempotency-Key": "try-2"})
    assert (other.status_code, other.json()["created"], other.json()["seq"]) == (200, False, first.json()["seq"])
    plain = await client.post(path, json=body)
    assert (plain.status_code, plain.json()["created"]) == (200, False)
    assert len(await events(client, sid)) == 1
    bad = await client.post(path, json=body, headers={"Idempotency-Key": "has space"})
    assert_problem(bad, 422, "invalid_request")


async def test_two_idempotency_keys_are_refused_and_nothing_is_done(client: httpx.AsyncClient) -> None:
    """An append (the hot path hands it on) or a usage call with two ``Idempotency-Key`` headers
    names no one request: ``400 ambiguous_idempotency_key``, whichever comes first, nothing written;
    and the refusal comes before the body is judged. One key with another header alike is fine."""
    sid = new_sid()
    first = await append(client, sid, msg("m0", "zero"))
    before, last = await events(client, sid), await stream_last_seq(client)
    for pair in (["x", "y"], ["y", "x"], ["x", "x"]):
        headers = [("Idempotency-Key", key) for key in pair]
        for path, body in [
            (f"/v1/sessions/{sid}/messages", append_body(msg("m1", "one"))),
            (f"/v1/sessions/{sid}/messages", {"message": "not a message"}),
            (f"/v1/sessions/{sid}/usage", {"input_tokens": 3}),
        ]:
            r = await client.post(path, json=body, headers=headers)
            problem = assert_problem(r, 400, "ambiguous_idempotency_key")
            assert "this request has 2" in problem["detail"], problem
    assert await events(client, sid) == before
    assert await stream_last_seq(client) == last
    got = await client.get(f"/v1/sessions/{sid}", params={"min_seq": first["seq"]})
    assert got.json()["input_tokens"] == 0
    one = [("Idempotency-Key", "x"), ("X-Idempotency-Key", "y")]
    r = await client.post(f"/v1/sessions/{sid}/messages", json=append_body(msg("m1", "one")), headers=one)
    assert r.status_code == 201, r.text


async def test_same_body_with_other_key_order_is_the_same_body(client: httpx.AsyncClient) -> None:
    sid = new_sid()
    first = await append(client, sid, {"id": "k", "role": "user", "parts": [{"type": "text", "text": "t"}]})
    again = await append(client, sid, {"parts": [{"text": "t", "type": "text"}], "role": "user", "id": "k"}, expect=200)
    assert again["seq"] == first["seq"]
    assert again["created"] is False


async def test_replay_with_an_explicit_parent_still_gives_the_first_answer(client: httpx.AsyncClient) -> None:
    sid = new_sid()
    await chain(client, sid, ["m1", "m2"])
    first = await append(client, sid, msg("m3", "x"), "m1")
    again = await append(client, sid, msg("m3", "x"), "m2", expect=200)
    assert again == {**first, "created": False}


async def test_same_id_other_body_conflicts(client: httpx.AsyncClient) -> None:
    sid = new_sid()
    first = await append(client, sid, msg("m1", "original"))
    n_events = len(await events(client, sid))
    r = await client.post(f"/v1/sessions/{sid}/messages", json=append_body(msg("m1", "changed")))
    assert_problem(r, 409, "message_conflict")
    r = await client.post(f"/v1/sessions/{sid}/messages", json=append_body(msg("m1", "original", role="assistant")))
    assert_problem(r, 409, "message_conflict")

    assert len(await events(client, sid)) == n_events
    h = await history(client, sid, min_seq=first["seq"])
    assert h["messages"] == [msg("m1", "original")]


async def test_unknown_parent_is_an_error_and_writes_nothing(client: httpx.AsyncClient) -> None:
    sid = new_sid()
    seq = await chain(client, sid, ["m1", "m2"])
    before = await events(client, sid)
    r = await client.post(f"/v1/sessions/{sid}/messages", json=append_body(msg("m3", "orphan"), "no-such-parent"))
    assert_problem(r, 422, "unknown_parent")

    assert await events(client, sid) == before
    assert await history_ids(client, sid, min_seq=seq) == ["m1", "m2"]
    r = await client.get(f"/v1/sessions/{sid}/messages/m3", params={"min_seq": seq})
    assert_problem(r, 404, "message_not_found")


async def test_unknown_parent_on_a_new_session_writes_nothing(client: httpx.AsyncClient) -> None:
    sid = new_sid()
    r = await client.post(f"/v1/sessions/{sid}/messages", json=append_body(msg("m1", "orphan"), "ghost"))
    assert_problem(r, 422, "unknown_parent")
    assert await events(client, sid) == []
    assert_problem(await client.get(f"/v1/sessions/{sid}"), 404, "session_not_found")


async def test_parent_from_another_session_is_unknown(client: httpx.AsyncClient) -> None:
    other, sid = new_sid(), new_sid()
    await append(client, other, msg("foreign", "lives in the other session"))
    seq = await chain(client, sid, ["m1"])
    before = await events(client, sid)
    r = await client.post(f"/v1/sessions/{sid}/messages", json=append_body(msg("m2", "x"), "foreign"))
    assert_problem(r, 422, "unknown_parent")
    assert await events(client, sid) == before
    assert await history_ids(client, sid, min_seq=seq) == ["m1"]


# -- update --------------------------------------------------------------------------------------


async def test_update_changes_the_body(client: httpx.AsyncClient) -> None:
    sid = new_sid()
    await chain(client, sid, ["m1", "m2", "m3"])
    new_body = {**msg("m2", "edited text", role="assistant"), "metadata": {"edited": True}}
    r = await client.put(f"/v1/sessions/{sid}/messages/m2", json={"message": new_body})
    assert r.status_code == 200, r.text
    out = r.json()
    assert out["id"] == "m2"
    seq = out["seq"]
    assert isinstance(seq, int)

    h = await history(client, sid, min_seq=seq)
    assert [m["id"] for m in h["messages"]] == ["m1", "m2", "m3"]  # tree unchanged
    assert h["messages"][1] == new_body
    r = await client.get(f"/v1/sessions/{sid}/messages/m2", params={"min_seq": seq})
    assert r.json() == new_body
    kinds = [e["event"]["type"] for e in await events(client, sid)]
    assert kinds == ["message.appended"] * 3 + ["message.updated"]


async def test_update_path_id_must_equal_body_id(client: httpx.AsyncClient) -> None:
    sid = new_sid()
    await chain(client, sid, ["m1", "m2"])
    before = await events(client, sid)
    r = await client.put(f"/v1/sessions/{sid}/messages/m1", json={"message": msg("m2", "sneaky")})
    assert_problem(r, 422, "invalid_request")
    assert await events(client, sid) == before


async def test_update_unknown_message_is_404(client: httpx.AsyncClient) -> None:
    sid = new_sid()
    await chain(client, sid, ["m1"])
    before = await events(client, sid)
    r = await client.put(f"/v1/sessions/{sid}/messages/ghost", json={"message": msg("ghost", "x")})
    assert_problem(r, 404, "message_not_found")
    assert await events(client, sid) == before


async def test_update_role_is_reflected_in_search(client: httpx.AsyncClient) -> None:
    """The role column of the read model follows the updated body (search results carry it)."""
    sid = new_sid()
    await append(client, sid, msg("m1", "quarterly budget figures", role="user"))
    r = await client.put(
        f"/v1/sessions/{sid}/messages/m1", json={"message": msg("m1", "quarterly budget figures", role="assistant")}
    )
    assert r.status_code == 200, r.text
    r = await client.get(f"/v1/sessions/{sid}/search", params={"q": "budget", "min_seq": r.json()["seq"]})
    [hit] = r.json()["results"]
    assert hit["role"] == "assistant"


# -- delete and clear ----------------------------------------------------------------------------


async def test_delete_ids_children_keep_their_parent(client: httpx.AsyncClient) -> None:
    sid = new_sid()
    await chain(client, sid, ["m1", "m2", "m3", "m4"])
    r = await client.delete(f"/v1/sessions/{sid}/messages", params={"ids": "m2"})
    assert r.status_code == 200, r.text
    out = r.json()
    assert out["deleted"] == ["m2"]
    seq = out["seq"]

    # m3 keeps parent_id m2 (as the reference): its history stops at the gap.
    assert await history_ids(client, sid, min_seq=seq) == ["m3", "m4"]
    assert await history_ids(client, sid, min_seq=seq, leaf_id="m4") == ["m3", "m4"]
    assert await history_ids(client, sid, min_seq=seq, leaf_id="m1") == ["m1"]
    assert_problem(
        await client.get(f"/v1/sessions/{sid}/messages/m2", params={"min_seq": seq}), 404, "message_not_found"
    )
    r = await client.get(f"/v1/sessions/{sid}/messages/m1/children", params={"min_seq": seq})
    assert r.json()["messages"] == []
    r = await client.get(f"/v1/sessions/{sid}/path-length", params={"min_seq": seq, "leaf_id": "m4"})
    assert r.json()["length"] == 2
    [deleted] = [e for e in await events(client, sid) if e["event"]["type"] == "messages.deleted"]
    assert deleted["event"]["message_ids"] == ["m2"]
    assert deleted["seq"] == seq


async def test_delete_several_ids(client: httpx.AsyncClient) -> None:
    sid = new_sid()
    await chain(client, sid, ["a", "b", "c", "d", "e"])
    r = await client.delete(f"/v1/sessions/{sid}/messages", params=[("ids", "b,c"), ("ids", "e"), ("ids", "zzz")])
    assert r.status_code == 200, r.text
    out = r.json()
    assert sorted(out["deleted"]) == ["b", "c", "e"]  # unknown ids are ignored
    assert await history_ids(client, sid, min_seq=out["seq"]) == ["d"]
    assert await history_ids(client, sid, min_seq=out["seq"], leaf_id="a") == ["a"]


async def test_delete_only_unknown_ids_writes_nothing(client: httpx.AsyncClient) -> None:
    sid = new_sid()
    seq = await chain(client, sid, ["a"])
    before = await events(client, sid)
    r = await client.delete(f"/v1/sessions/{sid}/messages", params={"ids": "ghost"})
    assert r.status_code == 200, r.text
    assert r.json()["deleted"] == []
    assert await events(client, sid) == before
    assert await history_ids(client, sid, min_seq=seq) == ["a"]


async def test_clear_empties_the_session(client: httpx.AsyncClient) -> None:
    sid = new_sid()
    await chain(client, sid, ["m1", "m2"])
    await append(client, sid, msg("b1", "branch"), "m1")
    r = await client.post(f"/v1/sessions/{sid}/messages:clear")
    assert r.status_code == 200, r.text
    out = r.json()
    assert out["cleared"] is True
    seq = out["seq"]

    assert await history(client, sid, min_seq=seq) == {"leaf_id": None, "messages": []}
    assert await history_ids(client, sid, min_seq=seq, leaf_id="m2") == []
    r = await client.get(f"/v1/sessions/{sid}/leaf", params={"min_seq": seq})
    assert r.json() == {"leaf_id": None, "message": None}
    # The log keeps the originals; the clear is one more event.
    kinds = [e["event"]["type"] for e in await events(client, sid)]
    assert kinds == ["message.appended"] * 3 + ["messages.cleared"]
    # After a clear, the next message (omitted parent) is a root again.
    nxt = await append(client, sid, msg("fresh", "start over"))
    assert nxt["parent_id"] is None
    assert await history_ids(client, sid, min_seq=nxt["seq"]) == ["fresh"]


async def test_clear_of_an_unknown_session_writes_nothing(client: httpx.AsyncClient) -> None:
    """Like deleting unknown ids, clearing a session that has never existed is a no-op."""
    sid = new_sid()
    r = await client.post(f"/v1/sessions/{sid}/messages:clear")
    assert r.status_code in {200, 404}, r.text
    assert await events(client, sid) == []
    assert_problem(await client.get(f"/v1/sessions/{sid}"), 404, "session_not_found")


# -- large bodies and concurrency ------------------------------------------------------------------


async def test_large_body_round_trips_through_the_claim_check(client: httpx.AsyncClient) -> None:
    sid = new_sid()
    # ~360 KB, over the 256 KiB inline limit; the word within the first 100,000 characters, which are indexed
    big_text = "needleword " + "lorem ipsum dolor " * 20_000 + "tailword"
    body = msg("big", big_text)
    out = await append(client, sid, body)
    seq = out["seq"]
    r = await client.get(f"/v1/sessions/{sid}/messages/big", params={"min_seq": seq})
    assert r.status_code == 200
    assert r.json() == body
    h = await history(client, sid, min_seq=seq)
    assert h["messages"] == [body]
    r = await client.get(f"/v1/sessions/{sid}/search", params={"q": "needleword", "min_seq": seq})
    assert [x["id"] for x in r.json()["results"]] == ["big"]
    r = await client.get(f"/v1/sessions/{sid}/search", params={"q": "tailword", "min_seq": seq})
    assert r.json()["results"] == []  # past the indexed part (docs/http-api.md, search)
    [ev] = await events(client, sid)
    assert ev["event"].get("message") is None
    assert ev["event"]["message_ref"]
    # Idempotent replay of a claim-checked body still answers as the first time.
    again = await append(client, sid, body, expect=200)
    assert again == {**out, "created": False}


async def test_concurrent_appends_without_parent_make_one_chain(client: httpx.AsyncClient) -> None:
    sid = new_sid()

    async def writer(w: int) -> list[int]:
        return [(await append(client, sid, msg(f"w{w}-{i}", f"writer {w} message {i}")))["seq"] for i in range(5)]

    seqs = [s for batch in await asyncio.gather(*(writer(w) for w in range(6))) for s in batch]
    h = await history(client, sid, min_seq=max(seqs))
    ids = [m["id"] for m in h["messages"]]
    assert len(ids) == 30
    assert sorted(ids) == sorted(f"w{w}-{i}" for w in range(6) for i in range(5))
    evs = await events(client, sid)
    parents = [e["event"]["parent_id"] for e in evs]
    assert parents == [None, *[logged_message(e["event"]).message_id for e in evs[:-1]]]  # one linear chain


async def test_concurrent_duplicate_appends(client: httpx.AsyncClient) -> None:
    sid = new_sid()
    await append(client, sid, msg("root", "root"))
    same = await asyncio.gather(
        *(client.post(f"/v1/sessions/{sid}/messages", json=append_body(msg("dup", "same"))) for _ in range(6))
    )
    assert sorted(r.status_code for r in same) == [200] * 5 + [201]
    assert len({r.json()["seq"] for r in same}) == 1
    clash = await asyncio.gather(
        *(client.post(f"/v1/sessions/{sid}/messages", json=append_body(msg("clash", f"body {i}"))) for i in range(6))
    )
    assert sorted(r.status_code for r in clash) == [201] + [409] * 5
    assert len(await events(client, sid)) == 3
