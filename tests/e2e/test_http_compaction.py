"""Compaction over HTTP against the running stack (the default offline summarizer): every overlay
a new one hides is carried into its summary, after a lowered ``protect_head`` nothing summarised
stays visible, a sibling branch's newer, narrower overlay leaves this branch's in force, an
unknown session or leaf is refused, and a summary that would not shrink the context is not
recorded."""

from __future__ import annotations

import re
from typing import Any

import httpx

from tests.e2e.helpers import PROSE, append, msg, new_sid


def _text(mid: str) -> str:
    return f"marker{mid}{PROSE}"


async def _chain(client: httpx.AsyncClient, sid: str, ids: list[str], parent: str | None = None) -> int:
    body: dict[str, Any] = {"messages": [msg(i, _text(i)) for i in ids]}
    if parent is not None:
        body["parent_id"] = parent
    r = await client.post(f"/v1/sessions/{sid}/messages:batch", json=body)
    assert r.status_code == 201, r.text
    seq: int = r.json()["seq"]
    return seq


async def _config(client: httpx.AsyncClient, sid: str, protect_head: int) -> None:
    cfg = {"compaction": {"protect_head": protect_head, "tail_token_budget": 10, "min_tail_messages": 2}}
    r = await client.put(f"/v1/sessions/{sid}/config", json=cfg)
    assert r.status_code == 200, r.text


async def _compact(client: httpx.AsyncClient, sid: str, leaf: str | None = None) -> dict[str, Any]:
    r = await client.post(f"/v1/sessions/{sid}/compact", json={"leaf_id": leaf} if leaf else {})
    assert r.status_code == 200, r.text
    out: dict[str, Any] = r.json()
    return out


async def _overlay(client: httpx.AsyncClient, sid: str, leaf: str | None = None) -> dict[str, Any]:
    out = await _compact(client, sid, leaf)
    assert out["compacted"] is True, out
    overlay: dict[str, Any] = out["overlay"]
    overlay["seq"] = out["seq"]
    return overlay


async def _history(client: httpx.AsyncClient, sid: str, seq: int, **params: Any) -> list[dict[str, Any]]:
    r = await client.get(f"/v1/sessions/{sid}/history", params={"min_seq": seq, **params})
    assert r.status_code == 200, r.text
    messages: list[dict[str, Any]] = r.json()["messages"]
    return messages


def _topics(summary: str) -> str:
    m = re.search(r"## Topic\n(.*?)\n## ", summary, re.S)
    assert m, summary
    return m.group(1)


async def _compacted_then_head_lowered(client: httpx.AsyncClient, sid: str) -> dict[str, Any]:
    """m0…m14 compacted under ``protect_head`` 5 (the overlay m5→m12), then ``protect_head`` 1."""
    await _config(client, sid, protect_head=5)
    await _chain(client, sid, [f"m{i}" for i in range(15)])
    overlay = await _overlay(client, sid)
    assert (overlay["from_message_id"], overlay["to_message_id"]) == ("m5", "m12")
    await _config(client, sid, protect_head=1)
    return overlay


async def test_compacting_over_two_overlays_carries_both_summaries(client: httpx.AsyncClient) -> None:
    sid = new_sid("cmp-two")
    late = await _compacted_then_head_lowered(client, sid)
    early = await _overlay(client, sid, leaf="m6")  # on m0…m6 the m5→m12 overlay is not in force
    assert (early["from_message_id"], early["to_message_id"]) == ("m1", "m4")
    view = await _history(client, sid, early["seq"])
    assert [m["id"] for m in view] == ["m0", early["message_id"], late["message_id"], "m13", "m14"]
    assert "markerm1" in _topics(early["summary"])
    assert "markerm5" in _topics(late["summary"])
    seq = await _chain(client, sid, ["m15", "m16"])
    grown = await _overlay(client, sid)
    assert (grown["from_message_id"], grown["to_message_id"]) == ("m1", "m14")
    # what both hidden overlays summarised reached the summarizer (the offline one keeps topics)
    assert "markerm1" in _topics(grown["summary"])
    assert "markerm5" in _topics(grown["summary"])
    view = await _history(client, sid, max(seq, grown["seq"]))
    assert [m["id"] for m in view] == ["m0", grown["message_id"], "m15", "m16"]


async def test_after_lowering_protect_head_nothing_summarised_stays_visible(client: httpx.AsyncClient) -> None:
    sid = new_sid("cmp-head")
    await _compacted_then_head_lowered(client, sid)
    seq = await _chain(client, sid, ["m15", "m16"])
    grown = await _overlay(client, sid)
    assert "markerm1" in grown["summary"]  # m1…m4 were summarised this time…
    assert (grown["from_message_id"], grown["to_message_id"]) == ("m1", "m14")
    view = await _history(client, sid, max(seq, grown["seq"]))
    assert [m["id"] for m in view] == ["m0", grown["message_id"], "m15", "m16"]  # …so they are hidden


async def test_a_message_whose_id_starts_like_an_overlays_is_compacted_as_a_message(client: httpx.AsyncClient) -> None:
    """A client may give a message an id starting with ``compaction_``, the prefix overlays read
    under. The planner took such a message for an overlay: in the head, ``protect_head`` was
    bypassed (the overlay began at it, so the head was summarised and hidden), and its text reached
    the summarizer as a previous summary. Overlays are told by what they are, not by their id: the
    head stays, and the message is summarised as any other."""
    sid = new_sid("cmp-lookalike")
    await _config(client, sid, protect_head=3)
    await _chain(client, sid, ["compaction_mine", *[f"m{i}" for i in range(1, 12)]])
    overlay = await _overlay(client, sid)
    assert (overlay["from_message_id"], overlay["to_message_id"]) == ("m3", "m9")
    view = await _history(client, sid, overlay["seq"])
    assert [m["id"] for m in view] == ["compaction_mine", "m1", "m2", overlay["message_id"], "m10", "m11"]
    assert view[0]["parts"] == [{"type": "text", "text": _text("compaction_mine")}]

    # in the middle it is summarised as a message, and hidden by the overlay like the others
    sid = new_sid("cmp-lookalike")
    await _config(client, sid, protect_head=1)
    await _chain(client, sid, ["m0", "m1", "compaction_mine", *[f"m{i}" for i in range(3, 12)]])
    overlay = await _overlay(client, sid)
    assert (overlay["from_message_id"], overlay["to_message_id"]) == ("m1", "m9")
    view = await _history(client, sid, overlay["seq"])
    assert [m["id"] for m in view] == ["m0", overlay["message_id"], "m10", "m11"]


async def test_a_sibling_branchs_newer_narrower_overlay_leaves_the_main_branch_compacted(
    client: httpx.AsyncClient,
) -> None:
    sid = new_sid("cmp-sib")
    await _config(client, sid, protect_head=1)
    await _chain(client, sid, [f"a{i}" for i in range(12)])
    main = await _overlay(client, sid)
    assert (main["from_message_id"], main["to_message_id"]) == ("a1", "a9")
    await append(client, sid, msg("b6", _text("b6")), "a5")
    branch = await _overlay(client, sid, leaf="b6")
    assert (branch["from_message_id"], branch["to_message_id"]) == ("a1", "a4")
    seq = branch["seq"]
    main_view = ["a0", main["message_id"], "a10", "a11"]
    assert [m["id"] for m in await _history(client, sid, seq, leaf_id="a11")] == main_view
    assert [m["id"] for m in await _history(client, sid, seq, leaf_id="b6")] == ["a0", branch["message_id"], "a5", "b6"]
    # time travel folds the log by the same rule
    as_of = await _history(client, sid, seq, leaf_id="a11", as_of_seq=seq)
    assert [m["id"] for m in as_of] == main_view
    # a fork of the main branch carries the overlay in force there
    r = await client.post(f"/v1/sessions/{sid}/fork", json={"at_message_id": "a11"})
    assert r.status_code == 201, r.text
    forked = await _history(client, r.json()["id"], r.json()["seq"])
    assert [m["id"] for m in forked][2:] == ["a10", "a11"]
    assert forked[1]["parts"][0]["text"] == main["summary"]
    # compacting the main branch again extends its own overlay, not the branch's
    seq = await _chain(client, sid, ["a12", "a13"], parent="a11")
    again = await _overlay(client, sid, leaf="a13")
    assert (again["from_message_id"], again["to_message_id"]) == ("a1", "a11")


async def test_compact_refuses_an_unknown_session_or_leaf(client: httpx.AsyncClient) -> None:
    never = await client.post(f"/v1/sessions/{new_sid('cmp-never')}/compact", json={})
    assert (never.status_code, never.json()["code"]) == (404, "session_not_found")
    sid = new_sid("cmp-leaf")
    await _config(client, sid, protect_head=1)
    await _chain(client, sid, [f"m{i}" for i in range(8)])
    overlay = await _overlay(client, sid)
    for leaf in ("nope", overlay["message_id"]):
        r = await client.post(f"/v1/sessions/{sid}/compact", json={"leaf_id": leaf})
        assert (r.status_code, r.json()["code"]) == (404, "message_not_found"), (leaf, r.text)
    listed = (await client.get(f"/v1/sessions/{sid}/compactions")).json()["compactions"]
    assert [o["id"] for o in listed] == [overlay["id"]]  # the refusals recorded nothing


async def test_a_summary_that_would_not_shrink_the_context_is_not_recorded(client: httpx.AsyncClient) -> None:
    sid = new_sid("cmp-grow")
    await _config(client, sid, protect_head=1)
    short = [msg(f"m{i}", f"ok {i}") for i in range(8)]  # the offline summary of these is longer than they are
    r = await client.post(f"/v1/sessions/{sid}/messages:batch", json={"messages": short})
    assert r.status_code == 201, r.text
    out = await _compact(client, sid)
    assert out["compacted"] is False
    assert out["reason"].startswith("the summary would not shrink the context"), out
    listed = (await client.get(f"/v1/sessions/{sid}/compactions")).json()["compactions"]
    assert listed == []
    view = await _history(client, sid, r.json()["seq"])
    assert [m["id"] for m in view] == [f"m{i}" for i in range(8)]
