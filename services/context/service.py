"""Context memory: session config, block writes within token budgets, keyed entries, skills,
frozen system prompts, and the LLM tools over them. Every change is an event; state-dependent
changes go through :class:`~services.writes.optimistic.OptimisticWriter`."""

from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import dataclass
from typing import Any, Literal

import psycopg
from psycopg_pool import AsyncConnectionPool

from events.admission import Refused, has_bad_chars
from events.catalog import (
    ContextWritten,
    PromptRendered,
    SearchEntryIndexed,
    SessionConfigured,
    SkillIndexed,
    SkillLoaded,
    SkillUnloaded,
)
from events.context import ReadonlyBlock, SearchableBlock, SessionConfig, SkillsBlock, WritableBlock
from events.ids import TENANT_SCOPE, derived_id
from events.publisher import Publisher
from projections import context_queries, queries
from services.context.entry_keys import context_entry_key, unsafe_object_key, unsafe_prefix
from services.context.prompt_text import RenderedBlock, history_summary, render, search_summary, skill_listing, usage
from services.context.tool_specs import blocks_of, tool_specs
from services.errors import (
    BlockNotFound,
    BudgetExceeded,
    ChronicleError,
    InvalidConfig,
    InvalidRequest,
    KeyedBlock,
    ObjectStorageError,
    ReadOnlyBlock,
    SessionNotFound,
    UnsafeStoredConfig,
)
from services.storage.s3 import SkillStore
from services.tokens import TokenCounter
from services.writes.liveness import live_session
from services.writes.optimistic import Decision, OptimisticWriter

Conn = psycopg.AsyncConnection[Any]
Mode = Literal["replace", "append"]
HISTORY_DESCRIPTION = "Cross-session conversation history"
log = logging.getLogger("chronicle.context")
TOOL_FAILED = "Error: the tool failed unexpectedly; try again later"
"""What an LLM is told of an unexpected failure (the exception goes to the log, never to it)."""


@dataclass(frozen=True, slots=True)
class WriteResult:
    label: str
    content: str
    tokens: int
    max_tokens: int | None
    seq: int


@dataclass(frozen=True, slots=True)
class Prompt:
    text: str
    tokens: int
    version: int
    seq: int


def object_key(tenant: str, key: str) -> str:
    """Where a tenant's objects live in a bucket: ``tenants/<tenant>/<key>``.

    Every tenant's reads and writes go through the server's S3 credentials, so each tenant is
    confined to its own key space; one tenant cannot name another's objects.
    """
    return f"tenants/{tenant}/{key}"


def joined(current: str, addition: str) -> str:
    """Append as the reference does: a newline between, unless empty or already starting with one."""
    sep = "\n" if current and not addition.startswith("\n") else ""
    return current + sep + addition


Sources = dict[tuple[str, str], str]
"""Object-storage texts of read-only blocks by (bucket, key)."""


class ContextService:
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

    @property
    def skills(self) -> SkillStore | None:
        return self._skills

    # -- config -----------------------------------------------------------------------------

    async def configure(self, tenant: str, session: str, config: SessionConfig) -> int:
        problem = unsafe_keys(config)
        if problem is not None:
            raise InvalidConfig(problem)
        for block in config.blocks:
            if self._skills is None:
                break
            if isinstance(block, SkillsBlock):
                await self._require_bucket(block.bucket)
            elif isinstance(block, ReadonlyBlock) and block.source is not None:
                await self._require_bucket(block.source.bucket)

        async def decide(conn: Conn) -> Decision:
            await live_session(conn, tenant, session, must_exist=False)
            return Decision(SessionConfigured(tenant=tenant, session=session, config=config), lambda seq: seq)

        seq: int = await self._cond.run(tenant, session, decide)
        return seq

    async def _require_bucket(self, bucket: str) -> None:
        assert self._skills is not None
        if bucket in self.reserved_buckets:
            raise InvalidConfig(f"bucket {bucket!r} is reserved for Chronicle's own data")
        if not await self._skills.bucket_exists(bucket):
            raise InvalidConfig(f"bucket {bucket!r} does not exist")

    async def config(self, conn: Conn, tenant: str, session: str) -> SessionConfig:
        return await context_queries.config(conn, tenant, session) or SessionConfig()

    # -- blocks -----------------------------------------------------------------------------

    async def sources(self, tenant: str, session: str, *, catch_up: bool = False) -> Sources:
        """The object-storage texts of the session's read-only blocks, read with no database
        connection held (object storage may be slow; the pool must not wait on it). With
        ``catch_up``, the configuration is read once the session's events are all applied."""
        if catch_up:
            await self._cond.catch_up(tenant, session)
        async with self._pool.connection() as conn:
            config = await self.config(conn, tenant, session)
        _refuse_unsafe(config)
        wanted = [
            (b.source.bucket, object_key(tenant, b.source.key))
            for b in config.blocks
            if isinstance(b, ReadonlyBlock) and b.source is not None
        ]
        if not wanted:
            return {}
        texts = await asyncio.gather(*(self._storage().get_text(bucket, key) for bucket, key in wanted))
        return {where: text or "" for where, text in zip(wanted, texts, strict=True)}

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
    ) -> list[RenderedBlock]:
        """Every configured block with its current content and exact token count, in order.

        Read-only blocks kept in object storage take their text from ``sources`` (see
        :meth:`sources`); one missing there (the configuration changed since) is read here.
        ``contents`` (writable blocks) and ``counts`` (searchable entries), when given, replace
        the read models' (time travel folds them from the log)."""
        config = config or await self.config(conn, tenant, session)
        _refuse_unsafe(config)
        if contents is None:
            contents = await context_queries.block_contents(conn, tenant, session)
        if counts is None:  # one query per kind, never one per block
            counts = await context_queries.entry_counts(
                conn, tenant, session, [b.label for b in config.blocks if isinstance(b, SearchableBlock)]
            )
        listings = await context_queries.skill_listings(
            conn, tenant, list(dict.fromkeys((b.bucket, b.prefix) for b in config.blocks if isinstance(b, SkillsBlock)))
        )
        out: list[RenderedBlock] = []
        for b in config.blocks:
            match b:
                case ReadonlyBlock():
                    content = b.content or ""
                    if b.source is not None:
                        where = (b.source.bucket, object_key(tenant, b.source.key))
                        if sources is not None and where in sources:
                            content = sources[where]
                        else:
                            content = await self._storage().get_text(*where) or ""
                case WritableBlock():
                    content = contents.get(b.label, "")
                case SearchableBlock():
                    content = search_summary(counts.get(b.label, 0))
                case SkillsBlock():
                    content = skill_listing(_allowed(b, listings[(b.bucket, b.prefix)]))
            out.append(
                RenderedBlock(b.label, b.kind, b.description, content, self.counter.count(content), b.max_tokens)
            )
        if config.searchable_history:
            content = history_summary(await context_queries.live_session_count(conn, tenant))
            out.append(
                RenderedBlock(
                    config.searchable_history,
                    "history",
                    HISTORY_DESCRIPTION,
                    content,
                    self.counter.count(content),
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
        """Replace or append to a writable block; the budget is checked on the resulting text."""

        async def decide(conn: Conn) -> Decision:
            await live_session(conn, tenant, session, must_exist=False)
            config = await self.config(conn, tenant, session)
            block = _find(config, label)
            if block is None and label == config.searchable_history:
                # the history block is searchable but has no writer: read-only, as in the reference
                raise ReadOnlyBlock(f'Block "{label}" is readonly')
            if block is None:
                raise BlockNotFound(f'Block "{label}" not found')
            if isinstance(block, SearchableBlock | SkillsBlock):
                raise KeyedBlock(f'Block "{label}" is a keyed provider. Use set_context with metadata instead.')
            if not isinstance(block, WritableBlock):
                raise ReadOnlyBlock(f'Block "{label}" is readonly')
            current = (await context_queries.block_contents(conn, tenant, session)).get(label, "")
            new = joined(current, content) if mode == "append" else content
            tokens = self.counter.count(new)
            if block.max_tokens is not None and tokens > block.max_tokens:
                raise BudgetExceeded(f'Block "{label}" exceeds maxTokens: {tokens} > {block.max_tokens}')
            event = ContextWritten(
                tenant=tenant, session=session, label=label, content=new, tokens=tokens, mode=mode, writer=writer
            )
            return Decision(event, lambda seq: WriteResult(label, new, tokens, block.max_tokens, seq))

        result: WriteResult = await self._cond.run(tenant, session, decide)
        return result

    async def index_entry(self, tenant: str, session: str, label: str, key: str, content: str) -> int:
        async def decide(conn: Conn) -> Decision:
            await live_session(conn, tenant, session, must_exist=False)
            block = _find(await self.config(conn, tenant, session), label)
            if not isinstance(block, SearchableBlock):
                raise BlockNotFound(f'Block "{label}" is not a search provider')
            event = SearchEntryIndexed(tenant=tenant, session=session, label=label, key=key, content=content)
            return Decision(event, lambda seq: seq)

        seq: int = await self._cond.run(tenant, session, decide)
        return seq

    # -- skills -----------------------------------------------------------------------------

    async def put_skill(self, tenant: str, bucket: str, key: str, content: str, description: str | None) -> int:
        """Store a document and record it in the tenant's skills index (idempotent per etag)."""
        problem = unsafe_object_key(key)
        if problem is not None:
            raise InvalidRequest(f"key {key[:200]!r} is not a safe object key: {problem}")
        stored = await self._storage().put(bucket, object_key(tenant, key), content, description)
        return await self.record_skill(tenant, bucket, key, stored.description, stored.etag, stored.size)

    async def record_skill(
        self, tenant: str, bucket: str, key: str, description: str | None, etag: str, size: int
    ) -> int:
        event_id = derived_id("skill", tenant, bucket, key, etag, description)
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
        seq = (await self._pub.publish(event)).seq
        await self._cond.catch_up(tenant, TENANT_SCOPE)  # the next render sees it
        return seq

    async def set_skill(
        self, tenant: str, session: str, label: str, key: str, content: str, description: str | None
    ) -> int:
        async with self._pool.connection() as conn:
            await live_session(conn, tenant, session, must_exist=False)
            block = _find(await self.config(conn, tenant, session), label)
        if not isinstance(block, SkillsBlock):
            raise BlockNotFound(f'Block "{label}" is not a skill provider')
        return await self.put_skill(tenant, block.bucket, block.prefix + key, content, description)

    async def load_skill(
        self, tenant: str, session: str, label: str, key: str, tool_call_id: str | None = None
    ) -> str | None:
        """The document, recorded as loaded (by ``tool_call_id`` when given); None (never fetched)
        for a key outside the allowlist."""
        async with self._pool.connection() as conn:
            await live_session(conn, tenant, session, must_exist=False)
            block = _find(await self.config(conn, tenant, session), label)
        if not isinstance(block, SkillsBlock):
            raise BlockNotFound(f'Block "{label}" is not a skill provider')
        if (block.keys and key not in block.keys) or unsafe_object_key(block.prefix + key) is not None:
            return None
        text = await self._storage().get_text(block.bucket, object_key(tenant, block.prefix + key))
        if text is None:
            return None
        await self._pub.publish(
            SkillLoaded(tenant=tenant, session=session, label=label, key=key, tool_call_id=tool_call_id)
        )
        return text

    async def unload_skill(self, tenant: str, session: str, label: str, key: str) -> bool:
        async def decide(conn: Conn) -> Decision:
            if (label, key) not in await context_queries.loaded_skills(conn, tenant, session):
                return Decision(None, lambda _seq: False)
            call = await context_queries.load_call(conn, tenant, session, label, key)
            # the loading call when known (its output may not be stored yet: the reference's
            # unload race, its §7.6.3), else the newest stored load output
            output = (
                (None, call) if call else await context_queries.newest_load_output(conn, tenant, session, label, key)
            )
            event = SkillUnloaded(
                tenant=tenant,
                session=session,
                label=label,
                key=key,
                message_id=output[0] if output else None,
                tool_call_id=output[1] if output else None,
            )
            return Decision(event, lambda _seq: True)

        done: bool = await self._cond.run(tenant, session, decide)
        return done

    # -- search -----------------------------------------------------------------------------

    async def search(self, tenant: str, session: str, label: str, query: str) -> str | None:
        if not query.strip():
            return None
        async with self._pool.connection() as conn:
            config = await self.config(conn, tenant, session)
            if label == config.searchable_history:
                hits = await queries.search(conn, tenant, None, query, 10)
                return "\n---\n".join(f"[{h.role}] {h.content}" for h in hits) or None
            rows = await context_queries.search_entries(conn, tenant, session, label, query)
        return "\n\n".join(f"[{k}]\n{c}" for k, c in rows) or None

    async def session_search(self, tenant: str, query: str) -> str:
        async with self._pool.connection() as conn:
            hits = await queries.search(conn, tenant, None, query, 10) if query.strip() else []
        return "\n---\n".join(f"[{h.role}] {h.content}" for h in hits) if hits else "No results found."

    # -- system prompt ----------------------------------------------------------------------

    async def frozen_prompt(self, tenant: str, session: str) -> Prompt:
        """The frozen prompt; rendered and recorded on first use, the same string afterwards."""
        async with self._pool.connection() as conn:
            row = await context_queries.latest_prompt(conn, tenant, session)
        if row is not None:
            return Prompt(row.text, row.tokens, row.version, row.seq)
        return await self._render_prompt(tenant, session, "freeze")

    async def refresh_prompt(
        self, tenant: str, session: str, reason: Literal["refresh", "clear", "compaction"] = "refresh"
    ) -> Prompt:
        return await self._render_prompt(tenant, session, reason)

    async def _render_prompt(
        self, tenant: str, session: str, reason: Literal["freeze", "refresh", "clear", "compaction"]
    ) -> Prompt:
        texts: Sources | None = None

        async def decide(conn: Conn) -> Decision:
            await live_session(conn, tenant, session, must_exist=False)
            latest = await context_queries.latest_prompt(conn, tenant, session)
            if latest is None and not await context_queries.session_known(conn, tenant, session):
                # a read must not create state: no prompt is frozen for a session that does not exist
                raise SessionNotFound(f"session {session!r} does not exist")
            if reason == "freeze" and latest is not None:
                return Decision(None, lambda _seq: Prompt(latest.text, latest.tokens, latest.version, latest.seq))
            text = render(await self.blocks(conn, tenant, session, sources=texts))
            tokens = self.counter.count(text)
            version = (latest.version if latest else 0) + 1
            event = PromptRendered(
                tenant=tenant, session=session, text=text, tokens=tokens, version_no=version, reason=reason
            )
            return Decision(event, lambda seq: Prompt(text, tokens, version, seq))

        texts = await self.sources(tenant, session, catch_up=True)
        prompt: Prompt = await self._cond.run(tenant, session, decide)
        return prompt

    async def has_prompt(self, tenant: str, session: str) -> bool:
        async with self._pool.connection() as conn:
            return await context_queries.latest_prompt(conn, tenant, session) is not None

    # -- tools ------------------------------------------------------------------------------

    async def tools(self, tenant: str, session: str) -> list[Any]:
        async with self._pool.connection() as conn:
            config = await self.config(conn, tenant, session)
            loaded = [f"{label}:{key}" for label, key in await context_queries.loaded_skills(conn, tenant, session)]
        return tool_specs(config, loaded)

    async def execute(self, tenant: str, session: str, name: str, args: Any, tool_call_id: str | None = None) -> str:
        """Run a tool with the LLM's arguments (``tool_call_id``: the LLM's id for this call);
        never raises: failures are ``Error: …`` strings."""
        try:
            await self._cond.catch_up(tenant, session)
            names = {spec.name for spec in await self.tools(tenant, session)}
            if name not in names:
                return f'Error: tool "{name}" is not available in this session'
            if not isinstance(args, dict):
                return "Error: tool arguments must be a JSON object"
            if has_bad_chars(args):
                return "Error: tool arguments must not contain NUL characters or lone surrogates"
            return await self._dispatch(tenant, session, name, args, tool_call_id)
        except ChronicleError as exc:
            if exc.status < 500:  # the caller's mistake, in our words
                return f"Error: {exc.detail}"
            log.warning("tool %s failed: %s", name, exc.detail)
            return f"Error: {exc.title}"  # a backing service's detail is for the log, not the LLM
        except Refused as exc:  # the write would make an event the log refuses (e.g. too large)
            return f"Error: {exc.detail}"
        except Exception:
            log.exception("tool %s failed", name)
            return TOOL_FAILED

    async def _dispatch(
        self, tenant: str, session: str, name: str, args: dict[str, Any], tool_call_id: str | None = None
    ) -> str:
        async with self._pool.connection() as conn:
            config = await self.config(conn, tenant, session)
        infos = blocks_of(config)
        if name == "session_search":
            return await self.session_search(tenant, _str(args, "query"))
        label = _str(args, "label")
        if name == "set_context":
            return await self._set_context(tenant, session, config, label, args)
        if name in ("load_context", "unload_context"):
            skills = [b.label for b in infos if b.kind == "skills"]
            key = _str(args, "key")
            if label not in skills:
                return f'Error: "{label}" is not a skill block. Skill blocks: {", ".join(skills)}'
            if name == "load_context":
                content = await self.load_skill(tenant, session, label, key, tool_call_id)
                return content if content is not None else f"Not found: {key}"
            if not await self.unload_skill(tenant, session, label, key):
                return f'Skill "{key}" is not currently loaded in "{label}".'
            return f'Unloaded "{key}" from {label}. Context reclaimed.'
        # search_context
        searchable = [b.label for b in infos if b.kind in ("searchable", "history")]
        if label not in searchable:
            return f'Error: "{label}" is not searchable. Searchable blocks: {", ".join(searchable)}'
        return await self.search(tenant, session, label, _str(args, "query")) or "No results found."

    async def _set_context(
        self, tenant: str, session: str, config: SessionConfig, label: str, args: dict[str, Any]
    ) -> str:
        content = _str(args, "content")
        info = next((b for b in blocks_of(config) if b.label == label), None)
        if info is None:
            return f'Error: block "{label}" not found'
        if info.kind in ("skills", "searchable"):
            meta = args.get("metadata") if isinstance(args.get("metadata"), dict) else {}
            assert isinstance(meta, dict)
            title = meta.get("title") if isinstance(meta.get("title"), str) else None
            description = meta.get("description") if isinstance(meta.get("description"), str) else None
            key = context_entry_key(title, content)
            if info.kind == "skills":
                await self.set_skill(tenant, session, label, key, content, description or title)
            else:
                await self.index_entry(tenant, session, label, key, content)
            return f'Indexed "{key}" in {label}.'
        if info.kind == "history":
            return f'Error: Block "{label}" does not support writes'
        mode: Mode = "append" if args.get("action") == "append" else "replace"
        result = await self.write(tenant, session, label, content, mode, "tool")
        return usage(label, result.tokens, result.max_tokens)


def unsafe_keys(config: SessionConfig) -> str | None:
    """Why ``config`` names an object outside its tenant's space (the first block that does), or
    None. Object keys are relative to ``tenants/<tenant>/`` (see :func:`object_key`)."""
    for b in config.blocks:
        found: list[tuple[str, str, str | None]] = []
        if isinstance(b, ReadonlyBlock) and b.source is not None:
            found.append(("source.key", b.source.key, unsafe_object_key(b.source.key)))
        if isinstance(b, SkillsBlock):
            found.append(("prefix", b.prefix, unsafe_prefix(b.prefix)))
            found.extend(("keys", k, unsafe_object_key(b.prefix + k)) for k in b.keys or [])
        for field, value, why in found:
            if why is not None:
                return f"block {b.label!r}: {field} {value[:200]!r} is not a safe object key: {why}"
    return None


def _refuse_unsafe(config: SessionConfig) -> None:
    """A configuration stored before keys were checked is refused where it would be rendered."""
    problem = unsafe_keys(config)
    if problem is not None:
        raise UnsafeStoredConfig(problem)


def _allowed(block: SkillsBlock, listing: list[tuple[str, str | None]]) -> list[tuple[str, str | None]]:
    """(key relative to the block's prefix, description) of the listed skills the block allows."""
    entries: list[tuple[str, str | None]] = []
    for key, desc in listing:
        rel = key[len(block.prefix) :]
        if rel and (not block.keys or rel in block.keys):
            entries.append((rel, desc))
    return entries


def _str(args: dict[str, Any], name: str) -> str:
    value = args.get(name)
    if not isinstance(value, str):
        raise InvalidToolArguments(f"argument {name!r} must be a string")
    return value


class InvalidToolArguments(ChronicleError):
    code = "invalid_tool_arguments"
    status = 422
    title = "Invalid tool arguments"


def _find(config: SessionConfig, label: str) -> ReadonlyBlock | WritableBlock | SearchableBlock | SkillsBlock | None:
    return next((b for b in config.blocks if b.label == label), None)


@dataclass(frozen=True, slots=True)
class Reclaimed:
    """Unloaded skills' tool outputs: by message, and by tool call alone (message not known)."""

    by_message: dict[str, dict[str, str]]
    by_call: dict[str, str]

    def outputs(self, message_id: str, content: str) -> dict[str, str]:
        """{tool call id: skill key} to show as unloaded in this stored message."""
        found = dict(self.by_message.get(message_id, {}))
        for call, key in self.by_call.items():
            if f'"toolCallId":{json.dumps(call, ensure_ascii=False)}' in content:  # stored compact JSON
                found.setdefault(call, key)
        return found


def reclaimed_in(rows: dict[tuple[str, str], str]) -> Reclaimed:
    """:func:`projections.context_queries.reclaimed` rows, grouped for history reads."""
    by_message: dict[str, dict[str, str]] = {}
    by_call: dict[str, str] = {}
    for (mid, call), key in rows.items():
        if mid:
            by_message.setdefault(mid, {})[call] = key
        else:
            by_call[call] = key
    return Reclaimed(by_message, by_call)


def reclaim(content: str, outputs: dict[str, str]) -> str:
    """Stored message JSON with unloaded skills' tool outputs shown as ``[skill unloaded: key]``."""
    body = json.loads(content)
    for part in body.get("parts") or []:
        if isinstance(part, dict) and part.get("toolCallId") in outputs:
            part["output"] = f"[skill unloaded: {outputs[part['toolCallId']]}]"
    return json.dumps(body, ensure_ascii=False, separators=(",", ":"))
