"""Quarantine: stored events no projection applies, recorded instead of stopping a projector.

Pure core: :func:`screen` decides, for one stored event, the admitted event or the quarantine
item (the same bytes and subject always decide the same). Thin shell: :func:`record` writes items
inside the caller's transaction, the one that moves the checkpoint past them.
"""

from __future__ import annotations

import functools
import json
import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

import psycopg

from events.admission import Reason, Refused, admit
from events.catalog import SessionErased
from events.envelope import Event
from events.ids import (
    MAX_SESSION_LEN,
    TENANT_SCOPE,
    InvalidId,
    check_session,
    check_tenant,
    decode_token,
    encode_token,
)
from events.sealing import KeyDestroyed, KeyLookup, KeyReader
from events.subjects import SubjectLayout

log = logging.getLogger("chronicle.quarantine")

MAX_DETAIL = 500

DATA_ERRORS: tuple[type[Exception], ...] = (
    psycopg.errors.DataError,  # SQLSTATE class 22: a value the column cannot hold
    psycopg.errors.IntegrityError,  # class 23: a constraint the rows would break
    psycopg.errors.ProgramLimitExceeded,  # 54000: e.g. a text too long for a tsvector
)
"""What a projection raises for an event's data (decided by the data, so the same on a rebuild),
as opposed to a failure of the database itself (retried, never quarantined)."""


@dataclass(frozen=True, slots=True)
class Quarantined:
    """One stored event that no projection applies, and why."""

    seq: int
    subject: str
    reason: Reason
    detail: str
    raw: bytes


def storable_text(value: str, limit: int = MAX_DETAIL) -> str:
    """``value`` as Postgres ``text`` can hold it: NUL and lone surrogates escaped, bounded."""
    text = value.encode("utf-8", "backslashreplace").decode("utf-8").replace("\x00", "\\x00")
    return text[:limit]


UNRECORDED = (
    "session.erased for a session whose erasure is not recorded: not published by Chronicle's "
    "erasure (which destroys the key and records it first), so the session is kept"
)


@dataclass(frozen=True, slots=True)
class Tombstone:
    """A stored event of an erased session: not applied, not quarantined; the checkpoint moves past it."""

    seq: int
    subject: str


class Erasures(Protocol):
    """Whether a session is erased: what decides a refusal's fate (a :class:`KeyLookup` answers it,
    and so does :class:`ErasedSet`)."""

    def erased(self, tenant: str, session: str) -> bool: ...


@dataclass(frozen=True, slots=True)
class ErasedSet:
    """The erased sessions among those asked about (:func:`projections.keystore.erased_under_lock`)."""

    pairs: frozenset[tuple[str, str]]

    def erased(self, tenant: str, session: str) -> bool:
        return (tenant, session) in self.pairs


class ErasureProofs(Protocol):
    """Tells a ``session.erased`` that Chronicle made (its proof holds: :class:`events.catalog.SessionErased`)
    and takes note of one the database does not hold (:class:`projections.keystore.PgKeyStore`)."""

    def proven(self, event: SessionErased) -> bool: ...

    def learn(self, seq: int, event: SessionErased) -> None: ...


def screen(
    seq: int,
    subject: str,
    data: bytes,
    layout: SubjectLayout,
    keys: KeyReader | None = None,
    proofs: ErasureProofs | None = None,
) -> tuple[int, Event] | Quarantined | Tombstone:
    """The admitted ``(seq, event)``, the quarantine item the contract's refusal makes, or a
    :class:`Tombstone` for an event of an erased session (its key destroyed, or its erasure
    recorded: nothing of an erased session is materialised, whether sealed or not). A refused
    event under an erased session's subject, or whose body names an erased session of the
    subject's tenant (a stray: it arrived on another subject of the tenant), is a tombstone too,
    never quarantined (its raw bytes are the session's; :func:`refusal_erased`): the subject and
    bytes decide, so the live projector (whose erasure deletes what it quarantined before) and a
    rebuild (which knows every erasure) agree. The ``session.erased`` event itself is admitted
    (projections drop the session's rows) only when
    ``keys`` knows the erasure as recorded: the real erasure records it (and destroys the key)
    before publishing the event, so one that is not recorded was published by the tenant itself
    and is quarantined (``unrecorded_erasure``): nothing was destroyed, so nothing is dropped,
    unless its proof holds (``proofs``): Chronicle made it, and the database lost its record
    (restored from an older backup, or rebuilt without one): it is admitted, and ``proofs``
    learns it, to record it again (the caller records before it commits what it read). The
    caller loads ``keys`` first (:meth:`~projections.keystore.PgKeyStore.refresh` the session when
    it gets that reason, as an erasure may be newer than what it holds)."""
    try:
        event = admit(data, subject, layout, keys)
    except KeyDestroyed:
        return Tombstone(seq, subject)
    except Refused as exc:
        if keys is not None and refusal_erased(subject, data, layout, keys):
            return Tombstone(seq, subject)  # its raw bytes are the erased session's: never stored again
        return refused_item(seq, subject, data, exc)
    if keys is not None:
        if isinstance(event, SessionErased):
            if not keys.erased(event.tenant, event.session):
                if proofs is None or not proofs.proven(event):
                    return Quarantined(seq, subject, "unrecorded_erasure", UNRECORDED, data)
                proofs.learn(seq, event)
            keys.forget(event.tenant, event.session)
        elif keys.erased(event.tenant, event.session):
            return Tombstone(seq, subject)
    return seq, event


def tombstone_erased(items: Sequence[tuple[int, Event]], keys: KeyLookup) -> tuple[list[tuple[int, Event]], list[int]]:
    """``items`` (admitted by :func:`screen`) split into those still to apply and the sequences
    that are tombstones now: the events of a session ``keys`` has learned as erased since they
    were screened (its ``session.erased``, proven or recorded, came later in the same batch), as
    :func:`screen` decides them now and a rebuild that knows the erasure decides them. Their
    data key is destroyed, so a sealed claim-checked body of theirs no longer opens. The
    ``session.erased`` events stay: they drop the session's rows."""
    kept: list[tuple[int, Event]] = []
    gone: list[int] = []
    for seq, event in items:
        if not isinstance(event, SessionErased) and keys.erased(event.tenant, event.session):
            gone.append(seq)
        else:
            kept.append((seq, event))
    return kept, gone


def tombstone_refused(
    refused: Sequence[Quarantined], layout: SubjectLayout, keys: Erasures
) -> tuple[list[Quarantined], list[int]]:
    """``refused`` (quarantine items :func:`screen` made) split into those still to record and the
    sequences that are tombstones now: the refusals of a session ``keys`` has learned as erased
    since they were screened (:func:`refusal_erased`: a stray waiting in another partition's batch
    while the session's erasure ran), as :func:`screen` decides them now and a rebuild that knows
    the erasure decides them."""
    kept: list[Quarantined] = []
    gone: list[int] = []
    for q in refused:
        if refusal_erased(q.subject, q.raw, layout, keys):
            gone.append(q.seq)
        else:
            kept.append(q)
    return kept, gone


def refused_sessions(refused: Iterable[Quarantined], layout: SubjectLayout) -> set[tuple[str, str]]:
    """The sessions whose erasure decides what becomes of ``refused``: each one's subject's
    (:func:`subject_owner`), and the one of its tenant that its bytes name (a stray's:
    :func:`named_session`)."""
    found: set[tuple[str, str]] = set()
    for q in refused:
        if (owner := subject_owner(q.subject, layout)) is not None:
            found.add(owner)
        if (named := named_session(q.subject, q.raw, layout)) is not None:
            found.add(named)
    return found


def subject_owner(subject: str, layout: SubjectLayout) -> tuple[str, str] | None:
    """The session whose erasure decides a refusal stored on ``subject``, from the subject alone:
    ``(tenant, session)`` for the session's ids under any partition token (``<prefix>.<tenant>.<any
    token>.<session>``, the tokens canonical, the session a valid id: the subject the stored message
    is filed under, whatever its bytes say); ``(tenant, TENANT_SCOPE)`` for any other subject under
    the tenant's prefix (``<prefix>.<tenant>.``: no session, or a session token that is no valid id),
    decided by the tenant scope's erasure, the last step of a tenant's; None for a subject under no
    tenant's prefix (no tenant published it). The tenant is its exact token (a tenant id is its own
    token); nothing else is read, so another tenant's subject never maps to this tenant. A session
    token that is not the canonical encoding of its id (``a:b``, ``hé``: NATS takes them; or a
    subject as the quarantine table stores it, its NUL escaped) is the tenant scope's: an erasure
    finds a session's rows by its canonical token, and the stored and the live subject must agree."""
    head = layout.prefix + "."
    if not subject.startswith(head):
        return None
    tokens = subject[len(head) :].split(".")
    if len(tokens) < 2:
        return None
    try:
        tenant = check_tenant(tokens[0])
    except InvalidId:
        return None
    if len(tokens) == 3:
        try:
            session = decode_token(tokens[2])
            if encode_token(session) == tokens[2]:  # the canonical token only: a plain ``a:b`` or ``hé`` is none
                return tenant, session if session == TENANT_SCOPE else check_session(session)
        except ValueError:  # not canonical, not UTF-8, not an id (InvalidId, UnicodeDecodeError)
            pass
    return tenant, TENANT_SCOPE


def subject_erased(subject: str, layout: SubjectLayout, keys: Erasures) -> bool:
    """Whether the session that owns ``subject`` (:func:`subject_owner`) is one ``keys`` knows as
    erased: its ids under any partition token, or, for a subject under a tenant's prefix that
    names no session, the tenant scope (erased by a tenant's erasure). The subject decides (the
    session a stored message is filed under, whatever its bytes say): a refused event of an erased
    session is a tombstone, never quarantined (its raw bytes are that session's content). A
    subject under no tenant's prefix decides nothing here."""
    owner = subject_owner(subject, layout)
    return owner is not None and keys.erased(*owner)


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


@functools.lru_cache(maxsize=16)
def body_names(data: bytes) -> tuple[str, str] | None:
    """The ``(tenant, session)`` that ``data`` names: its ``tenant`` and ``session`` when it is a
    JSON object holding both as strings, the tenant a tenant id (:func:`~events.ids.check_tenant`)
    and the session of at most ``MAX_SESSION_LEN`` characters without a NUL or a lone surrogate (what
    an index entry and Postgres text can hold; another is no session id, so never erased); None
    otherwise (not JSON, or cut). Parsed only for events already refused (rare), and once for the
    several decisions one refusal takes (screening, the rechecks, the row: the last few are kept).

    Read as migration 031 reads the rows it fills (UTF-8 text, strict JSON): no byte-order mark or
    other encoding, no ``NaN``/``Infinity``, numbers of any length (never converted)."""
    try:
        found: Any = json.loads(data.decode(), parse_int=str, parse_float=str, parse_constant=_no_constant)
    except (ValueError, RecursionError):  # UnicodeDecodeError is a ValueError
        return None
    if not isinstance(found, dict):
        return None
    tenant, session = found.get("tenant"), found.get("session")
    if not isinstance(tenant, str) or not isinstance(session, str):
        return None
    if len(session) > MAX_SESSION_LEN or "\x00" in session:
        return None
    try:
        session.encode()  # a lone surrogate (an escape in the JSON) is no text Postgres holds
        return check_tenant(tenant), session
    except (InvalidId, UnicodeEncodeError):
        return None


def named_session(subject: str, data: bytes, layout: SubjectLayout) -> tuple[str, str] | None:
    """The session of the subject's tenant that a refused event's bytes name (:func:`body_names`):
    ``(tenant, session)`` when ``subject`` is a session subject (:meth:`SubjectLayout.parse`) whose
    tenant is the one the bytes name; None otherwise. A tenant publishes only on its own subjects,
    so bytes naming another tenant's session decide nothing about that session: whether it is
    erased must not show in this tenant's quarantine. Recorded with the row (``named_tenant``,
    ``named_session``: :func:`record`, from the whole event), where an erasure finds its strays."""
    try:
        tenant, _ = layout.parse(subject)
    except ValueError:
        return None
    named = body_names(data)
    return named if named is not None and named[0] == tenant else None


def refusal_erased(subject: str, data: bytes, layout: SubjectLayout, keys: Erasures) -> bool:
    """Whether a refused event is an erased session's: filed under its subject
    (:func:`subject_erased`), or its bytes name it, a session of the subject's tenant
    (:func:`named_session`: a stray, stored on another session's subject or another partition's
    token). Either way its raw bytes may be the session's content, so it is a tombstone, never
    quarantined; the same bytes and the same erasures decide the same, live and in a rebuild."""
    if subject_erased(subject, layout, keys):
        return True
    named = named_session(subject, data, layout)
    return named is not None and keys.erased(*named)


def refused_item(seq: int, subject: str, data: bytes, exc: Refused) -> Quarantined:
    """The quarantine item of the stored event ``data`` the contract refused with ``exc``."""
    return Quarantined(seq, subject, exc.reason, exc.detail, data)


def data_error(seq: int, subject: str, data: bytes, projection: str, exc: Exception) -> Quarantined:
    """The quarantine item of an admitted event that ``projection``'s database refused."""
    state = getattr(exc, "sqlstate", None) or "client"
    detail = f"{projection}: {type(exc).__name__} [{state}]: {str(exc).strip()}"
    return Quarantined(seq, subject, "data_error", detail, data)


RAW_KEPT = 65_536
"""How much of a quarantined event's bytes Postgres keeps (the whole event stays in the log)."""
INSERT_BYTES = 16 << 20
"""At most this much raw data in one insert (a batch of a thousand 1 MiB events was one parameter
over Postgres's 1 GB message limit)."""

_INSERT = (
    "INSERT INTO quarantine (seq, subject, reason, detail, raw, size, consumer, named_tenant, named_session, "
    "recorded_at) SELECT seq, subject, reason, detail, raw, size, consumer, named_tenant, named_session, "
    "coalesce(stored_at, now()) FROM unnest(%s::bigint[], %s::text[], %s::text[], %s::text[], %s::bytea[], "
    "%s::int[], %s::text[], %s::text[], %s::text[], %s::timestamptz[]) "
    "AS q(seq, subject, reason, detail, raw, size, consumer, named_tenant, named_session, stored_at) "
    "ON CONFLICT (seq) DO NOTHING RETURNING seq"
)


def _chunks(items: Sequence[Quarantined]) -> list[list[Quarantined]]:
    """``items`` in inserts of at most ``INSERT_BYTES`` of kept raw data (at least one item each)."""
    chunks: list[list[Quarantined]] = [[]]
    size = 0
    for q in items:
        kept = min(len(q.raw), RAW_KEPT)
        if chunks[-1] and size + kept > INSERT_BYTES:
            chunks.append([])
            size = 0
        chunks[-1].append(q)
        size += kept
    return chunks


async def record(
    conn: psycopg.AsyncConnection[Any],
    consumer: str,
    items: Sequence[Quarantined],
    layout: SubjectLayout | None = None,
    *,
    announce: bool = True,
    stored: Mapping[int, datetime] | None = None,
) -> int:
    """Record ``items`` (a sequence already recorded, by any consumer, is left as it is; each with
    its first ``RAW_KEPT`` bytes and its size); returns how many rows are new. With ``layout``, each
    row keeps the session of its subject's tenant that its whole bytes name (:func:`named_session`,
    decided here, before the bytes are cut; the projector and a rebuild always pass it). ``announce``
    logs one warning per new row (live projectors). ``stored`` holds when the stream stored each
    sequence (its JetStream timestamp), the row's ``recorded_at``: the same for the live projector
    and a rebuild of the same log (the projector and a rebuild always pass it; a sequence it lacks
    is recorded at the transaction's time)."""
    if not items:
        return 0
    new: set[int] = set()
    for chunk in _chunks(items):
        named = [named_session(q.subject, q.raw, layout) if layout is not None else None for q in chunk]
        cur = await conn.execute(
            _INSERT,
            (
                [q.seq for q in chunk],
                [storable_text(q.subject) for q in chunk],
                [q.reason for q in chunk],
                [storable_text(q.detail) for q in chunk],
                [q.raw[:RAW_KEPT] for q in chunk],
                [len(q.raw) for q in chunk],
                [consumer] * len(chunk),
                [n[0] if n is not None else None for n in named],
                [n[1] if n is not None else None for n in named],
                [stored.get(q.seq) if stored is not None else None for q in chunk],
            ),
        )
        new.update(int(row[0]) for row in await cur.fetchall())
    if announce:
        for q in items:
            if q.seq in new:
                log.warning(
                    "quarantined event %d on %s (%s): %s", q.seq, storable_text(q.subject, 200), q.reason, q.detail
                )
    return len(new)


_STRAYS = (
    "SELECT seq FROM quarantine WHERE named_tenant = %(tenant)s AND named_session = %(session)s "
    "AND subject <> ALL(%(own)s::text[]) AND seq >= %(from)s AND (%(to)s::bigint IS NULL OR seq <= %(to)s)"
)
"""One session's strays: an equality lookup on the index ``quarantine_named`` (migration 031); the
columns are set only on rows whose bytes name a session of their own subject's tenant."""


async def strays(
    conn: psycopg.AsyncConnection[Any],
    sessions: Iterable[tuple[str, str]],
    own: Sequence[str],
    from_seq: int = 1,
    to_seq: int | None = None,
) -> list[int]:
    """The sequences, in order, of the quarantined events stored on a subject not in ``own`` (the
    sessions' own subjects) whose bytes name one of ``sessions`` (``(tenant, session)``), a session
    of the tenant whose subject they were stored on (:func:`named_session`, recorded with the row
    from the whole event): the strays a rebuild tombstones once the session is erased
    (:func:`refusal_erased`). Reads only those rows (by index), never another tenant's, nor the log."""
    found: set[int] = set()
    for tenant, session in sorted(set(sessions)):
        cur = await conn.execute(
            _STRAYS,
            {"tenant": tenant, "session": session, "own": list(own), "from": max(from_seq, 1), "to": to_seq},
        )
        found.update(int(row[0]) for row in await cur.fetchall())
    return sorted(found)


def tenant_range(layout: SubjectLayout, tenant: str) -> tuple[str, str]:
    """``(low, high)``: the subjects under ``tenant``'s prefix (``<prefix>.<tenant>.``) are exactly
    those ``low <= subject < high`` compared byte by byte (``~>=~``/``~<~``, the operators of the
    index ``quarantine_subject_pattern``, migration 032): no pattern, so no wildcard in an id can
    widen it (``_`` is a ``LIKE`` wildcard and a tenant id's character)."""
    low = f"{layout.prefix}.{check_tenant(tenant)}."
    return low, _after(low)


def _after(low: str) -> str:
    """The least string past every one that starts with ``low`` (which ends in ``.``)."""
    return low[:-1] + chr(ord(".") + 1)


_OWNED_TENANT = "SELECT seq, subject FROM quarantine WHERE subject ~>=~ %(low)s AND subject ~<~ %(high)s"
"""Rows under one tenant's prefix: a range of the index ``quarantine_subject_pattern``."""
_OWNED_SESSION = (
    "SELECT seq, subject FROM quarantine WHERE reverse(subject) ~>=~ %(rlow)s AND reverse(subject) ~<~ %(rhigh)s "
    "AND subject ~>=~ %(low)s AND subject ~<~ %(high)s"
)
"""Rows under one tenant's prefix that end in one session's token: a range of the index
``quarantine_subject_reversed`` (the subjects ending in ``.<token>``), then the tenant's range."""


async def owned(conn: psycopg.AsyncConnection[Any], layout: SubjectLayout, tenant: str, session: str) -> list[int]:
    """The sequences of the quarantined events whose subject the session owns
    (:func:`subject_owner`: its ids under any partition token; for the tenant scope, every other
    subject under the tenant's prefix too). Reads by index the subjects of this tenant's rows only
    (those ending in the session's token; every one for the tenant scope), never their raw bytes."""
    low, high = tenant_range(layout, tenant)
    if session == TENANT_SCOPE:
        cur = await conn.execute(_OWNED_TENANT, {"low": low, "high": high})
    else:
        rlow = ("." + encode_token(session))[::-1]  # a token is ASCII: reversed as Postgres reverses it
        cur = await conn.execute(_OWNED_SESSION, {"rlow": rlow, "rhigh": _after(rlow), "low": low, "high": high})
    rows = await cur.fetchall()
    return sorted(int(seq) for seq, subject in rows if subject_owner(subject, layout) == (tenant, session))


async def tenant_sessions(conn: psycopg.AsyncConnection[Any], layout: SubjectLayout, tenant: str) -> set[str]:
    """The sessions of ``tenant`` whose erasure decides one of its quarantined events: the owner of
    each subject under its prefix (:func:`subject_owner`; the tenant scope among them) and each
    session its rows' bytes name (``named_session``, recorded with the row), whether or not the
    session has an event, a key or a row anywhere else (a session that exists only through refused
    events). Reads this tenant's rows only, by index."""
    low, high = tenant_range(layout, tenant)
    cur = await conn.execute(
        "SELECT DISTINCT subject FROM quarantine WHERE subject ~>=~ %s AND subject ~<~ %s", (low, high)
    )
    found = {owner[1] for (subject,) in await cur.fetchall() if (owner := subject_owner(subject, layout)) is not None}
    cur = await conn.execute("SELECT DISTINCT named_session FROM quarantine WHERE named_tenant = %s", (tenant,))
    found.update(str(s) for (s,) in await cur.fetchall() if s is not None)
    return found


async def forget(
    conn: psycopg.AsyncConnection[Any], layout: SubjectLayout, sessions: Iterable[tuple[str, str]]
) -> None:
    """Delete the quarantined events of erased ``sessions``: those stored on a subject the session
    owns (:func:`owned`: its ids under any partition token; for a tenant scope, every subject of its
    tenant that names no session) and those whose bytes name it (its strays, on any subject of the
    tenant: ``named_session``), as a rebuild that knows the erasures tombstones them all
    (:func:`refusal_erased`). Each an indexed lookup: no other tenant's rows are read."""
    for tenant, session in sorted(set(sessions)):
        gone = set(await owned(conn, layout, tenant, session))
        gone.update(await strays(conn, [(tenant, session)], []))
        if gone:
            await conn.execute("DELETE FROM quarantine WHERE seq = ANY(%s)", (sorted(gone),))
