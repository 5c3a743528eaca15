"""Keys of keyed writes, derived exactly as the reference does (slug, or slug + FNV-1a base 36).

Reference: the Cloudflare Agents SDK Session API, §2 and §8 of docs/reference.md."""

from __future__ import annotations

import re
import unicodedata

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


JS_TRIMMED = (
    "\t\n\v\f\r \u00a0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009\u200a"
    "\u2028\u2029\u202f\u205f\u3000\ufeff"
)
"""What JavaScript's ``String.prototype.trim`` removes (WhiteSpace and LineTerminator): U+FEFF
included, U+001C-U+001F and U+0085 not, unlike Python's ``str.strip()``."""


def js_trim(text: str) -> str:
    return text.strip(JS_TRIMMED)


def context_entry_key(title: str | None, content: str) -> str:
    """The reference's key: a title blank after JavaScript's ``trim`` counts as no title."""
    if title is not None and js_trim(title):
        return slugify(title) or f"entry-{hash36(title)}"
    return f"{slugify(content) or 'entry'}-{hash36(content)}"


def unsafe_object_key(key: str) -> str | None:
    """Why ``key`` may not name an object under a tenant's root (``tenants/<tenant>/``), or None.

    Keys are relative: no leading ``/``, no empty, ``.`` or ``..`` segment (object stores that map
    keys to paths resolve them, and a key could step out of the tenant's space), no backslash, no
    control character."""
    if not key:
        return "it is empty"
    if key.startswith("/"):
        return "it is absolute (starts with '/')"
    if "\\" in key:
        return "it holds a backslash"
    if any(unicodedata.category(ch) == "Cc" for ch in key):
        return "it holds a control character"
    segments = key.split("/")
    if any(s in ("", ".", "..") for s in segments):
        return "it has an empty, '.' or '..' segment"
    return None


def unsafe_prefix(prefix: str) -> str | None:
    """:func:`unsafe_object_key` for a key prefix: empty, or a safe key, optionally ending in ``/``."""
    return unsafe_object_key(prefix.removesuffix("/")) if prefix else None
