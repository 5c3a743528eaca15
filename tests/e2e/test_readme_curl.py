"""The README's curl session runs as written: each ``curl`` of its block is sent to the API, and
each answer the README shows after one (``# {…}``) matches what the API answers: every object it
writes out, with the fields it names (a value written ``.../x`` ends with ``/x``), is an object of
the answer. The session id is made fresh (the README's ``demo``), and its ``seq`` values are read as
"the answer of the README's Nth write" (the README's were taken on a new stack)."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path
from typing import Any

import httpx

from tests.e2e.helpers import new_sid

README = Path(__file__).resolve().parents[2] / "README.md"
PAIR = re.compile(r'"(\w+)"\s*:\s*("(?:[^"\\]|\\.)*"|-?\d+(?:\.\d+)?|null|true|false)')
INNERMOST = re.compile(r"\{[^{}]*\}")


def session_block() -> str:
    """The shell block of the README's ``## A curl session``."""
    text = README.read_text(encoding="utf-8")
    section = text[text.index("\n## A curl session\n") :]
    return section[section.index("```sh\n") + len("```sh\n") : section.index("\n```\n")]


def steps(block: str) -> list[tuple[list[str], str]]:
    """Each ``curl`` command as its words, with the answer the README shows after it ('' for none)."""
    found: list[tuple[list[str], str]] = []
    lines = block.replace("\\\n", " ").splitlines()
    for line in lines:
        if line.startswith("curl "):
            found.append((shlex.split(line, comments=True), ""))
        elif found and (line.startswith("# {") or (found[-1][1] and line.startswith("#  "))):
            found[-1] = (found[-1][0], found[-1][1] + line[2:])  # an answer, or its next line
    return found


def expected_objects(shown: str) -> list[dict[str, Any]]:
    """The objects an answer shows, innermost first, each as the scalar fields it writes out."""
    objects: list[dict[str, Any]] = []
    while match := INNERMOST.search(shown):
        fields = {k: json.loads(v) for k, v in PAIR.findall(match.group())}
        if fields:
            objects.append(fields)
        shown = shown[: match.start()] + "@" + shown[match.end() :]
    return objects


def dicts(node: Any) -> list[dict[str, Any]]:
    if isinstance(node, dict):
        return [node, *(d for v in node.values() for d in dicts(v))]
    if isinstance(node, list):
        return [d for v in node for d in dicts(v)]
    return []


def matches(want: Any, got: Any) -> bool:
    if isinstance(want, str) and want.startswith("..."):
        return isinstance(got, str) and got.endswith(want[3:])
    return bool(want == got and type(want) is type(got))


def test_the_readme_block_has_the_steps_this_test_reads() -> None:
    found = steps(session_block())
    assert len(found) == 11, found
    assert sum(1 for _, shown in found if shown) == 7


async def test_the_readme_curl_session_answers_as_the_readme_shows(client: httpx.AsyncClient) -> None:
    sid = new_sid("readme")
    seqs: list[int] = []  # the answered seq of each write, in order: the README's seq N is seqs[N-1]
    for words, shown in steps(session_block()):
        words = [re.sub(r"\bdemo\b", sid, w) for w in words]
        method = words[words.index("-X") + 1] if "-X" in words else "GET"
        body = words[words.index("-d") + 1] if "-d" in words else None
        url = next(w for w in words if w.startswith("$B"))
        url = re.sub(r"min_seq=(\d+)", lambda m: f"min_seq={seqs[int(m.group(1)) - 1]}", url)
        r = await client.request(
            method, url.removeprefix("$B"), content=body, headers={"content-type": "application/json"} if body else {}
        )
        if not shown:
            assert r.status_code == 200, (words, r.text)
            continue
        answer = r.json()
        if r.status_code < 300 and method == "POST":
            seqs.append(answer["seq"])
        for want in expected_objects(re.sub(r"\bdemo\b", sid, shown)):
            if "seq" in want:
                want["seq"] = seqs[want["seq"] - 1]
            assert any(all(k in d and matches(v, d[k]) for k, v in want.items()) for d in dicts(answer)), (
                words,
                want,
                answer,
            )
