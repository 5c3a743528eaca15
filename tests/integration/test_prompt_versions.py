"""The frozen prompt's version changes exactly when its text changes, on real JetStream + Postgres:
a block write racing a refresh (landing between its render and its publish) is never lost, and a
log written before that rule (identical ``prompt.rendered`` events in a row) projects as before."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest

from events.catalog import PromptRendered
from events.context import SessionConfig
from events.envelope import Event
from events.publisher import Published, Publisher
from projections import context_queries
from services.audit import readers as audit
from services.bootstrap import Container
from services.context.prompt import Prompt
from services.context.prompt_text import SEP
from tests.conftest import make_settings, running_stack

T = "tenant-a"
MEMORY = SessionConfig.model_validate({"blocks": [{"kind": "writable", "label": "memory"}]})


def rendered(content: str) -> str:
    return f"{SEP}\nMEMORY [writable]\n{SEP}\n{content}"


async def prompt_events(c: Container, sid: str) -> list[tuple[int, str, str]]:
    """(version, reason, text) of every recorded prompt, read once the session is caught up."""
    await c.commands.optimistic.catch_up(T, sid)
    async with c.pool.connection() as conn:
        found, more = await context_queries.prompts(conn, T, sid, 0, 1000)
    assert not more
    return [(p.version, p.reason, p.text) for p in found]


@dataclass(frozen=True, slots=True)
class Raced:
    first: Prompt  # frozen with the block at "v1"
    refreshed: Prompt  # the refresh that rendered "v2", raced by a write
    tried: list[int]  # the expected sequence of every publish of a prompt the refresh tried


async def refresh_raced(c: Container, sid: str, content: str, monkeypatch: pytest.MonkeyPatch) -> Raced:
    """Freeze the block at "v1", write "v2", then refresh; the refresh's first publish of a
    ``prompt.rendered`` (its text rendered with "v2") writes ``content`` just before it."""
    await c.context.configure(T, sid, MEMORY)
    await c.context.write(T, sid, "memory", "v1", "replace", "api")
    first = await c.context.frozen_prompt(T, sid)
    await c.context.write(T, sid, "memory", "v2", "replace", "api")
    real = Publisher.publish
    tried: list[int] = []

    async def publish(self: Publisher, event: Event, **kw: Any) -> Published:
        if isinstance(event, PromptRendered):
            tried.append(kw["expected_last_subject_seq"])
            if len(tried) == 1:
                assert event.text == rendered("v2")
                await c.context.write(T, sid, "memory", content, "replace", "api")
        return await real(self, event, **kw)

    monkeypatch.setattr(Publisher, "publish", publish)
    try:
        refreshed = await c.context.refresh_prompt(T, sid)
    finally:
        monkeypatch.undo()
    return Raced(first, refreshed, tried)


async def test_a_write_between_the_render_and_the_publish_is_in_the_new_prompt(
    stack: Container, new_id: Callable[[str], str], monkeypatch: pytest.MonkeyPatch
) -> None:
    sid = new_id("race-newer")
    raced = await refresh_raced(stack, sid, "v3", monkeypatch)
    assert len(raced.tried) == 2  # the first publish conflicted; decided again after the write
    assert raced.tried[1] > raced.tried[0]
    assert (raced.refreshed.text, raced.refreshed.version) == (rendered("v3"), 2)
    assert await prompt_events(stack, sid) == [(1, "freeze", rendered("v1")), (2, "refresh", rendered("v3"))]
    assert await stack.context.frozen_prompt(T, sid) == raced.refreshed


async def test_a_write_back_to_the_prompt_in_force_between_render_and_publish_records_nothing(
    stack: Container, new_id: Callable[[str], str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The refresh rendered a changed text, but before its publish a write put the block back:
    the publish conflicts, and decided again the text is the one in force, so nothing is recorded
    (recording the rendered text would freeze a block content that is no longer there)."""
    sid = new_id("race-back")
    raced = await refresh_raced(stack, sid, "v1", monkeypatch)
    assert len(raced.tried) == 1  # conflicted once; the second decision published nothing
    assert raced.refreshed == raced.first
    assert await prompt_events(stack, sid) == [(1, "freeze", rendered("v1"))]
    await stack.context.write(T, sid, "memory", "v4", "replace", "api")
    later = await stack.context.refresh_prompt(T, sid)
    assert (later.text, later.version) == (rendered("v4"), 2)


async def test_a_log_with_identical_prompts_in_a_row_projects_as_before_and_verifies(
    nats_url: str, fresh_db: str, new_id: Callable[[str], str]
) -> None:
    """Before this rule every re-render was recorded: such a log keeps its versions (the read
    model has each of them, the latest is in force), a refresh answers the latest without
    recording another, and a rebuild from the log equals the live read model."""
    sid = new_id("old-log")
    async with running_stack(make_settings(nats_url, fresh_db)) as c:
        await c.context.configure(T, sid, MEMORY)
        await c.context.write(T, sid, "memory", "same", "replace", "api")
        text = rendered("same")
        tokens = c.context.counter.count(text)
        for version, reason in ((1, "freeze"), (2, "refresh"), (3, "compaction"), (4, "refresh")):
            await c.publisher.publish(
                PromptRendered(tenant=T, session=sid, text=text, tokens=tokens, version_no=version, reason=reason)
            )
        before = await prompt_events(c, sid)
        assert before == [(1, "freeze", text), (2, "refresh", text), (3, "compaction", text), (4, "refresh", text)]
        in_force = await c.context.frozen_prompt(T, sid)
        assert in_force.version == 4
        last = await c.publisher.last_subject_seq(T, sid)

        assert await c.context.refresh_prompt(T, sid) == in_force
        assert await c.publisher.last_subject_seq(T, sid) == last
        assert await prompt_events(c, sid) == before
        report = await audit.verify(c)
        assert report.ok, report.differences
