"""System prompt over HTTP: rendering byte for byte, freeze, refresh, clear, and as_of_seq."""

from __future__ import annotations

import asyncio
import io
from typing import Any

import httpx

from services.settings import Settings
from tests.e2e.context_support import (
    block,
    configure,
    context,
    events,
    last_seq,
    listed,
    minio,
    new_bucket,
    pct,
    problem,
    prompt,
    put_object,
    refresh,
    sid,
    tenant_key,
    tokens,
    tool,
)
from tests.e2e.helpers import PROSE, append, msg


async def test_prompt_renders_every_block_kind_exactly(client: httpx.AsyncClient, api_settings: Settings) -> None:
    s = sid()
    bucket = new_bucket(api_settings)
    put_object(api_settings, bucket, "policy.md", "Refunds within 30 days.")
    config: dict[str, Any] = {
        "blocks": [
            {"kind": "readonly", "label": "soul", "content": "You are a careful assistant.\nAnswer in English."},
            {"kind": "readonly", "label": "notes", "content": ""},
            {"kind": "readonly", "label": "unset"},
            {
                "kind": "readonly",
                "label": "policy",
                "description": "Refund policy",
                "max_tokens": 50,
                "source": {"bucket": bucket, "key": "policy.md"},
            },
            {"kind": "writable", "label": "memory", "description": "Learned facts", "max_tokens": 100},
            {"kind": "writable", "label": "scratch"},
            {"kind": "searchable", "label": "knowledge", "description": "Searchable docs"},
            {"kind": "searchable", "label": "archive"},
            {
                "kind": "skills",
                "label": "skills",
                "description": "Loadable docs",
                "bucket": bucket,
                "prefix": "skills/",
                "keys": ["tax", "bank-reconciliation"],
            },
        ]
    }
    await configure(client, s, config)
    r = await client.put(f"/v1/sessions/{s}/context/memory", json={"content": "User likes tea."})
    assert r.status_code == 200, r.text
    res, _ = await tool(
        client, s, "set_context", {"label": "memory", "content": "User lives in Kyoto.", "action": "append"}
    )
    assert res.startswith("Written to memory. Usage: ")
    for title, content in [("deploy", "Deploys happen on Friday."), ("oncall", "Ask Kim when paged.")]:
        res, _ = await tool(
            client, s, "set_context", {"label": "knowledge", "content": content, "metadata": {"title": title}}
        )
        assert res == f'Indexed "{title}" in knowledge.'
    for title, desc in [("tax", "Tax workflows"), ("bank reconciliation", "Bank reconciliation"), ("hidden", "Nope")]:
        res, written = await tool(
            client,
            s,
            "set_context",
            {"label": "skills", "content": f"# {title}", "metadata": {"title": title, "description": desc}},
        )
        if title == "hidden":  # outside the block's keys: refused, nothing written (it would never be listed)
            assert res.startswith('Error: Skill "hidden" is not in the keys allowed in block "skills"'), res
        else:
            assert res == f'Indexed "{title.replace(" ", "-")}" in skills.'
            seq = written

    memory = "User likes tea.\nUser lives in Kyoto."
    policy = "Refunds within 30 days."
    listing = "- bank-reconciliation: Bank reconciliation\n- tax: Tax workflows"
    await listed(client, s, "skills", listing)
    expected = "\n\n".join(
        [
            block("SOUL [readonly]", "You are a careful assistant.\nAnswer in English."),
            block(
                f"POLICY (Refund policy) [{pct(tokens(policy), 50)}% \u2014 {tokens(policy)}/50 tokens] [readonly]",
                policy,
            ),
            block(
                f"MEMORY (Learned facts) [{pct(tokens(memory), 100)}% \u2014 {tokens(memory)}/100 tokens] [writable]",
                memory,
            ),
            block("SCRATCH [writable]", ""),
            block("KNOWLEDGE (Searchable docs) [searchable]", "2 entries indexed."),
            block("ARCHIVE [searchable]", ""),
            block("SKILLS (Loadable docs) [loadable]", listing),
        ]
    )
    p = await prompt(client, s)
    assert p["prompt"] == expected
    assert p["tokens"] == tokens(expected)
    assert p["version"] == 1

    blocks = await context(client, s, seq)
    assert list(blocks) == ["soul", "notes", "unset", "policy", "memory", "scratch", "knowledge", "archive", "skills"]
    assert blocks["memory"] == {
        "label": "memory",
        "kind": "writable",
        "description": "Learned facts",
        "content": memory,
        "tokens": tokens(memory),
        "max_tokens": 100,
        "writable": True,
    }
    assert blocks["policy"]["content"] == policy
    assert blocks["policy"]["writable"] is False
    assert blocks["skills"]["content"] == listing
    assert blocks["notes"]["content"] == ""


async def test_prompt_of_a_session_with_only_empty_readonly_blocks_is_empty(client: httpx.AsyncClient) -> None:
    s = sid()
    await configure(client, s, {"blocks": [{"kind": "readonly", "label": "soul", "content": ""}]})
    first = await prompt(client, s)
    assert (first["prompt"], first["tokens"], first["version"]) == ("", 0, 1)
    # the stored "" is a value: it is returned, not re-rendered
    await configure(client, s, {"blocks": [{"kind": "readonly", "label": "soul", "content": "Now set."}]})
    again = await prompt(client, s)
    assert again == first


async def test_the_prompt_of_an_unknown_session_is_404_and_freezes_nothing(client: httpx.AsyncClient) -> None:
    s = sid()
    problem(await client.get(f"/v1/sessions/{s}/system-prompt"), 404, "session_not_found")
    problem(await client.post(f"/v1/sessions/{s}/system-prompt:refresh"), 404, "session_not_found")
    assert await events(client, s) == []


async def test_prompt_without_config_is_empty(client: httpx.AsyncClient) -> None:
    s = sid()
    seq = (await append(client, s, msg("m1", "hello")))["seq"]
    p = await prompt(client, s, min_seq=seq)
    assert (p["prompt"], p["version"]) == ("", 1)


async def test_frozen_prompt_is_stable_until_refresh(client: httpx.AsyncClient) -> None:
    s = sid()
    await configure(client, s, {"blocks": [{"kind": "writable", "label": "memory", "description": "Learned facts"}]})
    await client.put(f"/v1/sessions/{s}/context/memory", json={"content": "old fact"})
    first = await prompt(client, s)
    assert first["prompt"] == block("MEMORY (Learned facts) [writable]", "old fact")

    await tool(client, s, "set_context", {"label": "memory", "content": "new fact"})
    r = await client.put(f"/v1/sessions/{s}/context/memory", json={"content": "newer fact", "mode": "append"})
    assert r.status_code == 200, r.text
    assert (await context(client, s, r.json()["seq"]))["memory"]["content"] == "new fact\nnewer fact"
    assert await prompt(client, s) == first
    assert await prompt(client, s) == first

    second = await refresh(client, s)
    assert second["prompt"] == block("MEMORY (Learned facts) [writable]", "new fact\nnewer fact")
    assert second["version"] == 2
    assert second["seq"] > first["seq"]
    # frozen again, at the refreshed text, even after another write
    await tool(client, s, "set_context", {"label": "memory", "content": "third"})
    assert await prompt(client, s, min_seq=second["seq"]) == second

    rendered = [e["event"] for e in await events(client, s) if e["event"]["type"] == "prompt.rendered"]
    assert [(e["version_no"], e["reason"]) for e in rendered] == [(1, "freeze"), (2, "refresh")]
    assert [e["text"] for e in rendered] == [first["prompt"], second["prompt"]]


async def test_clearing_messages_refreshes_the_frozen_prompt(client: httpx.AsyncClient) -> None:
    s = sid()
    r = await client.post("/v1/sessions", json={"id": s, "name": "clear"})
    assert r.status_code == 201, r.text
    await configure(client, s, {"blocks": [{"kind": "writable", "label": "memory"}]})
    msg = {"id": "m1", "role": "user", "parts": [{"type": "text", "text": "hello"}]}
    assert (await client.post(f"/v1/sessions/{s}/messages", json={"message": msg})).status_code == 201
    first = await prompt(client, s)
    assert first["prompt"] == block("MEMORY [writable]", "")
    await client.put(f"/v1/sessions/{s}/context/memory", json={"content": "kept across clear"})

    r = await client.post(f"/v1/sessions/{s}/messages:clear")
    assert r.status_code == 200, r.text
    after = await prompt(client, s, min_seq=await last_seq(client, s))
    assert after["prompt"] == block("MEMORY [writable]", "kept across clear")
    assert after["version"] == 2
    types = [(e["event"]["type"], e["event"].get("reason")) for e in await events(client, s)]
    assert types[-2:] == [("messages.cleared", None), ("prompt.rendered", "clear")]


async def test_a_clear_answers_the_seq_of_the_prompt_it_re_rendered(client: httpx.AsyncClient) -> None:
    """Read-your-writes after a clear: its ``seq`` covers the re-rendered prompt, so a read with
    it as ``min_seq`` sees the new prompt (the reference's clear replaces the frozen snapshot
    before it returns)."""
    s = sid()
    await configure(client, s, {"blocks": [{"kind": "writable", "label": "memory"}]})
    await append(client, s, msg("m1", "hello"))
    assert (await prompt(client, s))["version"] == 1
    await client.put(f"/v1/sessions/{s}/context/memory", json={"content": "kept across clear"})

    r = await client.post(f"/v1/sessions/{s}/messages:clear")
    assert r.status_code == 200, r.text
    evs = await events(client, s)
    assert [e["event"]["type"] for e in evs[-2:]] == ["messages.cleared", "prompt.rendered"]
    assert r.json() == {"cleared": True, "seq": evs[-1]["seq"]}
    after = await prompt(client, s, min_seq=r.json()["seq"])
    assert (after["version"], after["prompt"]) == (2, block("MEMORY [writable]", "kept across clear"))


def _rendered(evs: list[dict[str, Any]]) -> list[tuple[int, str]]:
    return [(e["event"]["version_no"], e["event"]["reason"]) for e in evs if e["event"]["type"] == "prompt.rendered"]


async def test_refreshing_an_unchanged_prompt_keeps_its_version_and_records_nothing(
    client: httpx.AsyncClient,
) -> None:
    """The version changes exactly when the text does: refreshes that render the same bytes
    answer the prompt in force (its version and seq) and leave the log as it was."""
    s = sid()
    await configure(client, s, {"blocks": [{"kind": "writable", "label": "memory"}]})
    await client.put(f"/v1/sessions/{s}/context/memory", json={"content": "a fact"})
    first = await prompt(client, s)
    assert (first["prompt"], first["version"]) == (block("MEMORY [writable]", "a fact"), 1)
    last = await last_seq(client, s)

    assert await refresh(client, s) == first
    assert await refresh(client, s) == first
    assert await last_seq(client, s) == last
    # the same content written again changes no byte of the prompt either
    written = await client.put(f"/v1/sessions/{s}/context/memory", json={"content": "a fact"})
    assert written.status_code == 200, written.text
    assert await refresh(client, s) == first
    assert await prompt(client, s, min_seq=first["seq"]) == first

    # a write that changes the text: a new version, once
    await client.put(f"/v1/sessions/{s}/context/memory", json={"content": "another fact"})
    second = await refresh(client, s)
    assert (second["prompt"], second["version"]) == (block("MEMORY [writable]", "another fact"), 2)
    assert second["seq"] > written.json()["seq"]
    assert await refresh(client, s) == second
    assert await prompt(client, s, min_seq=second["seq"]) == second
    assert _rendered(await events(client, s)) == [(1, "freeze"), (2, "refresh")]


async def test_clearing_with_an_unchanged_prompt_records_no_new_version(client: httpx.AsyncClient) -> None:
    s = sid()
    await configure(client, s, {"blocks": [{"kind": "readonly", "label": "soul", "content": "Be brief."}]})
    await append(client, s, msg("m1", "hello"))
    first = await prompt(client, s)
    r = await client.post(f"/v1/sessions/{s}/messages:clear")
    assert r.status_code == 200, r.text
    evs = await events(client, s)
    assert evs[-1]["event"]["type"] == "messages.cleared"
    assert evs[-1]["seq"] == r.json()["seq"]
    assert _rendered(evs) == [(1, "freeze")]
    assert await prompt(client, s, min_seq=r.json()["seq"]) == first


async def test_a_compaction_with_an_unchanged_prompt_records_no_new_version(client: httpx.AsyncClient) -> None:
    s = sid()
    config = {
        "blocks": [{"kind": "readonly", "label": "soul", "content": "Be brief."}],
        "compaction": {"protect_head": 1, "tail_token_budget": 10, "min_tail_messages": 2},
    }
    await configure(client, s, config)
    r = await client.post(
        f"/v1/sessions/{s}/messages:batch", json={"messages": [msg(f"m{i}", f"m{i}{PROSE}") for i in range(8)]}
    )
    assert r.status_code == 201, r.text
    first = await prompt(client, s)
    compacted = await client.post(f"/v1/sessions/{s}/compact", json={})
    assert compacted.status_code == 200, compacted.text
    assert compacted.json()["compacted"] is True, compacted.json()
    evs = await events(client, s)
    assert evs[-1]["event"]["type"] == "compaction.recorded"
    assert _rendered(evs) == [(1, "freeze")]
    assert await prompt(client, s, min_seq=compacted.json()["seq"]) == first


async def test_clearing_a_session_without_a_frozen_prompt_renders_none(client: httpx.AsyncClient) -> None:
    s = sid()
    await client.post("/v1/sessions", json={"id": s})
    await configure(client, s, {"blocks": [{"kind": "writable", "label": "memory"}]})
    msg = {"id": "m1", "role": "user", "parts": [{"type": "text", "text": "hello"}]}
    await client.post(f"/v1/sessions/{s}/messages", json={"message": msg})
    r = await client.post(f"/v1/sessions/{s}/messages:clear")
    assert r.status_code == 200, r.text
    assert "prompt.rendered" not in [e["event"]["type"] for e in await events(client, s)]


async def test_prompt_as_of_seq_is_the_one_in_force_then(client: httpx.AsyncClient) -> None:
    s = sid()
    await configure(client, s, {"blocks": [{"kind": "writable", "label": "memory"}]})
    await client.put(f"/v1/sessions/{s}/context/memory", json={"content": "v1"})
    before = await last_seq(client, s)
    v1 = await prompt(client, s)
    await client.put(f"/v1/sessions/{s}/context/memory", json={"content": "v2"})
    v2 = await refresh(client, s)
    r = await client.put(f"/v1/sessions/{s}/context/memory", json={"content": "v3"})
    v3 = await refresh(client, s)
    assert [v1["version"], v2["version"], v3["version"]] == [1, 2, 3]

    async def as_of(seq: int) -> dict[str, Any]:
        return await prompt(client, s, as_of_seq=seq)

    assert (await as_of(before))["prompt"] is None
    assert (await as_of(v1["seq"]))["prompt"] == block("MEMORY [writable]", "v1")
    assert (await as_of(v2["seq"] - 1))["version"] == 1
    assert await as_of(v2["seq"]) == {k: v2[k] for k in ("prompt", "tokens", "version", "seq")}
    assert (await as_of(r.json()["seq"]))["prompt"] == block("MEMORY [writable]", "v2")
    assert (await as_of(v3["seq"]))["prompt"] == block("MEMORY [writable]", "v3")
    problem(await client.get(f"/v1/sessions/{s}/system-prompt", params={"as_of_seq": -1}), 422, "invalid_request")
    # past the log's last sequence: the prompt then is not known yet
    problem(await client.get(f"/v1/sessions/{s}/system-prompt", params={"as_of_seq": 10**12}), 422, "seq_not_reached")


async def test_concurrent_first_reads_freeze_once(client: httpx.AsyncClient) -> None:
    s = sid()
    await configure(client, s, {"blocks": [{"kind": "readonly", "label": "soul", "content": "Be brief."}]})
    answers = await asyncio.gather(*(prompt(client, s) for _ in range(8)))
    assert all(a == answers[0] for a in answers)
    assert answers[0]["version"] == 1
    rendered = [e for e in await events(client, s) if e["event"]["type"] == "prompt.rendered"]
    assert len(rendered) == 1
    assert rendered[0]["seq"] == answers[0]["seq"]


def _missing_count(metrics: str) -> float:
    line = next(x for x in metrics.splitlines() if x.startswith("chronicle_context_sources_missing_total "))
    return float(line.split()[1])


async def test_a_readonly_block_whose_object_is_missing_is_refused_not_rendered_empty(
    client: httpx.AsyncClient, api_settings: Settings
) -> None:
    s = sid()
    bucket = new_bucket(api_settings)
    await append(client, s, msg("m1", "hello"))
    seq = await configure(
        client,
        s,
        {
            "blocks": [
                {"kind": "readonly", "label": "soul", "content": "Be kind."},
                {"kind": "readonly", "label": "policy", "source": {"bucket": bucket, "key": "policy.md"}},
            ]
        },
    )
    counted = _missing_count((await client.get("/metrics")).text)
    last = await last_seq(client, s)
    answers = [
        await client.get(f"/v1/sessions/{s}/context", params={"min_seq": seq}),
        await client.get(f"/v1/sessions/{s}/context", params={"as_of_seq": seq}),
        await client.get(f"/v1/sessions/{s}/system-prompt"),
        await client.post(f"/v1/sessions/{s}/system-prompt:refresh"),
    ]
    for r in answers:
        detail = problem(r, 409, "source_missing")["detail"]
        assert "'policy'" in detail, detail
        assert f"'policy.md' is not in bucket {bucket!r}" in detail, detail
    assert await last_seq(client, s) == last  # no prompt was frozen without the block
    assert _missing_count((await client.get("/metrics")).text) == counted + len(answers)

    put_object(api_settings, bucket, "policy.md", "Refunds within 30 days.")
    frozen = await prompt(client, s)
    assert "Refunds within 30 days." in frozen["prompt"]
    assert (await context(client, s))["policy"]["content"] == "Refunds within 30 days."

    # gone again: a clear still clears, and the prompt in force stays until a refresh works
    minio(api_settings).remove_object(bucket, tenant_key("policy.md"))
    cleared = await client.post(f"/v1/sessions/{s}/messages:clear")
    assert cleared.status_code == 200, cleared.text
    history = await client.get(f"/v1/sessions/{s}/history", params={"min_seq": cleared.json()["seq"]})
    assert history.json()["messages"] == []
    assert await prompt(client, s, min_seq=cleared.json()["seq"]) == frozen
    problem(await client.post(f"/v1/sessions/{s}/system-prompt:refresh"), 409, "source_missing")


async def test_a_readonly_block_whose_object_is_not_text_is_refused_not_a_500(
    client: httpx.AsyncClient, api_settings: Settings
) -> None:
    s = sid()
    bucket = new_bucket(api_settings)
    data = b"\xff\xfe policy"
    minio(api_settings).put_object(bucket, tenant_key("policy.bin"), io.BytesIO(data), len(data))
    await append(client, s, msg("m1", "hello"))
    source = {"bucket": bucket, "key": "policy.bin"}
    seq = await configure(client, s, {"blocks": [{"kind": "readonly", "label": "policy", "source": source}]})
    last = await last_seq(client, s)
    for r in [
        await client.get(f"/v1/sessions/{s}/context", params={"min_seq": seq}),
        await client.get(f"/v1/sessions/{s}/system-prompt"),
    ]:
        detail = problem(r, 409, "source_not_text")["detail"]
        assert f"'policy.bin' in bucket {bucket!r} is not UTF-8 text" in detail, detail
    assert await last_seq(client, s) == last  # no prompt was frozen


async def test_a_clear_whose_prompt_source_is_no_longer_text_stands_and_answers_200(
    client: httpx.AsyncClient, api_settings: Settings
) -> None:
    """(The clear was recorded, then answered 409 source_not_text: a client retried a clear that
    had happened.) Whatever fails re-rendering after the clear is recorded, it is answered 200."""
    s = sid()
    bucket = new_bucket(api_settings)
    put_object(api_settings, bucket, "policy.md", "Refunds within 30 days.")
    await append(client, s, msg("m1", "hello"))
    await configure(
        client,
        s,
        {"blocks": [{"kind": "readonly", "label": "policy", "source": {"bucket": bucket, "key": "policy.md"}}]},
    )
    frozen = await prompt(client, s)
    data = b"\xff\xfe policy"
    minio(api_settings).put_object(bucket, tenant_key("policy.md"), io.BytesIO(data), len(data))
    cleared = await client.post(f"/v1/sessions/{s}/messages:clear")
    assert cleared.status_code == 200, cleared.text
    seq = cleared.json()["seq"]
    history = await client.get(f"/v1/sessions/{s}/history", params={"min_seq": seq})
    assert history.json()["messages"] == []
    assert await prompt(client, s, min_seq=seq) == frozen  # in force until a refresh works
    problem(await client.post(f"/v1/sessions/{s}/system-prompt:refresh"), 409, "source_not_text")


async def test_prompt_as_of_seq_of_an_unknown_or_erased_session_is_404_or_410_as_other_as_of_reads(
    client: httpx.AsyncClient,
) -> None:
    """(It answered 200 ``{"prompt": null}`` where history and context ``as_of_seq`` answer 404.)
    An unknown session is 404, an erased one 410 (as its writes); a live session with no prompt in
    force then still answers ``null``."""
    unknown, erased = sid(), sid()
    await configure(client, erased, {"blocks": [{"kind": "writable", "label": "memory"}]})
    before = await last_seq(client, erased)
    assert (await prompt(client, erased, as_of_seq=before))["prompt"] is None  # live: none frozen yet
    frozen = await prompt(client, erased)
    r = await client.post(f"/v1/sessions/{erased}:erase")
    assert r.status_code == 200, r.text
    gone = r.json()["seq"]  # read once the projector applied the erasure
    for s, seq in ((unknown, 1), (erased, before), (erased, frozen["seq"])):
        for path in ("system-prompt", "history", "context"):
            answer = await client.get(f"/v1/sessions/{s}/{path}", params={"as_of_seq": seq, "min_seq": gone})
            problem(answer, *((404, "session_not_found") if s == unknown else (410, "session_erased")))
