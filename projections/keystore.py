"""Data keys in Postgres, wrapped by a key-encryption key: the key store of :mod:`events.sealing`.

* :class:`KeyWrapper` is what a KMS implements: wrap and unwrap a data key under a named
  key-encryption key (KEK). :class:`LocalKek` holds the KEKs itself (settings or a secrets file);
  the first is current, the others still unwrap (rotation: add a new first KEK, run
  ``chronicle keys rewrap``, then drop the old one).
* One data key per session, made on its first sealed write (``for_writing``), under a
  transaction-scoped advisory lock shared with :meth:`PgKeyStore.erase`: a key is never made for
  an erased session.
* Readers (the projector, rebuild, replay) :meth:`~PgKeyStore.load` the keys of a batch's
  sessions before admitting it; what was asked about a session (its key, or that it has none) is
  kept while it is used (a session has one key; an erasure reaches a live projector as the
  ``session.erased`` event, in order), for the ``cache_sessions`` most recently used sessions
  (:class:`projections.lru.Lru`): a session is asked about again when an event names a key id not
  held, or when it was evicted. Readers serving a request
  :meth:`~PgKeyStore.refresh` (another process may have erased). Writers poll the erasures
  recorded since their last poll, one query every ``write_ttl_s`` for the whole process, and drop
  the keys of the sessions erased by another process within that time. The poll is not what
  refuses writes: every command's decision reads the erasure, under the log's optimistic
  concurrency (services/writes/optimistic.py), and a refusal drops the key at once (:meth:`forget`).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import logging
import os
import re
import secrets
import time
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol

import psycopg
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from psycopg_pool import AsyncConnectionPool

from events.admission import has_bad_chars
from events.catalog import SessionErased
from events.sealing import KEY_BYTES, DataKey, KeyDestroyed, KeyUnavailable
from projections.lru import Lru

log = logging.getLogger("chronicle.keys")

KEY_CACHE_SESSIONS = 100_000
"""Sessions whose key (or its absence) a key store keeps by default: about 2.5 KB each."""

Pair = tuple[str, str]
"""(tenant, session)"""

_LOCK = "SELECT pg_advisory_xact_lock(hashtext('chronicle-data-key'), hashtext(%s || '/' || %s))"
ERASURE_LOCK = "SELECT pg_advisory_xact_lock(hashtext('chronicle-erasure'), hashtext(%s))"
"""Taken (exclusive, per tenant) by the transaction that records erasures of the tenant's sessions
(:meth:`PgKeyStore.erase`); :func:`erased_under_lock` takes it shared."""
_ERASURE_LOCK_SHARED = "SELECT pg_advisory_xact_lock_shared(hashtext('chronicle-erasure'), hashtext(%s))"


async def erased_under_lock(conn: psycopg.AsyncConnection[Any], pairs: Iterable[Pair]) -> frozenset[Pair]:
    """Which of ``pairs`` are erased, asked in the caller's open transaction under the advisory lock
    :meth:`PgKeyStore.erase` records erasures under (:data:`ERASURE_LOCK`, one per tenant), shared
    here until that transaction ends: an erasure being recorded is waited for and seen, and one
    recorded after this answer waits for the caller's commit (so what the caller writes is there for
    the erasure's later steps to delete). One lock per tenant, not per session: the sessions come
    from what a tenant published (a batch of refusals may name thousands), and Postgres' lock table
    is shared by every connection; the tenants are those whose subjects the caller read. Locks are
    taken in one order (sorted). A pair holding what no id can (a subject may carry a NUL) is never
    erased, and not asked about."""
    todo = sorted({p for p in pairs if not has_bad_chars(list(p))})
    if not todo:
        return frozenset()
    for tenant in sorted({t for t, _ in todo}):
        await conn.execute(_ERASURE_LOCK_SHARED, (tenant,))
    cur = await conn.execute(
        "SELECT e.tenant, e.session_id FROM erasures e JOIN unnest(%s::text[], %s::text[]) AS q(t, s) "
        "ON e.tenant = q.t AND e.session_id = q.s",
        ([t for t, _ in todo], [s for _, s in todo]),
    )
    return frozenset((str(t), str(s)) for t, s in await cur.fetchall())


class KeyWrapper(Protocol):
    """Wraps data keys under a key-encryption key; a KMS client can implement it."""

    @property
    def current(self) -> str: ...

    def wrap(self, secret: bytes, context: bytes) -> tuple[str, bytes]: ...

    def unwrap(self, kek_id: str, wrapped: bytes, context: bytes) -> bytes: ...

    def prove(self, statement: bytes) -> str:
        """``<key id>:<MAC>`` of ``statement`` under the current key-encryption key (an erasure's proof)."""
        ...

    def proves(self, proof: str, statement: bytes) -> bool:
        """Whether ``proof`` is :meth:`prove`'s of ``statement`` under a configured key."""
        ...


KEK_ID = re.compile(r"[A-Za-z0-9._-]{1,64}")
"""A key-encryption key's id (``chronicle keys new-kek`` makes ``kek-<8 hex>``)."""


class LocalKek:
    """Key-encryption keys held by this process: ``{id: 32 bytes}``, the first one current.
    Wrapping is AES-256-GCM (random nonce first) with the session as associated data."""

    def __init__(self, keks: dict[str, bytes]) -> None:
        if not keks:
            raise ValueError("at least one key-encryption key is needed")
        for kek_id, secret in keks.items():
            if not KEK_ID.fullmatch(kek_id):  # it names the key in every wrapped key and erasure proof
                raise ValueError(f"a key-encryption key id is 1 to 64 of A-Z a-z 0-9 . _ -, not {kek_id[:80]!r}")
            if len(secret) != KEY_BYTES:
                raise ValueError(f"key-encryption key {kek_id!r} must be {KEY_BYTES} bytes")
        self._keks = dict(keks)
        self._current = next(iter(keks))

    @classmethod
    def parse(cls, text: str) -> LocalKek:
        """``id:base64[,id:base64...]`` (newest first), as in the setting or its file."""
        keks: dict[str, bytes] = {}
        for entry in text.replace("\n", ",").split(","):
            entry = entry.strip()
            if not entry:
                continue
            kek_id, sep, b64 = entry.partition(":")
            if not sep or not kek_id:
                raise ValueError("a key-encryption key is written 'id:base64 of 32 bytes'")
            keks[kek_id] = base64.b64decode(b64, validate=True)
        return cls(keks)

    @property
    def current(self) -> str:
        return self._current

    def wrap(self, secret: bytes, context: bytes) -> tuple[str, bytes]:
        nonce = os.urandom(12)
        return self._current, nonce + AESGCM(self._keks[self._current]).encrypt(nonce, secret, context)

    def unwrap(self, kek_id: str, wrapped: bytes, context: bytes) -> bytes:
        kek = self._keks.get(kek_id)
        if kek is None:
            raise KeyUnavailable(f"data key wrapped by key-encryption key {kek_id!r}, which is not configured")
        try:
            return AESGCM(kek).decrypt(wrapped[:12], wrapped[12:], context)
        except InvalidTag:
            raise KeyUnavailable(f"a data key does not unwrap with key-encryption key {kek_id!r}") from None

    def prove(self, statement: bytes) -> str:
        return f"{self._current}:{_b64url(self._mac(self._current, statement))}"

    def proves(self, proof: str, statement: bytes) -> bool:
        kek_id, _, mac = proof.partition(":")
        if kek_id not in self._keks:
            return False
        return hmac.compare_digest(mac, _b64url(self._mac(kek_id, statement)))

    def _mac(self, kek_id: str, statement: bytes) -> bytes:
        """HMAC-SHA256 under a key derived from the key-encryption key for this use alone (HKDF):
        a MAC never reveals anything of the key that wraps the data keys."""
        derived = HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=PROOF_KEY_INFO).derive(self._keks[kek_id])
        return hmac.new(derived, statement, hashlib.sha256).digest()


PROOF_KEY_INFO = b"chronicle erasure proof key v1"


def _b64url(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def new_kek_line() -> str:
    """A fresh key-encryption key, as the setting and its file hold it."""
    return f"kek-{secrets.token_hex(4)}:{base64.b64encode(AESGCM.generate_key(bit_length=256)).decode()}"


def _context(tenant: str, session: str) -> bytes:
    return f"data-key\n{tenant}\n{session}".encode()


class PgKeyStore:
    """The data keys of every session, in Postgres (``data_keys``, ``erasures``).

    In memory: what was asked about the ``cache_sessions`` most recently used sessions (their
    keys, or that they have none; None: every session, as a rebuild needs), and the sessions known
    to be erased. An evicted session is asked about again when next loaded. The erased ones are
    kept exactly, unbounded, for the process's life: an erased session must never get its key
    back or take a write, and erasures are rare (a set of pairs, no keys).
    """

    def __init__(
        self,
        pool: AsyncConnectionPool[psycopg.AsyncConnection[Any]],
        wrapper: KeyWrapper | None,
        *,
        seal: bool = False,
        write_ttl_s: float = 2.0,
        cache_sessions: int | None = KEY_CACHE_SESSIONS,
    ) -> None:
        self._pool = pool
        self._wrapper = wrapper
        self.seal = seal and wrapper is not None
        self._ttl = write_ttl_s
        # asked about, least recently used first: the key, or None (it had none when asked)
        self._held: Lru[Pair, DataKey | None] = Lru(cache_sessions)
        self._erased: set[Pair] = set()  # exact and unbounded (see the class)
        self._polled = float("-inf")  # when erasures were last polled (monotonic)
        self._newest: datetime | None = None  # the newest erased_at seen
        self._erased_since = datetime.min.replace(tzinfo=UTC)
        self._learned: dict[Pair, tuple[int, SessionErased]] = {}  # proven, not yet recorded

    @property
    def kek_id(self) -> str | None:
        """The current key-encryption key's id (None: none configured)."""
        return self._wrapper.current if self._wrapper is not None else None

    @property
    def cache_sessions(self) -> int | None:
        """How many sessions' keys are kept at most (None: every one, since :meth:`load_all`)."""
        return self._held.capacity

    @property
    def held_sessions(self) -> int:
        """How many sessions' keys (or their absence) are held in memory now."""
        return len(self._held)

    # -- reading (events.sealing.KeyReader) -------------------------------------------------

    def key(self, tenant: str, session: str, kid: str) -> DataKey:
        pair = (tenant, session)
        if pair in self._erased:
            raise KeyDestroyed(tenant, session)
        found = self._held.get(pair)
        if found is None or found.kid != kid:
            raise KeyUnavailable(f"no data key {kid[:64]!r} for session {session[:64]!r}")
        return found

    def erased(self, tenant: str, session: str) -> bool:
        return (tenant, session) in self._erased

    def forget(self, tenant: str, session: str) -> None:
        """The session is erased (its ``session.erased`` event was read): never read its key again."""
        self._held.pop((tenant, session))
        self._erased.add((tenant, session))

    async def load(self, wanted: Iterable[tuple[str, str, str | None]]) -> None:
        """Ask the database about the sessions not held (never asked about, or evicted), and those
        whose wanted key id is not the one held (a key made since). A session known to have no key
        and not to be erased is not asked again: its erasure reaches this process as its
        ``session.erased`` event. Every session of ``wanted`` not erased is held when this returns,
        however many, even one a concurrent load evicted while this one waited: :meth:`key` answers
        for them until the caller awaits something; after that, a session is evicted only once
        ``cache_sessions`` others were used since (a reader that awaits between events loads each
        sealed one's session again: asked only if evicted)."""
        held, erased = self._held, self._erased
        pairs: set[Pair] = set()
        todo: set[Pair] = set()
        for t, s, kid in wanted:
            pair = (t, s)
            if pair in erased:
                continue
            pairs.add(pair)
            if (
                pair not in held or (kid is not None and getattr(held.get(pair), "kid", None) != kid)
            ) and not has_bad_chars([t, s]):  # a subject may carry what no id can: its events are refused anyway
                todo.add(pair)
        if todo:
            await self._ask(sorted(todo), pairs)

    async def refresh(self, sessions: Iterable[tuple[str, str]]) -> None:
        """Ask the database now (a reader serving a request: another process may have erased)."""
        todo = sorted({p for p in sessions if not has_bad_chars(list(p))})
        if todo:
            await self._ask(todo, todo)

    async def load_all(self) -> None:
        """Every key and erasure (a rebuild reads the whole log): the store holds every session
        from now on, however many (a rebuild's process is a command's, which ends with it)."""
        self._held.unbound()
        async with self._pool.connection() as conn:
            cur = await conn.execute("SELECT tenant, session_id FROM erasures")
            self._erased.update((str(t), str(s)) for t, s in await cur.fetchall())
            cur = await conn.execute("SELECT tenant, session_id, kid, kek_id, wrapped FROM data_keys")
            self._held.put_all(self._unwrap(await cur.fetchall()))

    async def _ask(self, todo: Sequence[Pair], pairs: Iterable[Pair]) -> None:
        """Ask about ``todo``, then hold every one of ``pairs`` not erased, evicting none of them:
        those held before are put back if another caller evicted them while this one waited."""
        held = self._held
        before = {p: held.get(p) for p in pairs if p in held}
        tenants, sids = [t for t, _ in todo], [s for _, s in todo]
        async with self._pool.connection() as conn:
            cur = await conn.execute(
                "SELECT e.tenant, e.session_id FROM erasures e JOIN unnest(%s::text[], %s::text[]) AS q(t, s) "
                "ON e.tenant = q.t AND e.session_id = q.s",
                (tenants, sids),
            )
            gone = await cur.fetchall()
            cur = await conn.execute(
                "SELECT k.tenant, k.session_id, k.kid, k.kek_id, k.wrapped FROM data_keys k "
                "JOIN unnest(%s::text[], %s::text[]) AS q(t, s) ON k.tenant = q.t AND k.session_id = q.s",
                (tenants, sids),
            )
            rows = await cur.fetchall()
        for t, s in gone:
            self.forget(str(t), str(s))
        found = self._unwrap(rows)
        erased = self._erased
        held.put_all(
            {p: found[p] if p in found else held.get(p, before.get(p)) for p in (*todo, *before) if p not in erased}
        )

    def _unwrap(self, rows: Sequence[tuple[Any, ...]]) -> dict[Pair, DataKey]:
        if rows and self._wrapper is None:
            raise KeyUnavailable("sealed data keys exist and no key-encryption key is configured")
        keys: dict[Pair, DataKey] = {}
        for tenant, session, kid, kek_id, wrapped in rows:
            assert self._wrapper is not None
            secret = self._wrapper.unwrap(str(kek_id), bytes(wrapped), _context(str(tenant), str(session)))
            keys[(str(tenant), str(session))] = DataKey(str(kid), secret)
        if rows:
            log.debug("read %d data keys", len(rows))
        return keys

    # -- proven erasures (projections.quarantine.ErasureProofs) ------------------------------

    def proof(self, statement: bytes) -> str | None:
        """A proof of ``statement`` (an erasure's), None without a key-encryption key."""
        return self._wrapper.prove(statement) if self._wrapper is not None else None

    def proven(self, event: SessionErased) -> bool:
        """Whether the erasure carries a proof this store's key-encryption keys vouch for."""
        proof = event.proof
        return proof is not None and self._wrapper is not None and self._wrapper.proves(proof, event.statement())

    def learn(self, seq: int, event: SessionErased) -> None:
        """A proven erasure the database did not hold: the session is erased from now on, and the
        erasure is recorded by :meth:`record_learned` (before what read it commits)."""
        self.forget(event.tenant, event.session)
        self._learned.setdefault((event.tenant, event.session), (seq, event))

    async def record_learned(self) -> int:
        """Record the erasures :meth:`learn` found (destroying their data keys): the ones a
        database restored from an older backup, or rebuilt without one, had lost. Each stays to be
        recorded until it is (idempotent: a concurrent caller records it once). Returns how many."""
        done = 0
        for pair, (seq, event) in list(self._learned.items()):
            tenant, session = pair
            new = await self.erase(tenant, [session], requested_by=event.requested_by, reason=event.reason)
            await self.note_erasure_seq(tenant, session, seq)
            self._learned.pop(pair, None)
            if new:
                done += 1
                log.warning(
                    "recorded the erasure of session %r of tenant %r from its proven session.erased (sequence %d): "
                    "the database did not hold it (restored from a backup older than the erasure?); its data key, "
                    "if any, is destroyed again",
                    session,
                    tenant,
                    seq,
                )
        return done

    # -- writing (events.sealing.KeySource) -------------------------------------------------

    async def for_writing(self, tenant: str, session: str) -> DataKey | None:
        """The key to seal with (None when this store does not seal); :class:`KeyDestroyed` when
        the session is erased, also when nothing is sealed (an erased session takes no writes)."""
        if time.monotonic() - self._polled >= self._ttl:
            await self._poll_erasures()
        pair = (tenant, session)
        if pair in self._erased:
            raise KeyDestroyed(tenant, session)
        if not self.seal:
            return None
        key = self._held.get(pair)
        return key if key is not None else await self.key_of(tenant, session, create=True)

    async def _poll_erasures(self) -> None:
        """Learn the erasures recorded since the last poll (by any process): one query every
        ``write_ttl_s`` for the whole process, however many sessions it writes to. Erasures that
        committed late are caught by looking a minute behind the newest one seen."""
        self._polled = time.monotonic()  # one poll at a time: the others go on with what is known
        async with self._pool.connection() as conn:
            cur = await conn.execute(
                "SELECT tenant, session_id, erased_at FROM erasures WHERE erased_at > %s",
                (self._erased_since,),
            )
            rows = await cur.fetchall()
        for tenant, session, at in rows:
            self.forget(str(tenant), str(session))
            if self._newest is None or at > self._newest:
                self._newest = at
        if self._newest is not None:
            self._erased_since = self._newest - timedelta(minutes=1)

    async def key_of(self, tenant: str, session: str, *, create: bool) -> DataKey | None:
        """The session's key from the database (made when ``create`` and there is none);
        :class:`KeyDestroyed` when erased; None when there is none and none is made."""
        pair = (tenant, session)
        async with self._pool.connection() as conn, conn.transaction():
            await conn.execute(_LOCK, pair)
            cur = await conn.execute("SELECT 1 FROM erasures WHERE tenant = %s AND session_id = %s", pair)
            if await cur.fetchone() is not None:
                self.forget(tenant, session)
                raise KeyDestroyed(tenant, session)
            cur = await conn.execute(
                "SELECT tenant, session_id, kid, kek_id, wrapped FROM data_keys WHERE tenant = %s AND session_id = %s",
                pair,
            )
            rows = await cur.fetchall()
            if not rows and create and self._wrapper is not None:
                kid = f"dk-{secrets.token_hex(8)}"
                kek_id, wrapped = self._wrapper.wrap(os.urandom(KEY_BYTES), _context(tenant, session))
                await conn.execute(
                    "INSERT INTO data_keys (tenant, session_id, kid, kek_id, wrapped) VALUES (%s, %s, %s, %s, %s)",
                    (tenant, session, kid, kek_id, wrapped),
                )
                rows = [(tenant, session, kid, kek_id, wrapped)]
        found = self._unwrap(rows)
        self._held.put_all(found)
        return found.get(pair)

    # -- erasing ----------------------------------------------------------------------------

    async def erase(
        self, tenant: str, sessions: Iterable[str], *, requested_by: str | None = None, reason: str | None = None
    ) -> list[str]:
        """Destroy the data keys of ``sessions`` and record their erasure (who asked and why);
        returns the sessions whose erasure is new. Idempotent: a rerun keeps the first record."""
        new: list[str] = []
        async with self._pool.connection() as conn, conn.transaction():
            await conn.execute(ERASURE_LOCK, (tenant,))  # projector batches recording refusals wait (erased_under_lock)
            for session in sorted(set(sessions)):
                await conn.execute(_LOCK, (tenant, session))
                await conn.execute("DELETE FROM data_keys WHERE tenant = %s AND session_id = %s", (tenant, session))
                cur = await conn.execute(
                    "INSERT INTO erasures (tenant, session_id, requested_by, reason) VALUES (%s, %s, %s, %s) "
                    "ON CONFLICT DO NOTHING RETURNING 1",
                    (tenant, session, requested_by, reason),
                )
                if await cur.fetchone() is not None:
                    new.append(session)
        for session in sessions:
            self.forget(tenant, session)
        return new

    async def erasure_record(self, tenant: str, session: str) -> tuple[str | None, str | None]:
        """``(requested_by, reason)`` of the session's recorded erasure (its first record)."""
        async with self._pool.connection() as conn:
            cur = await conn.execute(
                "SELECT requested_by, reason FROM erasures WHERE tenant = %s AND session_id = %s", (tenant, session)
            )
            row = await cur.fetchone()
        return (None, None) if row is None else (row[0], row[1])

    async def erasure_seq(self, tenant: str, session: str) -> int | None:
        """The sequence of the erasure's ``session.erased`` event, as :meth:`note_erasure_seq` noted
        it (None: not erased, or its event not published yet)."""
        async with self._pool.connection() as conn:
            cur = await conn.execute(
                "SELECT seq FROM erasures WHERE tenant = %s AND session_id = %s", (tenant, session)
            )
            row = await cur.fetchone()
        return None if row is None or row[0] is None else int(row[0])

    async def note_erasure_seq(self, tenant: str, session: str, seq: int) -> None:
        """Record the sequence of the erasure's ``session.erased`` event (once: a rerun's is the same
        event, or a later copy of it that changes nothing)."""
        async with self._pool.connection() as conn:
            await conn.execute(
                "UPDATE erasures SET seq = %s WHERE tenant = %s AND session_id = %s AND seq IS NULL",
                (seq, tenant, session),
            )

    async def has_key(self, tenant: str, session: str) -> bool:
        """Whether the session has a data key (one was made, and not destroyed)."""
        async with self._pool.connection() as conn:
            cur = await conn.execute("SELECT 1 FROM data_keys WHERE tenant = %s AND session_id = %s", (tenant, session))
            return await cur.fetchone() is not None

    async def sessions_of(self, tenant: str) -> list[str]:
        """Every session of ``tenant`` with a key, a read-model row or an erasure."""
        async with self._pool.connection() as conn:
            cur = await conn.execute(
                "SELECT session_id FROM data_keys WHERE tenant = %s UNION SELECT id FROM sessions WHERE tenant = %s "
                "UNION SELECT session_id FROM erasures WHERE tenant = %s",
                (tenant, tenant, tenant),
            )
            return sorted(str(r[0]) for r in await cur.fetchall())

    async def rewrap(self) -> int:
        """Wrap every data key under the current key-encryption key (after a KEK rotation)."""
        if self._wrapper is None:
            raise KeyUnavailable("no key-encryption key is configured")
        done = 0
        async with self._pool.connection() as conn, conn.transaction():
            cur = await conn.execute(
                "SELECT tenant, session_id, kek_id, wrapped FROM data_keys WHERE kek_id <> %s FOR UPDATE",
                (self._wrapper.current,),
            )
            for tenant, session, kek_id, wrapped in await cur.fetchall():
                ctx = _context(str(tenant), str(session))
                secret = self._wrapper.unwrap(str(kek_id), bytes(wrapped), ctx)
                new_id, new_wrapped = self._wrapper.wrap(secret, ctx)
                await conn.execute(
                    "UPDATE data_keys SET kek_id = %s, wrapped = %s WHERE tenant = %s AND session_id = %s",
                    (new_id, new_wrapped, tenant, session),
                )
                done += 1
        return done
