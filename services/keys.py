"""Keys of keyed writes, derived exactly as the reference does (slug, or slug + FNV-1a base 36)."""

from __future__ import annotations

import re

_NON_ALNUM = re.compile(r"[^a-z0-9]+")
_DIGITS = "0123456789abcdefghijklmnopqrstuvwxyz"


def fnv1a_utf16(text: str) -> int:
    """32-bit FNV-1a over UTF-16 code units (as JavaScript's ``charCodeAt``)."""
    h = 0x811C9DC5
    data = text.encode("utf-16-le", errors="surrogatepass")
    for i in range(0, len(data), 2):
        h ^= data[i] | (data[i + 1] << 8)
        h = (h * 0x01000193) & 0xFFFFFFFF
    return h


def base36(n: int) -> str:
    if n == 0:
        return "0"
    out = []
    while n:
        n, r = divmod(n, 36)
        out.append(_DIGITS[r])
    return "".join(reversed(out))


def _js_slice(text: str, n: int) -> str:
    """``text.slice(0, n)`` in UTF-16 code units."""
    units = text.encode("utf-16-le", errors="surrogatepass")[: 2 * n]
    return units.decode("utf-16-le", errors="surrogatepass")


def slugify(text: str) -> str:
    """First 60 characters, lowercased, runs of ``[^a-z0-9]`` to ``-``, trimmed of ``-``."""
    return _NON_ALNUM.sub("-", _js_slice(text, 60).lower()).strip("-")


def hash36(text: str) -> str:
    return base36(fnv1a_utf16(text))


def context_entry_key(title: str | None, content: str) -> str:
    if title is not None and title.strip():
        return slugify(title) or f"entry-{hash36(title)}"
    return f"{slugify(content) or 'entry'}-{hash36(content)}"
