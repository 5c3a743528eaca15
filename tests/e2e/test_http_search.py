"""Full-text search over HTTP: all words, any order, Porter stemming, phrases, prefixes, text parts only, limits."""

from __future__ import annotations

from typing import Any

import httpx

from tests.e2e.helpers import append, history, msg, new_sid, unique_word


async def search(client: httpx.AsyncClient, sid: str, q: str, **params: Any) -> list[dict[str, Any]]:
    r = await client.get(f"/v1/sessions/{sid}/search", params={"q": q, **params})
    assert r.status_code == 200, r.text
    results: list[dict[str, Any]] = r.json()["results"]
    return results


async def fill(client: httpx.AsyncClient, sid: str, texts: dict[str, str]) -> int:
    seq = 0
    for mid, text in texts.items():
        seq = (await append(client, sid, msg(mid, text)))["seq"]
    return seq


async def test_words_match_in_any_order(client: httpx.AsyncClient) -> None:
    sid = new_sid()
    seq = await fill(
        client,
        sid,
        {
            "m1": "the deployment is on Friday",
            "m2": "the deployment is on Monday",
            "m3": "Friday is a holiday",
        },
    )
    hits = await search(client, sid, "Friday deployment", min_seq=seq)
    assert [h["id"] for h in hits] == ["m1"]
    hits = await search(client, sid, "deployment friday", min_seq=seq)
    assert [h["id"] for h in hits] == ["m1"]
    # All words must match: m2 has "deployment" but not "Friday".
    assert {h["id"] for h in await search(client, sid, "deployment", min_seq=seq)} == {"m1", "m2"}


async def test_porter_stemming_as_the_reference(client: httpx.AsyncClient) -> None:
    sid = new_sid()
    seq = await fill(
        client,
        sid,
        {
            "m1": "the deployment is on Friday",
            "m2": "we keep running the databases",
            "m3": "connection refused",
            "m4": "one more thing",
        },
    )
    # The original Porter algorithm, as FTS5's porter tokenizer: deployments/deployment -> deploy.
    assert [h["id"] for h in await search(client, sid, "deployments", min_seq=seq)] == ["m1"]
    assert [h["id"] for h in await search(client, sid, "deployment fridays", min_seq=seq)] == ["m1"]
    assert [h["id"] for h in await search(client, sid, "runs database", min_seq=seq)] == ["m2"]
    assert [h["id"] for h in await search(client, sid, "connecting", min_seq=seq)] == ["m3"]
    # Porter's own conflations are the reference's too: "one" and "on" share the stem "on", and
    # "deploying" and "deploys" (deploi) are not "deployment" (deploy).
    assert {h["id"] for h in await search(client, sid, "one", min_seq=seq)} == {"m1", "m4"}
    assert await search(client, sid, "deploying", min_seq=seq) == []
    # Stemming is not lemmatisation: the irregular "ran" is its own stem.
    assert await search(client, sid, "ran", min_seq=seq) == []


async def test_common_words_phrases_and_prefixes(client: httpx.AsyncClient) -> None:
    sid = new_sid()
    seq = await fill(
        client,
        sid,
        {
            "m1": "who deploys the blue green stack when it rains",
            "m2": "green and blue are colours",
            "m3": "the deployment of blue-green stacks",
        },
    )
    # Stop words are words: every one a user types is searched.
    assert {h["id"] for h in await search(client, sid, "the", min_seq=seq)} == {"m1", "m3"}
    assert [h["id"] for h in await search(client, sid, "who when", min_seq=seq)] == ["m1"]
    # A quoted phrase matches its words adjacent and in order; a hyphenated word is the phrase of its parts.
    assert {h["id"] for h in await search(client, sid, '"blue green"', min_seq=seq)} == {"m1", "m3"}
    assert [h["id"] for h in await search(client, sid, '"green blue"', min_seq=seq)] == []
    assert {h["id"] for h in await search(client, sid, "blue-green", min_seq=seq)} == {"m1", "m3"}
    assert {h["id"] for h in await search(client, sid, "green blue", min_seq=seq)} == {"m1", "m2", "m3"}
    # An unclosed quote is a phrase to the end of the query.
    assert {h["id"] for h in await search(client, sid, 'stack "blue green', min_seq=seq)} == {"m1", "m3"}
    # A trailing * is a prefix (of the stemmed word).
    assert {h["id"] for h in await search(client, sid, "deplo*", min_seq=seq)} == {"m1", "m3"}
    assert {h["id"] for h in await search(client, sid, "col*", min_seq=seq)} == {"m2"}
    assert await search(client, sid, "*", min_seq=seq) == []


async def test_only_text_parts_are_indexed(client: httpx.AsyncClient) -> None:
    sid = new_sid()
    secret_reasoning, secret_tool, visible = unique_word(), unique_word(), unique_word()
    body = {
        "id": "m1",
        "role": "assistant",
        "parts": [
            {"type": "reasoning", "text": f"I think about {secret_reasoning}"},
            {
                "type": "tool-lookup",
                "toolCallId": "c1",
                "state": "output-available",
                "input": {"query": secret_tool},
                "output": {"text": f"{secret_tool} found"},
            },
            {"type": "dynamic-tool", "toolName": "x", "toolCallId": "c2", "output": f"{secret_tool}"},
            {"type": "text", "text": f"the answer is {visible}"},
        ],
    }
    seq = (await append(client, sid, body))["seq"]
    assert [h["id"] for h in await search(client, sid, visible, min_seq=seq)] == ["m1"]
    assert await search(client, sid, secret_reasoning, min_seq=seq) == []
    assert await search(client, sid, secret_tool, min_seq=seq) == []


async def test_a_hits_content_joins_its_text_parts_with_a_newline(client: httpx.AsyncClient) -> None:
    """As the reference's Postgres provider; its SQLite provider joins them with a space."""
    sid = new_sid()
    word = unique_word()
    parts = [
        {"type": "text", "text": f"first {word}"},
        {"type": "reasoning", "text": "not indexed"},
        {"type": "text", "text": "second"},
    ]
    seq = (await append(client, sid, {"id": "m1", "role": "user", "parts": parts}))["seq"]
    assert [h["content"] for h in await search(client, sid, word, min_seq=seq)] == [f"first {word}\nsecond"]


async def test_no_match_gives_an_empty_list(client: httpx.AsyncClient) -> None:
    sid = new_sid()
    seq = await fill(client, sid, {"m1": "nothing to see here"})
    assert await search(client, sid, unique_word(), min_seq=seq) == []
    # Only punctuation: the query is empty after parsing, which matches nothing (and is not an error).
    assert await search(client, sid, "&& !? --", min_seq=seq) == []
    # Query syntax characters are plain text, not tsquery operators.
    assert [h["id"] for h in await search(client, sid, "see & (here | !", min_seq=seq)] == ["m1"]
    assert [h["id"] for h in await search(client, sid, "here:* see", min_seq=seq)] == ["m1"]
    # A session that does not exist is not found.
    r = await client.get(f"/v1/sessions/{new_sid()}/search", params={"q": "anything"})
    assert (r.status_code, r.json()["code"]) == (404, "session_not_found")


async def test_a_message_too_long_to_index_whole_is_stored_and_found_by_its_first_part(
    client: httpx.AsyncClient,
) -> None:
    """~900 KB of distinct words make a vector over Postgres's 1 MiB: the append was answered 201
    and the message then quarantined, never readable. Only the first 100,000 characters are
    indexed now; the message is stored whole."""
    first, inside, outside = unique_word(), unique_word(), unique_word()
    filler = [f"w{i:06d}" for i in range(110_000)]  # distinct words ("w" and digits: one token each)
    text = " ".join([first, *filler[:10_000], inside, *filler[10_000:20_000], outside, *filler[20_000:]])
    assert text.index(inside) < 100_000 < text.index(outside)
    assert len(text.encode()) > 850_000
    sid = new_sid()
    seq = (await append(client, sid, msg("m1", text)))["seq"]
    h = await history(client, sid, min_seq=seq)
    assert [(m["id"], m["parts"][0]["text"]) for m in h["messages"]] == [("m1", text)]
    assert [x["id"] for x in await search(client, sid, first, min_seq=seq)] == ["m1"]
    assert [x["id"] for x in await search(client, sid, inside, min_seq=seq)] == ["m1"]
    assert await search(client, sid, outside, min_seq=seq) == []


async def test_limit_and_snippet(client: httpx.AsyncClient) -> None:
    sid = new_sid()
    word = unique_word()
    seq = await fill(client, sid, {f"m{i}": f"note {i} mentions {word} among other words" for i in range(6)})
    hits = await search(client, sid, word, min_seq=seq)
    assert len(hits) == 6
    assert len(await search(client, sid, word, min_seq=seq, limit=2)) == 2
    for h in hits:
        assert h["session_id"] == sid
        assert h["role"] == "user"
        assert word in h["content"]
        assert f"**{word}**" in h["snippet"]
        assert isinstance(h["rank"], float)
        assert h["created_at"]


async def test_results_are_ranked(client: httpx.AsyncClient) -> None:
    sid = new_sid()
    word = unique_word()
    seq = await fill(
        client,
        sid,
        {"once": f"a long sentence that mentions {word} only once among many other words", "many": f"{word} " * 5},
    )
    hits = await search(client, sid, word, min_seq=seq)
    assert [h["id"] for h in hits] == ["many", "once"]
    assert hits[0]["rank"] > hits[1]["rank"]


async def test_default_limit_is_20(client: httpx.AsyncClient) -> None:
    sid = new_sid()
    word = unique_word()
    seq = await fill(client, sid, {f"m{i}": f"{word} {i}" for i in range(23)})
    assert len(await search(client, sid, word, min_seq=seq)) == 20


async def test_search_sees_updates_and_deletes(client: httpx.AsyncClient) -> None:
    sid = new_sid()
    before, after = unique_word(), unique_word()
    await fill(client, sid, {"m1": f"draft {before}", "m2": f"keep {before}"})
    r = await client.put(f"/v1/sessions/{sid}/messages/m1", json={"message": msg("m1", f"final {after}")})
    assert r.status_code == 200, r.text
    r = await client.delete(f"/v1/sessions/{sid}/messages", params={"ids": "m2"})
    seq = r.json()["seq"]
    assert await search(client, sid, before, min_seq=seq) == []
    assert [h["id"] for h in await search(client, sid, after, min_seq=seq)] == ["m1"]


async def test_tenant_wide_search_spans_sessions(client: httpx.AsyncClient) -> None:
    word = unique_word()
    s1, s2, s3 = new_sid(), new_sid(), new_sid()
    await append(client, s1, msg("a", f"first mention of {word}"))
    await append(client, s2, msg("b", f"second mention of {word}"))
    seq = (await append(client, s3, msg("c", "unrelated")))["seq"]

    r = await client.get("/v1/search", params={"q": word, "min_seq": seq})
    assert r.status_code == 200, r.text
    hits = r.json()["results"]
    assert {(h["session_id"], h["id"]) for h in hits} == {(s1, "a"), (s2, "b")}
    for h in hits:
        assert f"**{word}**" in h["snippet"]

    r = await client.get("/v1/search", params={"q": word, "limit": 1, "min_seq": seq})
    assert len(r.json()["results"]) == 1
    r = await client.get("/v1/search", params={"q": unique_word(), "min_seq": seq})
    assert r.json()["results"] == []


async def test_deleted_sessions_are_not_searched(client: httpx.AsyncClient) -> None:
    word = unique_word()
    gone, kept = new_sid(), new_sid()
    await append(client, gone, msg("g", f"{word} in a session that will be deleted"))
    await append(client, kept, msg("k", f"{word} in a session that stays"))
    r = await client.delete(f"/v1/sessions/{gone}")
    assert r.status_code == 200, r.text
    seq = r.json()["seq"]
    r = await client.get("/v1/search", params={"q": word, "min_seq": seq})
    assert [(h["session_id"], h["id"]) for h in r.json()["results"]] == [(kept, "k")]
    r = await client.get(f"/v1/sessions/{gone}/search", params={"q": word, "min_seq": seq})
    assert (r.status_code, r.json()["code"]) == (404, "session_not_found")


async def test_accents_and_widths_are_folded_both_ways(client: httpx.AsyncClient) -> None:
    """(The outside-in trial: `q=cafe` and `q=naive` found nothing for "naïve café résumé", and
    fullwidth FRIDAY did not find "Friday".) Migration 029."""
    sid = new_sid()
    friday = "".join(chr(ord(c) + 0xFEE0) for c in "FRIDAY")  # fullwidth
    seq = await fill(client, sid, {"m1": "naïve café résumé", "m2": "see you on Friday", "m3": "a plain cafe"})
    for q in ("cafe", "café", "CAFE"):
        hits = await search(client, sid, q, min_seq=seq)
        assert {h["id"]: h["snippet"] for h in hits} == {"m1": "naïve **café** résumé", "m3": "plain **cafe**"}, q
    for q in ("naive", "naïve", "resume", "résumé"):
        assert [h["id"] for h in await search(client, sid, q, min_seq=seq)] == ["m1"], q
    assert [h["id"] for h in await search(client, sid, friday, min_seq=seq)] == ["m2"]
    r = await client.get("/v1/search", params={"q": "naive cafe", "min_seq": seq})
    assert r.status_code == 200, r.text
    assert [h["id"] for h in r.json()["results"] if h["session_id"] == sid] == ["m1"]
