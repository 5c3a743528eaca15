"""A bounded read of an object (``SkillStore.get_bytes(limit=...)``: a skill document under
``CHRONICLE_MAX_SKILL_BYTES``) asks for ``limit`` + 1 bytes and reads no more, even from a store
that ignores the range and sends the whole object (it read the whole answer then)."""

from __future__ import annotations

import io
from typing import Any

import pytest

from services.storage.s3 import ObjectTooLarge, SkillStore


class _WholeAnswer:
    """An object store's answer that ignores the range asked for: the whole object."""

    def __init__(self, data: bytes) -> None:
        self._body = io.BytesIO(data)
        self.asked: list[int | None] = []

    def read(self, amt: int | None = None) -> bytes:
        self.asked.append(amt)
        return self._body.read(amt)

    def close(self) -> None:
        pass

    def release_conn(self) -> None:
        pass


class _Client:
    def __init__(self, answer: _WholeAnswer) -> None:
        self.answer = answer

    def get_object(self, bucket: str, key: str, length: int = 0) -> Any:
        return self.answer


async def test_a_bounded_read_reads_at_most_one_byte_past_its_limit_whatever_the_store_sends() -> None:
    store = SkillStore("127.0.0.1:1", "k", "s", secure=False, region="us-east-1")
    answer = _WholeAnswer(b"x" * 10_000)
    store._client = _Client(answer)  # type: ignore[assignment]
    with pytest.raises(ObjectTooLarge):
        await store.get_bytes("skills", "big.md", limit=100)
    assert answer.asked == [101]
    assert len(answer._body.read()) == 10_000 - 101  # the rest never read
