"""The frozen system prompt: rendered from the blocks and recorded on first use, the same string
afterwards until a refresh (cache-stable for the LLM provider).

Its version changes exactly when its text changes: a re-render (a refresh, a clear, a compaction)
whose text is byte for byte the prompt in force records nothing and answers that prompt, its
version and its seq, so a client comparing versions keeps a provider cache that is still valid.
The comparison is a decision on the session's state, made like every other one (after catching
up with the session's last sequence, :class:`~services.writes.optimistic.OptimisticWriter`): a
changed text is published expecting that sequence, so a block write landing between the render
and the publish makes it conflict and render again; an unchanged one is the prompt in force at
that sequence (a later write is picked up by the next re-render).

A prompt too large to be recorded (an object grown in storage, skills put to the tenant's index:
what no write of the session decides) is :class:`~services.errors.PromptUnstorable`, naming its
largest block and by how much it is over; nothing is recorded, and a frozen prompt stays in force.

Reference: the Cloudflare Agents SDK Session API, §1.2 and §3.1 of docs/reference.md."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

from events.admission import MAX_WRITTEN_BYTES, Refused
from events.catalog import (
    PromptRendered,
)
from projections import context_queries
from services.context.blocks import Conn, ContextBlocks
from services.context.prompt_size import largest_block, unstorable
from services.context.prompt_text import RenderedBlock, render
from services.context.rules import Sources
from services.errors import (
    PromptUnstorable,
    SessionNotFound,
)
from services.writes.liveness import live_session
from services.writes.optimistic import Decision


@dataclass(frozen=True, slots=True)
class Prompt:
    text: str
    tokens: int
    version: int
    seq: int


class ContextPrompt(ContextBlocks):
    async def frozen_prompt(self, tenant: str, session: str) -> Prompt:
        """The frozen prompt; rendered and recorded on first use, the same string afterwards."""
        prompt = await self.recorded_prompt(tenant, session)
        if prompt is not None:
            return prompt
        return await self._render_prompt(tenant, session, "freeze")

    async def recorded_prompt(self, tenant: str, session: str) -> Prompt | None:
        """The frozen prompt if one is recorded (None: none yet; reading it would freeze one)."""
        async with self._pool.connection() as conn:
            row = await context_queries.latest_prompt(conn, tenant, session)
        return None if row is None else Prompt(row.text, row.tokens, row.version, row.seq)

    async def refresh_prompt(
        self, tenant: str, session: str, reason: Literal["refresh", "clear", "compaction"] = "refresh"
    ) -> Prompt:
        """Re-render from the current blocks; a new version only when the text differs from the
        prompt in force (otherwise that prompt, recording nothing)."""
        return await self._render_prompt(tenant, session, reason)

    async def _render_prompt(
        self, tenant: str, session: str, reason: Literal["freeze", "refresh", "clear", "compaction"]
    ) -> Prompt:
        texts: Sources | None = None
        rendered: tuple[PromptRendered, list[RenderedBlock]] | None = None

        async def decide(conn: Conn) -> Decision:
            nonlocal rendered
            await live_session(conn, tenant, session, must_exist=False)  # deleted: 404, erased: 410
            latest = await context_queries.latest_prompt(conn, tenant, session)
            if latest is None and not await context_queries.session_known(conn, tenant, session):
                # a read must not create state: no prompt is frozen for a session that does not exist
                raise SessionNotFound(f"session {session!r} does not exist")
            in_force = None if latest is None else Prompt(latest.text, latest.tokens, latest.version, latest.seq)
            if reason == "freeze" and in_force is not None:
                return Decision(None, lambda _seq: in_force)
            blocks = await self.blocks(conn, tenant, session, sources=texts)
            text = render(blocks)
            if in_force is not None and text == in_force.text:  # unchanged: the cached prefix stays valid
                return Decision(None, lambda _seq: in_force)
            tokens = self.counter.count(text)
            version = (latest.version if latest else 0) + 1
            event = PromptRendered(
                tenant=tenant, session=session, text=text, tokens=tokens, version_no=version, reason=reason
            )
            rendered = (event, blocks)
            return Decision(event, lambda seq: Prompt(text, tokens, version, seq))

        texts = await self.sources(tenant, session, catch_up=True)
        try:
            prompt: Prompt = await self._cond.run(tenant, session, decide)
        except Refused as exc:  # refused before anything is sent (events/publisher.py)
            if exc.reason != "too_large" or rendered is None:
                raise
            raise await self._unstorable(*rendered) from exc
        return prompt

    async def _unstorable(self, event: PromptRendered, blocks: list[RenderedBlock]) -> PromptUnstorable:
        """Why ``event``, rendered from ``blocks``, cannot be recorded: its stored size, and its
        largest block's room (measured with that block holding its first character only)."""
        largest = largest_block(blocks)
        shortened = [replace(b, content=b.content[:1]) if b is largest else b for b in blocks]
        size = await self._pub.stored_size(event)
        with_one = await self._pub.stored_size(event.model_copy(update={"text": render(shortened)}))
        return PromptUnstorable(unstorable(size, largest, with_one), largest.label, size, MAX_WRITTEN_BYTES)

    async def has_prompt(self, tenant: str, session: str) -> bool:
        async with self._pool.connection() as conn:
            return await context_queries.latest_prompt(conn, tenant, session) is not None
