"""Context blocks: the session's configuration, block contents within token budgets, keyed
search entries, and searching them. Every change is an event; state-dependent changes go through
:class:`~services.writes.optimistic.OptimisticWriter`.

Reference: the Cloudflare Agents SDK Session API, §1.4 of docs/reference.md."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from functools import partial
from typing import Any, Literal

import psycopg
from psycopg_pool import AsyncConnectionPool

from events.admission import MAX_WRITTEN_BYTES
from events.catalog import (
    ContextWritten,
    SearchEntryIndexed,
    SessionConfigured,
)
from events.context import ReadonlyBlock, SearchableBlock, SessionConfig, SkillsBlock, WritableBlock, is_bucket_name
from events.publisher import Publisher
from events.sealing import DataKey
from projections import context_queries, queries
from projections.search_bound import SEARCH_TIMEOUT_S
from projections.search_query import MAX_QUERY_CHARS
from services.context.prompt_size import bounding_event, config_too_large, most_grown, too_large
from services.context.prompt_text import RenderedBlock, history_summary, search_summary, skill_listing
from services.context.rules import (
    Listings,
    Sources,
    allowed,
    find_block,
    joined,
    named_buckets,
    object_key,
    refuse_unsafe,
    skill_sources,
    tool_writable,
    unsafe_keys,
)
from services.context.search_gate import SearchGate, search_slots
from services.errors import (
    BlockNotFound,
    BudgetExceeded,
    ChronicleError,
    ContentionExhausted,
    InvalidConfig,
    KeyedBlock,
    ObjectStorageError,
    PromptTooLarge,
    ReadOnlyBlock,
    SourceMissing,
    SourceNotText,
)
from services.storage.s3 import SkillStore
from services.tokens import TokenCounter
from services.writes.liveness import live_session
from services.writes.optimistic import Decision, OptimisticWriter

Conn = psycopg.AsyncConnection[Any]
Mode = Literal["replace", "append"]
HISTORY_DESCRIPTION = "Cross-session conversation history"
log = logging.getLogger("chronicle.context")


MISSING_LOG_EVERY_S = 300.0
"""A missing source is logged once in this many seconds per (tenant, session, bucket, key): a
client polling the context would otherwise write a warning per request."""
_missing_logged: dict[tuple[str, str, str, str], float] = {}


def source_missing(tenant: str, session: str, block: ReadonlyBlock) -> ChronicleError:
    """The error (and its log line, at most once in :data:`MISSING_LOG_EVERY_S` per object and
    session) of a read-only block whose object is not in storage: the block is never rendered
    empty in its place (a frozen prompt would keep the gap unseen)."""
    assert block.source is not None
    detail = (
        f"block {block.label!r}: object {block.source.key[:200]!r} is not in bucket {block.source.bucket!r}; "
        "upload it, or PUT a config without it"
    )
    which, now = (tenant, session, block.source.bucket, block.source.key), time.monotonic()
    if now - _missing_logged.get(which, -MISSING_LOG_EVERY_S) >= MISSING_LOG_EVERY_S:
        if len(_missing_logged) >= 10_000:  # bounded: forget them all rather than grow
            _missing_logged.clear()
        _missing_logged[which] = now
        log.warning("read-only source missing for %s/%s: %s", tenant, session, detail)
    return SourceMissing(detail)


SIZING_ROUNDS = 4
"""How many times a sized change reads the objects of a config it met unread (:class:`SourcesUnread`)
before it gives up (``503 contention``): each time the session's config changed meanwhile."""


class SourcesUnread(Exception):
    """A sizing :meth:`ContextBlocks.blocks` met an object of ``config`` that was not read before
    the decision (the config in force, on a refusal's path; a config changed since the objects
    were read): object storage is never read with a connection held, so the caller reads them
    and decides again (:meth:`ContextBlocks._decide_sized`)."""

    def __init__(self, config: SessionConfig) -> None:
        super().__init__("a sized config's objects were not read before the decision")
        self.config = config


@dataclass(frozen=True, slots=True)
class WriteResult:
    label: str
    content: str
    tokens: int
    max_tokens: int | None
    seq: int
    description: str | None = None


class ContextBlocks:
    """Configuration, blocks and search entries of sessions (the base of :class:`ContextService`)."""

    def __init__(
        self,
        optimistic: OptimisticWriter,
        publisher: Publisher,
        pool: AsyncConnectionPool[Conn],
        counter: TokenCounter,
        skills: SkillStore | None,
    ) -> None:
        self._cond = optimistic
        self._pub = publisher
        self._pool = pool
        self.counter = counter
        self._skills = skills
        self.reserved_buckets: frozenset[str] = frozenset()
        self.search_timeout_s = SEARCH_TIMEOUT_S  # CHRONICLE_SEARCH_TIMEOUT_S (services/bootstrap.py)
        # how many searches run at once (services/bootstrap.py sets it from the settings)
        self.search_gate = SearchGate(*search_slots(20, None, None))

    @property
    def skills(self) -> SkillStore | None:
        return self._skills

    # -- config -----------------------------------------------------------------------------

    async def configure(self, tenant: str, session: str, config: SessionConfig) -> int:
        """Store ``config``; refused (:class:`PromptTooLarge`, nothing stored) when the session's
        prompt could not be recorded with it and would be longer than with the config in force (a
        config that shortens the prompt is always taken: :meth:`_refuse_unstorable_config`)."""
        problem = unsafe_keys(config)
        if problem is not None:
            raise InvalidConfig(problem)
        for bucket in sorted(named_buckets(config)):  # the contract takes what S3 refuses: refused here
            if not is_bucket_name(bucket):
                raise InvalidConfig(f"invalid bucket name {bucket!r}: object storage takes no request for it")
        for block in config.blocks:
            if self._skills is None:
                break
            if isinstance(block, SkillsBlock):
                await self._require_bucket(block.bucket)
            elif isinstance(block, ReadonlyBlock) and block.source is not None:
                await self._require_bucket(block.source.bucket)

        async def decide(texts: Sources, key: DataKey | None, conn: Conn) -> Decision:
            await live_session(conn, tenant, session, must_exist=False)
            await self._refuse_unstorable_config(conn, tenant, session, config, texts, key)
            return Decision(SessionConfigured(tenant=tenant, session=session, config=config), lambda seq: seq)

        texts = await self._config_sources(tenant, session, config, sizing=True)
        seq: int = await self._decide_sized(tenant, session, decide, texts)
        return seq

    async def _decide_sized(
        self,
        tenant: str,
        session: str,
        decide: Callable[[Sources, DataKey | None, Conn], Awaitable[Decision]],
        texts: Sources,
    ) -> Any:
        """``decide`` (a change that sizes the prompt it would leave) under the session's
        optimistic concurrency, with ``texts`` the objects read for it and the session's data key
        (:meth:`~events.publisher.Publisher.sizing_key`), both fetched with no connection held. A
        config it meets whose objects are not among them (:class:`SourcesUnread`) has them read,
        with no connection held, and the change is decided again; :class:`ContentionExhausted`
        after :data:`SIZING_ROUNDS` such rounds."""
        key = await self._pub.sizing_key(tenant, session)
        for _ in range(SIZING_ROUNDS):
            try:
                return await self._cond.run(tenant, session, partial(decide, texts, key))
            except SourcesUnread as unread:
                texts = {**texts, **await self._config_sources(tenant, session, unread.config, sizing=True)}
        raise ContentionExhausted(
            f"gave up after the session's config changed {SIZING_ROUNDS} times while its objects were read"
        )

    async def _refuse_unstorable_config(
        self, conn: Conn, tenant: str, session: str, config: SessionConfig, texts: Sources, key: DataKey | None
    ) -> None:
        """:class:`PromptTooLarge` when the prompt the session would have with ``config``
        (bounded: :mod:`services.context.prompt_size`) is more than an event may be stored as and
        longer than the one of the config in force (a stored config with an unsafe key renders
        none: as an empty prompt); its detail says the room left."""
        after, blocks = await self._sized(conn, tenant, session, config, texts, key)
        if after <= MAX_WRITTEN_BYTES:
            return
        current = await self.config(conn, tenant, session)
        # the config in force's objects not in ``texts`` are read before deciding again (SourcesUnread):
        # the rare refusal's path only
        unsafe = unsafe_keys(current) is not None
        before, was = (0, []) if unsafe else await self._sized(conn, tenant, session, current, texts, key)
        if after > before:
            raise PromptTooLarge(config_too_large(after, before, *most_grown(blocks, was)))

    def refuse_reserved(self, bucket: str) -> None:
        """:class:`InvalidConfig` when ``bucket`` is one of Chronicle's own (claim-checked bodies,
        originals, the archive: :attr:`reserved_buckets`), or a name no object-storage request can
        be made for (:func:`events.context.is_bucket_name`: the contract admits ``two..dots``, as
        it did before that rule, and the client refuses it). Asked by :meth:`configure` and again
        where a tenant's object is read or written (a skill put or load, a read-only source): a
        ``session.configured`` published straight to JetStream is admitted whatever buckets it
        names (the contract cannot know a deployment's bucket settings), and a tenant's document
        stored in a reserved bucket would be left there by its erasure, which never cleans one."""
        if bucket in self.reserved_buckets:
            raise InvalidConfig(f"bucket {bucket!r} is reserved for Chronicle's own data")
        if not is_bucket_name(bucket):
            raise InvalidConfig(f"invalid bucket name {bucket!r}: object storage takes no request for it")

    async def _require_bucket(self, bucket: str) -> None:
        assert self._skills is not None
        self.refuse_reserved(bucket)
        if not await self._skills.bucket_exists(bucket):
            raise InvalidConfig(f"bucket {bucket!r} does not exist")

    async def config(self, conn: Conn, tenant: str, session: str) -> SessionConfig:
        return await context_queries.config(conn, tenant, session) or SessionConfig()

    # -- blocks -----------------------------------------------------------------------------

    async def _object_text(self, tenant: str, bucket: str, key: str, *, limit: int | None = None) -> str | None:
        """The text of the tenant's object ``key`` in ``bucket`` (a read-only source or a skill),
        None when it is not there; :class:`SourceNotText` (409) naming it when its bytes are
        not UTF-8; :class:`InvalidConfig` when ``bucket`` is reserved (:meth:`refuse_reserved`);
        :class:`~services.storage.s3.ObjectTooLarge` when it has more than ``limit`` bytes
        (never read whole)."""
        self.refuse_reserved(bucket)
        try:
            return await self._storage().get_text(bucket, object_key(tenant, key), limit=limit)
        except UnicodeDecodeError:
            raise SourceNotText(
                f"object {key[:200]!r} in bucket {bucket!r} is not UTF-8 text; upload it as text"
            ) from None

    async def sources(self, tenant: str, session: str, *, catch_up: bool = False, sizing: bool = False) -> Sources:
        """The object-storage texts of the session's read-only blocks, read with no database
        connection held (object storage may be slow; the pool must not wait on it). With
        ``catch_up``, the configuration is read once the session's events are all applied.
        ``sizing``: see :meth:`_config_sources`."""
        if catch_up:
            await self._cond.catch_up(tenant, session)
        async with self._pool.connection() as conn:
            config = await self.config(conn, tenant, session)
        return await self._config_sources(tenant, session, config, sizing=sizing)

    async def _config_sources(self, tenant: str, session: str, config: SessionConfig, *, sizing: bool) -> Sources:
        """:meth:`sources` of ``config``. ``sizing`` (to bound the prompt a change would leave):
        an object that is missing or not text is ``""``, as a sized prompt has it (:meth:`blocks`),
        and a configuration with an unsafe key has none, instead of being refused (the prompt is
        refused where it is rendered, not the change); every object of a safe ``config`` is then
        in the answer, so sizing reads none with a connection held."""
        if sizing and unsafe_keys(config) is not None:
            return {}
        refuse_unsafe(config)
        blocks = [b for b in config.blocks if isinstance(b, ReadonlyBlock) and b.source is not None]
        if not blocks:
            return {}
        wanted = [(b.source.bucket, object_key(tenant, b.source.key)) for b in blocks if b.source is not None]
        read = self._sizing_text if sizing else self._object_text
        texts = await asyncio.gather(
            *(read(tenant, b.source.bucket, b.source.key) for b in blocks if b.source is not None)
        )
        found: Sources = {}
        for block, where, text in zip(blocks, wanted, texts, strict=True):
            if text is None:
                raise source_missing(tenant, session, block)
            found[where] = text
        return found

    async def _sizing_text(self, tenant: str, bucket: str, key: str) -> str:
        """:meth:`_object_text` to size a prompt: ``""``, the block a sized prompt has in its place
        (:meth:`blocks`), for an object that is missing or not text, or with no object storage
        configured."""
        if self._skills is None:
            return ""
        try:
            return await self._object_text(tenant, bucket, key) or ""
        except SourceNotText:
            return ""

    async def blocks(
        self,
        conn: Conn,
        tenant: str,
        session: str,
        config: SessionConfig | None = None,
        sources: Sources | None = None,
        *,
        contents: dict[str, str] | None = None,
        counts: dict[str, int] | None = None,
        listings: Listings | None = None,
        sizing: bool = False,
    ) -> list[RenderedBlock]:
        """Every configured block with its current content and exact token count, in order.

        Read-only blocks kept in object storage take their text from ``sources`` (see
        :meth:`sources`); one missing there (the configuration changed since) is read here, but
        when sizing (:class:`SourcesUnread`: the caller reads it with no connection held). An
        object not in storage is :class:`~services.errors.SourceMissing` (``409
        source_missing``), never an empty block.
        ``contents`` (writable blocks) and ``counts`` (searchable entries), when given, replace
        the read models' (time travel folds them from the log); ``listings`` (skills), those of
        the skills index (a skill put sizes the prompt it would leave).
        ``sizing``: to bound the prompt's size (:mod:`services.context.prompt_size`): each
        block's ``tokens`` is its byte length (no shorter in a header, and not counted), and an
        object missing or not text is an empty block (``sources`` has it as ``""``:
        :meth:`_config_sources`)."""
        config = config or await self.config(conn, tenant, session)
        refuse_unsafe(config)
        if contents is None:
            contents = await context_queries.block_contents(conn, tenant, session)
        if counts is None:  # one query per kind, never one per block
            counts = await context_queries.entry_counts(
                conn, tenant, session, [b.label for b in config.blocks if isinstance(b, SearchableBlock)]
            )
        if listings is None:
            listings = await context_queries.skill_listings(conn, tenant, skill_sources(config))
        out: list[RenderedBlock] = []
        for b in config.blocks:
            match b:
                case ReadonlyBlock():
                    content = b.content or ""
                    if b.source is not None:
                        where = (b.source.bucket, object_key(tenant, b.source.key))
                        if sources is not None and where in sources:
                            content = sources[where]
                        elif sizing:
                            raise SourcesUnread(config)
                        else:
                            text = await self._object_text(tenant, b.source.bucket, b.source.key)
                            if text is None:
                                raise source_missing(tenant, session, b)
                            content = text
                case WritableBlock():
                    content = contents.get(b.label, "")
                case SearchableBlock():
                    content = search_summary(counts.get(b.label, 0))
                case SkillsBlock():
                    content = skill_listing(allowed(b, listings[(b.bucket, b.prefix)]))
            tokens = len(content.encode()) if sizing else self.counter.count(content)
            out.append(RenderedBlock(b.label, b.kind, b.description, content, tokens, b.max_tokens, tool_writable(b)))
        if config.searchable_history:
            content = history_summary(await context_queries.live_session_count(conn, tenant))
            out.append(
                RenderedBlock(
                    config.searchable_history,
                    "history",
                    HISTORY_DESCRIPTION,
                    content,
                    len(content.encode()) if sizing else self.counter.count(content),
                    None,
                )
            )
        return out

    def _storage(self) -> SkillStore:
        if self._skills is None:
            raise ObjectStorageError("object storage is not configured")
        return self._skills

    async def write(
        self, tenant: str, session: str, label: str, content: str, mode: Mode, writer: Literal["tool", "api"]
    ) -> WriteResult:
        """Replace or append to a writable block; the budget is checked on the resulting text, and
        a write that lengthens the block is refused (:class:`PromptTooLarge`, nothing written)
        when the session's prompt could not be recorded after it (:meth:`_refuse_unstorable`)."""

        async def decide(texts: Sources, key: DataKey | None, conn: Conn) -> Decision:
            await live_session(conn, tenant, session, must_exist=False)
            config = await self.config(conn, tenant, session)
            block = find_block(config, label)
            if block is None and label == config.searchable_history:
                # the history block is searchable but has no writer: read-only, as in the reference
                raise ReadOnlyBlock(f'Block "{label}" is readonly')
            if block is None:
                raise BlockNotFound(f'Block "{label}" not found')
            if isinstance(block, SearchableBlock | SkillsBlock):
                raise KeyedBlock(f'Block "{label}" is a keyed provider. Use set_context with metadata instead.')
            if not isinstance(block, WritableBlock):
                raise ReadOnlyBlock(f'Block "{label}" is readonly')
            contents = await context_queries.block_contents(conn, tenant, session)
            current = contents.get(label, "")
            new = joined(current, content) if mode == "append" else content
            tokens = self.counter.count(new)
            if block.max_tokens is not None and tokens > block.max_tokens:
                raise BudgetExceeded(f'Block "{label}" exceeds maxTokens: {tokens} > {block.max_tokens}')
            if len(new.encode()) > len(current.encode()):  # a write that shortens a block is always the way out
                await self._refuse_unstorable(conn, tenant, session, config, label, contents, new, texts, key)
            event = ContextWritten(
                tenant=tenant, session=session, label=label, content=new, tokens=tokens, mode=mode, writer=writer
            )
            return Decision(
                event, lambda seq: WriteResult(label, new, tokens, block.max_tokens, seq, block.description)
            )

        texts = await self.sources(tenant, session, sizing=True)
        result: WriteResult = await self._decide_sized(tenant, session, decide, texts)
        return result

    async def _refuse_unstorable(
        self,
        conn: Conn,
        tenant: str,
        session: str,
        config: SessionConfig,
        label: str,
        contents: dict[str, str],
        new: str,
        texts: Sources,
        key: DataKey | None,
    ) -> None:
        """:class:`PromptTooLarge` when the prompt the session would have with ``new`` in block
        ``label`` (bounded: :mod:`services.context.prompt_size`) is more than an event may be
        stored as (sealed, when the session seals); its detail says the room left."""
        if unsafe_keys(config) is not None:
            return  # no prompt can be rendered from it: refused where it is rendered, not here

        async def size(content: str) -> int:
            with_content = {**contents, label: content}
            return (await self._sized(conn, tenant, session, config, texts, key, contents=with_content))[0]

        after = await size(new)
        if after > MAX_WRITTEN_BYTES:
            raise PromptTooLarge(too_large(label, after, await size(""), new, contents.get(label, "")))

    async def _sized(
        self,
        conn: Conn,
        tenant: str,
        session: str,
        config: SessionConfig,
        texts: Sources,
        key: DataKey | None,
        *,
        contents: dict[str, str] | None = None,
        listings: Listings | None = None,
    ) -> tuple[int, list[RenderedBlock]]:
        """The bound on the stored size of the prompt ``config`` renders (``contents`` and
        ``listings`` in place of the read models', when given), and its blocks as sized. ``key``
        is the session's data key (:meth:`~events.publisher.Publisher.sizing_key`), fetched before
        ``conn`` was taken: the key store would take a second connection."""
        blocks = await self.blocks(
            conn, tenant, session, config, texts, contents=contents, listings=listings, sizing=True
        )
        return self._pub.size_with(bounding_event(tenant, session, blocks), key), blocks

    async def index_entry(self, tenant: str, session: str, label: str, key: str, content: str) -> int:
        async def decide(conn: Conn) -> Decision:
            await live_session(conn, tenant, session, must_exist=False)
            block = find_block(await self.config(conn, tenant, session), label)
            if not isinstance(block, SearchableBlock):
                raise BlockNotFound(f'Block "{label}" is not a search provider')
            event = SearchEntryIndexed(tenant=tenant, session=session, label=label, key=key, content=content)
            return Decision(event, lambda seq: seq)

        seq: int = await self._cond.run(tenant, session, decide)
        return seq

    # -- search -----------------------------------------------------------------------------

    async def search(self, tenant: str, session: str, label: str, query: str) -> str | None:
        """``search_context``'s hits, or None: a blank query, or one longer than the search
        routes take (as ``session_search`` answers it), finds nothing."""
        if not query.strip() or len(query) > MAX_QUERY_CHARS:
            return None
        async with self.search_gate.slot(tenant, self.search_timeout_s), self._pool.connection() as conn:
            config = await self.config(conn, tenant, session)
            if label == config.searchable_history:
                hits = await queries.search(conn, tenant, None, query, 10, self.search_timeout_s)
                return "\n---\n".join(f"[{h.role}] {h.content}" for h in hits) or None
            rows = await context_queries.search_entries(conn, tenant, session, label, query, 10, self.search_timeout_s)
        return "\n\n".join(f"[{k}]\n{c}" for k, c in rows) or None

    async def session_search(self, tenant: str, query: str) -> str:
        if not query.strip() or len(query) > MAX_QUERY_CHARS:
            return "No results found."
        async with self.search_gate.slot(tenant, self.search_timeout_s), self._pool.connection() as conn:
            hits = await queries.search(conn, tenant, None, query, 10, self.search_timeout_s)
        return "\n---\n".join(f"[{h.role}] {h.content}" for h in hits) if hits else "No results found."
