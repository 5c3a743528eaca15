"""The LLM tools over context memory (set_context, search_context, load_context,
unload_context, session_search): the reference's tool results, never an exception.

Reference: the Cloudflare Agents SDK Session API, §2 of docs/reference.md."""

from __future__ import annotations

import json
import logging
from typing import Any

from events.admission import Refused, has_bad_chars
from events.context import SessionConfig
from events.sealing import KeyDestroyed
from events.tool_names import unavailable_tool
from projections import context_queries
from projections.search_bound import SearchTimedOut
from projections.skill_scan import ARGS_BAD_CHARS, ARGS_NOT_AN_OBJECT, TOOL_FAILED
from services.context.blocks import Mode
from services.context.entry_keys import context_entry_key
from services.context.prompt import ContextPrompt
from services.context.prompt_text import usage
from services.context.skills import ContextSkills
from services.context.tool_specs import SET_CONTEXT_ACTIONS, blocks_of, tool_specs
from services.errors import (
    ChronicleError,
    ErasedSession,
    SearchTimeout,
    SessionNotFound,
)
from services.writes.liveness import live_session

log = logging.getLogger("chronicle.context")


class ContextTools(ContextSkills, ContextPrompt):
    """The LLM tools, over the blocks, skills and prompt of the classes below."""

    async def tools(self, tenant: str, session: str) -> list[Any]:
        async with self._pool.connection() as conn:
            config = await self.config(conn, tenant, session)
            loaded = [f"{label}:{key}" for label, key in await self.loaded_skills(conn, tenant, session, config)]
        return tool_specs(config, loaded)

    async def execute(self, tenant: str, session: str, name: str, args: Any, tool_call_id: str | None = None) -> str:
        """Run a tool with the LLM's arguments (``tool_call_id``: the LLM's id for this call);
        failures are ``Error: …`` strings, except a session never written (nor configured), deleted
        or erased (also one erased while the tool ran: its key destroyed), which raises: the
        request's 404 or 410."""
        try:
            await self._cond.catch_up(tenant, session)
            async with self._pool.connection() as conn:
                # an erased, deleted or never written session is the request's 410 or 404, not an
                # error result (as ``GET …/tools`` answers it: a session lives once configured or written)
                await live_session(conn, tenant, session, must_exist=False)
                if not await context_queries.session_known(conn, tenant, session):
                    raise SessionNotFound(f"session {session!r} does not exist")
                config = await self.config(conn, tenant, session)
            names = {spec.name for spec in tool_specs(config, [])}  # the loaded skills change no name
            if name not in names:
                return unavailable_tool(name)
            if not isinstance(args, dict):
                return ARGS_NOT_AN_OBJECT
            if has_bad_chars(args):
                return ARGS_BAD_CHARS
            return await self._dispatch(tenant, session, name, args, tool_call_id)
        except (SessionNotFound, ErasedSession, KeyDestroyed):
            raise  # the request's 404 or 410 (a destroyed key: erased while the tool ran), not a result
        except ChronicleError as exc:
            if exc.status < 500:  # the caller's mistake, in our words
                return f"Error: {exc.detail}"
            log.warning("tool %s failed: %s", name, exc.detail)
            return f"Error: {exc.title}"  # a backing service's detail is for the log, not the LLM
        except SearchTimedOut as exc:  # said so that an LLM knows what to do about it
            log.warning("tool %s: %s", name, exc)
            return f"Error: {SearchTimeout(exc.timeout_s).detail}"
        except Refused as exc:  # the write would make an event the log refuses (e.g. too large)
            if exc.reason == "too_large":  # said so that an LLM knows what to do about it
                return f"Error: content too large to store ({exc.detail}); write a shorter text"
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
        mode = _action(args)
        if info.kind in ("skills", "searchable"):
            title, description = _metadata(args)
            key = context_entry_key(title, content)
            if info.kind == "skills":
                # the reference's ``description ?? title``: an empty description is no description
                described = title if description is None else description or None
                await self.set_skill(tenant, session, label, key, content, described)
            else:
                await self.index_entry(tenant, session, label, key, content)
            return f'Indexed "{key}" in {label}.'
        if info.kind == "history":
            return f'Error: Block "{label}" does not support writes'
        result = await self.write(tenant, session, label, content, mode, "tool")
        return usage(label, result.tokens, result.max_tokens)


def _action(args: dict[str, Any]) -> Mode:
    """``set_context``'s ``action``: absent (or null) is ``replace``; a value its schema does not
    name is refused, nothing written (the reference replaces the block for any value but
    ``append``: a small model's ``"add"`` or ``"delete"`` wiped the block)."""
    action = args.get("action")
    if action is None:
        return "replace"
    if action not in SET_CONTEXT_ACTIONS:
        shown = json.dumps(action, ensure_ascii=False)
        shown = shown if len(shown) <= 40 else shown[:40] + "\u2026"
        valid = " or ".join(f'"{a}"' for a in SET_CONTEXT_ACTIONS)
        raise InvalidToolArguments(f"argument 'action' must be {valid} (got {shown}); nothing was written")
    return "append" if action == "append" else "replace"


def _metadata(args: dict[str, Any]) -> tuple[str | None, str | None]:
    """``set_context``'s optional ``metadata: {title?, description?}``, strings (the reference's
    schema refuses anything else: a title that is not a string must not silently become a
    content-hash key)."""
    meta = args.get("metadata")
    if meta is None:
        return None, None
    if not isinstance(meta, dict):
        raise InvalidToolArguments("argument 'metadata' must be an object: {title, description}")
    fields = []
    for name in ("title", "description"):
        value = meta.get(name)
        if value is not None and not isinstance(value, str):
            raise InvalidToolArguments(f"argument 'metadata.{name}' must be a string")
        fields.append(value)
    return fields[0], fields[1]


def _str(args: dict[str, Any], name: str) -> str:
    value = args.get(name)
    if not isinstance(value, str):
        raise InvalidToolArguments(f"argument {name!r} must be a string")
    return value


class InvalidToolArguments(ChronicleError):
    code = "invalid_tool_arguments"
    status = 422
    title = "Invalid tool arguments"
