"""Rebuild read models from the log into a schema of their own, and compare two schemas.

``rebuild_into`` replays the stream from sequence 1 through the same projection code the live
projector runs, so a rebuild equals the live read model whenever projections are deterministic.
``checksums`` gives one digest per table, ordered by primary key, for row-by-row comparison.
Events are admitted as the live projector admits them (:func:`projections.quarantine.screen`),
so the refused ones land in the schema's ``quarantine`` table exactly as they did live.
"""

from __future__ import annotations

import asyncio
import zlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import psycopg
from nats.js import JetStreamContext

from events import log as eventlog
from events.envelope import Event
from events.subjects import SubjectLayout
from projections import search_languages
from projections.keystore import PgKeyStore
from projections.migrate import migrate
from projections.quarantine import Quarantined, Tombstone, screen, tombstone_erased, tombstone_refused
from projections.runner import Prepared, Projection, apply_batch, checkpoint_partition, prepare
from projections.search_languages import Language

Horizon = Callable[[str], int]
"""For an event's subject, the last sequence to apply (the live checkpoint of its partition)."""

Reached = dict[int | None, int]
"""How far the live projectors got in each partition of the layout (``None``: the subjects no
partition's filter matches): the last sequence applied there (:func:`partition_horizons`)."""


def partition_horizons(projector: str, partitions: int, checkpoints: Mapping[str, int]) -> Reached:
    """Each partition's horizon from the live ``checkpoints``: its own (``<projector>.pNNN``, when
    partitioned projectors ran), else the single projector's (``<projector>``; 0 if it never ran).
    Partition workers never read a subject no partition's filter matches, and one starts where
    the single projector left off (its seed), so that is how far those events are applied."""
    parts = {p: seq for n, seq in checkpoints.items() if (p := checkpoint_partition(projector, n)) is not None}
    whole = checkpoints.get(projector, 0)
    return {p: whole if p is None else parts.get(p, whole) for p in (None, *range(partitions))}


def horizon_of(layout: SubjectLayout, at: Reached) -> Horizon:
    """The horizon of each subject: its partition's (the partition whose filter it matches)."""
    return lambda subject: at[layout.partition_token(subject)]


def catch_up_from(held: Reached, now: Reached) -> int | None:
    """The first sequence to read to bring a schema holding each partition's events up to
    ``held`` to ``now``: one past the lowest horizon that moved, None when none moved. A horizon
    that did not move costs nothing, however far behind: the single projector's (``None``, and
    every partition's before its worker reports), which stays put while partitioned projectors
    run (the two layouts never run together), even at 0."""
    moved = [seq for p, seq in held.items() if now[p] > seq]
    return min(moved) + 1 if moved else None


TABLES: dict[str, str] = {
    "sessions": "tenant, id",
    "messages": "tenant, session_id, id",
    "usage_applied": "tenant, session_id, event_id",
    "left_out_summaries": "tenant, session_id, id",
    "session_configs": "tenant, session_id",
    "context_blocks": "tenant, session_id, label",
    "search_entries": "tenant, session_id, label, key",
    "skills_index": "tenant, bucket, key",
    "loaded_skills": "tenant, session_id, label, key",
    "reclaimed_outputs": "tenant, session_id, message_id, tool_call_id",
    "prompts": "tenant, session_id, version",
    "overlays": "tenant, session_id, overlay_id",
    "compaction_failures": "tenant, session_id, seq",
    "compaction_skips": "tenant, session_id, seq",
}


async def apply_range(
    conn: psycopg.AsyncConnection[Any],
    js: JetStreamContext,
    layout: SubjectLayout,
    projections: Sequence[Projection],
    checkpoint: str,
    from_seq: int,
    to_seq: int,
    *,
    batch_size: int = 2000,
    progress: Callable[[int, int], None] | None = None,
    horizon: Horizon | None = None,
    since: Horizon | None = None,
    keys: PgKeyStore | None = None,
) -> int:
    """Apply the stream's events ``from_seq..to_seq`` on ``conn`` (its search_path decides the
    schema), one transaction or savepoint per batch, skipping events past their ``horizon`` and
    those at or before their ``since`` (already applied there: a catch-up from where the live
    projectors were to where they are). Returns the last sequence applied."""
    last = 0
    batch = _Pending(keys)
    if keys is not None:
        await keys.load_all()

    async def flush() -> None:
        batch.settle(layout)
        await batch.apply(conn, checkpoint, projections, layout)
        if progress is not None:
            progress(last, to_seq)
        batch.clear()

    if to_seq >= from_seq:
        async for stored in eventlog.read(js, layout, None, from_seq, to_seq):
            if horizon is not None and stored.seq > horizon(stored.subject):
                continue
            if since is not None and stored.seq <= since(stored.subject):
                continue
            batch.add(stored, layout)
            last = stored.seq
            if len(batch) >= batch_size:
                await flush()
        if len(batch):
            await flush()
    return last


async def rebuild_into(
    js: JetStreamContext,
    layout: SubjectLayout,
    conninfo: str,
    schema: str,
    projections: Sequence[Projection],
    checkpoint: str,
    *,
    to_seq: int | None = None,
    batch_size: int = 2000,
    workers: int = 2,
    progress: Callable[[int, int], None] | None = None,
    horizon: Horizon | None = None,
    languages: Mapping[str, Language] | None = None,
    keys: PgKeyStore | None = None,
) -> int:
    """Replay the stream from sequence 1 (up to ``to_seq``) into ``schema``, created and migrated
    first (with the tenants' search ``languages``, as the live read model has them). Returns the
    last sequence applied, recorded as ``checkpoint`` in ``schema``.

    One reader decodes and plans; ``workers`` connections apply in parallel, each the events of
    its share of subjects (a session's events, and a tenant's tenant-scope events, stay on one
    connection and in order), as partitioned projectors do. Events past their ``horizon`` (the
    live checkpoint of their partition) are skipped: the schema then holds what the live read
    models hold, for a comparison (``verify``) or for tables a live projector goes on from
    (``rebuild_and_swap``, which must never build past where the live projectors are: they apply
    every later event to the swapped tables, and to their compaction state, once). Without
    ``to_seq`` and ``horizon`` it replays the whole stream. Sealed events are opened
    with ``keys`` (every key and erasure is loaded once the end is known: the keys of the events
    up to it exist by then; the store holds them all, whatever its ``cache_sessions``); an erased
    session's events are tombstones, materialising nothing.
    """
    await migrate(conninfo, schema)
    async with await psycopg.AsyncConnection.connect(conninfo, autocommit=True) as conn:
        await conn.execute(f'SET search_path TO "{schema}"')
        await search_languages.apply(conn, languages or {})
    end = await eventlog.last_seq(js, layout)
    if to_seq is not None:
        end = min(end, to_seq)
    if keys is not None:
        await keys.load_all()
    workers = max(1, workers)
    queues: list[asyncio.Queue[_Planned | None]] = [asyncio.Queue(maxsize=2) for _ in range(workers)]
    committed = [0] * workers
    last = 0

    async def apply(i: int) -> None:
        async with await psycopg.AsyncConnection.connect(conninfo, autocommit=True) as conn:
            await conn.execute(f'SET search_path TO "{schema}"')
            name = f"{checkpoint}.rebuild{i}"
            while (planned := await queues[i].get()) is not None:
                batch = planned.batch
                await batch.apply(conn, name, projections, layout, planned.plans)
                committed[i] = max(batch.sources)
                if progress is not None:
                    progress(max(committed), end)

    async def read() -> None:
        nonlocal last
        pending = [_Pending(keys) for _ in range(workers)]

        async def hand_over(i: int) -> None:
            batch, pending[i] = pending[i], _Pending(keys)
            batch.settle(layout)
            await queues[i].put(_Planned(batch, await prepare(projections, batch.items)))

        if end >= 1:
            async for stored in eventlog.read(js, layout, None, 1, end):
                if horizon is not None and stored.seq > horizon(stored.subject):
                    continue
                i = zlib.crc32(stored.subject.encode()) % workers
                pending[i].add(stored, layout)
                last = stored.seq
                if len(pending[i]) >= batch_size:
                    await hand_over(i)
        for i in range(workers):
            if len(pending[i]):
                await hand_over(i)
            await queues[i].put(None)

    async with asyncio.TaskGroup() as group:
        for i in range(workers):
            group.create_task(apply(i), name=f"rebuild-apply-{i}")
        group.create_task(read(), name="rebuild-read")
    async with await psycopg.AsyncConnection.connect(conninfo, autocommit=True) as conn, conn.transaction():
        await conn.execute(f'SET LOCAL search_path TO "{schema}"')
        await conn.execute("DELETE FROM checkpoints WHERE starts_with(name, %s)", (f"{checkpoint}.rebuild",))
        await conn.execute(
            "INSERT INTO checkpoints (name, seq) VALUES (%s, %s) ON CONFLICT (name) DO UPDATE SET seq = excluded.seq",
            (checkpoint, last),
        )
    return last


@dataclass(slots=True)
class _Pending:
    """Stored events read for one batch: the admitted ones and the refused ones."""

    keys: PgKeyStore | None = None
    items: list[tuple[int, Event]] = field(default_factory=list)
    refused: list[Quarantined] = field(default_factory=list)
    sources: dict[int, tuple[str, bytes]] = field(default_factory=dict)
    passed: list[int] = field(default_factory=list)
    stored: dict[int, datetime] = field(default_factory=dict)  # when the stream stored each sequence

    def add(self, stored: eventlog.StoredEvent, layout: SubjectLayout) -> None:
        self.sources[stored.seq] = (stored.subject, stored.data)
        if stored.time is not None:
            self.stored[stored.seq] = stored.time
        decided = screen(stored.seq, stored.subject, stored.data, layout, self.keys, self.keys)
        if isinstance(decided, Quarantined):
            self.refused.append(decided)
        elif isinstance(decided, Tombstone):
            self.passed.append(stored.seq)
        else:
            self.items.append(decided)

    def settle(self, layout: SubjectLayout) -> None:
        """Once the whole batch is read, before it is planned: the events of a session whose
        erasure came later in it (a proven one the database lost) are tombstones, as the live
        projector decides (:func:`tombstone_erased`); their bodies are never fetched. So are its
        refusals of a session erased since (:func:`tombstone_refused`: a stray read before the
        erasure, which another worker may apply first)."""
        if self.keys is not None:
            self.items, erased = tombstone_erased(self.items, self.keys)
            self.refused, gone = tombstone_refused(self.refused, layout, self.keys)
            self.passed.extend([*erased, *gone])

    def clear(self) -> None:
        self.items, self.refused, self.sources, self.passed, self.stored = [], [], {}, [], {}

    async def apply(
        self,
        conn: psycopg.AsyncConnection[Any],
        checkpoint: str,
        projections: Sequence[Projection],
        layout: SubjectLayout,
        prepared: Prepared | None = None,
    ) -> None:
        """Apply the batch in one transaction (a savepoint inside the caller's) with its checkpoint,
        after recording the proven erasures the key store did not hold (:meth:`PgKeyStore.learn`);
        its quarantine rows name their strays' sessions as the live projector's do (``layout``)."""
        if self.keys is not None:
            await self.keys.record_learned()
        async with conn.transaction():
            await apply_batch(
                conn,
                checkpoint,
                projections,
                self.items,
                notify=False,
                prepared=prepared,
                refused=self.refused,
                sources=self.sources,
                passed=self.passed,
                layout=layout,
                stored=self.stored,
            )

    def __len__(self) -> int:
        return len(self.sources)


@dataclass(frozen=True, slots=True)
class _Planned:
    batch: _Pending
    plans: Prepared


QuarantineRow = tuple[int, str, str, str, str, str | None, str | None]


async def quarantine_rows(conn: psycopg.AsyncConnection[Any], schema: str) -> list[QuarantineRow]:
    """``(seq, subject, reason, detail, md5 of raw, named_tenant, named_session)`` of every
    quarantined event, by sequence: what a rebuild must reproduce (who recorded a row may differ).
    The session a row's bytes name (migration 031) is compared too: an erasure finds its strays by
    it. ``recorded_at`` is not: it is when the stream stored the event, which a rebuild records
    again, but a row an earlier release recorded holds its projector's clock, and a log restored
    from its archive stored its events anew (the read models rebound to it keep the first times)."""
    cur = await conn.execute(
        f"SELECT seq, subject, reason, detail, md5(raw), named_tenant, named_session "
        f'FROM "{schema}".quarantine ORDER BY seq'
    )
    return [(int(s), str(subj), str(r), str(d), str(h), nt, ns) for s, subj, r, d, h, nt, ns in await cur.fetchall()]


def row_text(table: str) -> str:
    """A row of ``table`` (alias ``t``) as compared: all of it, but for a message its hash, which
    rows written before migration 019 keep where a rebuild stores none (compared on its own:
    services/audit/readers.py ``kept_hashes``)."""
    return "(to_jsonb(t) - 'body_sha256')::text" if table == "messages" else "t::text"


LIVE_SCHEMA = "public"
"""Where the live read model is (a rebuild's schema is compared with it)."""


def compared_rows(table: str) -> str:
    """The condition on rows of ``table`` (alias ``t``) that a comparison looks at: all, but for
    ``usage_applied`` the rows past the live database's mark (migration 021): usage events
    applied before it are recorded by a rebuild only."""
    if table == "usage_applied":
        return f'WHERE t.seq > (SELECT coalesce(max(seq), 0) FROM "{LIVE_SCHEMA}".usage_applied_since)'
    return ""


async def checksums(conn: psycopg.AsyncConnection[Any], schema: str) -> dict[str, tuple[int, str]]:
    """``{table: (row count, md5 of all rows in key order)}`` for the read-model tables."""
    out: dict[str, tuple[int, str]] = {}
    for table, key in TABLES.items():
        cur = await conn.execute(
            f"SELECT count(*), coalesce(md5(string_agg({row_text(table)}, E'\\n' ORDER BY {key})), '') "
            f'FROM "{schema}"."{table}" t {compared_rows(table)}'
        )
        row = await cur.fetchone()
        assert row is not None
        out[table] = (int(row[0]), str(row[1]))
    return out
