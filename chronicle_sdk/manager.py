"""``SessionManager``: the registry of many sessions, cross-session search and ``session_search``."""

from __future__ import annotations

import builtins
import uuid
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from chronicle_sdk.config import ConfigBuilder
from chronicle_sdk.connection import Connection, Via, checked_mapping, checked_session_id, session_path
from chronicle_sdk.errors import (
    ChronicleError,
    InvalidRequest,
    MessageConflict,
    MessageNotFound,
    SessionExists,
    SessionNotFound,
)
from chronicle_sdk.session import Session
from chronicle_sdk.tools import MAX_QUERY_CHARS, SESSION_SEARCH, Tools, arguments_error, arguments_fault
from chronicle_sdk.types import OMITTED, Compaction, ErasureInfo, Message, ParentId, SearchResult, SessionInfo

NO_RESULTS = "No results found."
SPLIT_CONTEXT_PREFIX = "[Context from previous session]"
"""The first line of the message :meth:`SessionManager.compact_and_split` starts a child with."""
SPLIT_END_REASON = "compaction"


def format_session_search(results: Sequence[SearchResult]) -> str:
    """The reference's ``session_search`` text: ``[role] content`` joined by ``\\n---\\n``, or ``No results found.``."""
    if not results:
        return NO_RESULTS
    return "\n---\n".join(f"[{r.role}] {r.content}" for r in results)


class SessionManager(ConfigBuilder):
    """Many sessions of one tenant (``SessionManager.create(agent)``).

    The builder methods (:meth:`with_context`, :meth:`with_cached_prompt`, :meth:`compact_after`,
    :meth:`on_compaction`, :meth:`with_searchable_history`) form a template applied to every
    session returned by :meth:`get_session`.
    """

    def __init__(self, client: Connection) -> None:
        super().__init__()
        self.client = client
        self._sessions: dict[str, Session] = {}

    # -- sessions ---------------------------------------------------------------------------

    def get_session(self, session_id: str) -> Session:
        """The :class:`Session` for ``session_id`` with the manager's template, cached per manager.

        Like the reference it does not check that the session is registered.
        """
        session = self._sessions.get(session_id)
        if session is None:
            session = Session(self.client, session_id)
            session._copy_template(self)
            self._sessions[session_id] = session
        return session

    async def create(
        self,
        name: str = "",
        *,
        id: str | None = None,
        parent_session_id: str | None = None,
        metadata: Mapping[str, Any] | None = None,
        model: str | None = None,
        source: str | None = None,
    ) -> SessionInfo:
        """Register a new session (``create(name, {parentSessionId, model, source})``); returns its entry.

        The id is a new UUID unless given (``None``); ``model`` and ``source`` are kept in
        ``metadata``. The client retries a create that failed in a way that may have reached the
        server (a timeout, a lost connection); a live session already at the id with exactly this
        name, metadata and parent is that first attempt's (or the same create made again) and is
        answered, as an append of the same message again is (the server answers such a repeat
        itself; against an earlier server, which answers ``409``, the client reads the session
        and compares). Raises :class:`SessionExists` for
        an id taken otherwise (another name, metadata or parent, or a deleted session), and
        :class:`InvalidId` before any request for an id the server would refuse (``id=""``
        included: it is not "no id").
        """
        sid = str(uuid.uuid4()) if id is None else checked_session_id(id)
        meta = dict(metadata or {})
        if model is not None:
            meta["model"] = model
        if source is not None:
            meta["source"] = source
        body: dict[str, Any] = {"id": sid, "name": name, "metadata": meta}
        if parent_session_id is not None:
            body["parent_session_id"] = parent_session_id
        try:
            out = await self.client.request("POST", "/v1/sessions", body=body, idempotent=True)
        except SessionExists:
            # a retried create whose first attempt was stored: answer with what was stored
            existing = await self.get(sid)
            if existing is None or (existing.name, existing.metadata, existing.parent_session_id) != (
                name,
                meta,
                parent_session_id,
            ):
                raise
            return existing
        self.client.note_seq(sid, out.get("seq"))
        info = await self.get(sid)
        if info is None:  # deleted in between
            raise ChronicleError(f"session {sid!r} vanished after creation", code="session_not_found", status=404)
        return info

    async def get(self, session_id: str) -> SessionInfo | None:
        """The registry entry, or None for an unknown or deleted session (``get(id)``); an erased
        one raises :class:`SessionErased`, as its writes do."""
        out = await self.client.get_optional(session_path(session_id), session=session_id)
        return SessionInfo.from_json(out) if isinstance(out, dict) else None

    async def rename(self, session_id: str, name: str) -> None:
        """Rename a session (``rename(id, name)``)."""
        out = await self.client.request("PATCH", session_path(session_id), body={"name": name})
        self.client.note_seq(session_id, out.get("seq"))

    async def delete(self, session_id: str) -> None:
        """Delete a session and its messages (``delete(id)``); its events stay in the log."""
        out = await self.client.request("DELETE", session_path(session_id))
        self.client.note_seq(session_id, out.get("seq"))
        self._sessions.pop(session_id, None)

    async def add_usage(
        self, session_id: str, input_tokens: int = 0, output_tokens: int = 0, cost: float = 0.0
    ) -> None:
        """Add token usage and cost to the session's counters (``addUsage(sid, in, out, cost)``);
        :meth:`get` shows the sums (``input_tokens``, ``output_tokens``, ``estimated_cost``).

        The client retries a call that failed in a way that may have reached the server (a timeout,
        a lost connection) with the same ``Idempotency-Key`` (one per call): a retry adds nothing
        again, however late it reaches the server (the server records the usage events it applied
        for the session's life). Raises :class:`SessionNotFound` for an
        unknown or deleted session, :class:`InvalidRequest` for a negative amount; all three 0
        writes nothing (as the reference's ``addUsage``)."""
        body = {"input_tokens": input_tokens, "output_tokens": output_tokens, "cost": float(cost)}
        out = await self.client.request(
            "POST",
            session_path(session_id, "/usage"),
            body=body,
            idempotent=True,  # the key makes a repeat safe
            headers={"Idempotency-Key": uuid.uuid4().hex},
        )
        self.client.note_seq(session_id, out.get("seq"))

    async def end(self, session_id: str, reason: str) -> None:
        """Record why a session ended (its ``end_reason``); it stays readable and writable. Retried
        like a read: recording the same reason again changes nothing."""
        out = await self.client.request(
            "POST", session_path(session_id, ":end"), body={"reason": reason}, idempotent=True
        )
        self.client.note_seq(session_id, out.get("seq"))

    async def compact_and_split(
        self, session_id: str, summary: str, new_name: str | None = None, *, id: str | None = None
    ) -> SessionInfo:
        """Continue a conversation in a new session (``compactAndSplit(sid, summary, newName?)``).

        As the reference: a child session (``parent_session_id`` = ``session_id``, named
        ``new_name`` or as the old one, with its ``model`` and ``source``) starts with an assistant
        message ``[Context from previous session]``, a blank line and ``summary``; the old session's
        ``end_reason`` becomes ``compaction``. Returns the child's entry.

        The child is complete before the old session is marked ended; the summary message's id
        derives from the child's, so a retry with the same ``id`` appends it once. Raises
        :class:`SessionNotFound` for an unknown or deleted ``session_id``, and
        :class:`SessionExists` when ``id`` names a session that is not a child of ``session_id``
        (or a deleted one), before anything is written; :class:`InvalidId` before any request for
        an ``id`` the server would refuse (``id=""`` included: it is not "no id").
        """
        child_id = str(uuid.uuid4()) if id is None else checked_session_id(id)
        old = await self.get(session_id)
        if old is None:
            raise SessionNotFound(f"session {session_id!r} not found", status=404)
        child = await self.get(child_id) if id is not None else None
        if child is not None and child.parent_session_id != session_id:
            raise SessionExists(f"session {child_id!r} already exists and is not a child of {session_id!r}", status=409)
        if child is None:
            child = await self.create(
                old.name if new_name is None else new_name,
                id=child_id,
                parent_session_id=session_id,
                model=old.model,
                source=old.source,
            )
        message = {
            "id": str(uuid.uuid5(uuid.NAMESPACE_URL, f"chronicle:split:{child_id}")),
            "role": "assistant",
            "parts": [{"type": "text", "text": f"{SPLIT_CONTEXT_PREFIX}\n\n{summary}"}],
        }
        await self.get_session(child_id).append_message(message, None)
        await self.end(session_id, SPLIT_END_REASON)
        info = await self.get(child_id)
        return info if info is not None else child

    async def erase(self, session_id: str, reason: str | None = None) -> int:
        """Erase a session for good (``POST /v1/sessions/{id}:erase``): its data key is destroyed,
        every row and stored object of it dropped, the log keeps tombstones; writes to it then
        fail (``session_erased``). Returns the sequence of its ``session.erased`` event. Raises
        :class:`SessionNotFound` for a session the log holds nothing of and that has no data key
        (nothing to erase: the id stays usable).

        ``reason`` (at most 500 characters, no NUL, else :class:`InvalidRequest` and nothing is
        erased) is recorded with the erasure, with this API key as who asked, for
        :meth:`list_erasures`; it is kept after the session is gone: no personal data in it.
        Erasing again keeps the first record."""
        body: Any = {"reason": reason} if reason is not None else OMITTED
        out = await self.client.request("POST", session_path(session_id, ":erase"), body=body)
        self._sessions.pop(session_id, None)
        return int(out["seq"])

    async def fork(
        self,
        session_id: str,
        at_message_id: str,
        new_name: str | None = None,
        *,
        id: str | None = None,
    ) -> SessionInfo:
        """A new session holding ``session_id``'s path up to ``at_message_id`` (``fork(sid, atId, name)``).

        ``parent_session_id`` is the source. Unlike the reference, messages keep their ids and
        the overlay in force is carried over (not materialised as a message), so the fork reads
        exactly like the source branch did. An ``at_message_id`` that is not in the session raises
        :class:`MessageNotFound` and makes no session (the reference's fork of an unknown id makes
        an empty one). The new session's id is a new UUID unless given (``None``); one the server
        would refuse (``id=""`` included) is :class:`InvalidId` before any request.

        The client retries a fork that failed in a way that may have reached the server (a
        timeout, a lost connection) with the same id, as it retries :meth:`create`: the server
        completes a fork of that id made part-way (the copies it lacks are published) and answers
        as the first attempt would have (a server of an earlier release answers the retry
        :class:`SessionExists` instead: upgrade the servers before the SDK). Raises
        :class:`SessionExists` when ``id`` names a session that is not this fork (another
        source, ``at_message_id`` or name, a session made otherwise, or a deleted one), with
        nothing written.
        """
        body: dict[str, Any] = {"at_message_id": at_message_id}
        if new_name is not None:
            body["name"] = new_name
        body["id"] = str(uuid.uuid4()) if id is None else checked_session_id(id)
        await self.get_session(session_id)._ensure_ready()
        out = await self.client.request(
            "POST",
            session_path(session_id, "/fork"),
            body=body,
            session=session_id,
            idempotent=True,  # the id makes a repeat safe: the server completes the same fork
        )
        new_id = str(out["id"])
        self.client.note_seq(new_id, out.get("seq"))
        info = await self.get(new_id)
        if info is None:  # deleted in between
            raise SessionNotFound(f"session {new_id!r} was deleted right after it was forked", status=404)
        return info

    # -- search and tools -------------------------------------------------------------------

    async def search(self, query: str, limit: int = 20) -> list[SearchResult]:
        """Full-text search across the tenant's sessions (``search(query, {limit})``); hits carry
        ``session_id``. ``limit``: 1 to 200 (a larger one is :class:`InvalidRequest`)."""
        if not query.strip():
            return []
        out = await self.client.request("GET", "/v1/search", params={"q": query, "limit": limit}, tenant_wide=True)
        return [SearchResult.from_json(r) for r in out.get("results", [])]

    def tools(self) -> Tools:
        """``{session_search}`` (``manager.tools()``), run here through :meth:`search` with limit 10.

        Not part of ``Session.tools()``; merge them with ``await session.tools() + manager.tools()``.
        A query over :data:`~chronicle_sdk.tools.MAX_QUERY_CHARS` characters answers
        ``No results found.``, as ``search_context`` does; arguments and failures are treated as
        :meth:`Tools.execute` says (transport failures raise).
        """

        async def session_search(_name: str, args: dict[str, Any]) -> str:
            query = args.get("query")
            if not isinstance(query, str):
                return "Error: argument 'query' must be a string"
            problem = arguments_error(args)
            if problem is not None:
                return problem
            if len(query) > MAX_QUERY_CHARS:  # finds nothing, as search_context answers (no request)
                return "No results found."
            try:
                return format_session_search(await self.search(query, limit=10))
            except InvalidRequest as exc:
                if not arguments_fault(exc):
                    raise
                return f"Error: {exc.detail}"

        return Tools([SESSION_SEARCH], {SESSION_SEARCH.name: session_search})

    # -- convenience (the reference's pass-throughs) ----------------------------------------

    async def append(
        self, session_id: str, message: Mapping[str, Any], parent_id: ParentId = OMITTED, *, via: Via | None = None
    ) -> str:
        """Append one message (``append(sid, msg, parentId?)``); returns its id."""
        return (await self.get_session(session_id).append_message(message, parent_id, via=via)).id

    async def upsert(self, session_id: str, message: Mapping[str, Any], parent_id: ParentId = OMITTED) -> str:
        """Update the message if its id exists, else append it (``upsert``); returns its id.

        Another writer may append or delete the id between the check and the write: an append
        that meets another body under the id (:class:`MessageConflict`) updates it instead, and an
        update of a message deleted meanwhile (:class:`MessageNotFound`) appends it."""
        session = self.get_session(session_id)
        mid = checked_mapping(message).get("id")
        if not isinstance(mid, str):
            raise InvalidRequest(f"message.id: an upsert names its message by a string id, not {mid!r}", status=422)
        if await session.get_message(mid) is not None:
            try:
                await session.update_message(message)
                return mid
            except MessageNotFound:
                pass  # deleted since: append it
        try:
            return (await session.append_message(message, parent_id)).id
        except MessageConflict:  # appended since, with another body: this one replaces it
            await session.update_message(message)
            return mid

    async def append_all(
        self,
        session_id: str,
        messages: Sequence[Mapping[str, Any]],
        parent_id: str | None = None,
        *,
        via: Via | None = None,
    ) -> str | None:
        """Append a chain (``appendAll``); returns the last id (None for no messages).

        Each message's parent is the previous one and the first's is ``parent_id``; so, as in
        the reference, without ``parent_id`` the batch starts a new root chain. Via JetStream
        the batch is pipelined with ``Publisher.publish_many``.
        """
        results = await self.get_session(session_id).append_all(messages, parent_id, via=via)
        return results[-1].id if results else None

    async def get_history(self, session_id: str, leaf_id: str | None = None) -> list[Message]:
        """``getHistory(sid, leafId?)``."""
        return await self.get_session(session_id).get_history(leaf_id)

    async def get_message_count(self, session_id: str) -> int:
        """The active path length (``getMessageCount``), not the number of stored messages."""
        return await self.get_session(session_id).get_path_length()

    async def clear_messages(self, session_id: str) -> None:
        """``clearMessages(sid)``."""
        await self.get_session(session_id).clear_messages()

    async def delete_messages(self, session_id: str, message_ids: Sequence[str]) -> list[str]:
        """``deleteMessages(sid, ids)``; returns the ids that existed, which the call deleted (see
        :meth:`Session.delete_messages`)."""
        return await self.get_session(session_id).delete_messages(message_ids)

    async def get_branches(self, session_id: str, message_id: str) -> list[Message]:
        """``getBranches(sid, messageId)``."""
        return await self.get_session(session_id).get_branches(message_id)

    async def get_compactions(self, session_id: str) -> list[Compaction]:
        """``getCompactions(sid)``."""
        return await self.get_session(session_id).get_compactions()

    async def compact(self, session_id: str, leaf_id: str | None = None) -> Compaction | None:
        """``compact`` on one session (see :meth:`Session.compact`)."""
        return await self.get_session(session_id).compact(leaf_id)

    async def list(
        self, limit: int | None = None, *, order: Literal["recent", "created"] = "recent"
    ) -> builtins.list[SessionInfo]:
        """Live sessions, most recently active first (``list()``: the reference's ``ORDER BY
        updated_at DESC``; any event of a session, an append, a rename, usage, makes it the most
        recent); ``order="created"`` lists them newest created first. Every page unless ``limit``
        is given. Sessions active while the pages are read may be missed, never listed twice."""
        rows = await self._pages("/v1/sessions", "sessions", limit, 200, {"order": order})
        return [SessionInfo.from_json(s) for s in rows]

    async def list_erasures(self, limit: int | None = None) -> builtins.list[ErasureInfo]:
        """The tenant's erased sessions, newest first (``GET /v1/erasures``): when, who asked, why,
        and the sequence of each ``session.erased`` event. Every page unless ``limit`` is given."""
        return [ErasureInfo.from_json(e) for e in await self._pages("/v1/erasures", "erasures", limit, 500, {})]

    async def _pages(
        self, path: str, key: str, limit: int | None, most: int, params: dict[str, Any]
    ) -> builtins.list[dict[str, Any]]:
        """The ``key`` entries of a tenant-wide list, page after page (at most ``most`` a page)
        by its ``next_cursor``, until the last page or ``limit`` entries."""
        found: builtins.list[dict[str, Any]] = []
        cursor: int | str | None = None
        while True:
            page = {**params, "limit": most if limit is None else min(most, limit - len(found))}
            if cursor is not None:
                page["cursor"] = cursor
            out = await self.client.request("GET", path, params=page, tenant_wide=True)
            found += out.get(key, [])
            cursor = out.get("next_cursor")
            if cursor is None or (limit is not None and len(found) >= limit):
                return found


__all__ = ["NO_RESULTS", "SessionManager", "format_session_search"]
