"""Context memory on real JetStream + Postgres: concurrent writers within one budget, and a frozen
prompt that survives a restart of the API side and the projector."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable

import pytest

from events.context import SessionConfig
from events.publisher import Publisher
from services.bootstrap import Container
from services.context.prompt_text import SEP
from services.context.service import ContextService
from services.errors import BudgetExceeded
from services.tokens import TokenCounter
from services.writes.optimistic import OptimisticWriter
from tests.conftest import make_settings, operator_nats, running_stack

MEMORY = SessionConfig.model_validate(
    {"blocks": [{"kind": "writable", "label": "memory", "description": "Learned facts", "max_tokens": 120}]}
)


async def test_concurrent_appends_stay_within_budget_and_lose_no_accepted_write(
    stack: Container, new_id: Callable[[str], str]
) -> None:
    """10 writers, each with its own NATS connection and services, append to one budgeted block."""
    sid = new_id("budget")
    await stack.context.configure("tenant-a", sid, MEMORY)
    writers, per_writer = 10, 8
    conns = [await operator_nats(stack.settings.nats_url) for _ in range(writers)]
    counter = TokenCounter(stack.settings.tiktoken_encoding)
    accepted: list[str] = []
    refused: list[str] = []
    errors: list[str] = []
    try:
        services = [
            ContextService(
                OptimisticWriter(
                    Publisher(nc.jetstream(), stack.layout), stack.pool, stack.waiter, attempts=1000, turn_timeout_s=5
                ),
                Publisher(nc.jetstream(), stack.layout),
                stack.pool,
                counter,
                None,
            )
            for nc in conns
        ]

        async def writer(w: int, svc: ContextService) -> None:
            for i in range(per_writer):
                line = f"writer {w} remembers fact number {i}"
                try:
                    result = await svc.write("tenant-a", sid, "memory", line, "append", "tool")
                except BudgetExceeded as exc:
                    errors.append(exc.detail)
                    refused.append(line)
                else:
                    assert result.tokens <= 120
                    assert line in result.content.split("\n")
                    accepted.append(line)

        await asyncio.gather(*(writer(w, svc) for w, svc in enumerate(services)))
    finally:
        for nc in conns:
            await nc.close()

    assert len(accepted) + len(refused) == writers * per_writer
    assert all(re.fullmatch(r'Block "memory" exceeds maxTokens: \d+ > 120', e) for e in errors), errors
    assert accepted, "the budget admits several lines"
    assert refused, "80 lines of ~8 tokens cannot fit in 120 tokens"
    last = await stack.publisher.last_subject_seq("tenant-a", sid)
    await stack.waiter.wait_session("tenant-a", sid, last)
    async with stack.pool.connection() as conn:
        [memory] = await stack.context.blocks(conn, "tenant-a", sid)
    lines = memory.content.split("\n")
    assert sorted(lines) == sorted(accepted)  # every accepted append, and nothing else
    assert memory.tokens == counter.count(memory.content) <= 120
    # every refused line would still overflow the final content
    for line in refused:
        assert counter.count(memory.content + "\n" + line) > 120
    # each writer's accepted lines appear in the order it wrote them
    for w in range(writers):
        mine = [int(x.rsplit(" ", 1)[1]) for x in lines if x.startswith(f"writer {w} ")]
        assert mine == sorted(mine)


async def test_concurrent_appends_through_one_service_lose_nothing(
    stack: Container, new_id: Callable[[str], str]
) -> None:
    """Each written event carries the whole resulting content, computed from the state it saw."""
    sid = new_id("mixed")
    unbounded = SessionConfig.model_validate({"blocks": [{"kind": "writable", "label": "memory"}]})
    await stack.context.configure("tenant-a", sid, unbounded)

    async def append(i: int) -> None:
        await stack.context.write("tenant-a", sid, "memory", f"a{i}", "append", "api")

    await asyncio.gather(*(append(i) for i in range(20)))
    await stack.commands.optimistic.catch_up("tenant-a", sid)
    async with stack.pool.connection() as conn:
        [memory] = await stack.context.blocks(conn, "tenant-a", sid)
    assert sorted(memory.content.split("\n")) == sorted(f"a{i}" for i in range(20))


@pytest.mark.parametrize("writer", ["api", "tool"])
async def test_frozen_prompt_survives_a_restart(
    nats_url: str, db_url: str, s3_endpoint: str, new_id: Callable[[str], str], writer: str
) -> None:
    settings = make_settings(nats_url, db_url, s3_endpoint=s3_endpoint)
    sid = new_id("restart")
    async with running_stack(settings) as c:
        await c.context.configure("tenant-a", sid, MEMORY)
        await c.context.write("tenant-a", sid, "memory", "before the restart", "replace", "api")
        frozen = await c.context.frozen_prompt("tenant-a", sid)
        if writer == "api":
            await c.context.write("tenant-a", sid, "memory", "after the freeze", "append", "api")
        else:
            args = {"label": "memory", "content": "after the freeze", "action": "append"}
            result = await c.context.execute("tenant-a", sid, "set_context", args)
            assert result.startswith("Written to memory. Usage: ")
        assert await c.context.frozen_prompt("tenant-a", sid) == frozen

    async with running_stack(settings) as c:
        await c.commands.optimistic.catch_up("tenant-a", sid)
        again = await c.context.frozen_prompt("tenant-a", sid)
        assert again == frozen
        assert (again.text, again.version) == (frozen.text, 1)
        refreshed = await c.context.refresh_prompt("tenant-a", sid)
        content = "before the restart\nafter the freeze"
        used = c.context.counter.count(content)
        pct = int(used / 120 * 100 + 0.5)
        header = f"MEMORY (Learned facts) [{pct}% \u2014 {used}/120 tokens] [writable]"
        assert refreshed.text == f"{SEP}\n{header}\n{SEP}\n{content}"
        assert refreshed.version == 2
        await c.commands.optimistic.catch_up("tenant-a", sid)
        assert await c.context.frozen_prompt("tenant-a", sid) == refreshed
