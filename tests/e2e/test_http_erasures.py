"""Who erased a session, and why: ``:erase`` records the API key and the reason given (``chronicle
erase`` the operator), in the erasures record and the ``session.erased`` event; ``GET
/v1/erasures`` lists them for the key's tenant, newest first, a page at a time."""

from __future__ import annotations

from typing import Any

import httpx

from services.ops.erase_cli import CLI_REQUESTER
from services.settings import Settings, hash_key
from tests.conftest import KEYS
from tests.e2e.helpers import append, assert_full_last_page_is_last, assert_problem, events, msg, new_sid
from tests.support import chronicle_cli

KEY_A = f"tenant:tenant-a key:{hash_key(KEYS['tenant-a'])[:12]}"


async def all_erasures(client: httpx.AsyncClient, limit: int = 50) -> list[dict[str, Any]]:
    """Every page of ``GET /v1/erasures``, walked by its cursor."""
    found: list[dict[str, Any]] = []
    params: dict[str, Any] = {"limit": limit}
    while True:
        r = await client.get("/v1/erasures", params=params)
        assert r.status_code == 200, r.text
        page = r.json()
        assert len(page["erasures"]) <= limit
        found += page["erasures"]
        if page["next_cursor"] is None:
            return found
        params["cursor"] = page["next_cursor"]


def erased_event(records: list[dict[str, Any]]) -> dict[str, Any]:
    found: list[dict[str, Any]] = [r["event"] for r in records if r.get("event", {}).get("type") == "session.erased"]
    assert len(found) == 1, records
    return found[0]


async def test_an_erasure_records_the_api_key_and_the_reason(client: httpx.AsyncClient) -> None:
    sid = new_sid("erase-why")
    await append(client, sid, msg("m1", "words"))
    r = await client.post(f"/v1/sessions/{sid}:erase", json={"reason": "ticket GDPR-1234"})
    assert r.status_code == 200, r.text
    seq = r.json()["seq"]
    [entry] = [e for e in await all_erasures(client) if e["session_id"] == sid]
    assert entry["requested_by"] == KEY_A
    assert entry["reason"] == "ticket GDPR-1234"
    assert entry["seq"] == seq
    assert entry["erased_at"]
    event = erased_event(await events(client, sid))
    assert (event["version"], event["requested_by"], event["reason"]) == (3, KEY_A, "ticket GDPR-1234")
    assert str(event["proof"]).startswith("kek-")  # Chronicle's proof: a restored database makes the erasure again


async def test_an_erasure_without_a_body_records_who_asked(client: httpx.AsyncClient) -> None:
    sid = new_sid("erase-nobody")
    await append(client, sid, msg("m1", "words"))
    assert (await client.post(f"/v1/sessions/{sid}:erase")).status_code == 200
    [entry] = [e for e in await all_erasures(client) if e["session_id"] == sid]
    assert (entry["requested_by"], entry["reason"]) == (KEY_A, None)


async def test_erasing_again_keeps_the_first_record(client: httpx.AsyncClient) -> None:
    sid = new_sid("erase-twice")
    await append(client, sid, msg("m1", "words"))
    first = await client.post(f"/v1/sessions/{sid}:erase", json={"reason": "first"})
    assert first.status_code == 200, first.text
    again = await client.post(f"/v1/sessions/{sid}:erase", json={"reason": "second"})
    assert again.status_code == 200, again.text
    assert again.json()["seq"] == first.json()["seq"]
    [entry] = [e for e in await all_erasures(client) if e["session_id"] == sid]
    assert (entry["reason"], entry["seq"]) == ("first", first.json()["seq"])
    assert erased_event(await events(client, sid))["reason"] == "first"


async def test_a_bad_reason_is_422_and_erases_nothing(client: httpx.AsyncClient) -> None:
    sid = new_sid("erase-bad")
    seq = (await append(client, sid, msg("m1", "still here")))["seq"]
    for reason in ("x" * 501, "nul\x00inside"):
        r = await client.post(f"/v1/sessions/{sid}:erase", json={"reason": reason})
        assert r.status_code == 422, r.text
    unknown = await client.post(f"/v1/sessions/{sid}:erase", json={"why": "unknown field"})
    assert_problem(unknown, 422, "invalid_request")
    assert (await client.get(f"/v1/sessions/{sid}/history", params={"min_seq": seq})).status_code == 200
    assert sid not in {e["session_id"] for e in await all_erasures(client)}
    assert (await client.post(f"/v1/sessions/{sid}:erase", json={"reason": "y" * 500})).status_code == 200


async def test_the_list_pages_newest_first_and_shows_each_erasure_once(client: httpx.AsyncClient) -> None:
    sids = [new_sid("erase-page") for _ in range(5)]
    for sid in sids:
        await append(client, sid, msg("m1", "words"))
        assert (await client.post(f"/v1/sessions/{sid}:erase", json={"reason": sid[-6:]})).status_code == 200
    listed = await all_erasures(client, limit=2)
    ours = [e["session_id"] for e in listed if e["session_id"] in sids]
    assert ours == sids[::-1]
    keys = [(e["erased_at"], e["session_id"]) for e in listed]
    assert len(set(keys)) == len(keys)
    assert keys == sorted(keys, reverse=True)


async def test_a_full_last_page_has_no_cursor(client: httpx.AsyncClient) -> None:
    sid = new_sid("erase-last")
    await append(client, sid, msg("m1", "words"))
    assert (await client.post(f"/v1/sessions/{sid}:erase")).status_code == 200
    await assert_full_last_page_is_last(client, "/v1/erasures", "erasures")


async def test_the_list_bounds_limit_and_cursor(client: httpx.AsyncClient) -> None:
    for params in ({"limit": 0}, {"limit": 501}, {"cursor": "not-a-cursor"}):
        assert (await client.get("/v1/erasures", params=params)).status_code == 422, params


async def test_a_cursor_no_list_gave_is_422_and_one_it_gave_pages_on(client: httpx.AsyncClient) -> None:
    """A cursor names an erasure of the tenant (``<erased_at in µs>.<session id>``): erasures are
    never forgotten, so any other is a cursor no list gave, never an empty or a first page."""
    for _ in range(2):
        sid = new_sid("erase-cursor")
        await append(client, sid, msg("m1", "words"))
        assert (await client.post(f"/v1/sessions/{sid}:erase")).status_code == 200
    page = (await client.get("/v1/erasures", params={"limit": 1})).json()
    cursor = page["next_cursor"]
    micros, _, named = cursor.partition(".")
    assert named == page["erasures"][0]["session_id"]
    too_late = ("9999999999999999999.x", "99999999999999999999.x", f"{'9' * 900}.{named}")  # any number of digits
    for bad in ("1.5", *too_late, f"{int(micros) + 1}.{named}", f"{micros}.{named}x"):
        problem = assert_problem(await client.get("/v1/erasures", params={"cursor": bad}), 422, "unknown_cursor")
        assert "cursor" in problem["detail"], (bad, problem)
    assert_problem(await client.get("/v1/erasures", params={"cursor": f"0{cursor}"}), 422, "invalid_request")
    r = await client.get("/v1/erasures", params={"limit": 1, "cursor": cursor})
    assert r.status_code == 200, r.text
    assert r.json()["erasures"][0]["session_id"] != named


async def test_another_tenant_sees_none_of_them(client: httpx.AsyncClient, client_b: httpx.AsyncClient) -> None:
    sid = new_sid("erase-tenant")
    await append(client, sid, msg("m1", "words"))
    assert (await client.post(f"/v1/sessions/{sid}:erase", json={"reason": "mine"})).status_code == 200
    seen_by_b = await all_erasures(client_b)
    assert sid not in {e["session_id"] for e in seen_by_b}
    assert all(e["requested_by"] != KEY_A for e in seen_by_b)


async def test_the_cli_records_the_operator_and_its_reason(client: httpx.AsyncClient, api_settings: Settings) -> None:
    sid = new_sid("erase-cli")
    await append(client, sid, msg("m1", "words"))
    done = chronicle_cli(api_settings, "erase", "--tenant", "tenant-a", "--session", sid, "--reason", "court order 7")
    assert done.returncode == 0, done.stderr
    [entry] = [e for e in await all_erasures(client) if e["session_id"] == sid]
    assert (entry["requested_by"], entry["reason"]) == (CLI_REQUESTER, "court order 7")
    assert erased_event(await events(client, sid))["requested_by"] == CLI_REQUESTER


async def test_the_cli_refuses_a_too_long_reason(client: httpx.AsyncClient, api_settings: Settings) -> None:
    sid = new_sid("erase-cli-bad")
    seq = (await append(client, sid, msg("m1", "words")))["seq"]
    done = chronicle_cli(api_settings, "erase", "--tenant", "tenant-a", "--session", sid, "--reason", "x" * 501)
    assert done.returncode == 2
    assert "--reason" in done.stderr
    assert (await client.get(f"/v1/sessions/{sid}/history", params={"min_seq": seq})).status_code == 200
