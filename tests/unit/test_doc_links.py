"""The README's and docs/'s Markdown links resolve: a relative link names a file of the checkout,
and its ``#anchor`` a heading of that file (GitHub's slugs: lower case, spaces to ``-``, punctuation
dropped, a repeated heading ``-1``, ``-2`` …). The docs stand on their own: none points outside the
repository."""

from __future__ import annotations

import re
import unicodedata
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\]\(([^)\s]+)\)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")


def lines(path: Path) -> list[tuple[int, str]]:
    """The file's lines outside fenced code blocks, numbered."""
    out, fenced = [], False
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced:
            out.append((number, line))
    return out


def slug(heading: str) -> str:
    kept = "".join(c for c in heading.strip().lower() if c in "-_ " or unicodedata.category(c)[0] in "LN")
    return kept.replace(" ", "-")


@cache
def anchors(path: Path) -> frozenset[str]:
    """The file's headings' slugs, and its HTML anchors (``<a id="…">``)."""
    seen: dict[str, int] = {}
    found: set[str] = set()
    for _, line in lines(path):
        if m := HEADING.match(line):
            s = slug(m.group(2))
            found.add(f"{s}-{seen[s]}" if s in seen else s)
            seen[s] = seen.get(s, 0) + 1
        found.update(re.findall(r'<a (?:id|name)="([^"]+)"', line))
    return frozenset(found)


def test_slugs_as_github_makes_them() -> None:
    assert slug("Backups: what the log cannot restore") == "backups-what-the-log-cannot-restore"
    assert (
        slug("Encryption on against off (`encryption`, issue #17)") == "encryption-on-against-off-encryption-issue-17"
    )
    assert slug("Erasure (crypto-shredding)") == "erasure-crypto-shredding"


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_and_anchor_resolves(doc: Path) -> None:
    broken = []
    for number, line in lines(doc):
        for target in LINK.findall(re.sub(r"`[^`]*`", "", line)):  # a link inside code is no link
            if re.match(r"^[a-z]+:", target):  # https:, mailto:
                continue
            path, _, fragment = target.partition("#")
            file = (doc.parent / path).resolve() if path else doc
            if not file.is_relative_to(ROOT) or not file.exists():
                broken.append(f"{doc.name}:{number}: {target} (no such file in the repository)")
            elif fragment and file.suffix == ".md" and fragment not in anchors(file):
                broken.append(f"{doc.name}:{number}: {target} (no such heading)")
    assert not broken, "\n".join(broken)
