"""Skills on S3 (moto) over HTTP: allowlist filtering, load/unload/reload, the history view of
unloaded skills, and ``chronicle skills put|sync``."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import httpx

from events.catalog import MessageAppended
from events.messages import body_hash
from services.settings import Settings
from tests.conftest import tenant_nats
from tests.e2e.context_support import (
    block,
    configure,
    context,
    events,
    last_seq,
    listed,
    minio,
    new_bucket,
    prompt,
    put_object,
    refresh,
    sid,
    tenant_key,
    tool,
)
from tests.support import chronicle_cli

PIRATE = "# Pirate style\nSay arr — always. 🏴\u200d☠️"


def skills_block(bucket: str, **extra: Any) -> dict[str, Any]:
    return {"kind": "skills", "label": "skills", "description": "Loadable docs", "bucket": bucket, **extra}


async def set_skill(client: httpx.AsyncClient, s: str, title: str, content: str, description: str | None) -> None:
    meta = {"title": title} if description is None else {"title": title, "description": description}
    res, _ = await tool(client, s, "set_context", {"label": "skills", "content": content, "metadata": meta})
    assert res.startswith('Indexed "'), res


async def unload_description(client: httpx.AsyncClient, s: str, min_seq: int) -> str:
    r = await client.get(f"/v1/sessions/{s}/tools", params={"format": "anthropic", "min_seq": min_seq})
    tools = {t["name"]: t for t in r.json()["tools"]}
    description: str = tools["unload_context"]["description"]
    return description


def recorded_paths(api_settings: Settings, action: str) -> list[str]:
    """Drive moto's request recorder; returns the recorded (method, path) lines on 'download'."""
    r = httpx.post(f"http://{api_settings.s3_endpoint}/moto-api/recorder/{action}", timeout=10)
    assert r.status_code == 200, r.text
    if action != "download-recording":
        return []
    return [f"{e['method']} {e['url']}" for e in map(json.loads, r.text.splitlines()) if e]


async def test_allowlist_filters_the_listing_and_loads(client: httpx.AsyncClient, api_settings: Settings) -> None:
    bucket = new_bucket(api_settings)
    s = sid()
    await configure(
        client, s, {"blocks": [skills_block(bucket, prefix="skills/", keys=["tax", "bank-reconciliation"])]}
    )
    await set_skill(client, s, "tax", "Tax doc", "Tax workflows")
    await set_skill(client, s, "bank reconciliation", "Bank doc", "Bank reconciliation")
    # the tenant's skill index is shared: another session's block, without the allowlist, puts one
    other = sid()
    await configure(client, other, {"blocks": [skills_block(bucket, prefix="skills/")]})
    await set_skill(client, other, "hidden", "Hidden doc", "Not for this session")
    put_object(api_settings, bucket, "elsewhere/tax", "outside the prefix")
    assert minio(api_settings).stat_object(bucket, tenant_key("skills/hidden")).size == len(b"Hidden doc")

    listing = "- bank-reconciliation: Bank reconciliation\n- tax: Tax workflows"
    await listed(client, s, "skills", listing)
    p = await prompt(client, s)
    assert p["prompt"] == block("SKILLS (Loadable docs) [loadable]", listing)

    recorded_paths(api_settings, "reset-recording")
    recorded_paths(api_settings, "start-recording")
    try:
        hidden, _ = await tool(client, s, "load_context", {"label": "skills", "key": "hidden"})
        tax, _ = await tool(client, s, "load_context", {"label": "skills", "key": "tax"})
    finally:
        recorded_paths(api_settings, "stop-recording")
    requests = recorded_paths(api_settings, "download-recording")
    recorded_paths(api_settings, "reset-recording")
    assert (hidden, tax) == ("Not found: hidden", "Tax doc")
    assert any(line.startswith("GET ") and f"/{bucket}/{tenant_key('skills/tax')}" in line for line in requests), (
        requests
    )
    assert not [line for line in requests if "hidden" in line]
    loaded = [e["event"] for e in await events(client, s) if e["event"]["type"] == "skill.loaded"]
    assert [(e["label"], e["key"]) for e in loaded] == [("skills", "tax")]


async def test_a_skill_outside_the_allowlist_is_refused_and_nothing_is_written(
    client: httpx.AsyncClient, api_settings: Settings
) -> None:
    """The outside trial: ``set_context`` on a block allowing only ``tax`` answered ``Indexed
    "refunds" in skills.`` for a skill the block never lists nor loads, written tenant-wide (other
    sessions listed it). Now an ``Error: …`` result: no object, no event, no listing anywhere."""
    bucket = new_bucket(api_settings)
    s, other = sid(), sid()
    await configure(client, s, {"blocks": [skills_block(bucket, prefix="skills/", keys=["tax"])]})
    await configure(client, other, {"blocks": [skills_block(bucket, prefix="skills/")]})
    await set_skill(client, s, "tax", "Tax doc", "Tax workflows")
    await listed(client, other, "skills", "- tax: Tax workflows")
    before = await events(client, s)
    meta = {"title": "refunds", "description": "Refund policy"}
    args = {"label": "skills", "content": "# Refunds\nAlways refund.", "metadata": meta}
    res, _ = await tool(client, s, "set_context", args)
    assert res == (
        'Error: Skill "refunds" is not in the keys allowed in block "skills" (tax): it could never be listed '
        "or loaded there; nothing was written"
    )
    assert await events(client, s) == before
    assert [o.object_name for o in minio(api_settings).list_objects(bucket, recursive=True)] == [
        tenant_key("skills/tax")
    ]
    # the listings still hold tax alone: a put through another session is indexed and listed after it
    await set_skill(client, other, "zz marker", "Marker", "Marker")
    await listed(client, other, "skills", "- tax: Tax workflows\n- zz-marker: Marker")
    assert (await tool(client, s, "load_context", {"label": "skills", "key": "refunds"}))[0] == "Not found: refunds"


async def test_a_skills_block_not_writable_takes_no_tool_writes(
    client: httpx.AsyncClient, api_settings: Settings
) -> None:
    """``"writable": false`` on a skills block: ``set_context`` does not list it (nor exists when
    no other block is written by it), a forced write is the reference's ``does not support
    writes`` with nothing stored, and the skills are still listed and loaded. Without it a session
    could overwrite a skill another session's model loads."""
    bucket = new_bucket(api_settings)
    memory = {"kind": "writable", "label": "memory"}
    s, only, writer = sid(), sid(), sid()
    await configure(client, writer, {"blocks": [skills_block(bucket)]})
    await set_skill(client, writer, "tax", "Tax doc", "Tax workflows")
    await configure(client, s, {"blocks": [memory, skills_block(bucket, writable=False)]})
    seq = await configure(client, only, {"blocks": [skills_block(bucket, writable=False)]})

    r = await client.get(f"/v1/sessions/{only}/tools", params={"min_seq": seq})
    assert [t["function"]["name"] for t in r.json()["tools"]] == ["load_context", "unload_context"]
    r = await client.get(f"/v1/sessions/{s}/tools")
    set_context = r.json()["tools"][0]["function"]
    assert set_context["name"] == "set_context"
    assert set_context["parameters"]["properties"]["label"]["enum"] == ["memory"]
    assert "skills" not in set_context["description"].split("\n\n")[0]
    assert "metadata" not in set_context["parameters"]["properties"]
    config = (await client.get(f"/v1/sessions/{s}/config")).json()["config"]
    assert config["blocks"][1]["writable"] is False
    writer_config = (await client.get(f"/v1/sessions/{writer}/config")).json()["config"]
    assert "writable" not in writer_config["blocks"][0]  # the default is stored as before
    blocks = {b["label"]: b for b in (await client.get(f"/v1/sessions/{s}/context")).json()["blocks"]}
    assert blocks["skills"]["writable"] is False
    assert blocks["memory"]["writable"] is True

    before = {x: await events(client, x) for x in (s, only)}
    args = {"label": "skills", "content": "Evil tax doc", "metadata": {"title": "tax"}}
    assert (await tool(client, s, "set_context", args))[0] == 'Error: Block "skills" does not support writes'
    assert (await tool(client, only, "set_context", args))[0] == (
        'Error: tool "set_context" is not available in this session'
    )
    assert {x: await events(client, x) for x in (s, only)} == before
    assert (await tool(client, s, "load_context", {"label": "skills", "key": "tax"}))[0] == "Tax doc"
    await listed(client, s, "skills", "- tax: Tax workflows")


async def test_no_or_empty_allowlist_lists_every_key(client: httpx.AsyncClient, api_settings: Settings) -> None:
    bucket = new_bucket(api_settings)
    no_allowlist: list[list[str] | None] = [None, []]
    for keys in no_allowlist:
        s = sid()
        await configure(client, s, {"blocks": [skills_block(bucket, keys=keys)]})
        await set_skill(client, s, "tax", "Tax doc", "Tax workflows")
        await set_skill(client, s, "hidden", "Hidden doc", "Hidden")
        await listed(client, s, "skills", "- hidden: Hidden\n- tax: Tax workflows")
        assert (await prompt(client, s))["prompt"] == block(
            "SKILLS (Loadable docs) [loadable]", "- hidden: Hidden\n- tax: Tax workflows"
        )
        assert (await tool(client, s, "load_context", {"label": "skills", "key": "hidden"}))[0] == "Hidden doc"


async def test_title_doubles_as_description_and_writes_accumulate(
    client: httpx.AsyncClient, api_settings: Settings
) -> None:
    bucket = new_bucket(api_settings)
    s = sid()
    await configure(client, s, {"blocks": [skills_block(bucket, prefix="p/")]})
    assert (await prompt(client, s))["prompt"] == block("SKILLS (Loadable docs) [loadable]", "")
    await set_skill(client, s, "Pirate style", PIRATE, None)
    await set_skill(client, s, "Legal", "Be careful.", "Legal review steps")
    await listed(client, s, "skills", "- legal: Legal review steps\n- pirate-style: Pirate style")
    await set_skill(client, s, "Pirate style", PIRATE + "\nv2", "Talk like a pirate")  # same key: replaced
    listing = "- legal: Legal review steps\n- pirate-style: Talk like a pirate"
    await listed(client, s, "skills", listing)
    p = await refresh(client, s)
    assert p["prompt"] == block("SKILLS (Loadable docs) [loadable]", listing)
    stat = minio(api_settings).stat_object(bucket, tenant_key("p/pirate-style"))
    assert {k.lower(): v for k, v in (stat.metadata or {}).items()}["x-amz-meta-description"] == "Talk like a pirate"
    res, _ = await tool(client, s, "load_context", {"label": "skills", "key": "pirate-style"})
    assert res == PIRATE + "\nv2"


async def test_an_empty_description_is_no_description_not_the_title(
    client: httpx.AsyncClient, api_settings: Settings
) -> None:
    """The reference passes ``metadata.description ?? metadata.title``: an empty description is
    kept (and then dropped as no description), only a missing one falls back to the title."""
    bucket = new_bucket(api_settings)
    s = sid()
    await configure(client, s, {"blocks": [skills_block(bucket, prefix="p/")]})
    await set_skill(client, s, "Quiet", "Say little.", "")
    await set_skill(client, s, "Loud", "Shout.", None)
    await listed(client, s, "skills", "- loud: Loud\n- quiet")
    stat = minio(api_settings).stat_object(bucket, tenant_key("p/quiet"))
    assert "x-amz-meta-description" not in {k.lower() for k in (stat.metadata or {})}


async def test_load_unload_reload(client: httpx.AsyncClient, api_settings: Settings) -> None:
    bucket = new_bucket(api_settings)
    s = sid()
    await configure(client, s, {"blocks": [skills_block(bucket, prefix="skills/", keys=["pirate", "gone"])]})
    await set_skill(client, s, "pirate", PIRATE, "Talk like a pirate")
    await set_skill(client, s, "gone", "soon deleted", "Gone")
    minio(api_settings).remove_object(bucket, tenant_key("skills/gone"))

    assert (await tool(client, s, "load_context", {"label": "skills", "key": "gone"}))[0] == "Not found: gone"
    assert (await tool(client, s, "load_context", {"label": "skills", "key": "never"}))[0] == "Not found: never"
    res, seq = await tool(client, s, "load_context", {"label": "skills", "key": "pirate"})
    assert res == PIRATE
    assert (await unload_description(client, s, seq)).endswith(" Currently loaded: skills:pirate.")

    res, seq = await tool(client, s, "unload_context", {"label": "skills", "key": "pirate"})
    assert res == 'Unloaded "pirate" from skills. Context reclaimed.'
    assert (await unload_description(client, s, seq)).endswith(" No skills currently loaded.")
    res, _ = await tool(client, s, "unload_context", {"label": "skills", "key": "pirate"})
    assert res == 'Skill "pirate" is not currently loaded in "skills".'

    res, seq = await tool(client, s, "load_context", {"label": "skills", "key": "pirate"})
    assert res == PIRATE
    assert (await unload_description(client, s, seq)).endswith(" Currently loaded: skills:pirate.")
    kinds = [(e["event"]["type"], e["event"].get("key")) for e in await events(client, s)]
    assert [k for k in kinds if k[0] in ("skill.loaded", "skill.unloaded")] == [
        ("skill.loaded", "pirate"),
        ("skill.unloaded", "pirate"),
        ("skill.loaded", "pirate"),
    ]


def load_part(call: str, key: str, output: str) -> dict[str, Any]:
    return {
        "type": "tool-load_context",
        "toolCallId": call,
        "state": "output-available",
        "input": {"label": "skills", "key": key},
        "output": output,
    }


async def history_parts(client: httpx.AsyncClient, s: str, min_seq: int) -> dict[str, list[dict[str, Any]]]:
    r = await client.get(f"/v1/sessions/{s}/history", params={"min_seq": min_seq})
    assert r.status_code == 200, r.text
    return {m["id"]: m["parts"] for m in r.json()["messages"]}


async def pirate_and_tax(client: httpx.AsyncClient, api_settings: Settings) -> str:
    """A new session with a skills block holding "pirate" and "tax"; its id."""
    s = sid()
    assert (await client.post("/v1/sessions", json={"id": s})).status_code == 201
    await configure(client, s, {"blocks": [skills_block(new_bucket(api_settings))]})
    await set_skill(client, s, "pirate", PIRATE, "Talk like a pirate")
    await set_skill(client, s, "tax", "Tax doc", "Tax")
    return s


async def test_history_view_shows_unloaded_skills(client: httpx.AsyncClient, api_settings: Settings) -> None:
    s = await pirate_and_tax(client, api_settings)

    user = {"id": "u1", "role": "user", "parts": [{"type": "text", "text": "talk like a pirate"}]}
    assert (await client.post(f"/v1/sessions/{s}/messages", json={"message": user})).status_code == 201
    doc, _ = await tool(client, s, "load_context", {"label": "skills", "key": "pirate"})
    tax, _ = await tool(client, s, "load_context", {"label": "skills", "key": "tax"})
    a1 = {
        "id": "a1",
        "role": "assistant",
        "parts": [
            {"type": "text", "text": "Loading"},
            load_part("c1", "pirate", doc),
            load_part("c2", "tax", tax),
        ],
    }
    assert (await client.post(f"/v1/sessions/{s}/messages", json={"message": a1})).status_code == 201

    res, seq = await tool(client, s, "unload_context", {"label": "skills", "key": "pirate"})
    assert res == 'Unloaded "pirate" from skills. Context reclaimed.'
    parts = (await history_parts(client, s, seq))["a1"]
    assert parts[1] == {**load_part("c1", "pirate", doc), "output": "[skill unloaded: pirate]"}
    assert parts[2] == load_part("c2", "tax", "Tax doc")
    assert parts[0] == {"type": "text", "text": "Loading"}

    # the log keeps the original tool output
    appended = [e["event"] for e in await events(client, s) if e["event"]["type"] == "message.appended"]
    assert appended[-1]["message"]["parts"][1]["output"] == PIRATE
    unloaded = [e["event"] for e in await events(client, s) if e["event"]["type"] == "skill.unloaded"]
    assert [(e["key"], e["message_id"], e["tool_call_id"]) for e in unloaded] == [("pirate", "a1", "c1")]

    # reload, a second output, unload again: both outputs read as unloaded
    again, _ = await tool(client, s, "load_context", {"label": "skills", "key": "pirate"})
    a2 = {"id": "a2", "role": "assistant", "parts": [load_part("c3", "pirate", again)]}
    assert (await client.post(f"/v1/sessions/{s}/messages", json={"message": a2})).status_code == 201
    _, seq = await tool(client, s, "unload_context", {"label": "skills", "key": "pirate"})
    parts_by_id = await history_parts(client, s, seq)
    assert parts_by_id["a1"][1]["output"] == "[skill unloaded: pirate]"
    assert parts_by_id["a2"][0]["output"] == "[skill unloaded: pirate]"
    assert parts_by_id["u1"] == user["parts"]


async def test_a_skill_loaded_twice_is_reclaimed_whole_by_one_unload(
    client: httpx.AsyncClient, api_settings: Settings
) -> None:
    """The outside trial: ``deploy`` loaded (a1), loaded again (a3), unloaded once. Only a3 read
    ``[skill unloaded: deploy]``; a1 kept the whole text while the tools said no skill was loaded,
    so nothing could reclaim it. One unload reclaims every output that still shows the text, the
    newest last, and the skill is unloaded."""
    s = await pirate_and_tax(client, api_settings)
    load = {"label": "skills", "key": "pirate"}
    doc, _ = await tool(client, s, "load_context", load)
    u1 = {"id": "u1", "role": "user", "parts": [{"type": "text", "text": "talk like a pirate"}]}
    a1 = {"id": "a1", "role": "assistant", "parts": [load_part("c1", "pirate", doc)]}
    u2 = {"id": "u2", "role": "user", "parts": [{"type": "text", "text": "again"}]}
    for m in (u1, a1, u2):
        assert (await client.post(f"/v1/sessions/{s}/messages", json={"message": m})).status_code == 201
    again, _ = await tool(client, s, "load_context", load)
    a3 = {"id": "a3", "role": "assistant", "parts": [load_part("c3", "pirate", again), {"type": "text", "text": "Arr"}]}
    seq = (await client.post(f"/v1/sessions/{s}/messages", json={"message": a3})).json()["seq"]
    assert (await unload_description(client, s, seq)).endswith(" Currently loaded: skills:pirate.")

    res, seq = await tool(client, s, "unload_context", load)
    assert res == 'Unloaded "pirate" from skills. Context reclaimed.'
    parts = await history_parts(client, s, seq)
    assert parts["a1"] == [{**load_part("c1", "pirate", doc), "output": "[skill unloaded: pirate]"}]
    assert parts["a3"] == [{**load_part("c3", "pirate", again), "output": "[skill unloaded: pirate]"}, a3["parts"][1]]
    assert (await unload_description(client, s, seq)).endswith(" No skills currently loaded.")
    unloaded = [e["event"] for e in await events(client, s) if e["event"]["type"] == "skill.unloaded"]
    assert [(e["message_id"], e["tool_call_id"]) for e in unloaded] == [("a1", "c1"), ("a3", "c3")]
    res, _ = await tool(client, s, "unload_context", load)
    assert res == 'Skill "pirate" is not currently loaded in "skills".'

    # loaded again in a turn whose message is not stored yet: both the stored and the pending go
    again, _ = await tool(client, s, "load_context", load)
    a5 = {"id": "a5", "role": "assistant", "parts": [load_part("c5", "pirate", again)]}
    assert (await client.post(f"/v1/sessions/{s}/messages", json={"message": a5})).status_code == 201
    r = await client.post(f"/v1/sessions/{s}/tools/load_context", params={"tool_call_id": "c6"}, json=load)
    assert r.json()["result"] == PIRATE
    assert (await tool(client, s, "unload_context", load))[0] == 'Unloaded "pirate" from skills. Context reclaimed.'
    a6 = {"id": "a6", "role": "assistant", "parts": [load_part("c6", "pirate", PIRATE)]}
    seq = (await client.post(f"/v1/sessions/{s}/messages", json={"message": a6})).json()["seq"]
    parts = await history_parts(client, s, seq)
    assert [parts[m][0]["output"] for m in ("a1", "a3", "a5", "a6")] == ["[skill unloaded: pirate]"] * 4
    assert (await unload_description(client, s, seq)).endswith(" No skills currently loaded.")


async def test_unload_in_the_same_turn_reclaims_an_output_not_stored_yet(
    client: httpx.AsyncClient, api_settings: Settings
) -> None:
    """The reference's unload race (its §7.6.3): load and unload in one turn, the assistant
    message with the load output appended only afterwards. The load said its tool call id, so
    the unload names it and the later message reads as unloaded."""
    bucket = new_bucket(api_settings)
    s = sid()
    assert (await client.post("/v1/sessions", json={"id": s})).status_code == 201
    await configure(client, s, {"blocks": [skills_block(bucket)]})
    await set_skill(client, s, "pirate", PIRATE, "Talk like a pirate")

    r = await client.post(
        f"/v1/sessions/{s}/tools/load_context",
        params={"tool_call_id": "call-1"},
        json={"label": "skills", "key": "pirate"},
    )
    assert r.status_code == 200, r.text
    doc = r.json()["result"]
    assert doc == PIRATE
    res, _ = await tool(client, s, "unload_context", {"label": "skills", "key": "pirate"})
    assert res == 'Unloaded "pirate" from skills. Context reclaimed.'
    unloaded = [e["event"] for e in await events(client, s) if e["event"]["type"] == "skill.unloaded"]
    assert [(e["message_id"], e["tool_call_id"]) for e in unloaded] == [(None, "call-1")]

    # only now does the turn's message reach the log
    a1 = {"id": "a1", "role": "assistant", "parts": [load_part("call-1", "pirate", doc), load_part("c9", "tax", "x")]}
    r = await client.post(f"/v1/sessions/{s}/messages", json={"message": a1})
    assert r.status_code == 201, r.text
    parts = (await history_parts(client, s, r.json()["seq"]))["a1"]
    assert parts[0]["output"] == "[skill unloaded: pirate]"
    assert parts[1]["output"] == "x"  # another call in the same message is untouched
    one = await client.get(f"/v1/sessions/{s}/messages/a1")
    assert one.json()["parts"][0]["output"] == "[skill unloaded: pirate]"


async def test_a_fork_keeps_unloaded_skills_unloaded(client: httpx.AsyncClient, api_settings: Settings) -> None:
    """A fork copies the path as history shows it (the reference copies ``getHistory``): an output
    an unload reclaimed, by message or by tool call alone, reads ``[skill unloaded: <key>]`` in
    the fork too, and the fork's own events hold the marker, so a rebuild reads the same."""
    s = await pirate_and_tax(client, api_settings)

    doc, _ = await tool(client, s, "load_context", {"label": "skills", "key": "pirate"})
    a1 = {"id": "a1", "role": "assistant", "parts": [load_part("c1", "pirate", doc), load_part("c2", "tax", "Tax doc")]}
    assert (await client.post(f"/v1/sessions/{s}/messages", json={"message": a1})).status_code == 201
    await tool(client, s, "unload_context", {"label": "skills", "key": "pirate"})  # reclaimed in message a1
    r = await client.post(
        f"/v1/sessions/{s}/tools/load_context", params={"tool_call_id": "c3"}, json={"label": "skills", "key": "pirate"}
    )
    assert r.json()["result"] == PIRATE
    await tool(client, s, "unload_context", {"label": "skills", "key": "pirate"})  # by call: a2 not stored yet
    a2 = {"id": "a2", "role": "assistant", "parts": [load_part("c3", "pirate", PIRATE)]}
    r = await client.post(f"/v1/sessions/{s}/messages", json={"message": a2})
    assert r.status_code == 201, r.text
    source = await history_parts(client, s, r.json()["seq"])

    r = await client.post(f"/v1/sessions/{s}/fork", json={"at_message_id": "a2"})
    assert r.status_code == 201, r.text
    fork, seq = r.json()["id"], r.json()["seq"]
    forked = await history_parts(client, fork, seq)
    assert forked == source
    assert forked["a1"][0]["output"] == "[skill unloaded: pirate]"
    assert forked["a1"][1]["output"] == "Tax doc"  # the output not unloaded is copied as it was
    assert forked["a2"][0]["output"] == "[skill unloaded: pirate]"
    # loaded there (configured as the source): what its history loaded, not an output read as unloaded
    await configure(client, fork, {"blocks": [skills_block(new_bucket(api_settings))]})
    assert (await unload_description(client, fork, await last_seq(client, fork))).endswith(
        " Currently loaded: skills:tax."
    )
    # the fork's own log holds the marker (nothing computed on read): rebuild equals live
    copies = [e["event"] for e in await events(client, fork) if e["event"]["type"] == "message.appended"]
    assert [m["message"]["parts"][0]["output"] for m in copies] == ["[skill unloaded: pirate]"] * 2
    assert PIRATE not in json.dumps(copies, ensure_ascii=False)
    # the source's log keeps the originals
    originals = [e["event"] for e in await events(client, s) if e["event"]["type"] == "message.appended"]
    assert [m["message"]["parts"][0]["output"] for m in originals] == [PIRATE, PIRATE]
    verify = chronicle_cli(api_settings, "verify", timeout=300)
    assert verify.returncode == 0, verify.stdout + verify.stderr


async def unloaded_by_call(client: httpx.AsyncClient, api_settings: Settings, call: str) -> str:
    """A new session (:func:`pirate_and_tax`) where "pirate" was loaded by tool call ``call`` and
    unloaded before any message held its output (reclaimed by call id alone); its id."""
    s = await pirate_and_tax(client, api_settings)
    args, params = {"label": "skills", "key": "pirate"}, {"tool_call_id": call}
    r = await client.post(f"/v1/sessions/{s}/tools/load_context", params=params, json=args)
    assert r.status_code == 200, r.text
    await tool(client, s, "unload_context", {"label": "skills", "key": "pirate"})
    return s


async def test_an_unloaded_output_beside_parts_of_any_shape_reads_as_unloaded(
    client: httpx.AsyncClient, api_settings: Settings
) -> None:
    """A part that is not a tool part keeps any JSON as sent, a ``toolCallId`` that is a list or
    an object included. Once a skill loaded by call id was unloaded, every read of a message
    holding that call's output showed such a part as ``500 internal_error`` (TypeError: the part's
    ``toolCallId`` was looked up among the unloaded calls), and a fork of it too. The output reads
    as unloaded, the other parts as they were sent."""
    s = await unloaded_by_call(client, api_settings, "call-1")
    odd = [{"type": "data-calls", "toolCallId": ["call-1"]}, {"type": "data-call", "toolCallId": {"id": "call-1"}}]
    a1 = {"id": "a1", "role": "assistant", "parts": [load_part("call-1", "pirate", PIRATE), *odd]}
    r = await client.post(f"/v1/sessions/{s}/messages", json={"message": a1})
    assert r.status_code == 201, r.text
    seq = r.json()["seq"]

    unloaded = [{**load_part("call-1", "pirate", PIRATE), "output": "[skill unloaded: pirate]"}, *odd]
    assert (await history_parts(client, s, seq))["a1"] == unloaded
    one = await client.get(f"/v1/sessions/{s}/messages/a1")
    assert one.status_code == 200, one.text
    assert one.json()["parts"] == unloaded
    tree = await client.get(f"/v1/sessions/{s}/tree")
    assert tree.status_code == 200, tree.text
    assert [m["message"]["parts"] for m in tree.json()["messages"]] == [unloaded]
    past = await client.get(f"/v1/sessions/{s}/history", params={"as_of_seq": seq})
    assert past.status_code == 200, past.text
    assert [m["parts"] for m in past.json()["messages"]] == [unloaded]
    r = await client.post(f"/v1/sessions/{s}/fork", json={"at_message_id": "a1"})
    assert r.status_code == 201, r.text
    assert (await history_parts(client, r.json()["id"], r.json()["seq"]))["a1"] == unloaded


async def published(api_settings: Settings, s: str, body: dict[str, Any]) -> int:
    """``body`` appended to session ``s`` as tenant-a's own NATS client may publish it, straight
    to its subject (no contract check, no API); the stream sequence."""
    event = MessageAppended(
        tenant="tenant-a",
        session=s,
        message_id=body["id"],
        parent_id=None,
        role=body["role"],
        body_sha256=body_hash(body),
        message=body,
    )
    nc = await tenant_nats(api_settings.nats_url, "tenant-a")
    try:
        subject = api_settings.layout().session_subject("tenant-a", s)
        return int((await nc.jetstream().publish(subject, event.to_json(), stream=api_settings.stream)).seq)
    finally:
        await nc.close()


async def test_a_published_message_whose_parts_are_no_list_reads_as_stored_after_an_unload(
    client: httpx.AsyncClient, api_settings: Settings
) -> None:
    """A tenant publishing straight to its subjects may store a message whose ``parts`` is no list
    (admission does not check a message's shape). With an unloaded call named in its text, its
    reads were ``500 internal_error``: they read it as stored, with nothing to reclaim."""
    s = await unloaded_by_call(client, api_settings, "call-1")
    body = {"id": "a1", "role": "assistant", "parts": 7, "metadata": {"toolCallId": "call-1"}}
    seq = await published(api_settings, s, body)

    r = await client.get(f"/v1/sessions/{s}/history", params={"min_seq": seq})
    assert r.status_code == 200, r.text
    assert r.json()["messages"] == [body]
    one = await client.get(f"/v1/sessions/{s}/messages/a1")
    assert one.status_code == 200, one.text
    assert one.json() == body


async def test_an_unload_looks_past_a_published_message_whose_parts_are_no_list(
    client: httpx.AsyncClient, api_settings: Settings
) -> None:
    """An unload that does not know the loading call looks for the newest stored load output. A
    newer assistant message published straight to the log, whose ``parts`` is no list and whose
    text names ``load_context``, made every such unload fail ("the tool failed unexpectedly",
    TypeError in the log), so the skill could never be unloaded; it is passed over, and the output
    before it reads as unloaded."""
    s = await pirate_and_tax(client, api_settings)
    doc, _ = await tool(client, s, "load_context", {"label": "skills", "key": "pirate"})  # no tool call id
    a1 = {"id": "a1", "role": "assistant", "parts": [load_part("c1", "pirate", doc)]}
    r = await client.post(f"/v1/sessions/{s}/messages", json={"message": a1})
    assert r.status_code == 201, r.text
    newer = {"id": "a2", "role": "assistant", "parts": 7, "metadata": {"note": "load_context"}}
    await published(api_settings, s, newer)

    res, seq = await tool(client, s, "unload_context", {"label": "skills", "key": "pirate"})
    assert res == 'Unloaded "pirate" from skills. Context reclaimed.'
    unloaded = [e["event"] for e in await events(client, s) if e["event"]["type"] == "skill.unloaded"]
    assert [(e["message_id"], e["tool_call_id"]) for e in unloaded] == [("a1", "c1")]
    one = await client.get(f"/v1/sessions/{s}/messages/a1", params={"min_seq": seq})
    assert one.json()["parts"][0]["output"] == "[skill unloaded: pirate]"


async def test_a_tool_call_id_is_checked(client: httpx.AsyncClient, api_settings: Settings) -> None:
    s = sid()
    assert (await client.post("/v1/sessions", json={"id": s})).status_code == 201
    for bad in ("", "x" * 257, "a\x00b"):
        r = await client.post(
            f"/v1/sessions/{s}/tools/load_context", params={"tool_call_id": bad}, json={"label": "skills", "key": "k"}
        )
        assert r.status_code == 422, (bad, r.text)
        assert r.json()["code"] == "invalid_request"


async def test_clear_forgets_loaded_skills(client: httpx.AsyncClient, api_settings: Settings) -> None:
    bucket = new_bucket(api_settings)
    s = sid()
    assert (await client.post("/v1/sessions", json={"id": s})).status_code == 201
    await configure(client, s, {"blocks": [skills_block(bucket)]})
    await set_skill(client, s, "pirate", PIRATE, "Talk like a pirate")
    msg = {"id": "m1", "role": "user", "parts": [{"type": "text", "text": "hi"}]}
    await client.post(f"/v1/sessions/{s}/messages", json={"message": msg})
    _, seq = await tool(client, s, "load_context", {"label": "skills", "key": "pirate"})
    assert (await unload_description(client, s, seq)).endswith("Currently loaded: skills:pirate.")
    r = await client.post(f"/v1/sessions/{s}/messages:clear")
    assert (await unload_description(client, s, r.json()["seq"])).endswith("No skills currently loaded.")


def dynamic_load_part(call: str, key: str, output: str, tool_name: str = "load_context") -> dict[str, Any]:
    return {
        "type": "dynamic-tool",
        "toolName": tool_name,
        "toolCallId": call,
        "state": "output-available",
        "input": {"label": "skills", "key": key},
        "output": output,
    }


async def unloaded_events(client: httpx.AsyncClient, s: str) -> list[tuple[str, str | None, str | None]]:
    evs = [e["event"] for e in await events(client, s) if e["event"]["type"] == "skill.unloaded"]
    return [(e["key"], e["message_id"], e["tool_call_id"]) for e in evs]


async def test_a_fork_has_the_skills_its_history_loaded(client: httpx.AsyncClient, api_settings: Settings) -> None:
    """The reference rebuilds the loaded set from history when a session starts: a fork, whose
    history holds the source's ``load_context`` output, has that skill loaded, and unloading it
    there reclaims the fork's copy of the output (the source keeps its own)."""
    s = await pirate_and_tax(client, api_settings)
    args = {"label": "skills", "key": "pirate"}
    r = await client.post(f"/v1/sessions/{s}/tools/load_context", params={"tool_call_id": "cp"}, json=args)
    doc = r.json()["result"]
    assert doc == PIRATE
    a1 = {
        "id": "a1",
        "role": "assistant",
        "parts": [{"type": "text", "text": "Arr"}, dynamic_load_part("cp", "pirate", doc)],
    }
    assert (await client.post(f"/v1/sessions/{s}/messages", json={"message": a1})).status_code == 201
    r = await client.post(f"/v1/sessions/{s}/fork", json={"at_message_id": "a1"})
    assert r.status_code == 201, r.text
    fork, seq = r.json()["id"], r.json()["seq"]
    await configure(client, fork, {"blocks": [skills_block(new_bucket(api_settings))]})
    seq = await last_seq(client, fork)

    assert (await unload_description(client, fork, seq)).endswith(" Currently loaded: skills:pirate.")
    res, seq = await tool(client, fork, "unload_context", args)
    assert res == 'Unloaded "pirate" from skills. Context reclaimed.'
    assert await unloaded_events(client, fork) == [("pirate", "a1", "cp")]
    assert (await history_parts(client, fork, seq))["a1"][1]["output"] == "[skill unloaded: pirate]"
    assert (await unload_description(client, fork, seq)).endswith(" No skills currently loaded.")
    res, _ = await tool(client, fork, "unload_context", args)
    assert res == 'Skill "pirate" is not currently loaded in "skills".'
    # the source is untouched: its skill still loaded, its output as it was
    assert (await unload_description(client, s, seq)).endswith(" Currently loaded: skills:pirate.")
    assert (await history_parts(client, s, 0))["a1"][1]["output"] == PIRATE


async def test_history_appended_elsewhere_loads_its_skills(client: httpx.AsyncClient, api_settings: Settings) -> None:
    """Assistant messages with ``load_context`` outputs made elsewhere (static ``tool-load_context``
    parts and dynamic ones) load their skills, in history order; an output already unloaded
    (``[skill unloaded: …]``), an ``unload_context`` output after a load, a part with no output
    yet and a user message's part load nothing."""
    s = await pirate_and_tax(client, api_settings)
    u1 = {"id": "u1", "role": "user", "parts": [load_part("u", "user-said", "text")]}
    a1 = {
        "id": "a1",
        "role": "assistant",
        "parts": [
            load_part("c1", "tax", "Tax doc"),
            dynamic_load_part("c2", "pirate", PIRATE),
            load_part("c3", "old", "[skill unloaded: old]"),
            load_part("c4", "gone", "Gone doc"),
            {**load_part("c5", "pending", ""), "state": "input-available"},
        ],
    }
    a2 = {"id": "a2", "role": "assistant", "parts": [dynamic_load_part("c6", "gone", "Unloaded", "unload_context")]}
    seq = 0
    for m in (u1, a1, a2):
        r = await client.post(f"/v1/sessions/{s}/messages", json={"message": m})
        assert r.status_code == 201, r.text
        seq = r.json()["seq"]
    assert (await unload_description(client, s, seq)).endswith(" Currently loaded: skills:tax, skills:pirate.")

    res, seq = await tool(client, s, "unload_context", {"label": "skills", "key": "tax"})
    assert res == 'Unloaded "tax" from skills. Context reclaimed.'
    assert await unloaded_events(client, s) == [("tax", "a1", "c1")]
    assert (await history_parts(client, s, seq))["a1"][0]["output"] == "[skill unloaded: tax]"
    assert (await unload_description(client, s, seq)).endswith(" Currently loaded: skills:pirate.")
    for key in ("tax", "old", "gone", "pending", "user-said"):
        res, _ = await tool(client, s, "unload_context", {"label": "skills", "key": key})
        assert res == f'Skill "{key}" is not currently loaded in "skills".', key
    assert len(await unloaded_events(client, s)) == 1


async def test_an_output_unloaded_before_it_was_stored_loads_nothing(
    client: httpx.AsyncClient, api_settings: Settings
) -> None:
    """A load output reclaimed by its tool call before its message was stored reads as unloaded
    once stored: the skill is not loaded, and a fork of it has none either."""
    s = await unloaded_by_call(client, api_settings, "call-1")
    a1 = {"id": "a1", "role": "assistant", "parts": [load_part("call-1", "pirate", PIRATE)]}
    r = await client.post(f"/v1/sessions/{s}/messages", json={"message": a1})
    assert r.status_code == 201, r.text
    assert (await unload_description(client, s, r.json()["seq"])).endswith(" No skills currently loaded.")
    res, _ = await tool(client, s, "unload_context", {"label": "skills", "key": "pirate"})
    assert res == 'Skill "pirate" is not currently loaded in "skills".'


def chronicle(settings: Settings, *args: str) -> str:
    done = chronicle_cli(settings, "skills", *args, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout


async def test_cli_put_and_sync(client: httpx.AsyncClient, api_settings: Settings, tmp_path: Path) -> None:
    bucket = new_bucket(api_settings)
    s = sid()
    await configure(client, s, {"blocks": [skills_block(bucket, prefix="skills/")]})
    doc = tmp_path / "tax.md"
    doc.write_text("# Tax\nFile by April — 日本", encoding="utf-8")

    out = chronicle(
        api_settings, "put", str(doc), "--bucket", bucket, "--key", "skills/tax", "--description", "Tax workflows",
        "--tenant", "tenant-a",
    )  # fmt: skip
    stored = f"stored {bucket}/tenants/tenant-a/skills/tax ({len(doc.read_bytes())} bytes); recorded at sequence "
    assert out.startswith(stored), out
    await listed(client, s, "skills", "- tax: Tax workflows")
    assert (await prompt(client, s))["prompt"] == block("SKILLS (Loadable docs) [loadable]", "- tax: Tax workflows")
    assert (await tool(client, s, "load_context", {"label": "skills", "key": "tax"}))[0] == doc.read_text("utf-8")

    # uploaded out of band: invisible until synced
    put_object(api_settings, bucket, "skills/direct", "Direct doc", description="Direct upload")
    put_object(api_settings, bucket, "skills/plain", "Plain doc")
    put_object(api_settings, bucket, "other/x", "outside the prefix", description="Other")
    unsynced = await refresh(client, s)
    assert unsynced["prompt"] == block("SKILLS (Loadable docs) [loadable]", "- tax: Tax workflows")
    assert unsynced["version"] == 1  # the same text: still the first freeze
    out = chronicle(api_settings, "sync", "--bucket", bucket, "--prefix", "skills/", "--tenant", "tenant-a")
    assert out.strip() == "indexed 2, removed 0, unchanged 1"
    listing = "- direct: Direct upload\n- plain\n- tax: Tax workflows"
    await listed(client, s, "skills", listing)
    assert (await refresh(client, s))["prompt"] == block("SKILLS (Loadable docs) [loadable]", listing)

    # removed out of band: gone after the next sync; a second sync changes nothing
    minio(api_settings).remove_object(bucket, tenant_key("skills/plain"))
    out = chronicle(api_settings, "sync", "--bucket", bucket, "--prefix", "skills/", "--tenant", "tenant-a")
    assert out.strip() == "indexed 0, removed 1, unchanged 2"
    await listed(client, s, "skills", "- direct: Direct upload\n- tax: Tax workflows")
    out = chronicle(api_settings, "sync", "--bucket", bucket, "--prefix", "skills/", "--tenant", "tenant-a")
    assert out.strip() == "indexed 0, removed 0, unchanged 2"
    listing = "- direct: Direct upload\n- tax: Tax workflows"
    last = await refresh(client, s)
    assert last["prompt"] == block("SKILLS (Loadable docs) [loadable]", listing)
    assert last["version"] == 3  # one new version per changed listing
    assert await prompt(client, s, min_seq=last["seq"]) == last  # frozen at the last refresh


async def test_set_context_into_a_bucket_that_no_longer_exists_is_an_error_result_and_makes_no_bucket(
    client: httpx.AsyncClient, api_settings: Settings
) -> None:
    """(The tool made the bucket; then it answered 409, an exception in an agent's loop, where tools
    never raise.) The bucket was there when the config was put, and deleted since: the call is
    200 with an ``Error: …`` result naming the bucket, and nothing is uploaded, recorded or made."""
    bucket = new_bucket(api_settings)
    s = sid()
    await configure(client, s, {"blocks": [skills_block(bucket)]})
    before = await events(client, s)
    minio(api_settings).remove_bucket(bucket)
    args = {"label": "skills", "content": "Tax doc", "metadata": {"title": "tax", "description": "Tax workflows"}}
    r = await client.post(f"/v1/sessions/{s}/tools/set_context", json=args)
    assert r.status_code == 200, r.text
    assert r.json()["result"] == (
        f'Error: Skill "tax" not stored: the bucket {bucket!r} of block "skills" does not exist '
        "(the deployment must create it)"
    )
    assert not minio(api_settings).bucket_exists(bucket)
    assert await events(client, s) == before
    assert "tax" not in (await prompt(client, s))["prompt"]  # nothing indexed for the tenant either


async def test_cli_put_with_create_bucket_makes_a_missing_bucket_and_indexes(
    client: httpx.AsyncClient, api_settings: Settings, tmp_path: Path
) -> None:
    """``--create-bucket``: a skill put into a bucket that does not exist yet, with no S3 client
    at hand (without it the put is refused: tests/integration/test_cli_errors.py)."""
    bucket = "sk-" + uuid.uuid4().hex[:16]
    assert not minio(api_settings).bucket_exists(bucket)
    doc = tmp_path / "tax.md"
    doc.write_text("# Tax\nFile by April", encoding="utf-8")
    out = chronicle(
        api_settings, "put", str(doc), "--bucket", bucket, "--key", "skills/tax", "--description", "Tax workflows",
        "--tenant", "tenant-a", "--create-bucket",
    )  # fmt: skip
    made, stored = out.splitlines()
    assert made == f"made bucket {bucket}"
    assert stored.startswith(f"stored {bucket}/tenants/tenant-a/skills/tax "), stored
    assert minio(api_settings).bucket_exists(bucket)
    s = sid()  # a session's skills block takes the bucket now (a missing one is refused)
    await context(client, s, min_seq=await configure(client, s, {"blocks": [skills_block(bucket, prefix="skills/")]}))
    await listed(client, s, "skills", "- tax: Tax workflows")
    # the bucket there now: the same put again says nothing of making it
    out = chronicle(
        api_settings, "put", str(doc), "--bucket", bucket, "--key", "skills/tax", "--tenant", "tenant-a",
        "--create-bucket",
    )  # fmt: skip
    assert out.startswith(f"stored {bucket}/tenants/tenant-a/skills/tax "), out
