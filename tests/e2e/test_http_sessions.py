"""Sessions over HTTP: create, read, list (newest created or most recently active first, paginated),
rename, delete."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest

from tests.conftest import SEALING
from tests.e2e.helpers import (
    append,
    append_body,
    assert_full_last_page_is_last,
    assert_problem,
    events,
    msg,
    new_sid,
    stream_last_seq,
)


async def create(client: httpx.AsyncClient, **body: Any) -> dict[str, Any]:
    r = await client.post("/v1/sessions", json=body)
    assert r.status_code == 201, r.text
    out: dict[str, Any] = r.json()
    assert isinstance(out["seq"], int)
    return out


@pytest.mark.parametrize("headers", [{}, {"Content-Type": "application/json"}], ids=["no-type", "json"])
async def test_an_empty_body_creates_as_an_empty_object_does(
    client: httpx.AsyncClient, headers: dict[str, str]
) -> None:
    """Every field is optional: no body is ``{}`` (it was 422 "body: Field required")."""
    r = await client.post("/v1/sessions", content=b"", headers=headers)
    assert r.status_code == 201, r.text
    out = r.json()
    assert (out["name"], out["parent_session_id"], out["metadata"]) == ("", None, {})
    r = await client.get(f"/v1/sessions/{out['id']}", params={"min_seq": out["seq"]})
    assert r.status_code == 200, r.text
    r = await client.post(f"/v1/sessions/{out['id']}/usage", content=b"", headers=headers)  # all optional too
    assert r.status_code == 200, r.text
    assert r.json()["seq"] == out["seq"]  # nothing added, nothing written
    last = await stream_last_seq(client)
    problem = assert_problem(
        await client.post("/v1/sessions", content=b"null", headers=headers), 422, "invalid_request"
    )
    assert problem["errors"], problem  # JSON null is no object, and not "no body"
    assert await stream_last_seq(client) == last


async def test_create_then_get(client: httpx.AsyncClient) -> None:
    sid = new_sid()
    out = await create(client, id=sid, name="planning", metadata={"owner": "ada", "tags": ["x"]})
    assert out["id"] == sid
    assert out["name"] == "planning"
    assert out["metadata"] == {"owner": "ada", "tags": ["x"]}

    r = await client.get(f"/v1/sessions/{sid}", params={"min_seq": out["seq"]})
    assert r.status_code == 200, r.text
    got = r.json()
    assert got["id"] == sid
    assert got["name"] == "planning"
    assert got["metadata"] == {"owner": "ada", "tags": ["x"]}
    assert got["parent_session_id"] is None
    assert got["seq"] == out["seq"]
    assert got["created_at"]
    assert got["updated_at"]
    [ev] = await events(client, sid)
    assert ev["seq"] == out["seq"]
    assert ev["event"]["type"] == "session.created"
    assert ev["event"]["name"] == "planning"


async def test_create_without_id_generates_one(client: httpx.AsyncClient) -> None:
    out = await create(client, name="anonymous")
    assert out["id"]
    r = await client.get(f"/v1/sessions/{out['id']}", params={"min_seq": out["seq"]})
    assert r.status_code == 200, r.text
    assert r.json()["name"] == "anonymous"


async def test_create_with_parent_session(client: httpx.AsyncClient) -> None:
    parent = await create(client, id=new_sid())
    r = await client.get(f"/v1/sessions/{parent['id']}", params={"min_seq": parent["seq"]})
    assert r.status_code == 200, r.text
    child = await create(client, id=new_sid(), parent_session_id=parent["id"])
    r = await client.get(f"/v1/sessions/{child['id']}", params={"min_seq": child["seq"]})
    assert r.json()["parent_session_id"] == parent["id"]


async def test_create_child_right_after_its_parent(client: httpx.AsyncClient) -> None:
    """Read-your-writes for commands: a parent created by the previous request must be visible."""
    for _ in range(50):  # the race loses about one time in three
        parent = await create(client, id=new_sid())
        child = await create(client, id=new_sid(), parent_session_id=parent["id"])
        assert child["parent_session_id"] == parent["id"]


async def test_create_with_unknown_parent_session_is_404(client: httpx.AsyncClient) -> None:
    sid = new_sid()
    r = await client.post("/v1/sessions", json={"id": sid, "parent_session_id": new_sid()})
    assert_problem(r, 404, "session_not_found")
    assert await events(client, sid) == []


async def test_create_existing_id_conflicts(client: httpx.AsyncClient) -> None:
    sid = new_sid()
    out = await create(client, id=sid, name="first")
    r = await client.post("/v1/sessions", json={"id": sid, "name": "second"})
    assert_problem(r, 409, "session_exists")
    assert len(await events(client, sid)) == 1
    r = await client.get(f"/v1/sessions/{sid}", params={"min_seq": out["seq"]})
    assert r.json()["name"] == "first"


async def test_the_same_create_again_answers_200_with_the_first_answer_and_writes_nothing(
    client: httpx.AsyncClient,
) -> None:
    """A create whose answer was lost (a timeout) is retried: the retry is the same create (same
    id, name, metadata and parent) and answers as the first one did, ``200`` where it was ``201``;
    it was ``409 session_exists``, and the client could not tell its own create from a clash. A
    create that differs in any of them is still ``409``, as is one of a deleted session."""
    parent = await create(client, name="parent")
    sid = new_sid()
    body = {"id": sid, "name": "child", "metadata": {"team": "ops", "n": [1, 2]}, "parent_session_id": parent["id"]}
    first = await client.post("/v1/sessions", json=body)
    assert first.status_code == 201, first.text
    before = await events(client, sid)
    again = await client.post("/v1/sessions", json=body)
    assert (again.status_code, again.json()) == (200, first.json())
    assert await events(client, sid) == before  # nothing published
    for other in ({"name": "other"}, {"metadata": {"team": "ops"}}, {"parent_session_id": None}):
        assert_problem(await client.post("/v1/sessions", json={**body, **other}), 409, "session_exists")
    renamed = await client.patch(f"/v1/sessions/{sid}", json={"name": "renamed"})
    assert renamed.status_code == 200, renamed.text
    again = await client.post("/v1/sessions", json=body)  # the create is what it was: renamed since
    assert (again.status_code, again.json()) == (200, first.json())
    assert (await client.delete(f"/v1/sessions/{sid}")).status_code == 200
    assert_problem(await client.post("/v1/sessions", json=body), 409, "session_exists")


async def test_create_id_of_a_session_made_by_an_append_conflicts(client: httpx.AsyncClient) -> None:
    sid = new_sid()
    await append(client, sid, msg("m1", "implicitly creates the session"))
    r = await client.post("/v1/sessions", json={"id": sid})
    assert_problem(r, 409, "session_exists")


async def test_append_creates_the_session_implicitly(client: httpx.AsyncClient) -> None:
    sid = new_sid()
    out = await append(client, sid, msg("m1", "first words"))
    r = await client.get(f"/v1/sessions/{sid}", params={"min_seq": out["seq"]})
    assert r.status_code == 200, r.text
    got = r.json()
    assert got["id"] == sid
    assert got["name"] == ""
    assert got["seq"] == out["seq"]


async def test_list_newest_first_with_pagination(client: httpx.AsyncClient) -> None:
    made = [await create(client, id=new_sid("list"), name=f"n{i}") for i in range(5)]
    newest_first = [m["id"] for m in reversed(made)]
    min_seq = made[-1]["seq"]

    r = await client.get("/v1/sessions", params={"limit": 2, "min_seq": min_seq})
    assert r.status_code == 200, r.text
    page = r.json()
    assert [s["id"] for s in page["sessions"]] == newest_first[:2]
    assert page["next_cursor"] is not None

    seen = [s["id"] for s in page["sessions"]]
    cursor = page["next_cursor"]
    while len(seen) < 5:
        r = await client.get("/v1/sessions", params={"limit": 2, "cursor": cursor})
        assert r.status_code == 200, r.text
        page = r.json()
        assert page["sessions"], "ran out of pages before seeing our sessions"
        seen.extend(s["id"] for s in page["sessions"])
        cursor = page["next_cursor"]
    assert seen[:5] == newest_first
    assert len(set(seen)) == len(seen)  # no session on two pages


async def test_list_last_page_has_no_cursor(client: httpx.AsyncClient) -> None:
    await create(client, id=new_sid())
    r = await client.get("/v1/sessions", params={"limit": 500})
    page = r.json()
    seen: list[str] = [s["id"] for s in page["sessions"]]
    while page["next_cursor"] is not None:
        r = await client.get("/v1/sessions", params={"limit": 500, "cursor": page["next_cursor"]})
        page = r.json()
        seen.extend(s["id"] for s in page["sessions"])
    assert len(seen) == len(set(seen))
    assert page["next_cursor"] is None


@pytest.mark.parametrize("order", ["created", "recent"])
async def test_a_full_last_page_has_no_cursor(client: httpx.AsyncClient, order: str) -> None:
    seq = (await create(client, id=new_sid()))["seq"]
    await assert_full_last_page_is_last(client, "/v1/sessions", "sessions", order=order, min_seq=seq)


async def _recent(client: httpx.AsyncClient, min_seq: int, ours: set[str], limit: int = 500) -> list[str]:
    """Our sessions in the order of a whole walk of ``order=recent`` (no session on two pages)."""
    seen: list[str] = []
    params: dict[str, Any] = {"order": "recent", "limit": limit, "min_seq": min_seq}
    while True:
        r = await client.get("/v1/sessions", params=params)
        assert r.status_code == 200, r.text
        page = r.json()
        seen += [s["id"] for s in page["sessions"]]
        if page["next_cursor"] is None or ours <= set(seen):
            break
        assert isinstance(page["next_cursor"], str)
        params = {"order": "recent", "limit": limit, "cursor": page["next_cursor"]}
    assert len(seen) == len(set(seen))
    return [s for s in seen if s in ours]


async def test_list_recent_puts_the_most_recently_active_first(client: httpx.AsyncClient) -> None:
    a, b, c = [(await create(client, id=new_sid("recent")))["id"] for _ in range(3)]
    ours = {a, b, c}
    seq = (await append(client, a, msg("m1", "hello")))["seq"]
    assert await _recent(client, seq, ours) == [a, c, b]
    r = await client.patch(f"/v1/sessions/{c}", json={"name": "renamed"})
    assert r.status_code == 200, r.text
    assert await _recent(client, r.json()["seq"], ours, limit=1) == [c, a, b]  # a page per session
    r = await client.post(f"/v1/sessions/{b}/usage", json={"input_tokens": 1, "output_tokens": 0, "cost": 0})
    assert r.status_code == 200, r.text
    assert await _recent(client, r.json()["seq"], ours) == [b, c, a]
    r = await client.get("/v1/sessions", params={"limit": 500})  # the default order is still creation
    assert [s["id"] for s in r.json()["sessions"] if s["id"] in ours] == [c, b, a]


async def test_a_cursor_only_pages_the_order_that_gave_it(client: httpx.AsyncClient) -> None:
    for _ in range(2):
        await create(client, id=new_sid("cursor"))
    created = (await client.get("/v1/sessions", params={"limit": 1})).json()["next_cursor"]
    recent = (await client.get("/v1/sessions", params={"limit": 1, "order": "recent"})).json()["next_cursor"]
    assert isinstance(created, int)
    assert isinstance(recent, str)
    refused: list[dict[str, Any]] = [
        {"order": "recent", "cursor": created},
        {"cursor": recent},
        {"order": "created", "cursor": recent},
    ]
    for params in refused:
        problem = assert_problem(await client.get("/v1/sessions", params=params), 422, "cursor_order_mismatch")
        assert "order=" in problem["detail"]
    accepted: list[dict[str, Any]] = [{"order": "recent", "cursor": recent}, {"order": "created", "cursor": created}]
    for params in accepted:
        assert (await client.get("/v1/sessions", params=params)).status_code == 200


@pytest.mark.parametrize(
    ("params", "code"),
    [
        ({"cursor": str(2**63)}, "unknown_cursor"),  # past the largest sequence (bigint)
        ({"cursor": "9" * 19}, "unknown_cursor"),
        ({"order": "recent", "cursor": f"recent.{2**63}.a"}, "unknown_cursor"),
        ({"order": "recent", "cursor": f"recent.{'9' * 19}."}, "unknown_cursor"),
        ({"cursor": "9" * 20}, "unknown_cursor"),  # however many digits (20 were invalid_request)
        ({"cursor": "9" * 1000}, "unknown_cursor"),
        ({"order": "recent", "cursor": f"recent.{'9' * 20}.a"}, "unknown_cursor"),
        ({"order": "recent", "cursor": "recent.5."}, "unknown_cursor"),  # no session id
        ({"order": "recent", "cursor": "recent.5. a"}, "unknown_cursor"),  # not a session id
        ({"order": "recent", "cursor": f"recent.5.{'s' * 129}"}, "unknown_cursor"),
        # not in the form the schema states: malformed
        ({"cursor": "0"}, "invalid_request"),  # no session is created at 0
        ({"cursor": "007"}, "invalid_request"),  # a list writes no leading zeros
        ({"order": "recent", "cursor": "recent.0.a"}, "invalid_request"),
    ],
)
async def test_a_cursor_no_list_gives_is_422_never_a_first_page(
    client: httpx.AsyncClient, params: dict[str, Any], code: str
) -> None:
    """(A cursor in the list's form that no page gives is ``unknown_cursor``: ``invalid_request``
    is for a request the OpenAPI schema refuses.)"""
    problem = assert_problem(await client.get("/v1/sessions", params=params), 422, code)
    assert "cursor" in problem["detail"], problem


async def test_the_largest_cursors_a_list_may_give_are_taken(client: httpx.AsyncClient) -> None:
    for params in ({"cursor": str(2**63 - 1)}, {"order": "recent", "cursor": f"recent.{2**63 - 1}.s-1"}):
        r = await client.get("/v1/sessions", params={"limit": 2, **params})
        assert r.status_code == 200, r.text


async def test_rename(client: httpx.AsyncClient) -> None:
    sid = new_sid()
    await create(client, id=sid, name="old")
    r = await client.patch(f"/v1/sessions/{sid}", json={"name": "new name"})
    assert r.status_code == 200, r.text
    out = r.json()
    assert out["name"] == "new name"
    r = await client.get(f"/v1/sessions/{sid}", params={"min_seq": out["seq"]})
    assert r.json()["name"] == "new name"
    assert [e["event"]["type"] for e in await events(client, sid)] == ["session.created", "session.renamed"]


async def test_rename_to_the_empty_name_gives_the_name_a_session_made_without_one_has(
    client: httpx.AsyncClient,
) -> None:
    """``""`` is a name, the default of a create (and of a session made by its first append), as
    in the reference: a rename to it is taken, not refused."""
    sid = new_sid()
    await create(client, id=sid, name="old")
    r = await client.patch(f"/v1/sessions/{sid}", json={"name": ""})
    assert r.status_code == 200, r.text
    r = await client.get(f"/v1/sessions/{sid}", params={"min_seq": r.json()["seq"]})
    assert r.json()["name"] == ""


async def test_rename_unknown_session_is_404(client: httpx.AsyncClient) -> None:
    sid = new_sid()
    r = await client.patch(f"/v1/sessions/{sid}", json={"name": "x"})
    assert_problem(r, 404, "session_not_found")
    assert await events(client, sid) == []


async def test_delete_session(client: httpx.AsyncClient) -> None:
    sid = new_sid()
    created = await create(client, id=sid, name="doomed")
    await append(client, sid, msg("m1", "soon gone"))
    r = await client.delete(f"/v1/sessions/{sid}")
    assert r.status_code == 200, r.text
    out = r.json()
    assert out["deleted"] is True
    seq = out["seq"]

    assert_problem(await client.get(f"/v1/sessions/{sid}", params={"min_seq": seq}), 404, "session_not_found")
    r = await client.post(f"/v1/sessions/{sid}/messages", json=append_body(msg("m2", "too late")))
    assert_problem(r, 404, "session_not_found")
    assert_problem(await client.delete(f"/v1/sessions/{sid}"), 404, "session_not_found")
    assert_problem(await client.patch(f"/v1/sessions/{sid}", json={"name": "x"}), 404, "session_not_found")
    assert_problem(await client.post(f"/v1/sessions/{sid}/messages:clear"), 404, "session_not_found")
    r = await client.put(f"/v1/sessions/{sid}/messages/m1", json={"message": msg("m1", "edit")})
    assert_problem(r, 404, "session_not_found")

    r = await client.get("/v1/sessions", params={"limit": 500, "min_seq": seq})
    assert sid not in [s["id"] for s in r.json()["sessions"]]
    # The log keeps everything.
    kinds = [e["event"]["type"] for e in await events(client, sid)]
    assert kinds == ["session.created", "message.appended", "session.deleted"]
    assert created["seq"] < seq


async def test_deleted_sessions_are_listed_for_auditors_with_when_newest_created_first(
    client: httpx.AsyncClient,
) -> None:
    """The log keeps a deleted session's events, but no list named it: an auditor exporting a
    tenant's log could not find it (``deleted=true`` was ``422``, an unknown parameter)."""
    made = [await create(client, id=new_sid("gone"), name=f"gone {i}") for i in range(3)]
    live = await create(client, id=new_sid("kept"))
    deletions = [(await client.delete(f"/v1/sessions/{m['id']}")).json() for m in made]
    last = max(d["seq"] for d in deletions)

    r = await client.get("/v1/sessions", params={"deleted": "true", "limit": 2, "min_seq": last})
    assert r.status_code == 200, r.text
    page = r.json()
    seen = page["sessions"]
    while page["next_cursor"] is not None and len(seen) < 500:
        page = (await client.get("/v1/sessions", params={"deleted": "true", "cursor": page["next_cursor"]})).json()
        seen += page["sessions"]
    ids = [s["id"] for s in seen]
    assert [i for i in ids if i in {m["id"] for m in made}] == [m["id"] for m in reversed(made)]
    assert live["id"] not in ids
    assert all(s["deleted_at"] for s in seen)
    listed = next(s for s in seen if s["id"] == made[0]["id"])
    assert (listed["name"], listed["seq"]) == ("gone 0", deletions[0]["seq"])
    lives = (await client.get("/v1/sessions", params={"limit": 500, "min_seq": last})).json()["sessions"]
    assert live["id"] in [s["id"] for s in lives]
    assert all("deleted_at" not in s for s in lives)  # the live list's answers as they were
    refused = await client.get("/v1/sessions", params={"deleted": "true", "order": "recent"})
    assert "order=created" in assert_problem(refused, 422, "invalid_request")["detail"]


async def test_delete_unknown_session_is_404(client: httpx.AsyncClient) -> None:
    sid = new_sid()
    assert_problem(await client.delete(f"/v1/sessions/{sid}"), 404, "session_not_found")
    assert await events(client, sid) == []


async def test_concurrent_creates_of_one_id(client: httpx.AsyncClient) -> None:
    sid = new_sid()
    answers = await asyncio.gather(*(client.post("/v1/sessions", json={"id": sid, "name": f"n{i}"}) for i in range(6)))
    assert sorted(r.status_code for r in answers) == [201] + [409] * 5
    assert [e["event"]["type"] for e in await events(client, sid)] == ["session.created"]


async def test_erasure_without_encryption_drops_the_rows_and_shows_tombstones(client: httpx.AsyncClient) -> None:
    """This stack does not seal (the setting's default): erasure still drops every row, refuses
    writes and shows the log's events as tombstones (docs/security.md: the log keeps their
    plaintext, which only sealing removes)."""
    sid = new_sid("erase-plain")
    await append(client, sid, msg("m1", "plain words"))
    before = await events(client, sid)
    r = await client.post(f"/v1/sessions/{sid}:erase")
    assert r.status_code == 200, r.text
    assert r.json()["objects_deleted"] == 0
    assert_problem(await client.get(f"/v1/sessions/{sid}/history"), 410, "session_erased")
    after = await events(client, sid)
    assert [e["seq"] for e in after if "erased" in e] == [e["seq"] for e in before]
    assert "plain words" not in str(after)
    r = await client.post(f"/v1/sessions/{sid}/messages", json=append_body(msg("m2", "again")))
    assert_problem(r, 410, "session_erased")


@pytest.mark.skipif(SEALING, reason="CHRONICLE_TEST_ENCRYPTION=1: this stack seals")
async def test_a_data_key_is_refused_where_nothing_is_sealed(client: httpx.AsyncClient) -> None:
    assert_problem(await client.get(f"/v1/sessions/{new_sid()}/data-key"), 404, "encryption_off")
