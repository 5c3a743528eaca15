"""Which event log the read models belong to: checked by every component before it reads or
writes by them.

A projector's checkpoints (``<name>`` and ``<name>.pNNN``) are stream sequences; they mean
something only in the stream they were taken in. A stream deleted and made again under the same
name (its data directory wiped), another server's stream, or a database restored next to the
wrong log starts at sequence 1 under checkpoints further on: the projector would skip the new
log's first events as already applied, and the API would answer appends from read models of the
other log. So ``log_binding`` records, per projector, the stream and its identity as JetStream
reports it (the stream's creation time from stream info: the same on every node of a cluster and
across leader changes, since it comes from the stream's assignment, not from a node), and
:func:`check_log` refuses when

* the binding names another stream, or the stream's creation time differs from the bound one, or
* a checkpoint is beyond the stream's last sequence (the read models hold events this log does
  not: a second, independent symptom, which also covers a purged or truncated stream).

The first component that starts on an empty binding records it, in the transaction that reads the
checkpoints, but only while the stream is still empty, or the database already holds read models
of it (checkpoints from before the binding existed, or another projector, a selective runner,
bound to the same stream): a database that has never held read models of the stream next to a
stream that already holds events is refused with :class:`NeverBound`. Such
a database was most likely lost or replaced, and Postgres holds what the log cannot restore (the
sessions' data keys and the erasure records): binding it silently would replay the log into it,
mint new keys for old sessions and hide the loss. A rebuild binds the database to the stream it
rebuilt from (the deliberate way to build read models of a log in a new database); ``chronicle
log rebind --yes`` rewrites the binding after a deliberate restore.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg
from nats.js import JetStreamContext

log = logging.getLogger("chronicle.logbinding")

REMEDY = (
    "Nothing was consumed. Either rebuild the read models from this log (`chronicle rebuild`), or point "
    "CHRONICLE_DATABASE_URL / CHRONICLE_NATS_URL / CHRONICLE_STREAM at the database and the log that belong "
    "together. After a deliberate restore (this log restored from a backup of the one the read models were made "
    "from), `chronicle log rebind --yes` records this stream as theirs."
)
EMPTY_REMEDY = (
    "Nothing was consumed. The stream holds no events, so this NATS server is most likely not the stack's: set "
    "CHRONICLE_NATS_URL (and CHRONICLE_NATS_NKEY_SEED) to the NATS server of the stack this database belongs to. "
    "If that log was lost (its NATS data wiped), restore it from its archive (`chronicle archive --restore`); only "
    "if it is lost for good does `chronicle rebuild` make the read models match this empty one."
)
"""What to do when the stream the read models do not match is empty: a rebuild or a rebind would
empty the read models or bind them to nothing; the likely cause is a NATS server that never held
the log (the default ``CHRONICLE_NATS_URL``, another stack's)."""


@dataclass(frozen=True, slots=True)
class LogIdentity:
    """A stream as JetStream reports it now: its name, creation time (None: not reported) and last sequence."""

    stream: str
    created: datetime | None
    last_seq: int


@dataclass(frozen=True, slots=True)
class Binding:
    """The log a projector's checkpoints (and so the read models) were made from."""

    projector: str
    stream: str
    created: datetime | None
    first_seen: datetime


class LogMismatch(RuntimeError):
    """The read models belong to another event log than the stream this process is set to: the
    process refuses to start (it would skip or misread events). ``str()`` says what differs and
    what to do: rebuild or rebind (:data:`REMEDY`) when the stream holds events, point the
    settings at the stack's NATS server (:data:`EMPTY_REMEDY`) when it holds none."""

    def __init__(
        self,
        detail: str,
        *,
        database: str,
        identity: LogIdentity,
        bound: Binding | None = None,
        checkpoint: tuple[str, int] | None = None,
    ) -> None:
        self.remedy = self.remedy_for(identity, bound)
        super().__init__(f"{detail}. {self.remedy}")
        self.detail = detail
        self.database = database
        self.identity = identity
        self.bound = bound
        self.checkpoint = checkpoint

    def remedy_for(self, identity: LogIdentity, bound: Binding | None) -> str:
        """What to do: :data:`EMPTY_REMEDY` when the (same) stream holds no events, else :data:`REMEDY`."""
        same_stream = bound is None or bound.stream == identity.stream  # (another name: CHRONICLE_STREAM)
        return EMPTY_REMEDY if identity.last_seq == 0 and same_stream else REMEDY

    def restated(self, detail: str) -> LogMismatch:
        """The same mismatch, said by a tool that refuses because of it (``detail`` first)."""
        return type(self)(
            f"{detail}: {self.detail}",
            database=self.database,
            identity=self.identity,
            bound=self.bound,
            checkpoint=self.checkpoint,
        )


class LogAbsent(LookupError):
    """The stream is not on this NATS server, but the database's read models were made from a log
    (it is bound to one, or holds checkpoints): the server is not the stack's. Raised before
    anything is created there (a stream made here would be another log, refused at once by
    :func:`check_log`, and left behind on a server that is not Chronicle's)."""

    def __init__(
        self, stream: str, *, database: str, bound: Binding | None, checkpoint: tuple[str, int] | None
    ) -> None:
        made = (
            f"stream {bound.stream!r} created {_when(bound.created)}"
            if bound is not None
            else f"a stream {stream!r} (checkpoint {checkpoint[0]!r} at sequence {checkpoint[1]})"
            if checkpoint is not None
            else f"a stream {stream!r}"
        )
        super().__init__(f"no stream {stream!r} here; the read models in database {database} were made from {made}")
        self.stream = stream
        self.database = database
        self.bound = bound
        self.checkpoint = checkpoint


async def refuse_absent_log(conn: psycopg.AsyncConnection[Any], stream: str, projector: str) -> None:
    """For a process that found no ``stream`` on its NATS server, before it creates anything
    there: raise :class:`LogAbsent` when the database's read models were made from a log (a
    binding, or a checkpoint past sequence 0). A database with neither (a new deployment) passes."""
    bound = await read_binding(conn, projector)
    furthest = await highest_checkpoint(conn, projector)
    if bound is not None or (furthest is not None and furthest[1] > 0):
        raise LogAbsent(stream, database=database_of(conn), bound=bound, checkpoint=furthest)


NEVER_BOUND_REMEDY = (
    "If the database was lost or replaced, restore it from a backup: it holds the sessions' data keys and the "
    "erasure records, which the log cannot restore. To build read models of this log in a new database on "
    "purpose, run `chronicle rebuild` (which records the binding). Nothing was consumed."
)


class NeverBound(LogMismatch):
    """The database has never held read models of the stream (no projector bound to it, no
    checkpoint of this one) and the stream already holds events: refused rather than bound, since
    a lost database also lost the data keys and erasure records. ``chronicle rebuild`` binds it
    on purpose."""

    def remedy_for(self, identity: LogIdentity, bound: Binding | None) -> str:
        return NEVER_BOUND_REMEDY


def _when(at: datetime | None) -> str:
    return at.isoformat() if at is not None else "(not reported)"


def database_of(conn: psycopg.AsyncConnection[Any]) -> str:
    """``name`` on ``host:port``, no credentials."""
    info = conn.info
    return f"{info.dbname!r} on {info.host}:{info.port}"


async def stream_identity(js: JetStreamContext, stream: str) -> LogIdentity:
    info = await js.stream_info(stream)
    return LogIdentity(stream, info.created, int(info.state.last_seq))


async def read_binding(conn: psycopg.AsyncConnection[Any], projector: str, *, lock: bool = False) -> Binding | None:
    cur = await conn.execute(
        "SELECT projector, stream, stream_created, first_seen FROM log_binding WHERE projector = %s"
        + (" FOR UPDATE" if lock else ""),
        (projector,),
    )
    row = await cur.fetchone()
    return Binding(str(row[0]), str(row[1]), row[2], row[3]) if row else None


async def highest_checkpoint(conn: psycopg.AsyncConnection[Any], projector: str) -> tuple[str, int] | None:
    """The furthest checkpoint of ``projector`` (``<name>`` or ``<name>.<partition>``), or None."""
    cur = await conn.execute(
        "SELECT name, seq FROM checkpoints WHERE name = %s OR starts_with(name, %s) ORDER BY seq DESC, name LIMIT 1",
        (projector, projector + "."),
    )
    row = await cur.fetchone()
    return (str(row[0]), int(row[1])) if row else None


async def stream_bound(conn: psycopg.AsyncConnection[Any], stream: str) -> bool:
    """Whether any projector's read models in this database are bound to ``stream``."""
    cur = await conn.execute("SELECT EXISTS (SELECT 1 FROM log_binding WHERE stream = %s)", (stream,))
    row = await cur.fetchone()
    return bool(row and row[0])


async def bind(conn: psycopg.AsyncConnection[Any], projector: str, identity: LogIdentity) -> None:
    """Record ``identity`` as the log of ``projector``'s checkpoints (replacing any binding)."""
    await conn.execute(
        "INSERT INTO log_binding (projector, stream, stream_created) VALUES (%s, %s, %s) ON CONFLICT (projector) "
        "DO UPDATE SET stream = excluded.stream, stream_created = excluded.stream_created, first_seen = now()",
        (projector, identity.stream, identity.created),
    )


async def check_log(
    conn: psycopg.AsyncConnection[Any], js: JetStreamContext, stream: str, projector: str, *, bind_empty: bool = True
) -> Binding | None:
    """Raise :class:`LogMismatch` unless ``projector``'s checkpoints belong to ``stream`` as it is
    now; on an empty binding, record it (``bind_empty``). Run it inside the transaction that reads
    the checkpoints: they are read before the stream's state, so a checkpoint moved meanwhile by a
    running projector is never taken for one beyond the log. Returns the binding (None: empty and
    not recorded)."""
    furthest = await highest_checkpoint(conn, projector)
    bound = await read_binding(conn, projector)
    identity = await stream_identity(js, stream)
    database = database_of(conn)
    if bound is not None and bound.stream != stream:
        raise LogMismatch(
            f"the read models in database {database} (projector {projector!r}) were made from stream "
            f"{bound.stream!r}, but this process is set to stream {stream!r}",
            database=database,
            identity=identity,
            bound=bound,
        )
    if identity.created is None:
        log.warning(
            "stream %s reports no creation time (an old nats-server?): only its last sequence is checked against "
            "the checkpoints of %s",
            stream,
            projector,
        )
    elif bound is not None and bound.created is not None and bound.created != identity.created:
        raise LogMismatch(
            f"the read models in database {database} (projector {projector!r}) were made from stream {stream!r} "
            f"created {_when(bound.created)} (first seen {_when(bound.first_seen)}), but stream {stream!r} now "
            f"was created {_when(identity.created)} (last sequence {identity.last_seq}): another log under the "
            "same name (deleted and made again, or another server's)",
            database=database,
            identity=identity,
            bound=bound,
        )
    if furthest is not None and furthest[1] > identity.last_seq:
        name, seq = furthest
        raise LogMismatch(
            f"checkpoint {name!r} in database {database} is at sequence {seq}, beyond the last sequence "
            f"{identity.last_seq} of stream {stream!r} (created {_when(identity.created)}): the read models hold "
            "events this log does not (it was made again, truncated, or is another's)",
            database=database,
            identity=identity,
            bound=bound,
            checkpoint=furthest,
        )
    if bound is None and furthest is None and identity.last_seq > 0 and not await stream_bound(conn, stream):
        raise NeverBound(
            f"database {database} has never held read models of stream {stream!r} ({identity.last_seq} events; "
            f"no binding to it, no checkpoint of projector {projector!r})",
            database=database,
            identity=identity,
        )
    if bound is None and bind_empty:
        await conn.execute(
            "INSERT INTO log_binding (projector, stream, stream_created) VALUES (%s, %s, %s) "
            "ON CONFLICT (projector) DO NOTHING",
            (projector, stream, identity.created),
        )
        bound = await read_binding(conn, projector)
        if bound is not None and (bound.stream, bound.created) != (stream, identity.created):
            # another component bound it first, to something else, between our reads: check again
            return await check_log(conn, js, stream, projector, bind_empty=False)
        if furthest is not None and furthest[1] > 0:
            log.info("bound the existing checkpoints of %s to stream %s (recorded now)", projector, stream)
    elif bound is not None and bound.created is None and identity.created is not None:
        await conn.execute(
            "UPDATE log_binding SET stream_created = %s WHERE projector = %s AND stream_created IS NULL",
            (identity.created, projector),
        )
    return bound
