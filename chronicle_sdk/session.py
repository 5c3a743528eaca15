"""``Session``: one conversation's history, context blocks, tools and frozen system prompt."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncGenerator, Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from chronicle_sdk.config import ConfigBuilder, parse_config
from chronicle_sdk.connection import Connection, Via, checked_mapping, quote, refuse_unnameable_ids, session_path
from chronicle_sdk.errors import (
    MAX_RETRY_AFTER_S,
    InvalidConfig,
    InvalidRequest,
    NotFound,
    RateLimited,
    SessionNotFound,
    Unavailable,
)
from chronicle_sdk.tools import (
    SESSION_SEARCH,
    ToolDefinition,
    Tools,
    arguments_error,
    arguments_fault,
    parse_arguments,
)
from chronicle_sdk.types import (
    OMITTED,
    AppendResult,
    Compaction,
    CompactionFailure,
    ContextBlock,
    HistoryRowStat,
    Message,
    ParentId,
    RecentHistory,
    SearchResult,
    SystemPrompt,
)
from events.admission import has_bad_chars
from events.tool_names import unavailable_tool

if TYPE_CHECKING:
    from chronicle_sdk.config import Provider


_EVENTS_PAGE = 10_000  # events per GET …/events (the server's bound)
_FOLLOW_RETRIES = 8  # lost connections in a row a followed session survives
_FOLLOW_PAUSE_S = 0.2  # the pause after the first; doubled after each next, at most 30 s
_ENDING = frozenset({"session.deleted", "session.erased"})


def _ends_session(record: dict[str, Any]) -> bool:
    """Whether a record of ``GET …/events`` is its session's deletion or erasure (nothing follows)."""
    shown = record.get("event") or record.get("erased") or {}
    return isinstance(shown, dict) and shown.get("type") in _ENDING


_MAX_QUERY_INT = 2**63 - 1  # the largest integer a query parameter may carry


def never_written(exc: NotFound) -> bool:
    """Whether ``exc`` is the ``404 session_not_found`` of a session that was never written,
    which a :class:`Session` reads as empty (the reference's sessions exist implicitly); a
    deleted session's (:attr:`SessionNotFound.deleted`) is raised by reads as by writes."""
    return exc.code == "session_not_found" and not (isinstance(exc, SessionNotFound) and exc.deleted)


class Session(ConfigBuilder):
    """A session, built like the reference's ``Session.create(agent).forSession(id)``.

    Builder methods (:meth:`with_context`, :meth:`with_cached_prompt`, :meth:`compact_after`,
    :meth:`on_compaction`, :meth:`with_searchable_history`) return the session; the first data
    call sends the resulting config once (``PUT …/config``, skipped when the server already has
    exactly this config). Builder calls after that are sent with the next data call, where the
    reference silently ignored them. A session with no builder calls never sends a config, so it
    keeps whatever another process configured.

    The config lives on the server, one per session, and the last writer wins: every instance
    with builder calls (another replica, this process after a restart) PUTs its whole builder
    config on its first call when the stored one differs. A block that one instance added at
    runtime (:meth:`add_context`, or removed with :meth:`remove_context`) is therefore undone by
    the next instance that starts with a different builder. Configure every replica identically
    (the same builder calls, runtime additions included), or let one process own the config and
    build the others with no builder calls.

    Every data method is async and waits, on the server, until this client's own earlier
    writes are visible (``min_seq``): ``append_message`` then ``get_history`` always shows the
    message.

    A session never written reads as empty (no messages, no config, the empty prompt), as the
    reference's implicit sessions do. A deleted session's reads raise :class:`SessionNotFound`
    (its ``deleted`` is True), an erased one's :class:`SessionErased`, as their writes do: neither
    reads as a new, empty one (:meth:`get_events` still gives an erased session's tombstones).
    """

    def __init__(self, client: Connection, session_id: str) -> None:
        super().__init__()
        self.client = client
        self.id = session_id
        self._ready_lock = asyncio.Lock()
        self._prompt_version = 0
        self.last_compact_reason: str | None = None
        """Why the last :meth:`compact` compacted nothing (None after a compaction)."""

    @classmethod
    def create(cls, client: Connection, session_id: str) -> Session:
        """A session builder for ``session_id`` (``Session.create(agent).forSession(id)``).

        Nothing is sent yet; a session that was never created is created by its first write,
        as ``forSession`` does in the reference.
        """
        return cls(client, session_id)

    def __repr__(self) -> str:
        return f"Session({self.id!r})"

    # -- plumbing ---------------------------------------------------------------------------

    def _path(self, tail: str = "") -> str:
        return session_path(self.id, tail)

    async def _ensure_ready(self) -> None:
        if not self._dirty:
            return
        async with self._ready_lock:
            if not self._dirty:
                return
            wanted = self.session_config()
            current = await self._read_config()
            try:
                same = parse_config(current.get("config") if isinstance(current, dict) else None) == wanted
            except InvalidConfig:
                same = False
            if not same:
                out = await self.client.request("PUT", self._path("/config"), body=self.config_json(), session=self.id)
                self.client.note_seq(self.id, out.get("seq"))
            self._dirty = False

    async def _get(self, tail: str, params: Mapping[str, Any] | None = None) -> Any:
        """A read of this session; one that was never written to reads as empty (``{}``), as the
        reference's sessions exist implicitly (the server answers ``404 session_not_found``); a
        deleted one raises :class:`SessionNotFound`, an erased one :class:`SessionErased` (``410``),
        as their writes do."""
        await self._ensure_ready()
        try:
            return await self.client.request("GET", self._path(tail), params=params, session=self.id)
        except NotFound as exc:
            if not never_written(exc):
                raise
            return {}

    async def _write(
        self,
        method: str,
        tail: str,
        body: Any = OMITTED,
        *,
        idempotent: bool | None = None,
        params: Mapping[str, str] | None = None,
        on_retry: Callable[[], None] | None = None,
    ) -> Any:
        await self._ensure_ready()
        out = await self.client.request(
            method,
            self._path(tail),
            params=params,
            body=body,
            session=self.id,
            idempotent=idempotent,
            on_retry=on_retry,
        )
        if isinstance(out, dict):
            self.client.note_seq(self.id, out.get("seq"))
        return out

    # -- writes -----------------------------------------------------------------------------

    async def append_message(
        self, message: Mapping[str, Any], parent_id: ParentId = OMITTED, *, via: Via | None = None
    ) -> AppendResult:
        """Append a message to the tree (``appendMessage(message, parentId?)``).

        ``parent_id`` omitted: attach to the latest leaf; ``None``: start a new root; an id:
        that message, which must be in this session (else :class:`UnknownParent`; the reference
        silently made a root). Appending the same id with the same body again is a no-op that
        answers like the first time (``created=False``); with a different body it raises
        :class:`MessageConflict` (the reference silently kept the first).

        ``via="nats"`` (or ``"jetstream"``) sends it as a NATS command to the server's command
        service, as the API key's tenant (the client needs ``nats_url``); ``"http"`` goes through
        the API; the default is the client's ``append_via``. The server decides either way (the
        parent, the repeat, the conflict), so all give the same result.

        A new message's id may not hold a ``/``, nor be ``.`` or ``..``: no URL could name it
        afterwards (``/messages/{id}``), so it raises :class:`InvalidId` before any request (the
        server refuses it too). Messages stored earlier with such an id stay readable, and their
        id is still a ``parent_id``.
        """
        refuse_unnameable_ids([message])
        await self._ensure_ready()
        return await self.client.append(self.id, message, parent_id, via=via)

    async def append_all(
        self, messages: Sequence[Mapping[str, Any]], parent_id: str | None = None, *, via: Via | None = None
    ) -> list[AppendResult]:
        """Append a chain: each message's parent is the previous one; the first's is ``parent_id``.

        As the reference's ``appendAll``, without ``parent_id`` the chain starts a new root
        (it does not attach to the latest leaf). Over HTTP the chain goes in ``messages:batch``
        requests, via NATS in ``append_batch`` commands; via JetStream it is pipelined with
        ``Publisher.publish_many`` (a chain holding a body over the payload limit is sent whole
        over HTTP). Ids must be distinct, and follow :meth:`append_message`'s rules: one holding a
        ``/`` (or ``.``, ``..``) raises :class:`InvalidId` before any message is sent. The
        JetStream path checks that ``parent_id`` exists but not that the chain would not make a
        message its own ancestor (the server's ``409 parent_cycle``): re-using a deleted message's
        id there may store a cycle, which reads tolerate (the path ends where it repeats).

        Under concurrent writers, over HTTP or NATS each next message follows an append that
        another writer made onto the chain's line meanwhile (the server's ``messages:batch``
        rule: one chain); after a message that was already stored (a replay), the next is its
        child whatever is under it, as the reference appends it. A compaction summary sent back
        as history showed it (``append_all(history + [new])``) is such a replay, never stored as a
        message: the next message goes after the last message it covers (another body under its
        id raises :class:`MessageConflict`; an id in its form that no overlay of the session has,
        :class:`InvalidId`). Via JetStream a chain holding one is sent over HTTP instead, as only
        the server knows the session's overlays. Via JetStream only the first
        message is conditional; the others keep the parent they were given, so an append without
        a parent that lands between two of them (attached to the earlier one) is left on a side
        branch, off the latest leaf's path.

        Not atomic: an error part-way (a conflict at the fifth message, say) carries the
        messages stored before it, ``written``, and ``failed_index`` (see
        :class:`ChronicleError`); this client's reads wait for them. Via JetStream ``written``
        is the acknowledged prefix of the chain, and the messages after it were published with
        the one that failed, so they may be stored too (the error's message says so). A chain over 1,000
        messages is several requests, and under a low rate limit the next request after a
        stored one may be refused at once (:class:`RateLimited`, a ``retry_after`` over a
        minute: a batch of N messages takes N tokens); its message says how many of the chain
        are stored and how to go on: after ``retry_after``, ``append_all(messages[failed_index:],
        parent_id=written[-1].id)`` (the whole chain again replays the stored ones but is
        charged for them again).

        ``created`` is True for the messages this call stored, also those a retry of it found
        stored by its own earlier attempt (one ``Idempotency-Key`` per call), and False for ones
        stored before it. Via JetStream, where a call is not retried, it is True for the messages
        new to the session and False for those it held before the chain was published (the
        client asks once which of the ids it holds, ``POST …/messages:exists``, when the session
        has events) or that the stream answered as duplicates (the same chain again inside its
        duplicate window).
        """
        refuse_unnameable_ids(messages)
        await self._ensure_ready()
        return await self.client.append_chain(self.id, messages, parent_id, via=via)

    async def update_message(self, message: Mapping[str, Any]) -> int:
        """Replace a stored message by its ``id`` (``updateMessage``); returns the event ``seq``.

        Raises :class:`MessageNotFound` for an unknown id (the reference: a silent no-op).
        """
        mid = checked_mapping(message).get("id")
        if not isinstance(mid, str):
            raise InvalidRequest(f"message.id: an update names its message by a string id, not {mid!r}", status=422)
        body = {"message": dict(message)}
        out = await self._write("PUT", f"/messages/{quote(mid)}", body)
        return int(out["seq"])

    async def delete_messages(self, message_ids: Sequence[str]) -> list[str]:
        """Delete messages (``deleteMessages``); returns the ids that existed, which the call
        deleted, in the order given. Children keep their parent id. One request.

        Retried after a failure that may have reached the server (deleting again changes
        nothing). A retry whose first attempt had deleted some of the ids (its answer lost) finds
        them gone, so, only when the request was retried, the answer is completed from the
        session's log: the ``messages.deleted`` events naming only listed ids, stored after the
        session's last ``seq`` this client knew when the call began (0 when it had written
        nothing to it: the session's whole log is read) and up to the retry's answer. An id
        another writer deleted in that window counts as deleted by the call too (the log does not
        say whose a deletion was). A call answered at its first attempt names only what it
        deleted, whatever other writers did meanwhile."""
        if not message_ids:
            return []
        await self._ensure_ready()
        wanted = list(dict.fromkeys(message_ids))
        since = self.client.last_seq(self.id)  # before the first attempt: its deletion comes after
        retried: list[bool] = []
        # the ids as a JSON list: an id may hold ',' (the query form splits on it)
        out = await self._write(
            "POST",
            "/messages:delete",
            {"ids": list(message_ids)},
            idempotent=True,
            on_retry=lambda: retried.append(True),
        )
        deleted = {str(i) for i in out.get("deleted", [])}
        seq = int(out.get("seq") or 0)
        if retried and seq > since and any(i not in deleted for i in wanted):
            deleted |= await self._deleted_in(since + 1, seq, set(wanted))  # by an attempt whose answer was lost
        return [i for i in wanted if i in deleted]

    async def _deleted_in(self, from_seq: int, to_seq: int, wanted: set[str]) -> set[str]:
        """The message ids the session's ``messages.deleted`` events from ``from_seq`` to
        ``to_seq`` name, of those that name only ids of ``wanted`` (a delete of them names no other)."""
        found: set[str] = set()
        for record in await self.get_events(from_seq, to_seq):
            event = record.get("event")
            if isinstance(event, dict) and event.get("type") == "messages.deleted":
                named = {str(i) for i in event.get("message_ids") or ()}
                if named <= wanted:
                    found |= named
        return found

    async def clear_messages(self) -> None:
        """Delete every message (``clearMessages``); a frozen prompt is re-rendered, blocks stay."""
        await self._write("POST", "/messages:clear")

    # -- history reads ----------------------------------------------------------------------

    async def get_history(self, leaf_id: str | None = None, *, compacted: bool = True) -> list[Message]:
        """Root-to-leaf path (``getHistory(leafId?)``), the latest leaf by default, overlays applied.

        An unknown ``leaf_id`` gives ``[]``. ``compacted=False`` returns the raw path.
        """
        params: dict[str, Any] = {} if compacted else {"compacted": "false"}
        if leaf_id is not None:
            params["leaf_id"] = leaf_id
        out = await self._get("/history", params)
        return list(out.get("messages", []))

    async def get_recent_history(self, max_content_bytes: int, min_recent_messages: int = 1) -> RecentHistory:
        """The recent end of the active path within a byte budget (``getRecentHistory``).

        From the latest leaf backwards, while fewer than ``max(1, min_recent_messages)`` are
        kept or the previous message's stored JSON still fits what is left of
        ``max_content_bytes`` (UTF-8 bytes); the leaf is always in. Overlays apply when they
        start inside the window. A budget below 0 counts as 0, as the reference's would.
        """
        params = {
            "max_bytes": min(max(0, int(max_content_bytes)), _MAX_QUERY_INT),
            "min_recent": min(max(1, int(min_recent_messages)), _MAX_QUERY_INT),
        }
        return RecentHistory.from_json(await self._get("/history", params))

    async def get_history_row_stats(self, leaf_id: str | None = None) -> list[HistoryRowStat]:
        """``{id, role, bytes}`` of each stored row of the path, root first (``getHistoryRowStats``).

        The active path (the latest leaf's) by default; overlays not applied. ``bytes`` is what
        :meth:`get_recent_history` counts; the server reads them without the messages' content.
        """
        out = await self._get("/history/stats", {"leaf_id": leaf_id} if leaf_id is not None else None)
        return [HistoryRowStat.from_json(r) for r in out.get("rows", [])]

    async def get_message(self, message_id: str, *, original: bool = False) -> Message | None:
        """The stored message, or None (``getMessage``).

        A message over the server's row cap is stored capped (long texts cut, structure kept);
        ``original=True`` returns its untruncated original (from object storage) instead. For a
        message that was not capped both are the same.
        """
        await self._ensure_ready()
        try:
            found = await self.client.request(
                "GET",
                self._path(f"/messages/{quote(message_id)}"),
                params={"original": "true"} if original else None,
                session=self.id,
            )
        except NotFound as exc:
            if exc.code in ("message_not_found", "not_found") or never_written(exc):
                return None
            raise
        return found if isinstance(found, dict) else None

    async def get_latest_leaf(self) -> Message | None:
        """The most recently appended childless message, or None (``getLatestLeaf``)."""
        out = await self._get("/leaf")
        message = out.get("message") if isinstance(out, dict) else None
        return message if isinstance(message, dict) else None

    async def get_branches(self, message_id: str) -> list[Message]:
        """Direct children of a message, oldest first (``getBranches``)."""
        return await self._every_page(f"/messages/{quote(message_id)}/children", "messages")

    async def _every_page(self, path: str, key: str) -> list[Any]:
        """The ``key`` items of every page of a per-session list, in order: the server answers
        a page at a time, and each page's ``next_cursor`` is the next one's ``cursor``."""
        found: list[Any] = []
        params: dict[str, Any] = {}
        while True:
            out = await self._get(path, params)
            found.extend(out.get(key, []))
            if out.get("next_cursor") is None:
                return found
            params = {"cursor": out["next_cursor"]}

    async def get_path_length(self, leaf_id: str | None = None) -> int:
        """Number of stored messages on the path to ``leaf_id`` (default: latest leaf), overlays not applied."""
        out = await self._get("/path-length", {"leaf_id": leaf_id} if leaf_id is not None else None)
        return int(out.get("length", 0))

    async def search(self, query: str, limit: int = 20) -> list[SearchResult]:
        """Full-text search in this session (``search(query, {limit})``): all words, stemmed, ranked.

        ``limit``: 1 to 200 (a larger one is :class:`InvalidRequest`); an empty query finds nothing."""
        if not query.strip():
            return []
        out = await self._get("/search", {"q": query, "limit": limit})
        return [SearchResult.from_json(r) for r in out.get("results", [])]

    async def get_events(self, from_seq: int = 1, to_seq: int | None = None) -> list[dict[str, Any]]:
        """The session's raw events ``{seq, stored_at, event}``, in order: the stored events, sealed
        fields opened with the session's key, an erased session's as tombstones (audit).
        ``stored_at`` is when the stream stored the event (the server's clock); the event's own
        ``occurred_at`` is what its publisher wrote.

        Raw means compact where the event's version is: a ``message.appended`` (v3) or
        ``message.updated`` (v2) with an inline ``message`` leaves out ``message_id``, ``role`` and
        ``body_sha256`` when they are its body's (``id``, ``role``, hash), and unset optional fields;
        ``events.registry.decode(record["event"])`` gives the event with every field."""
        params: dict[str, Any] = {"from_seq": from_seq, "limit": _EVENTS_PAGE}
        if to_seq is not None:
            params["to_seq"] = to_seq
        await self._ensure_ready()
        found: list[dict[str, Any]] = []
        while True:  # a page holds at most ``limit`` events; a full one may have more after it
            text = await self.client.request("GET", self._path("/events"), params=params)
            page = [json.loads(line) for line in str(text or "").split("\n") if line.strip()]
            found.extend(page)
            if len(page) < _EVENTS_PAGE:
                return found
            params["from_seq"] = int(page[-1]["seq"]) + 1

    async def follow_events(self, from_seq: int = 1, to_seq: int | None = None) -> AsyncGenerator[dict[str, Any], None]:
        """The session's events as :meth:`get_events` gives them, then each new one as the log
        stores it (``GET …/events?follow=true``): what the reference broadcasts to a session's
        clients, for a UI that shows another writer's messages or a compaction as it lands.

        Runs until the caller stops iterating, the stream passed ``to_seq`` (when given), or the
        session was deleted or erased (those events are given, then it ends). A lost connection,
        a server that stops or a request limit (``rate_limited``) is waited out and the answer
        resumed from the event after the last one given (up to 8 times in a row, waiting longer
        after each), so none is missed or given twice. A limit whose ``retry_after`` is over
        ``MAX_RETRY_AFTER_S`` (60 s: the tenant deep in debt after a large batch or fork) raises
        :class:`RateLimited` at once, as any call does; follow again from the event after the
        last one given once it has passed. Stop early with
        ``contextlib.aclosing(session.follow_events())``, which closes the connection at once. An
        event is in the log before the read models apply it: a read after it waits for it by
        itself (read-your-writes)."""
        await self._ensure_ready()
        next_seq, failures = max(1, from_seq), 0
        while to_seq is None or next_seq <= to_seq:
            params: dict[str, Any] = {"from_seq": next_seq, "follow": "true"}
            if to_seq is not None:
                params["to_seq"] = to_seq
            given, ended = 0, False
            try:
                async with contextlib.aclosing(self.client.stream_lines(self._path("/events"), params)) as lines:
                    async for line in lines:
                        if not line.strip():
                            continue  # a keep-alive
                        record: dict[str, Any] = json.loads(line)
                        failures, given, next_seq = 0, given + 1, int(record["seq"]) + 1
                        self.client.note_seq(self.id, record["seq"])
                        ended = _ends_session(record)
                        yield record
            except (Unavailable, RateLimited) as exc:
                if isinstance(exc, RateLimited) and exc.code != "rate_limited":
                    raise  # too_many_streams: waiting frees nothing
                if isinstance(exc, RateLimited) and (exc.retry_after or 0.0) > MAX_RETRY_AFTER_S:
                    raise  # minutes of silence would read as a hang: the caller decides, as for any call
                failures += 1
                if failures > _FOLLOW_RETRIES:
                    raise
                wait = min(30.0, _FOLLOW_PAUSE_S * 2 ** (failures - 1))
                await asyncio.sleep(max(wait, getattr(exc, "retry_after", None) or 0.0))
                continue
            if ended or to_seq is not None:
                return  # the server ended the answer at the deletion or erasure, or past to_seq
            if not given:  # it ended with nothing to give (a server stopping): wait a little
                failures += 1
                await asyncio.sleep(min(30.0, _FOLLOW_PAUSE_S * 2 ** (failures - 1)))

    # -- compaction -------------------------------------------------------------------------

    async def compact(self, leaf_id: str | None = None) -> Compaction | None:
        """Compact the branch of ``leaf_id`` (default: latest leaf) now (``compact(leafId?)``).

        Returns the new overlay, or None when there was nothing to compact (the reason is kept
        in :attr:`last_compact_reason`; a session never written has no messages, as the
        reference's implicit sessions), or when the overlay was recorded but the server's read
        model had not applied it yet (reason ``recorded; not yet visible``: :meth:`get_compactions`
        lists it once applied; no need to compact again). Originals are never changed; history reads apply it.
        Raises :class:`MessageNotFound` for a ``leaf_id`` that is not a stored message,
        :class:`CompactionInProgress` (nothing summarised) while another compaction of the session
        runs: the compactor's, or another ``compact()``, and :class:`SummarizerFailed` when the
        server's summarizer fails (the LLM down or refusing): nothing is compacted, the failure is
        recorded (``compaction.failed``, listed by the audit's compaction failures) and ``detail``
        names it in at most 200 characters; call again later. A manual compaction is not retried by
        the server and holds nothing: the automatic compaction goes on as before.

        The call waits for the summarizer, which may take longer than the client's ``timeout_s``
        (30 s by default; the server gives the summarizer ``CHRONICLE_SUMMARIZER_TIMEOUT_S``, 60 s,
        per attempt): :class:`Unavailable` then means no answer came in time, not that nothing
        happened. The server goes on and may record the overlay; :meth:`get_compactions` tells,
        and a second ``compact()`` answers None ("nothing new") once it is recorded. Give the
        client a ``timeout_s`` above the summarizer's budget when you compact by hand.
        """
        try:
            out = await self._write("POST", "/compact", {"leaf_id": leaf_id} if leaf_id is not None else {})
        except NotFound as exc:
            if not never_written(exc):
                raise
            out = {"compacted": False, "reason": "no messages"}
        if not out.get("compacted"):
            self.last_compact_reason = out.get("reason")
            return None
        self.last_compact_reason = None
        return Compaction.from_json(out["overlay"])

    async def get_compactions(self) -> list[Compaction]:
        """Every overlay of the session, superseded ones included, oldest first (``getCompactions``);
        read a page at a time, every page."""
        return [Compaction.from_json(c) for c in await self._every_page("/compactions", "compactions")]

    async def get_compaction_failures(self) -> list[CompactionFailure]:
        """Every recorded summarizer failure of the session, oldest first: why a compaction that
        was due did not happen (the automatic one then waits for the session to grow); read a
        page at a time, every page."""
        return [CompactionFailure.from_json(f) for f in await self._every_page("/compaction-failures", "failures")]

    # -- context blocks ---------------------------------------------------------------------

    async def get_context_blocks(self) -> list[ContextBlock]:
        """Every configured block with its current content and tokens, in render order."""
        out = await self._get("/context")
        return [ContextBlock.from_json(b) for b in out.get("blocks", [])]

    async def get_context_block(self, label: str) -> ContextBlock | None:
        """One block by label, or None."""
        return next((b for b in await self.get_context_blocks() if b.label == label), None)

    async def replace_context_block(self, label: str, content: str) -> ContextBlock:
        """Replace a writable block's content (``replaceContextBlock``); the frozen prompt is unchanged.

        Raises :class:`ReadOnlyBlock` (read-only block), :class:`BlockNotFound` (unknown label),
        :class:`KeyedBlock` (skills/searchable), :class:`BudgetExceeded` (over ``max_tokens``) or
        :class:`PayloadTooLarge` (a longer text after which the system prompt would be too large
        to store; a shorter one is always taken).
        """
        return await self._write_block(label, content, "replace")

    async def append_context_block(self, label: str, content: str) -> ContextBlock:
        """Append to a writable block (``appendContextBlock``), joined with a newline as the reference does."""
        return await self._write_block(label, content, "append")

    async def _write_block(self, label: str, content: str, mode: str) -> ContextBlock:
        out = await self._write(
            "PUT", f"/context/{quote(label)}", {"content": content, "mode": mode}, idempotent=mode == "replace"
        )
        return ContextBlock(
            label=str(out["label"]),
            kind="writable",
            description=out.get("description"),
            content=str(out["content"]),
            tokens=int(out["tokens"]),
            max_tokens=out.get("max_tokens"),
            writable=True,
        )

    async def add_context(
        self,
        label: str,
        description: str | None = None,
        max_tokens: int | None = None,
        provider: Provider | None = None,
    ) -> None:
        """Add a block at runtime (``addContext``); raises :class:`InvalidConfig` if the label exists.

        Like the reference it does not refresh the frozen prompt.
        """
        await self._ensure_ready()
        config = await self._server_config()
        if any(b.get("label") == label for b in config["blocks"]) or config.get("searchable_history") == label:
            raise InvalidConfig(f'Block "{label}" already exists', status=422)
        self.with_context(label, description, max_tokens, provider)
        config["blocks"].append(self._blocks[-1])
        await self._put_config(config)

    async def remove_context(self, label: str) -> bool:
        """Remove a block at runtime (``removeContext``); False if there was none. History is untouched."""
        await self._ensure_ready()
        config = await self._server_config()
        blocks = [b for b in config["blocks"] if b.get("label") != label]
        removed = len(blocks) != len(config["blocks"])
        if config.get("searchable_history") == label:
            config.pop("searchable_history")
            removed = True
        if not removed:
            return False
        config["blocks"] = blocks
        self._blocks = [b for b in self._blocks if b["label"] != label]
        if self._searchable_history == label:
            self._searchable_history = None
        await self._put_config(config)
        return True

    async def _read_config(self) -> Any:
        """The server's config answer; a session that does not exist yet has none (``{}``): the
        reference's sessions exist implicitly, and the first write makes it (a deleted one raises
        :class:`SessionNotFound`)."""
        try:
            return await self.client.request("GET", self._path("/config"), session=self.id)
        except NotFound as exc:
            if not never_written(exc):
                raise
            return {}

    async def _server_config(self) -> dict[str, Any]:
        out = await self._read_config()
        config = dict(out.get("config") or {})
        config["blocks"] = list(config.get("blocks") or [])
        return config

    async def _put_config(self, config: dict[str, Any]) -> None:
        out = await self.client.request("PUT", self._path("/config"), body=config, session=self.id)
        self.client.note_seq(self.id, out.get("seq"))
        self._dirty = False

    # -- system prompt ----------------------------------------------------------------------

    async def get_system_prompt(self) -> SystemPrompt:
        """The frozen prompt with its version and tokens; frozen (version 1) on first call.

        A session that was never written nor configured has nothing to freeze: it answers the
        empty prompt, version 0, and freezes nothing (the first write or config then lets the
        next call freeze version 1). Raises :class:`PromptUnstorable` when nothing is frozen yet
        and the prompt the blocks render is too large to store (an object behind a read-only
        block grew)."""
        await self._ensure_ready()
        delay = 0.02
        while True:
            try:
                out = await self.client.request("GET", self._path("/system-prompt"), session=self.id)
            except NotFound as exc:
                if not never_written(exc):
                    raise
                # nothing configured or written yet: the empty prompt, and nothing is frozen
                return SystemPrompt("", 0, 0, 0)
            prompt = SystemPrompt(str(out["prompt"]), int(out["tokens"]), int(out["version"]), int(out["seq"]))
            # the endpoint takes no min_seq: wait (bounded) until it shows this client's last refresh
            if prompt.version >= self._prompt_version or delay > 5:
                break
            await asyncio.sleep(delay)
            delay *= 1.5
        self._prompt_version = max(self._prompt_version, prompt.version)
        self.client.note_seq(self.id, prompt.seq)
        return prompt

    async def freeze_system_prompt(self) -> str:
        """The frozen system prompt (``freezeSystemPrompt``): rendered and stored once, then the same text.

        Block writes do not change it until :meth:`refresh_system_prompt`, so the provider's
        prompt cache stays valid across turns. As in the reference, two other things re-render it:
        :meth:`clear_messages` and every recorded compaction (whether :meth:`compact` or the
        server's compactor, which runs in the background after an append crosses
        ``compact_after``). A re-render whose text is byte for byte the prompt in force records
        nothing and keeps its version, so :attr:`SystemPrompt.version` (from
        :meth:`get_system_prompt`) changes exactly when the text changes: compare it to know
        when the cached prefix changed.
        """
        return (await self.get_system_prompt()).prompt

    async def refresh_system_prompt(self) -> str:
        """Re-render from the current blocks and store it as the new frozen prompt (``refreshSystemPrompt``).

        A new version only when the text changed; the same text keeps the version in force
        and records nothing (the provider's cached prefix stays valid). Raises
        :class:`PromptUnstorable` when the prompt the blocks render is too large to store; the
        one in force stays.
        """
        out = await self._write("POST", "/system-prompt:refresh", idempotent=False)
        self._prompt_version = max(self._prompt_version, int(out["version"]))
        return str(out["prompt"])

    # -- tools ------------------------------------------------------------------------------

    async def tools(self) -> Tools:
        """The session's LLM tools (``tools()``): ``set_context``, ``load_context``, ``unload_context``,
        ``search_context`` as the blocks call for them; empty when only read-only blocks exist.

        ``session_search`` is not among them, as in the reference, even with
        :meth:`with_searchable_history` (whose block gives ``search_context``): it is
        :meth:`SessionManager.tools`'s (merge with ``+``). The HTTP API's ``GET …/tools`` lists it
        for clients without a manager.

        ``execute(name, arguments)`` runs a tool on the server and returns the reference's result
        string (``Written to memory. Usage: …``, ``Error: …``).
        """
        out = await self._get("/tools", {"format": "openai"})
        listed = [ToolDefinition.from_openai(t) for t in out.get("tools", [])]
        definitions = [d for d in listed if d.name != SESSION_SEARCH.name]
        remote = _RemoteTool(self)
        return Tools(definitions, {d.name: remote for d in definitions})

    async def _execute(self, name: str, arguments: dict[str, Any], tool_call_id: str | None = None) -> str:
        """The tool's result; what is the arguments' fault is an ``Error: …`` result (see
        :meth:`Tools.execute`), anything else raises."""
        problem = arguments_error(arguments)
        if problem is None and tool_call_id is not None and has_bad_chars(tool_call_id):
            problem = "Error: the tool call id must not contain NUL characters or lone surrogates"
        if problem is not None:
            return problem
        await self._ensure_ready()  # the builder's config goes first: its refusal is not the arguments'
        call = {"tool_call_id": tool_call_id} if tool_call_id is not None else None
        try:  # the id as a parameter, not in the path: over NATS the path names the tool
            out = await self._write("POST", f"/tools/{quote(name)}", arguments, idempotent=False, params=call)
        except InvalidRequest as exc:
            if not arguments_fault(exc):
                raise
            return f"Error: {exc.detail}"
        except NotFound as exc:  # a session never written has no tools, as it reads as empty
            if not never_written(exc):
                raise
            return unavailable_tool(name)
        return str(out["result"])

    async def execute_tool(self, name: str, arguments: Any = None, *, tool_call_id: str | None = None) -> str:
        """Run one tool without fetching the definitions first (see :meth:`Tools.execute`)."""
        args = parse_arguments(arguments)
        if isinstance(args, str):
            return args
        return await self._execute(name, args, tool_call_id)


class _RemoteTool:
    """Executes a Chronicle tool over the API, passing the LLM's tool call id along."""

    accepts_tool_call_id = True

    def __init__(self, session: Session) -> None:
        self._session = session

    async def __call__(self, name: str, arguments: dict[str, Any], tool_call_id: str | None = None) -> str:
        return await self._session._execute(name, arguments, tool_call_id)


__all__ = ["Session"]
