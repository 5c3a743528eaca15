"""Skills: documents in object storage, indexed per tenant, loaded into and unloaded from a
session's context.

Reference: the Cloudflare Agents SDK Session API, §1.4 and §2 of docs/reference.md."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

from events.admission import MAX_WRITTEN_BYTES
from events.catalog import (
    SkillIndexed,
    SkillLoaded,
    SkillUnloaded,
)
from events.context import SessionConfig, SkillsBlock
from events.ids import TENANT_SCOPE, derived_id, keyed_digest
from projections import context_queries
from services.context.blocks import Conn, ContextBlocks
from services.context.entry_keys import unsafe_object_key
from services.context.prompt_size import SHORTER_SKILL, too_large
from services.context.prompt_text import skill_listing
from services.context.rules import (
    allowed,
    allows,
    find_block,
    object_key,
    outside_allowlist,
    skill_sources,
    unsafe_keys,
    with_skill,
)
from services.errors import (
    BlockNotFound,
    InvalidConfig,
    InvalidRequest,
    PromptTooLarge,
    ReadOnlyBlock,
    SkillTooLarge,
)
from services.storage.s3 import BucketMissing, ObjectTooLarge
from services.writes.liveness import live_session
from services.writes.optimistic import Decision

log = logging.getLogger("chronicle.context")

MAX_SKILL_BYTES = 1024 * 1024
"""The largest skill document, in UTF-8 bytes (``CHRONICLE_MAX_SKILL_BYTES``, set by
services/bootstrap.py): a loaded skill's whole text is a tool result, which an agent puts in the
LLM's context and the session's history (a 28.5 MB one was stored and loaded whole before)."""


class ContextSkills(ContextBlocks):
    max_skill_bytes = MAX_SKILL_BYTES

    def _refuse_oversized(self, key: str, content: str) -> None:
        """:class:`SkillTooLarge` when ``content`` is more than :attr:`max_skill_bytes`."""
        size = len(content.encode("utf-8", "surrogatepass"))
        if size > self.max_skill_bytes:
            raise SkillTooLarge(
                f'Skill "{key[:200]}" is {size:,} bytes, more than the {self.max_skill_bytes:,} a skill document may '
                "have (CHRONICLE_MAX_SKILL_BYTES); nothing was stored: write a shorter document, or split it in several"
            )

    async def put_skill(
        self,
        tenant: str,
        bucket: str,
        key: str,
        content: str,
        description: str | None,
        *,
        bucket_made: Callable[[str], None] | None = None,
    ) -> int:
        """Store a document and record it in the tenant's skills index (idempotent per etag);
        :class:`~events.sealing.KeyDestroyed` (nothing stored) when the tenant is erased,
        :class:`~services.storage.s3.BucketMissing` (nothing stored, no bucket made) when ``bucket``
        does not exist (the put itself says so: no check before it that a deletion could slip past).
        With ``bucket_made`` (``chronicle skills put --create-bucket``) a missing ``bucket`` is made
        first, after every other check (a refused put makes none), and ``bucket_made`` is told it.
        :class:`~services.errors.InvalidConfig` (nothing stored) when ``bucket`` is one of
        Chronicle's own (:meth:`refuse_reserved`); :class:`SkillTooLarge` (nothing stored) when
        ``content`` is more than :attr:`max_skill_bytes`."""
        self.refuse_reserved(bucket)
        problem = unsafe_object_key(key)
        if problem is not None:
            raise InvalidRequest(f"key {key[:200]!r} is not a safe object key: {problem}")
        self._refuse_oversized(key, content)
        if self._pub.keys is not None:  # an erased tenant's record would be refused: upload nothing either
            await self._pub.keys.for_writing(tenant, TENANT_SCOPE)  # KeyDestroyed
        if bucket_made is not None and await self._storage().create_bucket(bucket):
            bucket_made(bucket)
        stored = await self._storage().put(bucket, object_key(tenant, key), content, description)
        return await self.record_skill(tenant, bucket, key, stored.description, stored.etag, stored.size)

    async def record_skill(
        self, tenant: str, bucket: str, key: str, description: str | None, etag: str, size: int
    ) -> int:
        event_id = derived_id("skill", tenant, bucket, key, etag, description)
        scope_key = await self._pub.keys.for_writing(tenant, TENANT_SCOPE) if self._pub.keys is not None else None
        if scope_key is not None:
            # sealed: an id derived from the key, description and etag alone would confirm a guess
            # of them, as a plain hash would; keyed with the tenant scope's data key, it is still
            # one id per document (a retry is deduplicated) and no one without that key derives it
            event_id = derived_id("skill-sealed", tenant, keyed_digest(scope_key.secret.hex(), event_id))
        event = SkillIndexed(
            id=event_id,
            tenant=tenant,
            session=TENANT_SCOPE,
            bucket=bucket,
            key=key,
            description=description,
            etag=etag,
            size=size,
        )
        # an id derived from public inputs may be taken on another subject: then a fresh id (as the
        # compaction worker's overlay does, services/compaction/service.py)
        seq = (await self._pub.publish(event, fresh_id_on_foreign=True)).seq
        await self._cond.catch_up(tenant, TENANT_SCOPE)  # the next render sees it
        return seq

    async def set_skill(
        self, tenant: str, session: str, label: str, key: str, content: str, description: str | None
    ) -> int:
        """Put a skill through the session's skills block ``label``; refused, nothing stored, when
        ``key`` is outside the block's ``keys`` allowlist (:class:`InvalidRequest`: the block would
        never list nor load it, while the document is the tenant's, listed by other sessions; the
        reference's provider writes it anyway), when its line in the listing would lengthen the
        session's prompt past what can be stored (:class:`PromptTooLarge`:
        :meth:`_refuse_unstorable_skill`), and when the block's bucket does not exist
        (:class:`InvalidConfig`, no bucket made, a warning logged for the operator: deleted after
        the config named it, the deployment's to create again) or is one of Chronicle's own
        (:class:`InvalidConfig`: a config published straight to JetStream may name one)."""
        async with self._pool.connection() as conn:
            await live_session(conn, tenant, session, must_exist=False)
            config = await self.config(conn, tenant, session)
        block = find_block(config, label)
        if not isinstance(block, SkillsBlock):
            raise BlockNotFound(f'Block "{label}" is not a skill provider')
        if not block.writable:  # the reference's words for a skill provider without ``set``
            raise ReadOnlyBlock(f'Block "{label}" does not support writes')
        self.refuse_reserved(block.bucket)
        outside = outside_allowlist(block, key)
        if outside is not None:
            raise InvalidRequest(outside)
        self._refuse_oversized(key, content)  # before the prompt is sized: nothing is read for it
        await self._refuse_unstorable_skill(tenant, session, config, block, key, description)
        try:
            return await self.put_skill(tenant, block.bucket, block.prefix + key, content, description)
        except BucketMissing:
            log.warning(
                "skills block %r of session %r (tenant %r): bucket %r does not exist; create it, with its policy",
                label,
                session,
                tenant,
                block.bucket,
            )
            raise InvalidConfig(
                f'Skill "{key}" not stored: the bucket {block.bucket!r} of block "{label}" does not exist '
                "(the deployment must create it)"
            ) from None

    async def _refuse_unstorable_skill(
        self, tenant: str, session: str, config: SessionConfig, block: SkillsBlock, key: str, description: str | None
    ) -> None:
        """:class:`PromptTooLarge` when the session's prompt (bounded:
        :mod:`services.context.prompt_size`) with skill ``key`` indexed under ``block`` with
        ``description`` is more than an event may be stored as and longer than it is now (a put
        that shortens a skill's line is always taken); its detail says the block's room left.
        Decided on the session's state when the put is made: the index is the tenant's, and the
        session's log does not order the put (what slips past is answered where the prompt is
        rendered: :class:`~services.errors.PromptUnstorable`)."""
        if unsafe_keys(config) is not None:
            return  # no prompt can be rendered from it: refused where it is rendered, not here
        texts = await self._config_sources(tenant, session, config, sizing=True)
        data_key = await self._pub.sizing_key(tenant, session)  # with no connection held: the key store takes one
        where = (block.bucket, block.prefix)
        async with self._pool.connection() as conn:
            listings = await context_queries.skill_listings(conn, tenant, skill_sources(config))
            grown = with_skill(listings, block.bucket, block.prefix + key, description)
            after, _ = await self._sized(conn, tenant, session, config, texts, data_key, listings=grown)
            if after <= MAX_WRITTEN_BYTES:
                return
            before, _ = await self._sized(conn, tenant, session, config, texts, data_key, listings=listings)
            if after <= before:
                return
            emptied = {**grown, where: []}
            without, _ = await self._sized(conn, tenant, session, config, texts, data_key, listings=emptied)
        raise PromptTooLarge(
            too_large(
                block.label,
                after,
                without,
                skill_listing(allowed(block, grown[where])),
                skill_listing(allowed(block, listings[where])),
                subject=f'Skill "{key}" in block "{block.label}"',
                advice=SHORTER_SKILL,
            )
        )

    async def load_skill(
        self, tenant: str, session: str, label: str, key: str, tool_call_id: str | None = None
    ) -> str | None:
        """The document, recorded as loaded (by ``tool_call_id`` when given); None (never fetched)
        for a key outside the allowlist; :class:`~services.errors.InvalidConfig` (nothing read)
        when the block's bucket is one of Chronicle's own (:meth:`refuse_reserved`);
        :class:`SkillTooLarge` (nothing recorded, no more than :attr:`max_skill_bytes` + 1 bytes
        of it read) for a document larger than a skill may be, stored before the bound or
        uploaded out of band: it is not cut short, which would hand the LLM part of a document
        as if whole."""
        async with self._pool.connection() as conn:
            await live_session(conn, tenant, session, must_exist=False)
            block = find_block(await self.config(conn, tenant, session), label)
        if not isinstance(block, SkillsBlock):
            raise BlockNotFound(f'Block "{label}" is not a skill provider')
        if not allows(block, key) or unsafe_object_key(block.prefix + key) is not None:
            return None
        try:
            text = await self._object_text(tenant, block.bucket, block.prefix + key, limit=self.max_skill_bytes)
        except ObjectTooLarge:
            raise SkillTooLarge(
                f'Skill "{key[:200]}" is more than the {self.max_skill_bytes:,} bytes a skill document may have '
                "(CHRONICLE_MAX_SKILL_BYTES): it was not loaded; it loads once it is stored again, shorter"
            ) from None
        if text is None:
            return None
        event = SkillLoaded(tenant=tenant, session=session, label=label, key=key, tool_call_id=tool_call_id)

        async def decide(conn: Conn) -> Decision:
            # asked again under the log's concurrency check: an erasure (by any process) while the
            # document was fetched is 410, never an event after its ``session.erased``
            await live_session(conn, tenant, session, must_exist=False)
            return Decision(event, lambda _seq: None)

        await self._cond.run(tenant, session, decide)
        return text

    async def loaded_skills(
        self, conn: Conn, tenant: str, session: str, config: SessionConfig
    ) -> list[tuple[str, str]]:
        """The skills loaded in the session, as the reference's set holds them: those its history
        shows loaded (:func:`~projections.context_queries.history_loaded_skills`, the reference's
        restore scan, in history order; looked at only when a skills block is configured, as the
        reference scans only then), then those loaded through ``load_context`` and not unloaded
        since that history does not show (yet: a load's output is stored with the turn's message)."""
        recorded = await context_queries.loaded_skills(conn, tenant, session)
        if not any(isinstance(b, SkillsBlock) for b in config.blocks):
            return recorded
        shown = await context_queries.history_loaded_skills(conn, tenant, session)
        return [*shown, *(s for s in recorded if s not in shown)]

    async def unload_skill(self, tenant: str, session: str, label: str, key: str) -> bool:
        """Unload a skill that :meth:`loaded_skills` holds: one ``skill.unloaded`` for each of its
        ``load_context`` outputs that history still shows whole (history reads show them as
        ``[skill unloaded: <key>]``), so that a skill loaded twice leaves no copy of its text
        behind (the reference rewrites the newest output only); False when the skill is not
        loaded.

        The outputs are reclaimed oldest first, each by an event of its own: the newest output
        (or a load whose output is not stored yet) goes last, so an unload cut short leaves the
        skill loaded as history shows it, and unloading it again reclaims the rest."""

        async def decide(conn: Conn) -> Decision:
            recorded = (label, key) in await context_queries.loaded_skills(conn, tenant, session)
            if not recorded and (label, key) not in await context_queries.history_loaded_skills(conn, tenant, session):
                return Decision(None, lambda _seq: [])
            outputs: list[tuple[str | None, str | None]] = list(
                await context_queries.history_load_outputs(conn, tenant, session, label, key)
            )
            call = await context_queries.load_call(conn, tenant, session, label, key) if recorded else None
            if call is not None and all(c != call for _, c in outputs):
                # the loading call, its output not stored yet (the reference's unload race, its §7.6.3)
                outputs.append((None, call))
            if not outputs:  # loaded through the tool, its output not on the path scanned: the newest stored
                outputs.append(
                    await context_queries.newest_load_output(conn, tenant, session, label, key) or (None, None)
                )
            first, rest = outputs[0], outputs[1:]
            return Decision(self._unloaded(tenant, session, label, key, first), lambda _seq: [first, *rest])

        done: list[tuple[str | None, str | None]] = await self._cond.run(tenant, session, decide)
        for output in done[1:]:
            await self._cond.run(tenant, session, _publishing(self._unloaded(tenant, session, label, key, output)))
        return bool(done)

    @staticmethod
    def _unloaded(
        tenant: str, session: str, label: str, key: str, output: tuple[str | None, str | None]
    ) -> SkillUnloaded:
        message_id, tool_call_id = output
        return SkillUnloaded(
            tenant=tenant, session=session, label=label, key=key, message_id=message_id, tool_call_id=tool_call_id
        )


def _publishing(event: SkillUnloaded) -> Callable[[Conn], Awaitable[Decision]]:
    """A decision that publishes ``event`` (one more output of an unload: reclaiming an output
    twice changes nothing), asked under the log's concurrency check whether the session still
    lives (an erasure or a delete since the unload began is its 410 or 404, never an event after
    it)."""

    async def decide(conn: Conn) -> Decision:
        await live_session(conn, event.tenant, event.session, must_exist=False)
        return Decision(event, lambda _seq: None)

    return decide
