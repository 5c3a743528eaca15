"""Command handlers: validate, decide from the read model, publish one event.

State-dependent commands all take one shape (:meth:`Commands._optimistic`):
0. wait for the session's turn among this process's writes to it (services/writes/turns.py);
1. read the session subject's last sequence from JetStream;
2. wait until the projection has applied it;
3. decide from the projection (a pure function in :mod:`services.writes.decisions`);
4. publish with that sequence as ``Nats-Expected-Last-Subject-Sequence``;
5. on a conflict (another writer got there first) repeat, a bounded number of times.

Reference: the Cloudflare Agents SDK Session API, §1.2 (writes) and §4.5 of docs/reference.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import uuid
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any, NoReturn, TypeVar

import psycopg
from psycopg_pool import AsyncConnectionPool

from events import log as eventlog
from events.admission import Refused, admit
from events.blobs import BlobNotFound, BlobRef, BlobStore
from events.bodies import pack_body
from events.catalog import (
    MAX_ERASURE_REASON,
    CompactionRecorded,
    MessageAppended,
    MessagesCleared,
    MessagesDeleted,
    MessageUpdated,
    SessionCreated,
    SessionDeleted,
    SessionEnded,
    SessionRenamed,
    SessionUsageAdded,
    overlay_id_in,
    overlay_shaped,
)
from events.envelope import Event
from events.ids import derived_id
from events.messages import JsonObject, body_hash, stored_json
from events.objects import NotTheOwner, is_sealed_object, open_object
from events.omitted import OMITTED
from events.publisher import ForeignDuplicate, Published, Publisher
from events.registry import decode
from events.sealing import KeyDestroyed, SealBroken, kid_in
from projections import context_queries, queries
from projections.overlays import Overlay, apply_overlays, overlay_at
from projections.overlays import overlays as overlays_of
from projections.reclaimed import reclaim, reclaimed_in
from services.compaction.micro import ROW_MAX_BYTES, enforce_row_size_limit, json_bytes
from services.errors import (
    ContentionExhausted,
    ErasedSession,
    IdempotencyKeyConflict,
    IdempotencyKeyReused,
    MessageNotFound,
    PayloadTooLarge,
    SessionExists,
    SessionNotFound,
    Unavailable,
)
from services.offload import off_loop
from services.writes.decisions import Append, AppendState, Existing, ParentSpec, Replay, Summary, decide_append
from services.writes.erasure import Eraser
from services.writes.liveness import live_session
from services.writes.optimistic import MAX_SESSION_IDS, Decision, OptimisticWriter, UnappliedChain
from services.writes.unrecorded import OwnObjects, decided
from services.writes.waiting import AppliedWaiter

Conn = psycopg.AsyncConnection[Any]
T = TypeVar("T")

CREATE_READS = 3
"""How many times a create decides again after reading a session's first event from the log
(:class:`_FirstUnread`): more only when the session is deleted and made again meanwhile."""


class _FirstUnread(Exception):
    """A create met a live session whose first event (at ``seq``) it has not read: the log and the
    key store (a second connection) are asked with the decision's connection given back, and
    the create decides again."""

    def __init__(self, seq: int) -> None:
        super().__init__(f"the session's first event (sequence {seq}) was not read before the decision")
        self.seq = seq


log = logging.getLogger("chronicle.writes")


@dataclass(frozen=True, slots=True)
class AppendResult:
    id: str
    parent_id: str | None
    seq: int
    created: bool
    # the id a chain's next message goes under: ``id``, but for a compaction summary sent back as
    # history showed it (a replay), the last message it covers (services/writes/decisions.py)
    tail: str = ""

    def __post_init__(self) -> None:
        if not self.tail:
            object.__setattr__(self, "tail", self.id)


@dataclass(frozen=True, slots=True)
class _Appended:
    result: AppendResult
    stored: bool  # this call's event was stored (not a replay, nor a keyed request's earlier event)


@dataclass(frozen=True, slots=True)
class WriteReceipt:
    seq: int
    ids: tuple[str, ...] = ()
    # False: the log already held the event's id at ``seq`` (a client's retry, or this call's own
    # publish repeated after a lost ack): nothing new was stored by this attempt
    written: bool = True


class Commands:
    def __init__(
        self,
        publisher: Publisher,
        pool: AsyncConnectionPool[Conn],
        waiter: AppliedWaiter,
        blobs: BlobStore | None,
        *,
        payload_limit_bytes: int,
        max_message_bytes: int,
        attempts: int = 100,
        turn_timeout_s: float = 5.0,
        originals: BlobStore | None = None,
        row_cap_bytes: int = ROW_MAX_BYTES,
    ) -> None:
        self._pub = publisher
        self._pool = pool
        self._blobs = blobs
        self._limit = payload_limit_bytes
        self._max = max_message_bytes
        self._originals = originals
        self._row_cap = row_cap_bytes
        self.optimistic = OptimisticWriter(publisher, pool, waiter, attempts, turn_timeout_s)
        self._optimistic = self.optimistic.run

    # -- sessions -------------------------------------------------------------------------

    async def create_session(
        self,
        tenant: str,
        session: str | None,
        name: str,
        parent_session_id: str | None,
        metadata: JsonObject,
        *,
        replay: bool = True,
    ) -> WriteReceipt:
        """Create the session; ``SessionExists`` when the id is taken. A live session that a
        ``session.created`` with exactly this name, metadata and parent made is this create made
        before (a retry whose first attempt's answer was lost): with ``replay``, it is answered as
        that first attempt was (that event's sequence, ``written`` False) and nothing is
        published. Decided from the read model once it has applied the session's log, as every
        write is; a session an append made (its first event no ``session.created``), a deleted
        one, or one created otherwise (renamed since counts as created so: its event is what is
        compared) is ``SessionExists``."""
        sid = session or str(uuid.uuid4())
        if parent_session_id is not None:
            await self.optimistic.catch_up(tenant, parent_session_id)
        firsts: dict[int, SessionCreated | None] = {}  # read from the log with no connection held

        async def decide(conn: Conn) -> Decision:
            row = await queries.get_session(conn, tenant, sid)
            if row is not None:
                if replay and row.deleted_at is None:
                    if row.created_seq not in firsts:
                        raise _FirstUnread(row.created_seq)
                    first = firsts[row.created_seq]
                    asked = (name, metadata, parent_session_id)
                    if first is not None and (first.name, first.metadata, first.parent_session_id) == asked:
                        return Decision(None, lambda _: WriteReceipt(row.created_seq, (sid,), written=False))
                raise SessionExists(f"session {sid!r} already exists")
            if await queries.is_erased(conn, tenant, sid):  # recorded by any process: its id is burnt
                raise ErasedSession(f"session {sid!r} was erased")
            if parent_session_id is not None:
                await live_session(conn, tenant, parent_session_id, must_exist=True)  # erased: 410 as a fork
            event = SessionCreated(
                tenant=tenant, session=sid, name=name, parent_session_id=parent_session_id, metadata=metadata
            )
            return Decision(event, lambda seq: WriteReceipt(seq, (sid,)))

        for _ in range(CREATE_READS):
            try:
                result: WriteReceipt = await self._optimistic(tenant, sid, decide)
            except _FirstUnread as unread:  # the log and the key store are asked with no connection held
                firsts[unread.seq] = await self._created_by(tenant, sid, unread.seq)
                continue
            return result
        raise ContentionExhausted(f"session {sid!r} was made again {CREATE_READS} times while its creation was read")

    async def _created_by(self, tenant: str, sid: str, seq: int) -> SessionCreated | None:
        """The ``session.created`` stored at ``seq`` (a session's first event, unsealed when sealed);
        None when that event is another (an append made the session) or not one the projector applies."""
        msg = await self._pub.js.get_msg(self._pub.layout.stream, seq)
        data, keys = msg.data or b"", self._pub.keys
        if keys is not None and (kid := kid_in(data)) is not None:
            await keys.load([(tenant, sid, kid)])
        try:
            event = admit(data, msg.subject or "", self._pub.layout, keys)
        except (Refused, KeyDestroyed):
            return None
        return event if isinstance(event, SessionCreated) else None

    async def _of_live(self, event: Event) -> WriteReceipt:
        """Publish ``event`` if its session is live (``404``/``410`` otherwise): the decision of a
        write that depends on nothing else."""

        async def decide(conn: Conn) -> Decision:
            await live_session(conn, event.tenant, event.session, must_exist=True)
            return Decision(event, WriteReceipt)

        result: WriteReceipt = await self._optimistic(event.tenant, event.session, decide)
        return result

    async def rename_session(self, tenant: str, session: str, name: str) -> WriteReceipt:
        return await self._of_live(SessionRenamed(tenant=tenant, session=session, name=name))

    async def add_usage(
        self,
        tenant: str,
        session: str,
        input_tokens: int,
        output_tokens: int,
        cost: float,
        request_key: str | None = None,
    ) -> WriteReceipt:
        """Add to the session's token and cost counters (``addUsage``).

        ``request_key`` (the client's ``Idempotency-Key``) names the request across retries: the
        event id is derived from the tenant, the session and the key alone. Once the history
        projection has applied that event, its id, amounts and sequence are in ``usage_applied``
        (for the session's life): a retry is answered from there, with no publish; the same
        amounts answer as the first time (its ``seq``, ``written=False``); other amounts raise
        :class:`IdempotencyKeyReused`. A retry racing the first attempt's publish is caught by
        JetStream's duplicate window instead, and its stored event read back, deciding the same;
        a stored event that is not this call's (another event published straight to the stream
        under the id) raises :class:`IdempotencyKeyConflict`. Nothing is written in either case,
        and a duplicate that reaches the log is applied once all the same.
        """
        event_id = derived_id("usage", tenant, session, request_key) if request_key is not None else str(uuid.uuid4())
        amounts = (input_tokens, output_tokens, cost)

        def first(seq: int, stored: tuple[int, int, float], where: str) -> WriteReceipt:
            if stored != amounts:
                raise IdempotencyKeyReused(
                    f"Idempotency-Key {request_key!r} was used {where} to add input_tokens={stored[0]}, "
                    f"output_tokens={stored[1]}, cost={stored[2]!r} to this session (seq {seq}); nothing was added"
                )
            return WriteReceipt(seq, written=False)

        async def replayed(seq: int) -> WriteReceipt:
            stored = await self._stored_event(seq)
            if not isinstance(stored, SessionUsageAdded) or (stored.id, stored.tenant, stored.session) != (
                event_id,
                tenant,
                session,
            ):
                raise IdempotencyKeyConflict(
                    f"the event id Idempotency-Key {request_key!r} derives is held by another event of the log "
                    f"(seq {seq}), not a usage call of this session; nothing was added: use another key"
                )
            return first(seq, (stored.input_tokens, stored.output_tokens, stored.cost), "just before")

        async def decide(conn: Conn) -> Decision:
            await live_session(conn, tenant, session, must_exist=True)
            if request_key is not None and (done := await queries.applied_usage(conn, tenant, session, event_id)):
                receipt = first(done.seq, (done.input_tokens, done.output_tokens, done.cost), "before")
                return Decision(None, lambda _last: receipt)
            if not (input_tokens or output_tokens or cost):  # nothing to add: nothing written
                return Decision(None, lambda seq: WriteReceipt(seq, written=False))
            event = SessionUsageAdded(
                id=event_id,
                tenant=tenant,
                session=session,
                input_tokens=input_tokens,
                output_tokens=output_tokens,
                cost=cost,
            )
            return Decision(event, WriteReceipt, replayed if request_key is not None else None)

        try:
            result: WriteReceipt = await self._optimistic(tenant, session, decide)
        except ForeignDuplicate as exc:
            raise self._key_conflict(request_key, exc) from exc
        return result

    @staticmethod
    def _key_conflict(request_key: str | None, exc: ForeignDuplicate) -> Exception:
        """What a write whose event id derives from the client's ``Idempotency-Key`` answers when
        the id is held by a message on another subject (another session's, or another tenant's,
        published straight to the stream): nothing was stored, and only another key can write.
        An id that derives from no key (a random one) is no client's doing: the error as it is."""
        if request_key is None:
            return exc
        return IdempotencyKeyConflict(
            f"the event id Idempotency-Key {request_key!r} derives is held by another event of the log "
            f"(seq {exc.seq}), not one of this session; nothing was written: use another key"
        )

    async def end_session(self, tenant: str, session: str, reason: str) -> WriteReceipt:
        """Record that the session ended and why (``end_reason``); a later end replaces the reason."""
        return await self._of_live(SessionEnded(tenant=tenant, session=session, reason=reason))

    async def delete_session(self, tenant: str, session: str) -> WriteReceipt:
        return await self._of_live(SessionDeleted(tenant=tenant, session=session))

    # -- messages -------------------------------------------------------------------------

    def _fitting(self, body: JsonObject) -> bytes:
        """The body's stored bytes; :class:`PayloadTooLarge` past the message limit."""
        data = stored_json(body).encode()  # as long as the canonical form: only the key order differs
        if len(data) > self._max:
            raise PayloadTooLarge(f"message is {len(data)} bytes; the limit is {self._max}")
        return data

    def _measured(self, body: JsonObject) -> tuple[str, JsonObject, bytes | None, bytes]:
        """What an append computes of its body before any I/O, the CPU-heavy part (run off the
        loop for a large body: services/offload.py): its hash, the form it is recorded in (capped
        when over the row cap), the stored bytes of the whole body when capped (its original,
        None when not capped) and those of the recorded form; :class:`PayloadTooLarge` past the
        message limit."""
        digest = body_hash(body)
        if self._originals is None or json_bytes(body) <= self._row_cap:
            return digest, body, None, self._fitting(body)
        capped, changed = enforce_row_size_limit(body, self._row_cap)
        if not changed:
            return digest, body, None, self._fitting(body)
        return digest, capped, self._fitting(body), self._fitting(capped)

    def _fitting_and_hash(self, body: JsonObject) -> tuple[bytes, str]:
        """:meth:`_fitting`, and the body's hash (off the loop for a large body)."""
        return self._fitting(body), body_hash(body)

    async def _pack(
        self,
        tenant: str,
        session: str,
        body: JsonObject,
        digest: str | None = None,
        own: OwnObjects | None = None,
        *,
        data: bytes | None = None,
    ) -> dict[str, Any]:
        """Event fields for ``body`` (services.writes.unrecorded: ``own`` records a sealed claim
        check as the write's); ``data``: its :meth:`_fitting` bytes, when the caller has them."""
        data = self._fitting(body) if data is None else data

        async def seal(raw: bytes) -> bytes:
            return await self._pub.seal_object(tenant, session, raw)

        store = own.store(self._blobs) if own is not None and self._blobs is not None else self._blobs
        return await pack_body(body, store, self._limit, data=data, digest=digest, seal=seal)

    async def carried_original(
        self, tenant: str, source: str, target: str, original_ref: dict[str, Any], own: OwnObjects | None = None
    ) -> dict[str, Any]:
        """A capped message's original, stored again for the session ``target`` (a fork of
        ``source``: objects belong to one session), as event fields: its hash and reference.

        Nothing (the message is copied as history shows it) when ``source`` cannot read the
        original: a reference published straight to the log may name another session's object,
        or none, and ``GET …/messages/{mid}?original=true`` answers 404 for it
        (services/api/messages.py). The fork answered 500 ``NotTheOwner`` before; refusing the
        fork instead would make every point after that message unforkable, for a reference the
        session's own reads already treat as absent. A key that is unavailable (configuration,
        retried) still fails the fork rather than drop an original the session can read."""
        assert self._originals is not None  # a row has an original only where originals are kept
        keys = self._pub.keys
        try:
            data = await self._originals.get(BlobRef.model_validate(original_ref))
            if is_sealed_object(data) and keys is not None:
                await keys.load([(tenant, source, None)])
            whole = open_object(data, keys, tenant, source)
        except (BlobNotFound, NotTheOwner, SealBroken):
            return {}
        sealed = await self._pub.seal_object(tenant, target, whole)
        stored = await (own.put(self._originals, sealed) if own is not None else self._originals.put(sealed))
        return {"body_sha256": body_hash(json.loads(whole)), "original_ref": stored}

    async def append(
        self,
        tenant: str,
        session: str,
        body: JsonObject,
        parent: ParentSpec = OMITTED,
        request_key: str | None = None,
        *,
        follow: bool = False,
    ) -> AppendResult:
        """Append one message; same id + same body answers as the first time (``created=False``).

        ``follow`` (a batch's next message; ``parent`` is the batch's previous one): the parent is
        the latest leaf instead when that is under ``parent`` (another writer appended onto the
        batch's line meanwhile), so concurrent writers leave one chain. The decision is taken
        under the same optimistic concurrency as an append without a parent: a publish by anyone
        after it conflicts, and it is decided again. Only when the latest leaf is not ``parent``
        itself does it read more (the slow way, one walk of ``parent``'s few descendants).

        ``request_key`` (the client's ``Idempotency-Key``) names the request across the client's
        retries: the event id is derived from it (with the message id and body), so a retry whose
        first attempt was stored although its answer was lost answers ``created=True`` too.

        A message over the row cap is recorded in the reference's size-capped form, with the
        untruncated original stored whole in object storage (``original_ref``); only the capped
        form is claim-checked (the whole one was too, an object no event referenced).

        The objects stored for it are stored before it is decided: sealed ones (this write's own,
        services/writes/unrecorded.py) are deleted again when it records no event of its own (a
        replay, a refusal).
        """
        digest, capped, whole, data = await off_loop(self._measured, body)
        own = OwnObjects()
        publishing = False
        try:
            if whole is not None:
                assert self._originals is not None
                original = await own.put(self._originals, await self._pub.seal_object(tenant, session, whole))
                packed = {
                    **await self._pack(tenant, session, capped, digest, own, data=data),
                    "original_ref": original,
                }
            else:
                packed = await self._pack(tenant, session, body, digest, own, data=data)
            publishing = True
            appended = await self._append_packed(tenant, session, body, packed, parent, request_key, follow=follow)
        except BaseException as exc:
            if not publishing or decided(exc):
                await own.drop()
            raise
        if not appended.stored:  # answered by an event already in the log: its references stay
            await own.settle(self._pub, appended.result.seq)
        return appended.result

    async def _append_packed(
        self,
        tenant: str,
        session: str,
        body: JsonObject,
        packed: dict[str, Any],
        parent: ParentSpec,
        request_key: str | None,
        *,
        follow: bool,
    ) -> _Appended:
        """:meth:`append` of its packed event fields; ``stored``: this call's event was stored."""
        message_id = str(body["id"])
        digest = str(packed["body_sha256"])
        stored = False

        # One event id for every attempt of this request: when an attempt was stored but its ack
        # was lost (NATS restarting), a later attempt finds the message and, by the stored event's
        # id, knows this request created it.
        event_id = (
            derived_id("append", tenant, session, message_id, digest, request_key)
            if request_key is not None
            else str(uuid.uuid4())
        )
        attempted = request_key is not None  # a keyed request may have been stored by an earlier try

        if follow and not isinstance(parent, str):
            raise TypeError("follow continues after a given message: parent must be its id")

        def publish(pid: str | None) -> Decision:
            nonlocal attempted
            attempted = True
            event = MessageAppended(
                id=event_id, tenant=tenant, session=session, message_id=message_id, parent_id=pid, **packed
            )

            def answer(seq: int) -> AppendResult:
                nonlocal stored
                stored = True
                return AppendResult(message_id, pid, seq, created=True)

            async def replayed(seq: int) -> AppendResult:  # a keyed request's event, stored before
                return AppendResult(message_id, pid, seq, created=True)

            return Decision(event, answer, replayed)

        async def decided(state: AppendState) -> Decision:
            match decide_append(state, digest, parent, follow=follow):
                case Replay(parent_id=pid, seq=first_seq, tail=tail):
                    created = tail is None and attempted and await self._stored_event_id(first_seq) == event_id
                    result = AppendResult(message_id, pid, first_seq, created=created, tail=tail or "")
                    return Decision(None, lambda _seq: result)
                case Append(parent_id=pid):
                    return publish(pid)

        async def decide(conn: Conn, tip: UnappliedChain | None = None) -> Decision | None:
            implicit = parent is OMITTED
            want_leaf = implicit or follow
            ask_ids = tip is not None and tip.ids is None and not tip.ids_tried
            # the parent this append may take among the chain's appends (the read model may not
            # hold them yet): the read model is asked whether the first id above them is under
            # the new id; a new root asks nothing
            chained = tip.appends[-1].message_id if implicit and tip is not None and tip.appends else parent
            above = tip.above(chained) if tip is not None and isinstance(chained, str) else None
            found = await queries.append_state(
                conn,
                tenant,
                session,
                message_id,
                parent if isinstance(parent, str) else None,
                want_leaf or ask_ids,
                MAX_SESSION_IDS if ask_ids else None,
                leaf_parent=want_leaf,
                chain_parents=[above] if above is not None else [],
            )
            unapplied = tip.unapplied(found.applied_seq) if tip is not None else []
            if unapplied is None:
                return None  # the read model is behind this process's chain: decide the slow way
            if tip is not None:
                self.optimistic.trim(tenant, session, found.applied_seq)
            existing = (
                Existing(found.existing_parent_id, found.existing_seq, found.existing_sha256)
                if found.existing_seq is not None and found.existing_sha256 is not None
                else None
            )
            for a in unapplied:
                if existing is None and a.message_id == message_id:
                    existing = Existing(a.parent_id, a.seq, a.body_sha256)
            # the parents asked about that are under the new id, and the chain's appends under
            # them (oldest first; applied or not, each append's parent is the one it was given)
            descendants = set(found.under or ())
            for a in tip.appends if tip is not None else ():
                if a.parent_id == message_id or a.parent_id in descendants:
                    descendants.add(a.message_id)
            summary, summary_like = None, False
            if existing is None and (overlay_id := overlay_id_in(message_id)) is not None:
                # a compaction summary's id (rare): history shows an overlay there, not a message
                if (at := await overlay_at(conn, tenant, session, overlay_id)) is not None:
                    o, first_parent = at
                    summary = Summary(first_parent, o.seq, body_hash(o.as_message()), o.to_message_id)
                summary_like = summary is None and overlay_shaped(message_id)
            state = AppendState(
                summary=summary,
                summary_like=summary_like,
                session_erased=found.session_erased,
                session_deleted=found.session_deleted,
                existing=existing,
                latest_leaf=unapplied[-1].message_id if unapplied else found.latest_leaf,
                parent_exists=found.parent_exists or any(a.message_id == parent for a in unapplied),
                descendants=frozenset(descendants),
            )
            if ask_ids and tip is not None and not found.session_deleted:
                ids = None if found.ids is None else {*found.ids, *(a.message_id for a in unapplied)}
                dangling = set(found.dangling or ()) - (ids or set())
                self.optimistic.know(tenant, session, tip, ids, state.latest_leaf, dangling)
            leaf = state.latest_leaf
            if follow and existing is None and state.parent_exists and leaf is not None and leaf != parent:
                if tip is not None:
                    return None  # whether the leaf is under the parent: the read model, the slow way
                assert isinstance(parent, str)
                state = replace(state, leaf_follows=await queries.descends_from(conn, tenant, session, leaf, parent))
            return await decided(state)

        def known(tip: UnappliedChain) -> Decision | None:
            """From the chain's ids alone: a new id (an id the session holds, or a parent it
            lacks, is decided the slow way, where its answer or its error is exact; so is an id
            stored messages name as their parent, whose descendants the chain does not know)."""
            ids = tip.ids
            if ids is None or message_id in ids or (isinstance(parent, str) and parent not in ids):
                return None
            if overlay_id_in(message_id) is not None:  # a summary's id: the overlays decide, the slow way
                return None
            if message_id in tip.dangling:
                return None
            if follow and tip.leaf != parent:  # another leaf: whether it is under the parent, the slow way
                return None
            state = AppendState(session_deleted=False, existing=None, latest_leaf=tip.leaf, parent_exists=True)
            match decide_append(state, digest, parent):
                case Append(parent_id=pid):
                    return publish(pid)
                case _:  # no existing message: never a replay
                    return None

        async def slow(conn: Conn) -> Decision:
            decision = await decide(conn)
            assert decision is not None  # without a chain the read model is never "behind"
            return decision

        try:
            result: AppendResult = await self._optimistic(tenant, session, slow, decide, known)
        except ForeignDuplicate as exc:
            raise self._key_conflict(request_key, exc) from exc
        return _Appended(result, stored)

    async def _stored_event_id(self, seq: int) -> str | None:
        """The event id (``Nats-Msg-Id``) stored at stream sequence ``seq``; None if unknown."""
        try:
            msg = await self._pub.js.get_msg(self._pub.layout.stream, seq)
        except Exception:  # unknown counts as someone else's: the answer is then created=False
            return None
        return (msg.headers or {}).get("Nats-Msg-Id")

    async def _stored_event(self, seq: int) -> Event | None:
        """The event stored at stream sequence ``seq``, read back from the log (never sealed: only
        events without personal fields are read back this way); None when its bytes are no event
        of the contract (anything may be published straight to the stream under an id)."""
        msg = await self._pub.js.get_msg(self._pub.layout.stream, seq)
        try:
            raw = json.loads(msg.data or b"")
            return decode(raw) if isinstance(raw, dict) else None
        except (ValueError, KeyError, TypeError):  # not JSON, no or an unknown type, invalid fields
            return None

    async def update(self, tenant: str, session: str, body: JsonObject) -> WriteReceipt:
        message_id = str(body["id"])
        own = OwnObjects()
        try:
            data, digest = await off_loop(self._fitting_and_hash, body)
            packed = await self._pack(tenant, session, body, digest, own, data=data)
        except BaseException:
            await own.drop()
            raise

        async def decide(conn: Conn) -> Decision:
            await live_session(conn, tenant, session, must_exist=False)
            if await queries.get_message(conn, tenant, session, message_id) is None:
                raise MessageNotFound(f"message {message_id!r} is not in this session")
            event = MessageUpdated(tenant=tenant, session=session, message_id=message_id, **packed)
            return Decision(event, lambda seq: WriteReceipt(seq, (message_id,)))

        try:
            result: WriteReceipt = await self._optimistic(tenant, session, decide)
        except BaseException as exc:  # a refused update stored no event: its sealed claim check goes
            if decided(exc):
                await own.drop()
            raise
        return result

    async def delete_messages(self, tenant: str, session: str, ids: list[str]) -> WriteReceipt:
        """Delete the listed messages that exist; children keep their parent id."""

        async def decide(conn: Conn) -> Decision:
            await live_session(conn, tenant, session, must_exist=False)
            wanted = list(dict.fromkeys(ids))
            found = await queries.existing_ids(conn, tenant, session, wanted)
            present = [i for i in wanted if i in found]
            if not present:
                return Decision(None, WriteReceipt)
            event = MessagesDeleted(tenant=tenant, session=session, message_ids=present)
            return Decision(event, lambda seq: WriteReceipt(seq, tuple(present)))

        result: WriteReceipt = await self._optimistic(tenant, session, decide)
        return result

    async def clear(self, tenant: str, session: str) -> WriteReceipt:
        async def decide(conn: Conn) -> Decision:
            if await live_session(conn, tenant, session, must_exist=False) is None:
                return Decision(None, lambda _seq: WriteReceipt(0))  # nothing to clear; record nothing
            return Decision(MessagesCleared(tenant=tenant, session=session), WriteReceipt)

        result: WriteReceipt = await self._optimistic(tenant, session, decide)
        return result


@dataclass(frozen=True, slots=True)
class Forked:
    id: str
    seq: int
    messages: int


FORK_REQUESTER = "chronicle (fork of an erased session)"
"""Who erased a fork whose source was erased while it was being made (its ``requested_by``)."""


FORK_CHUNK = 500
"""The copies a fork publishes at once: it is at most two such chunks ahead of the projector, so
another tenant's event waits behind at most a batch's worth (1,000) of them."""
FORK_YIELD_EVERY = 100
"""Copies a fork packs (and checks) between its turns given to the process's other requests:
packing 20,000 held the API's event loop ~3 s."""


async def fork(
    cmd: Commands,
    eraser: Eraser,
    tenant: str,
    session: str,
    at_message_id: str,
    new_id: str | None,
    name: str | None,
    charge: Callable[[int], None] | None = None,
) -> Forked:
    """A new session (``parent_session_id`` = source) holding the source's path to ``at_message_id``.

    The path's messages are re-recorded on the new session with their ids and parents, and the
    overlay in force on that path is carried over, so the fork reads exactly like the source
    branch did. A tool output that an ``unload_context`` reclaimed is copied as history shows it
    (``[skill unloaded: <key>]``, as the reference's fork copies ``getHistory``), so the skill text
    does not come back in the fork; a capped message's original keeps what it held. The source's
    log is untouched.

    The copy of ``at_message_id`` is published last, alone, once every other copy is stored: a
    fork whose log holds it is complete. Retried with the same ``new_id`` (:func:`_made_fork`: a
    fork of ``session`` at ``at_message_id``, and of ``name`` when one is given; any other session
    of that id is ``409 session_exists``), a complete fork publishes nothing and answers from its
    own log, whatever the source became since (deleted, erased, its message deleted, a new
    overlay). An incomplete one is completed from the source's path as it is now, with the
    overlays in force on it that were recorded before the fork (what the first call carried);
    only the copies its log lacks are published. A copy's event id derives from the tenant, the
    fork's id and the copied message's (overlay's) id, so a retry racing the first call is
    deduplicated by the stream as well.

    An erasure of the source that began while the copies were being made (recorded before the
    check that follows them) erases the fork too, and the fork answers ``410 session_erased``;
    so does a retry of an incomplete fork whose source was erased since. The copies hold the
    source's content under the fork's own key, which the source's erasure does not destroy. One
    recorded after a completed fork is a separate session from then on (erase it on its own). An
    erasure of the new id in that window is ``410`` as well.

    ``charge`` (the tenant's request limit, services/requests/limits.py) is called with the
    number of copies this call will publish (every event past its first, the new session's
    creation), once the source is read and before any copy is packed (a body claim-checked, an
    original stored again, the fork's data key made): a refusal it raises leaves nothing
    published or stored. A fork refused after the charge and before its first event (a copy the
    log would refuse) is given the charge back (``charge(-n)``). A complete fork answered from its
    log is not charged, one that another call completed after this one's charge is given it back.
    """
    await cmd.optimistic.catch_up(tenant, session)
    gone: Exception | None = None
    rows: list[queries.MessageRow] = []
    in_force: list[Overlay] = []
    async with cmd._pool.connection() as conn:
        try:
            source = await live_session(conn, tenant, session, must_exist=True)
        except (SessionNotFound, ErasedSession) as exc:  # a completed fork is answered all the same
            source, gone = None, exc
        if gone is None:
            rows = await queries.history(conn, tenant, session, at_message_id)
            in_force = await overlays_of(conn, tenant, session)
            unloaded = reclaimed_in(await context_queries.reclaimed(conn, tenant, session))
    made: ForkMade | None = None
    if new_id is not None:  # the copies are at most the path's messages and its overlays
        bound = len(rows) + len(in_force) if rows else None
        made = await _made_fork(cmd, tenant, new_id, session, at_message_id, name, bound)
        if made is not None and made.complete:
            return Forked(new_id, made.last_seq, made.messages)
    if isinstance(gone, ErasedSession) and made is not None:  # its copies must not outlive the source
        await _erase_fork(eraser, tenant, session, new_id or "")
    if gone is not None:
        raise gone
    if not rows:
        raise MessageNotFound(f"message {at_message_id!r} is not in this session")
    assert source is not None
    sid = new_id or str(uuid.uuid4())
    if made is not None:  # what the first call carried: the overlays recorded before the fork
        in_force = [o for o in in_force if o.seq < made.created_seq]
    path_ids = [r.id for r in rows]
    carried = [item for item in apply_overlays(path_ids, in_force) if not isinstance(item, str)]
    held = made.copies if made is not None else {}
    # charged before any copy is packed (a body claim-checked, an original stored again, the
    # fork's data key made), so a refused charge leaves nothing behind: the events past the first
    # (the creation; a retry's copies when it is made)
    to_copy = sum(("message", r.id) not in held for r in rows)
    to_copy += sum(("overlay", _overlay_copy_id(tenant, sid, item)) not in held for item in carried)
    charged = to_copy if made is None else to_copy - 1
    if charge is not None:
        charge(charged)
    own = OwnObjects()  # the sealed objects packed for the copies: deleted when no copy is published
    try:
        messages: list[Event] = []
        on_path = set(path_ids)
        for i, row in enumerate(rows):
            if ("message", row.id) in held:  # copied by an earlier call of this fork
                continue
            if i % FORK_YIELD_EVERY == FORK_YIELD_EVERY - 1:
                await asyncio.sleep(0)  # other requests of the process between these rows
            # the path's root keeps its parent id (a deleted message's, as in the source), unless it
            # names a message of the path: a cycle stored before appends refused them (or published
            # straight to the stream) is not copied, the fork's path starts a new root there
            parent_id = None if i == 0 and row.parent_id in on_path else row.parent_id
            outputs = unloaded.outputs(row.id, row.content)
            body = json.loads(reclaim(row.content, outputs) if outputs else row.content)
            packed = await cmd._pack(tenant, sid, body, own=own)
            if row.original_ref is not None:  # a capped message keeps its original in the fork too
                packed = {**packed, **await cmd.carried_original(tenant, session, sid, row.original_ref, own)}
            event_id = derived_id("fork-message", tenant, sid, row.id)
            messages.append(
                MessageAppended(
                    id=event_id, tenant=tenant, session=sid, message_id=row.id, parent_id=parent_id, **packed
                )
            )
        overlays: list[Event] = []
        for item in carried:
            overlay_id = _overlay_copy_id(tenant, sid, item)
            if ("overlay", overlay_id) in held:
                continue
            overlays.append(
                CompactionRecorded(
                    id=overlay_id,
                    tenant=tenant,
                    session=sid,
                    overlay_id=overlay_id,
                    from_message_id=item.from_message_id,
                    to_message_id=item.to_message_id,
                    leaf_id=at_message_id,
                    tokens_before=item.tokens_before,
                    tokens_after=item.tokens_after,
                    summarizer=item.summarizer,
                    model=item.model,
                    summary=item.summary,
                )
            )
        # the copy of at_message_id last: the fork is complete once its log holds it
        last = [e for e in messages if _copy_key(e) == ("message", at_message_id)]
        events = [e for e in messages if e not in last] + overlays + last
        # Every event is admitted before the first one (the new session) is published: a fork the
        # log would refuse part-way publishes nothing.
        for n, event in enumerate(events):
            cmd._pub.encode(event)
            if n % FORK_YIELD_EVERY == FORK_YIELD_EVERY - 1:
                await asyncio.sleep(0)
    except BaseException:  # nothing published: what was charged for it is given back
        if charge is not None:
            charge(-charged)
        await own.drop()
        raise
    answered: Forked | None = None
    try:
        if made is None:
            try:
                created = await cmd.create_session(
                    tenant,
                    sid,
                    name if name is not None else source.name,
                    session,
                    {"forked_from": at_message_id},
                    replay=False,  # a fork made before is completed below, never answered as a create
                )
                made = ForkMade(created.seq, {}, 0)
            except SessionExists:
                # the same fork's other call created it meanwhile (a client's retry racing the first)
                raced = (
                    None
                    if new_id is None
                    else await _made_fork(cmd, tenant, sid, session, at_message_id, name, len(rows) + len(carried))
                )
                if raced is None or raced.complete:  # this call publishes nothing: its charge is given back
                    if charge is not None:
                        charge(-charged)
                    if raced is None:
                        raise
                    answered = Forked(sid, raced.last_seq, raced.messages)
                else:
                    made = raced
                    events = [e for e in events if _copy_key(e) not in made.copies]
        if answered is None and await _erased(cmd, tenant, session):  # the usual race, before any copy
            await _erase_fork(eraser, tenant, session, sid)
    except BaseException as exc:
        if decided(exc):  # no copy published (a refusal, the source erased meanwhile)
            await own.drop()
        raise
    # the copies' objects that no copy to publish references (another call of this fork published
    # those copies, or all of them) are this call's own, and not needed
    await own.drop(_refs_of(events) if answered is None else ())
    if answered is not None:
        return answered
    assert made is not None
    now = datetime.now(UTC)  # the copies happen after the new session's creation
    # A copy's id derives from public inputs (the fork's id may be the client's): one taken on
    # another subject is published again under a fresh id (see events/publisher.py and the
    # compaction worker's overlay for why derived ids are not a reason to fail); a retry then
    # finds that copy by its message (overlay) id on the fork's subject. Two calls racing on such
    # an id each publish their copy under a fresh id: the projector applies the first (a message
    # id, an overlay id, is applied once) and ignores the second, which only the log shows.
    copies = [e.model_copy(update={"occurred_at": now}) for e in events]
    results: list[Published] = []
    # In chunks, at most two ahead of the projector: a chunk is published once the one before
    # the last is applied. The log is one order for every tenant, and a fork's copies published
    # at once (20,000 in ~3 s) held every other tenant's events behind them until the projector
    # had applied them all (their reads with min_seq and their writes waited, 503
    # projection_timeout past the read wait). Past the read wait in all, the rest is published at
    # once, as before.
    pacer = cmd.optimistic.pacer(tenant, sid)  # its waits share one budget (services/writes/pacing.py)
    for start in range(0, len(copies) - 1, FORK_CHUNK):
        await pacer.turn()
        chunk = copies[start : min(start + FORK_CHUNK, len(copies) - 1)]
        results += await cmd._pub.publish_many(chunk, fresh_id_on_foreign=True)
        pacer.stored(results[-1].seq)
    if copies:  # only once every other copy is stored
        results += await cmd._pub.publish_many(copies[-1:], fresh_id_on_foreign=True)
    # An erasure is recorded before its event is published: one not recorded now came after every
    # copy. The new id's, in between: the copies landed after its ``session.erased`` (tombstones).
    # The source's: the copies must not outlive it.
    if await _erased(cmd, tenant, session):
        await _erase_fork(eraser, tenant, session, sid)
    if await _erased(cmd, tenant, sid):
        raise ErasedSession(f"session {sid!r} was erased while it was being forked")
    seqs = [made.created_seq, *made.copies.values(), *(r.seq for r in results)]
    return Forked(sid, max(seqs), len(rows))


def _refs_of(events: list[Event]) -> set[BlobRef]:
    """The objects the message events among ``events`` reference."""
    return {
        ref
        for e in events
        if isinstance(e, MessageAppended)
        for ref in (e.message_ref, e.original_ref)
        if ref is not None
    }


def _overlay_copy_id(tenant: str, fork_id: str, item: Overlay) -> str:
    """The id of an overlay's copy in the fork (its event's id too)."""
    return derived_id("fork", tenant, fork_id, item.overlay_id)


CopyKey = tuple[str, str]
"""A fork's copy by what it copies: ``("message", message id)`` or ``("overlay", overlay id)``."""


def _copy_key(event: Event) -> CopyKey | None:
    if isinstance(event, MessageAppended):
        return ("message", event.message_id)
    if isinstance(event, CompactionRecorded):
        return ("overlay", event.overlay_id)
    return None


FORK_READ_MARGIN = 256
"""Events on a fork's subject read past the copies it can hold (writes to the fork while they
were being published), before it is taken as incomplete."""
FORK_READ_UNBOUNDED = 10_000
"""The events read on a fork's subject when its source no longer tells how many copies it has."""


@dataclass(frozen=True, slots=True)
class ForkMade:
    """A fork's session as the log holds it: its creation's sequence, the sequence of each copy
    its subject holds, and whether it holds the copy of ``at_message_id`` (published last)."""

    created_seq: int
    copies: dict[CopyKey, int]
    complete_seq: int

    @property
    def complete(self) -> bool:
        return self.complete_seq > 0

    @property
    def last_seq(self) -> int:
        return max([self.created_seq, *self.copies.values()])

    @property
    def messages(self) -> int:
        return sum(1 for kind, _ in self.copies if kind == "message")


async def _made_fork(
    cmd: Commands,
    tenant: str,
    sid: str,
    source: str,
    at_message_id: str,
    name: str | None,
    copies: int | None,
) -> ForkMade | None:
    """The session ``sid`` when an earlier call made it as this fork (None: there is none).

    It is this fork when its ``session.created`` names ``source`` as its parent, records
    ``{"forked_from": at_message_id}`` as its metadata and, when ``name`` is given, that name;
    else, or when the session is deleted, :class:`SessionExists` (as a create of a taken id); an
    erased one is :class:`ErasedSession`. Its copies are found in the log, on its subject (the
    authority, and what the read model may no longer show: a copy deleted or cleared since stays
    copied); a copy published under a fresh id (its derived id was taken on another subject) is
    found by what it copies. The read stops at the copy of ``at_message_id`` (the last), or after
    ``copies`` (at most so many copies; None: unknown) and :data:`FORK_READ_MARGIN` events: the
    fork's later writes are never read. A log that stops delivering is :class:`Unavailable`."""
    await cmd.optimistic.catch_up(tenant, sid)
    async with cmd._pool.connection() as conn:
        row = await queries.get_session(conn, tenant, sid)
        if row is None:
            if await queries.is_erased(conn, tenant, sid):
                raise ErasedSession(f"session {sid!r} was erased")
            return None
    exists = SessionExists(f"session {sid!r} already exists")
    if row.deleted_at is not None or row.parent_session_id != source or row.metadata != {"forked_from": at_message_id}:
        raise exists
    keys, layout = cmd._pub.keys, cmd._pub.layout
    created: SessionCreated | None = None
    found: dict[CopyKey, int] = {}
    complete = 0
    subject = layout.session_subject(tenant, sid)
    budget = (FORK_READ_UNBOUNDED if copies is None else copies) + FORK_READ_MARGIN
    try:
        async with contextlib.aclosing(eventlog.read(cmd._pub.js, layout, subject, from_seq=row.created_seq)) as log:
            async for stored in log:
                budget -= 1
                if keys is not None and (kid := kid_in(stored.data)) is not None:
                    await keys.load([(tenant, sid, kid)])
                try:
                    event = admit(stored.data, stored.subject, layout, keys)
                except (Refused, KeyDestroyed):  # what the projector does not apply copies nothing
                    event = None
                if created is None and isinstance(event, SessionCreated):  # its first event (create_session)
                    created = event
                elif event is not None and (key := _copy_key(event)) is not None:
                    found.setdefault(key, stored.seq)
                    if key == ("message", at_message_id):
                        complete = stored.seq
                        break
                if budget <= 0:
                    break
    except TimeoutError as exc:
        raise Unavailable("the event log stopped delivering the fork's events; retry") from exc
    if created is None or (name is not None and created.name != name):
        raise exists
    return ForkMade(row.created_seq, found, complete)


async def _erased(cmd: Commands, tenant: str, session: str) -> bool:
    async with cmd._pool.connection() as conn:
        return await queries.is_erased(conn, tenant, session)


FORK_ERASE_ATTEMPTS = 4


async def _erase_fork(eraser: Eraser, tenant: str, source: str, fork_id: str) -> NoReturn:
    """Erase the fork of an erased source, then answer ``410``. Tried again on failure: the fork
    must not stay live with the erased content (an error, logged, if it does)."""
    reason = f"its source session {source!r} was erased while the fork was being made"[:MAX_ERASURE_REASON]
    for attempt in range(FORK_ERASE_ATTEMPTS):
        try:
            await eraser.erase_session(tenant, fork_id, must_exist=False, requested_by=FORK_REQUESTER, reason=reason)
            break
        except Exception:
            if attempt + 1 == FORK_ERASE_ATTEMPTS:
                log.exception("the fork %r of the erased session %r could not be erased: erase it", fork_id, source)
                raise
            await asyncio.sleep(0.2 * 2**attempt)
    raise ErasedSession(f"session {source!r} was erased while it was being forked; the fork is erased too")
