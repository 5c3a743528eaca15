"""Erasure by crypto-shredding: destroy a session's data key, record it, drop what can be dropped.

Order, each step idempotent so a failed erasure is finished by running it again:

1. The data key is destroyed and the erasure recorded (``data_keys``/``erasures``): from here on
   every event of the session sealed with it is unreadable, wherever a copy of the log lives, and
   every reader of the log shows the session's events as tombstones.
2. ``session.erased`` is published (its id derived from tenant and session: stored once; under a
   fresh id when a message on another subject took that id first), with Chronicle's proof when a
   key-encryption key is configured (a database that loses the record makes it again from the
   event: :meth:`projections.keystore.PgKeyStore.learn`), and its sequence noted with the
   record; the projections drop every row of the session when they apply it (as often as it
   comes). A rerun finds the noted event in the log and publishes nothing (at any time: JetStream
   dedups an id for its duplicate window only).
3. The objects the session's events reference (claim-checked bodies, over-cap originals) are
   deleted when they are this session's alone (events/objects.py): their header names it (a
   reference published into the session may name any object), or, written before headers, they
   are sealed. A plain one written before headers is content-addressed and may be another
   session's too, so it is left (docs/security.md).
4. Quarantined events of the session's ids under any partition token are deleted (their raw bytes
   are the session's; a tenant scope's: of every subject of the tenant that names no session), and
   so are its strays: events refused on another subject of the tenant whose bytes name the session
   (:func:`projections.quarantine.forget`).
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import psycopg
from nats.js.errors import NotFoundError
from psycopg_pool import AsyncConnectionPool

from events import log as eventlog
from events.blobs import BlobNotFound, BlobRef, BlobStore, RoutedBlobStores, refs_in
from events.catalog import SessionErased, erasure_statement
from events.envelope import new_event_id
from events.ids import TENANT_SCOPE, InvalidId, check_session, derived_id
from events.objects import belongs_to
from events.publisher import Publisher
from projections import quarantine, queries
from projections.keystore import PgKeyStore
from services.errors import SessionNotFound
from services.storage.s3 import NotCleaned, PrefixSurvey

log = logging.getLogger("chronicle.erasure")


@dataclass(frozen=True, slots=True)
class Erasure:
    """What erasing one session did."""

    session: str
    seq: int
    newly_erased: bool
    objects_deleted: int
    buckets_not_cleaned: tuple[NotCleaned, ...] = ()
    """A tenant scope's: the buckets whose objects under the tenant's prefix could not be deleted
    (the store refused them); its erasure is not complete until a rerun cleans them."""


class TenantObjects(Protocol):
    """A tenant's own objects, apart from any session's (its skill documents, indexed or not, and
    the read-only sources its sessions read), in the buckets known to hold them."""

    async def survey(self, tenant: str, extra: Sequence[str] = ()) -> list[PrefixSurvey]:
        """What each bucket holds under the tenant's prefix (one the store refuses: its
        ``refused`` reason); fails when object storage cannot be used."""
        ...

    async def note(self, tenant: str, surveyed: Sequence[PrefixSurvey]) -> None:
        """Keep the surveyed buckets, so that a rerun cleans them once the sessions naming them are gone."""
        ...

    async def held(self, tenant: str, extra: Sequence[str] = ()) -> bool: ...

    async def delete(self, tenant: str, surveyed: Sequence[PrefixSurvey]) -> tuple[int, list[NotCleaned]]:
        """Delete them all in the surveyed buckets; how many went (a rerun deletes what is left),
        and the buckets the store refused (the others cleaned all the same)."""
        ...


def _valid_session(session: str) -> bool:
    try:
        check_session(session)
    except InvalidId:
        return False
    return True


TENANT_ROUNDS = 10
"""How often a tenant's erasure lists its sessions again (each round erases those it finds)."""


class Eraser:
    def __init__(
        self,
        keys: PgKeyStore,
        publisher: Publisher,
        pool: AsyncConnectionPool[psycopg.AsyncConnection[Any]],
        stores: Sequence[BlobStore],
        tenant_objects: TenantObjects | None = None,
    ) -> None:
        self._tenant_objects = tenant_objects
        self._keys = keys
        self._pub = publisher
        self._pool = pool
        self._stores = RoutedBlobStores(*stores)  # each reference read and deleted where it says it lives

    async def erase_session(
        self,
        tenant: str,
        session: str,
        *,
        must_exist: bool = True,
        requested_by: str | None = None,
        reason: str | None = None,
        deleted_before: int = 0,
    ) -> Erasure:
        """Erase one session. Unless ``must_exist`` is off (a tenant's erasure: its tenant scope),
        a session the log holds no event of and with no data key is ``404 session_not_found``
        and nothing is recorded: erasing a mistyped id would otherwise burn it for good. An erased
        session has its ``session.erased`` event: erasing again finds it, publishes nothing and
        answers its sequence (and deletes what steps 3 and 4 left, if anything).

        ``requested_by`` and ``reason`` (checked by the caller: :data:`~events.catalog.MAX_ERASURE_REASON`,
        no NUL) are recorded with the erasure and carried by its event; a rerun keeps the first
        record's (its event is the first one's, byte for byte). ``deleted_before``: objects the
        caller deleted for it (a tenant scope's documents), counted with its own."""
        if must_exist and not await self._exists(tenant, session):
            raise SessionNotFound(f"session {session!r} does not exist: nothing to erase")
        new = await self._keys.erase(tenant, [session], requested_by=requested_by, reason=reason)
        published_at = None if new else await self._published_erasure(tenant, session)
        if published_at is None:
            seq = await self._publish_erasure(tenant, session, bool(new))
        else:  # a rerun of a finished erasure: its event is in the log (under any id), and is the answer
            seq = published_at
        deleted = deleted_before + await self._delete_objects(tenant, session, seq)
        await self._delete_quarantined(tenant, session)
        what = f"session {session!r}" if session else "tenant-level entries"  # "": the tenant scope's
        if published_at is None:
            log.warning("erased %s of tenant %r (event %d, %d objects deleted)", what, tenant, seq, deleted)
        else:
            log.info("%s of tenant %r already erased (event %d; %d objects deleted now)", what, tenant, seq, deleted)
        return Erasure(session, seq, bool(new), deleted)

    async def _published_erasure(self, tenant: str, session: str) -> int | None:
        """The sequence of the recorded erasure's ``session.erased`` when the log holds it on the
        session's subject (None: its event was never published: the erasure stopped before)."""
        seq = await self._keys.erasure_seq(tenant, session)
        if seq is None or not await self._is_applied_erasure(seq, self._pub.layout.session_subject(tenant, session)):
            return None
        return seq

    async def _publish_erasure(self, tenant: str, session: str, new: bool) -> int:
        """Publish the erasure's ``session.erased`` and note its sequence with the record."""
        requested_by, reason = await self._keys.erasure_record(tenant, session)
        event = SessionErased(
            id=derived_id("erase", tenant, session),
            tenant=tenant,
            session=session,
            requested_by=requested_by,
            reason=reason,
            proof=self._keys.proof(erasure_statement(tenant, session, requested_by, reason)),
        )
        # The derived id makes a repeated erasure store one event, but anyone may take it first on
        # their own subjects (it is a hash of the tenant and session): then the event goes under a
        # fresh id. The erasure must happen. A rerun publishes only when the noted event is not in
        # the log (the erasure stopped before it): past JetStream's duplicate window the derived id
        # would not dedup, and each rerun would append one more ``session.erased``.
        published = await self._pub.publish(event, fresh_id_on_foreign=True)
        if published.duplicate and not (
            not new and await self._is_applied_erasure(published.seq, self._pub.subject_of(event))
        ):
            # held on the session's own subject by another event (its tenant, publishing straight
            # to the stream under the id): that tenant cannot keep its session from being erased.
            # A ``session.erased`` held there counts only for a rerun (the erasure was recorded by an
            # earlier call) and when the projector did not refuse it: one the tenant published itself
            # before the erasure was recorded was quarantined (unrecorded_erasure) and dropped nothing.
            published = await self._pub.publish(event.model_copy(update={"id": new_event_id()}))
        await self._keys.note_erasure_seq(tenant, session, published.seq)
        return published.seq

    async def erase_tenant(
        self,
        tenant: str,
        *,
        requested_by: str | None = None,
        reason: str | None = None,
        buckets: Sequence[str] = (),
    ) -> list[Erasure]:
        """Every session of ``tenant``, then its tenant-level entries (the tenant scope): its own
        objects (every one under its prefix in the buckets known to hold them, and in ``buckets``,
        whether its skills index lists it or not) are deleted before the skills index goes.

        The buckets are found (its sessions' configs name some) and each is looked at before any
        session is erased: object storage that cannot be used fails the erasure with nothing
        destroyed, and a tenant with no bucket known makes no object-storage call. They are noted
        then, so that a rerun of an erasure that failed later still cleans them. A bucket the
        store refuses (the tenant chose the buckets its configs and index name: ``AccessDenied``,
        a key it would not delete) stops nothing: everything else is erased, and the tenant
        scope's :class:`Erasure` names it in ``buckets_not_cleaned`` (a rerun tries it again).

        Its sessions are those :meth:`tenant_sessions` lists, those that exist only through refused
        events too (quarantined on their subject, or naming them), so that their erasure is
        recorded (a rebuild tombstones their refusals) and their quarantined events go; the tenant
        scope's erasure then deletes those stored on subjects of the tenant that name no session.
        The sessions are listed again after each round until a round finds none left: one made
        while the erasure runs (a fork of a session not yet erased, which copies its content) is
        erased too. A tenant that keeps making sessions meanwhile is stopped after
        :data:`TENANT_ROUNDS` rounds; its API keys are what stops it for good."""
        objects = self._tenant_objects
        surveyed = await objects.survey(tenant, buckets) if objects is not None else []
        if objects is not None:
            await objects.note(tenant, surveyed)
        done: list[Erasure] = []
        erased: set[str] = set()
        for _ in range(TENANT_ROUNDS):
            sessions = [s for s in await self.tenant_sessions(tenant) if s != TENANT_SCOPE and s not in erased]
            if not sessions:
                break
            for s in sessions:  # each known here
                done.append(
                    await self.erase_session(tenant, s, must_exist=False, requested_by=requested_by, reason=reason)
                )
                erased.add(s)
        documents, left = await objects.delete(tenant, surveyed) if objects is not None else (0, [])
        scope = await self.erase_session(
            tenant, TENANT_SCOPE, must_exist=False, requested_by=requested_by, reason=reason, deleted_before=documents
        )
        if left:
            log.warning(
                "tenant %r erased but for its objects in %s: run the erasure again once they can be deleted",
                tenant,
                ", ".join(f"bucket {b.bucket!r} ({b.reason})" for b in left),
            )
            scope = dataclasses.replace(scope, buckets_not_cleaned=tuple(left))
        done.append(scope)
        return done

    async def tenant_sessions(self, tenant: str) -> list[str]:
        """The sessions a tenant's erasure erases (its tenant scope among them when known): those with
        a data key, a read-model row or a recorded erasure (:meth:`PgKeyStore.sessions_of`), and
        those whose erasure decides one of its quarantined events
        (:func:`projections.quarantine.tenant_sessions`) that are valid ids (a row's bytes may name
        what is no id; that row is decided by the session or tenant scope owning its subject)."""
        found = set(await self._keys.sessions_of(tenant))
        async with self._pool.connection() as conn:
            named = await quarantine.tenant_sessions(conn, self._pub.layout, tenant)
        found.update(s for s in named if s == TENANT_SCOPE or _valid_session(s))
        return sorted(found)

    async def erased_sessions(self, tenant: str) -> set[str]:
        """The sessions of ``tenant`` (its tenant scope among them) whose erasure is recorded: their
        data keys are gone already (a tenant's dry run lists them apart and does not count them)."""
        async with self._pool.connection() as conn:
            cur = await conn.execute("SELECT session_id FROM erasures WHERE tenant = %s", (tenant,))
            return {row[0] for row in await cur.fetchall()}

    async def tenant_objects(self, tenant: str, buckets: Sequence[str] = ()) -> list[PrefixSurvey]:
        """What each bucket known to hold the tenant's objects (and each of ``buckets``) holds
        under its prefix (what its erasure would delete)."""
        return await self._tenant_objects.survey(tenant, buckets) if self._tenant_objects is not None else []

    async def tenant_exists(self, tenant: str, buckets: Sequence[str] = ()) -> bool:
        """Whether erasing ``tenant`` has anything to destroy: a session or tenant-level entry with
        a data key, a read-model row or a recorded erasure (a rerun finishes or repeats it), an entry
        in its skills index, an event of it in the log, or an object under its prefix in ``buckets``
        (the buckets Chronicle knows of are named by the entries above). A tenant with none of these
        (a mistyped name) is not erased: its erasure would burn the name for good."""
        if await self._keys.sessions_of(tenant):
            return True
        layout = self._pub.layout
        async with self._pool.connection() as conn:
            cur = await conn.execute("SELECT 1 FROM skills_index WHERE tenant = %s LIMIT 1", (tenant,))
            if await cur.fetchone() is not None:
                return True
            low, high = quarantine.tenant_range(layout, tenant)
            cur = await conn.execute(
                "SELECT 1 FROM quarantine WHERE subject ~>=~ %s AND subject ~<~ %s LIMIT 1", (low, high)
            )
            if await cur.fetchone() is not None:  # a refused event under its prefix (a subject naming no session)
                return True
        try:
            await self._pub.js.get_msg(layout.stream, seq=1, subject=layout.tenant_filter(tenant), next=True)
        except NotFoundError:
            return self._tenant_objects is not None and await self._tenant_objects.held(tenant, buckets)
        return True

    async def _is_applied_erasure(self, seq: int, subject: str) -> bool:
        """Whether the message at ``seq`` is a ``session.erased`` event (never sealed: readable) on
        ``subject`` that the projector has not quarantined."""
        msg = await self._pub.js.get_msg(self._pub.layout.stream, seq, direct=True)
        if msg.subject != subject:
            return False
        try:
            raw = json.loads(msg.data or b"")
        except ValueError:
            return False
        if not (isinstance(raw, dict) and raw.get("type") == SessionErased.model_fields["type"].default):
            return False
        async with self._pool.connection() as conn:
            cur = await conn.execute("SELECT 1 FROM quarantine WHERE seq = %s", (seq,))
            return await cur.fetchone() is None

    async def _exists(self, tenant: str, session: str) -> bool:
        """The log holds an event of the session, or it has a data key (an agent service asked
        for one before publishing to the stream itself), or its erasure is recorded (an erasure
        that stopped after destroying the key and before its event: running it again finishes it),
        or a quarantined event is its (stored on its ids under any partition token, or naming it)."""
        if await self._pub.last_subject_seq(tenant, session) > 0 or await self._keys.has_key(tenant, session):
            return True
        async with self._pool.connection() as conn:
            if await queries.is_erased(conn, tenant, session):
                return True
            # refused events it owns (its ids under another partition's token) or that name it (strays)
            return bool(await quarantine.owned(conn, self._pub.layout, tenant, session)) or bool(
                await quarantine.strays(conn, [(tenant, session)], [])
            )

    async def _delete_quarantined(self, tenant: str, session: str) -> None:
        """Step 4: the quarantined events of the session's ids under any partition token (a tenant
        scope's: of every subject of the tenant naming no session), and its strays (refused on
        another subject of the tenant, their bytes naming the session):
        :func:`projections.quarantine.forget`, indexed lookups. A rebuild tombstones them all
        (:func:`projections.quarantine.refusal_erased`)."""
        async with self._pool.connection() as conn:
            await quarantine.forget(conn, self._pub.layout, [(tenant, session)])

    async def _delete_objects(self, tenant: str, session: str, to_seq: int) -> int:
        refs: dict[str, BlobRef] = {}
        subject = self._pub.layout.session_subject(tenant, session)
        async for stored in eventlog.read(self._pub.js, self._pub.layout, subject, 1, to_seq):
            for ref in refs_in(stored.data):
                refs[f"{ref.store}/{ref.key}"] = ref
        deleted = 0
        for ref in refs.values():
            try:
                data = await self._stores.get(ref)
            except BlobNotFound:
                continue  # already gone (an erasure run again), or in no store configured here
            if belongs_to(data, tenant, session):
                await self._stores.delete(ref)
                deleted += 1
        return deleted
