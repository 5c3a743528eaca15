"""Object keys a session config may name: relative to the tenant's root, never stepping out of it."""

from __future__ import annotations

import pytest

from events.context import ObjectSource, ReadonlyBlock, SessionConfig, SkillsBlock
from services.context.entry_keys import unsafe_object_key, unsafe_prefix
from services.context.rules import unsafe_keys

BAD = ["", "/abs", "../x", "a/../b", "a/./b", ".", "..", "a//b", "a/", "a\\b", "a\x00b", "a\nb", "a\x7fb"]
GOOD = ["x.md", "docs/policy v2.md", "a..b", "...", ".hidden", "skills/tax", "日本/語.md"]


@pytest.mark.parametrize("key", BAD, ids=ascii)
def test_unsafe_keys(key: str) -> None:
    assert unsafe_object_key(key) is not None


@pytest.mark.parametrize("key", GOOD)
def test_safe_keys(key: str) -> None:
    assert unsafe_object_key(key) is None


@pytest.mark.parametrize("prefix", ["", "skills/", "skills", "a/b/", "a..b/"])
def test_safe_prefixes(prefix: str) -> None:
    assert unsafe_prefix(prefix) is None


@pytest.mark.parametrize("prefix", ["/", "../", "a//", "/abs/", "a/../", "./"])
def test_unsafe_prefixes(prefix: str) -> None:
    assert unsafe_prefix(prefix) is not None


def test_a_config_names_the_first_unsafe_block() -> None:
    config = SessionConfig(
        blocks=[
            ReadonlyBlock(label="ok", source=ObjectSource(bucket="docs", key="fine.md")),
            SkillsBlock(label="sk", bucket="docs", prefix="skills/", keys=["tax", "../escape"]),
        ]
    )
    problem = unsafe_keys(config)
    assert problem is not None
    assert "'sk'" in problem
    assert "keys" in problem
    assert unsafe_keys(SessionConfig(blocks=[ReadonlyBlock(label="r", content="inline")])) is None
