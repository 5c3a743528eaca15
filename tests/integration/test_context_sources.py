"""Read-only blocks kept in object storage are read with no database connection held (rendered, and
sized when a config is PUT)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any

from events.context import SessionConfig
from services.bootstrap import Container
from services.context.rules import object_key

T = "tenant-a"


async def test_object_storage_is_read_with_no_connection_held(stack: Container, new_id: Callable[[str], str]) -> None:
    sid = new_id("sources")
    storage = stack.context._storage()
    bucket = "src-" + sid.lower()[-12:]
    await storage.put(bucket, object_key(T, "soul.md"), "You are kind.", None)
    config = SessionConfig.model_validate(
        {"blocks": [{"label": "soul", "kind": "readonly", "source": {"bucket": bucket, "key": "soul.md"}}]}
    )
    await stack.context.configure(T, sid, config)

    holders: dict[asyncio.Task[Any], int] = {}
    connection = stack.pool.connection

    @contextlib.asynccontextmanager
    async def tracked(*args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        task = asyncio.current_task()
        assert task is not None
        holders[task] = holders.get(task, 0) + 1
        try:
            async with connection(*args, **kwargs) as conn:
                yield conn
        finally:
            holders[task] -= 1

    held: list[int] = []
    get_text = storage.get_text

    async def watched(bucket: str, key: str) -> str | None:  # get_text's own signature
        # connections held by anything but the projector (which applies events meanwhile)
        held.append(sum(n for t, n in holders.items() if "ProjectorRunner" not in repr(t.get_coro())))
        return await get_text(bucket, key)

    storage.get_text = watched  # type: ignore[method-assign]
    stack.pool.connection = tracked  # type: ignore[method-assign]
    try:
        await stack.context.configure(T, sid, config)  # the prompt it would leave is sized
        prompt = await stack.context.frozen_prompt(T, sid)
        sources = await stack.context.sources(T, sid)
        async with stack.pool.connection() as conn:
            blocks = await stack.context.blocks(conn, T, sid, sources=sources)
    finally:
        storage.get_text = get_text  # type: ignore[method-assign]
        stack.pool.connection = connection  # type: ignore[method-assign]
    assert "You are kind." in prompt.text
    assert [b.content for b in blocks if b.label == "soul"] == ["You are kind."]
    assert held
    assert set(held) == {0}, held  # every read happened with every pool connection idle
