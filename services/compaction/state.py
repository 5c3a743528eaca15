"""The compaction state: each tracked session's token estimate, kept by the projector in the
same transaction as the read models and its checkpoint (the SQL shell; the steps themselves are
pure, in :mod:`services.compaction.estimate`).

Only sessions with compaction configured (``compact_after``) are tracked: an event of any other
session is skipped before anything is tokenised or stored, so a session without compaction costs
nothing but a set lookup. When a session's compaction is switched on, its state is backfilled
from the read models of the same transaction (the projections before this one have applied the
whole batch already: nothing to wait for): per-message counts of the stored bodies, its overlays,
its frozen prompt. Events the read model already reflected are then recognised as applied
(inserts are idempotent), so the state converges to what tracking the session from its first
event would have built.

Each message of a tracked session is tokenised once, when it arrives. The running estimate of the
active branch (compacted view) grows by that count when a message extends the active leaf, so the
cost of an append does not depend on history length; only a branch switch, an update, a delete or
a new overlay re-sums the stored per-message counts (never re-tokenising).

A request that recorded nothing leaves ``compaction.skipped`` in the log, each failed attempt of
one ``compaction.failed`` (with the request's estimate and settings); either, applied here
(under the compaction settings it names), keeps the session from being due again until its estimate
passes the skipped (or failed) one by a tenth of ``compact_after``
(:func:`~services.compaction.estimate.is_due`): a summarizer that is down or refusing costs one
request's attempts, not a request per append. A failure also keeps its attempt number and time
(``failed_attempt``, ``failed_at``: :func:`series`), so the work queue continues that series of
attempts with a newer request of the session instead of starting another (a skip ends it).
Other compaction settings, an overlay, a clear, or the estimate falling back under the threshold
end it. A backfilled session starts without one.

The rows are keyed by ``worker`` (the projector's name): partition workers share it, each writing
only its own partitions' sessions. The state is not part of a rebuild (``verify`` compares the
read models only): it is the live projector's bookkeeping of decisions to come, and a rebuilt
schema swapped in leaves it where the live projector's checkpoint has it.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from psycopg import AsyncConnection
from psycopg.types.json import Jsonb

from events.blobs import BlobStore
from events.bodies import unpack_body
from events.catalog import (
    CompactionFailed,
    CompactionRecorded,
    CompactionSkipped,
    MessageAppended,
    MessagesCleared,
    MessagesDeleted,
    MessageUpdated,
    PromptRendered,
    SessionConfigured,
    SessionDeleted,
    SessionErased,
)
from events.envelope import Event
from events.sealing import KeyLookup
from projections import context_queries
from services.compaction.estimate import (
    Append,
    Branch,
    compacted_sum,
    extends,
    fold_appends,
    is_due,
    over,
    path_from_leaf,
)
from services.compaction.ranges import TOKENS_PER_MESSAGE, message_tokens
from services.compaction.service import Series

Conn = AsyncConnection[Any]
Key = tuple[str, str]
_CONFIGURED = SessionConfigured.TYPE.encode()


@dataclass(frozen=True, slots=True)
class Candidate:
    """A session over its ``compact_after``: its active leaf and estimate (prompt included) at
    log position ``seq``."""

    tenant: str
    session: str
    leaf: str | None
    estimate: int
    seq: int


class CompactorState:
    """Keeps the ``compactor_*`` tables of one projector (``worker``) and reports sessions over
    threshold. A projection: it runs after the read models, in their transaction."""

    name = "compactor-state"

    def __init__(
        self,
        worker: str,
        count: Callable[[str], int],
        blobs: BlobStore | None,
        owns: Callable[[str, str], bool] | None = None,
        *,
        adopt: bool = True,
    ) -> None:
        """``owns``: the sessions whose events reach this projector (a partition worker's); the
        candidates loaded at the start, and the sessions adopted, are those only. None: every
        session. ``adopt``: backfill the configured sessions this state does not track at its
        first batches (:meth:`_adopt`); False for a state fed synthetic events."""
        self.worker = worker
        self._count = count
        self._blobs = blobs
        self._owns = owns
        self.keys: KeyLookup | None = None  # data keys for sealed claim-checked bodies
        self.candidates: dict[Key, Candidate] = {}
        self.tracked: set[Key] = set()
        self._stale = True  # ``tracked`` must be read again from the database before it is used
        self._adopting = adopt  # until a batch finds no configured session untracked (see _adopt)
        self.generation = 0  # moves with every change of ``tracked`` or ``_stale`` (see Selective)

    async def load(self, conn: Conn) -> None:
        """The tracked sessions, and those already over their threshold (after a restart,
        nothing new may arrive for them)."""
        await self._load_tracked(conn)
        cur = await conn.execute(
            "SELECT tenant, session_id, leaf_id, estimate, prompt_tokens, compact_after, skipped_estimate, seq "
            "FROM compactor_sessions "
            "WHERE worker = %s AND compact_after IS NOT NULL AND estimate + prompt_tokens > compact_after",
            (self.worker,),
        )
        for t, s, leaf, estimate, prompt, after, skipped, seq in await cur.fetchall():
            if self._owns is not None and not self._owns(str(t), str(s)):
                continue
            if is_due(int(estimate), int(prompt), after, skipped):
                self.candidates[(str(t), str(s))] = Candidate(str(t), str(s), leaf, int(estimate + prompt), int(seq))

    async def _load_tracked(self, conn: Conn) -> None:
        cur = await conn.execute(
            "SELECT tenant, session_id FROM compactor_sessions WHERE worker = %s AND compact_after IS NOT NULL",
            (self.worker,),
        )
        self.tracked = {(str(t), str(s)) for t, s in await cur.fetchall()}
        self._stale = False
        self.generation += 1

    def wants_stored(self, tenant: str, session: str, data: bytes) -> bool:
        """Before decoding: a tracked session's event, or bytes that may hold a configuration
        (its type name, or a JSON escape that could spell it). A configuration may change what
        is tracked, so from there on everything is wanted until ``tracked`` is read again."""
        if _CONFIGURED in data or b"\\u" in data:
            self._stale = True
            self.generation += 1
            return True
        return self._stale or (tenant, session) in self.tracked

    def wants(self, event: Event) -> bool:
        """A configuration (it may switch compaction on), or any event of a tracked session."""
        return self._stale or isinstance(event, SessionConfigured) or (event.tenant, event.session) in self.tracked

    async def apply(self, conn: Conn, items: Sequence[tuple[int, Event]]) -> None:
        """Runs of appends are applied set-wise (a few statements per run, not per message);
        anything else one event at a time, in order. Events of untracked sessions are skipped.

        ``tracked`` changes only with a ``SessionConfigured`` event; such a change marks it
        stale, and the next call reads it from the database inside its own transaction. The
        database is the truth: a batch that rolled back leaves no trace in ``tracked``."""
        if self._stale:
            await self._load_tracked(conn)
        if self._adopting:
            await self._adopt(conn)
        run: list[tuple[int, MessageAppended]] = []
        for seq, event in items:
            if not isinstance(event, SessionConfigured) and (event.tenant, event.session) not in self.tracked:
                continue  # no compaction configured: nothing to count
            if isinstance(event, MessageAppended) and event.session:
                run.append((seq, event))
                continue
            if run:
                await self._apply_appends(conn, run)
                run = []
            await self._apply_one(conn, seq, event)
        if run:
            await self._apply_appends(conn, run)

    async def _adopt(self, conn: Conn) -> None:
        """Sessions the read models have configured for compaction (``compact_after``) that this
        state does not track: a state started after their configuration (an upgrade from the
        compactor's own consumer of the log). Each is backfilled here, consistently with the
        checkpoint; once a batch finds none, nothing is asked again (a batch that rolled back
        finds its sessions again in the next)."""
        cur = await conn.execute(
            "SELECT c.tenant, c.session_id, c.seq, (c.config->'compaction'->>'compact_after')::bigint, "
            "c.config->'compaction' "
            "FROM session_configs c WHERE c.config->'compaction'->>'compact_after' IS NOT NULL "
            "AND NOT EXISTS (SELECT 1 FROM compactor_sessions s WHERE s.worker = %s AND s.tenant = c.tenant "
            "AND s.session_id = c.session_id)",
            (self.worker,),
        )
        found = [(str(t), str(s), int(q), int(a), Jsonb(c)) for t, s, q, a, c in await cur.fetchall()]
        mine = [f for f in found if self._owns is None or self._owns(f[0], f[1])]
        if not mine:
            self._adopting = False
            return
        for t, s, seq, after, compaction in mine:
            await self._backfill(conn, t, s, seq)
            await self._set(conn, t, s, seq, compact_after=after, compaction=compaction)
            self.tracked.add((t, s))
            await self._check(conn, t, s, seq)
        self._stale = True  # read ``tracked`` again next time, whatever this transaction becomes
        self.generation += 1

    async def _apply_appends(self, conn: Conn, run: list[tuple[int, MessageAppended]]) -> None:
        rows = []
        for seq, ev in run:
            body = await unpack_body(ev, self._blobs, self.keys)
            rows.append((ev.tenant, ev.session, ev.message_id, ev.parent_id, message_tokens(body, self._count), seq))
        cur = await conn.execute(
            "INSERT INTO compactor_messages (worker, tenant, session_id, id, parent_id, tokens, seq) "
            "SELECT %s, t, s, i, p, n, q FROM unnest(%s::text[], %s::text[], %s::text[], %s::text[], %s::int[], "
            "%s::bigint[]) AS u(t, s, i, p, n, q) ON CONFLICT DO NOTHING RETURNING tenant, session_id, id",
            (self.worker, *(list(col) for col in zip(*rows, strict=True))),
        )
        fresh = {(str(t), str(s), str(i)) for t, s, i in await cur.fetchall()}
        keys = sorted({(t, s) for t, s, *_ in rows})
        last_seq = run[-1][0]
        await conn.execute(
            "INSERT INTO compactor_sessions (worker, tenant, session_id, seq) "
            "SELECT %s, t, s, %s FROM unnest(%s::text[], %s::text[]) AS u(t, s) ON CONFLICT DO NOTHING",
            (self.worker, last_seq, [k[0] for k in keys], [k[1] for k in keys]),
        )
        cur = await conn.execute(
            "SELECT tenant, session_id, leaf_id, estimate, prompt_tokens, compact_after, skipped_estimate "
            "FROM compactor_sessions "
            "WHERE worker = %s AND (tenant, session_id) IN (SELECT * FROM unnest(%s::text[], %s::text[]))",
            (self.worker, [k[0] for k in keys], [k[1] for k in keys]),
        )
        found = {
            (str(t), str(s)): (leaf, int(est), int(pt), ca, sk) for t, s, leaf, est, pt, ca, sk in await cur.fetchall()
        }
        branches, switched = fold_appends(
            {key: Branch(leaf, est) for key, (leaf, est, *_) in found.items()},
            (Append(t, s, mid, parent, tokens) for t, s, mid, parent, tokens, _ in rows if (t, s, mid) in fresh),
        )
        async with conn.cursor() as update:
            await update.executemany(
                "UPDATE compactor_sessions SET leaf_id = %s, estimate = %s, seq = %s "
                "WHERE worker = %s AND tenant = %s AND session_id = %s",
                [
                    (b.leaf, b.estimate, last_seq, self.worker, *key)
                    for key, b in branches.items()
                    if key not in switched
                ],
            )
        for t, s in sorted(switched):
            await self.resum(conn, t, s, last_seq, branches[(t, s)].leaf)
        for t, s in keys:
            if (t, s) in switched:
                await self._check(conn, t, s, last_seq)
            else:
                _, _, prompt_tokens, compact_after, skipped = found[(t, s)]
                branch = branches[(t, s)]  # only grew: a skip that holds still holds while over
                self._mark(t, s, branch, prompt_tokens, compact_after, skipped, last_seq)

    async def _session(
        self, conn: Conn, t: str, s: str, seq: int
    ) -> tuple[str | None, int, int, int | None, int | None]:
        await conn.execute(
            "INSERT INTO compactor_sessions (worker, tenant, session_id, seq) VALUES (%s, %s, %s, %s) "
            "ON CONFLICT DO NOTHING",
            (self.worker, t, s, seq),
        )
        cur = await conn.execute(
            "SELECT leaf_id, estimate, prompt_tokens, compact_after, skipped_estimate FROM compactor_sessions "
            "WHERE worker = %s AND tenant = %s AND session_id = %s",
            (self.worker, t, s),
        )
        row = await cur.fetchone()
        assert row is not None
        return row[0], int(row[1]), int(row[2]), row[3], row[4]

    async def _set(self, conn: Conn, t: str, s: str, seq: int, **values: Any) -> None:
        cols = ", ".join(f"{k} = %s" for k in values)
        await conn.execute(
            f"UPDATE compactor_sessions SET {cols}, seq = %s WHERE worker = %s AND tenant = %s AND session_id = %s",
            (*values.values(), seq, self.worker, t, s),
        )

    async def _apply_one(self, conn: Conn, seq: int, event: Event) -> None:
        t, s = event.tenant, event.session
        if not s:
            return
        match event:
            case SessionConfigured():
                cfg = event.config.compaction
                after = cfg.compact_after if cfg else None
                self._stale = True  # re-read in the next call, whatever this transaction becomes
                self.generation += 1
                if after is None:
                    if (t, s) in self.tracked:
                        await self._untrack(conn, t, s)
                    return
                if (t, s) not in self.tracked:
                    await self._backfill(conn, t, s, seq)
                    self.tracked.add((t, s))
                compaction = Jsonb(cfg.model_dump(mode="json")) if cfg else None
                await conn.execute(  # other compaction settings: a skip (or a failing series) under the old ones ends
                    "UPDATE compactor_sessions SET skipped_estimate = CASE WHEN compaction IS DISTINCT FROM %s "
                    "THEN NULL ELSE skipped_estimate END, failed_attempt = CASE WHEN compaction IS DISTINCT FROM %s "
                    "THEN NULL ELSE failed_attempt END, compaction = %s "
                    "WHERE worker = %s AND tenant = %s AND session_id = %s",
                    (compaction, compaction, compaction, self.worker, t, s),
                )
                await self._set(conn, t, s, seq, compact_after=after)
            case SessionErased():
                await self._untrack(conn, t, s)
                return  # no check: it would make the session's row again, and nothing of it may stay
            case PromptRendered():
                await self._session(conn, t, s, seq)
                await self._set(conn, t, s, seq, prompt_tokens=event.tokens)
            case MessageAppended():
                body = await unpack_body(event, self._blobs, self.keys)
                tokens = message_tokens(body, self._count)
                cur = await conn.execute(
                    "INSERT INTO compactor_messages (worker, tenant, session_id, id, parent_id, tokens, seq) "
                    "VALUES (%s, %s, %s, %s, %s, %s, %s) ON CONFLICT DO NOTHING",
                    (self.worker, t, s, event.message_id, event.parent_id, tokens, seq),
                )
                if cur.rowcount == 0:
                    return
                leaf, estimate, *_ = await self._session(conn, t, s, seq)
                if extends(Branch(leaf, estimate), event.parent_id):
                    await self._set(conn, t, s, seq, leaf_id=event.message_id, estimate=estimate + tokens)
                else:
                    await self.resum(conn, t, s, seq, event.message_id)
            case MessageUpdated():
                body = await unpack_body(event, self._blobs, self.keys)
                await conn.execute(
                    "UPDATE compactor_messages SET tokens = %s WHERE worker = %s AND tenant = %s AND session_id = %s "
                    "AND id = %s",
                    (message_tokens(body, self._count), self.worker, t, s, event.message_id),
                )
                leaf, *_ = await self._session(conn, t, s, seq)
                await self.resum(conn, t, s, seq, leaf)
            case MessagesDeleted() | MessagesCleared() | SessionDeleted():
                if isinstance(event, MessagesDeleted):
                    await conn.execute(
                        "DELETE FROM compactor_messages WHERE worker = %s AND tenant = %s AND session_id = %s "
                        "AND id = ANY(%s)",
                        (self.worker, t, s, list(event.message_ids)),
                    )
                else:
                    for table in ("compactor_messages", "compactor_overlays"):
                        await conn.execute(
                            f"DELETE FROM {table} WHERE worker = %s AND tenant = %s AND session_id = %s",
                            (self.worker, t, s),
                        )
                await self._session(conn, t, s, seq)
                if not isinstance(event, MessagesDeleted):
                    await self._set(conn, t, s, seq, skipped_estimate=None, failed_attempt=None)  # a new start
                await self.resum(conn, t, s, seq, await self._latest_leaf(conn, t, s))
            case CompactionSkipped() | CompactionFailed():
                if event.estimate is None or event.config is None:
                    return  # a manual failure (or one recorded before they were named): it holds nothing
                await self._session(conn, t, s, seq)
                # a failure's attempt number continues the session's series; a skip ends it
                failed = (event.attempt, event.occurred_at) if isinstance(event, CompactionFailed) else (None, None)
                await conn.execute(  # only under the settings it was tried with (else a change came between)
                    "UPDATE compactor_sessions SET skipped_estimate = %s, failed_attempt = %s, failed_at = %s, "
                    "seq = %s WHERE worker = %s AND tenant = %s AND session_id = %s AND compaction = %s",
                    (event.estimate, *failed, seq, self.worker, t, s, Jsonb(event.config.model_dump(mode="json"))),
                )
            case CompactionRecorded():
                await conn.execute(
                    "INSERT INTO compactor_overlays (worker, tenant, session_id, overlay_id, from_id, to_id, "
                    "summary_tokens, seq) VALUES (%s, %s, %s, %s, %s, %s, %s, %s) ON CONFLICT DO NOTHING",
                    (
                        self.worker,
                        t,
                        s,
                        event.overlay_id,
                        event.from_message_id,
                        event.to_message_id,
                        TOKENS_PER_MESSAGE + self._count(event.summary),
                        seq,
                    ),
                )
                leaf, *_ = await self._session(conn, t, s, seq)
                await self._set(conn, t, s, seq, skipped_estimate=None, failed_attempt=None)  # the view changed
                await self.resum(conn, t, s, seq, leaf)
            case _:
                return
        await self._check(conn, t, s, seq)

    async def _untrack(self, conn: Conn, t: str, s: str) -> None:
        """Compaction switched off: the session's state is dropped (a later switch-on backfills)."""
        for table in ("compactor_messages", "compactor_overlays", "compactor_sessions"):
            await conn.execute(
                f"DELETE FROM {table} WHERE worker = %s AND tenant = %s AND session_id = %s", (self.worker, t, s)
            )
        self.tracked.discard((t, s))
        self.candidates.pop((t, s), None)

    async def _backfill(self, conn: Conn, t: str, s: str, seq: int) -> None:
        """Start tracking a session at ``seq`` from the read models' copy of its history (in
        this transaction, they hold the whole batch: events after ``seq`` are recognised later)."""
        cur = await conn.execute(
            "SELECT id, parent_id, content, seq FROM messages WHERE tenant = %s AND session_id = %s", (t, s)
        )
        messages = [
            (str(i), p, message_tokens(json.loads(c), self._count), int(q)) for i, p, c, q in await cur.fetchall()
        ]
        if messages:
            await conn.execute(
                "INSERT INTO compactor_messages (worker, tenant, session_id, id, parent_id, tokens, seq) "
                "SELECT %s, %s, %s, i, p, n, q FROM unnest(%s::text[], %s::text[], %s::int[], %s::bigint[]) "
                "AS u(i, p, n, q) ON CONFLICT DO NOTHING",
                (self.worker, t, s, *(list(col) for col in zip(*messages, strict=True))),
            )
        cur = await conn.execute(
            "SELECT overlay_id, from_message_id, to_message_id, summary, seq FROM overlays "
            "WHERE tenant = %s AND session_id = %s",
            (t, s),
        )
        for overlay_id, first, last, summary, at in await cur.fetchall():
            await conn.execute(
                "INSERT INTO compactor_overlays (worker, tenant, session_id, overlay_id, from_id, to_id, "
                "summary_tokens, seq) VALUES (%s, %s, %s, %s, %s, %s, %s, %s) ON CONFLICT DO NOTHING",
                (self.worker, t, s, overlay_id, first, last, TOKENS_PER_MESSAGE + self._count(summary), at),
            )
        prompt = await context_queries.latest_prompt(conn, t, s)
        await self._session(conn, t, s, seq)
        await self._set(conn, t, s, seq, prompt_tokens=prompt.tokens if prompt else 0)
        await self.resum(conn, t, s, seq, await self._latest_leaf(conn, t, s))

    async def _latest_leaf(self, conn: Conn, t: str, s: str) -> str | None:
        cur = await conn.execute(
            "SELECT m.id FROM compactor_messages m WHERE m.worker = %s AND m.tenant = %s AND m.session_id = %s "
            "AND NOT EXISTS (SELECT 1 FROM compactor_messages c WHERE c.worker = m.worker AND c.tenant = m.tenant "
            "AND c.session_id = m.session_id AND c.parent_id = m.id) ORDER BY m.seq DESC LIMIT 1",
            (self.worker, t, s),
        )
        row = await cur.fetchone()
        return str(row[0]) if row else None

    async def resum(self, conn: Conn, t: str, s: str, seq: int, leaf: str | None) -> None:
        """Re-sum the stored counts along ``leaf``'s path, with its newest overlay applied."""
        estimate = 0
        if leaf is not None:
            cur = await conn.execute(
                "WITH RECURSIVE bound AS (SELECT count(*) AS n FROM compactor_messages"
                " WHERE worker = %(w)s AND tenant = %(t)s AND session_id = %(s)s),"
                " path (id, parent_id, tokens, depth) AS ("
                " SELECT id, parent_id, tokens, 0 FROM compactor_messages"
                " WHERE worker = %(w)s AND tenant = %(t)s AND session_id = %(s)s AND id = %(leaf)s"
                " UNION ALL SELECT m.id, m.parent_id, m.tokens, p.depth + 1 FROM path p JOIN compactor_messages m"
                " ON m.worker = %(w)s AND m.tenant = %(t)s AND m.session_id = %(s)s AND m.id = p.parent_id"
                " WHERE p.depth < (SELECT n FROM bound)"
                ") SELECT id, tokens FROM path ORDER BY depth",
                {"w": self.worker, "t": t, "s": s, "leaf": leaf},
            )
            path = path_from_leaf([(str(i), int(n)) for i, n in await cur.fetchall()])
            cur = await conn.execute(
                "SELECT from_id, to_id, summary_tokens FROM compactor_overlays WHERE worker = %s AND tenant = %s "
                "AND session_id = %s ORDER BY seq",
                (self.worker, t, s),
            )
            overlays = [(str(a), str(b), int(n)) for a, b, n in await cur.fetchall()]
            estimate = compacted_sum(path, overlays)
        await self._set(conn, t, s, seq, leaf_id=leaf, estimate=estimate)

    async def _check(self, conn: Conn, t: str, s: str, seq: int) -> None:
        """Mark the session due or not; a skip lapses once the session is back under its
        threshold (the next time it passes it, a new attempt is fair)."""
        leaf, estimate, prompt_tokens, compact_after, skipped = await self._session(conn, t, s, seq)
        if skipped is not None and not over(estimate, prompt_tokens, compact_after):
            await self._set(conn, t, s, seq, skipped_estimate=None, failed_attempt=None)
            skipped = None
        self._mark(t, s, Branch(leaf, estimate), prompt_tokens, compact_after, skipped, seq)

    def _mark(
        self,
        t: str,
        s: str,
        branch: Branch,
        prompt_tokens: int,
        compact_after: int | None,
        skipped: int | None,
        seq: int,
    ) -> None:
        if is_due(branch.estimate, prompt_tokens, compact_after, skipped):
            self.candidates[(t, s)] = Candidate(t, s, branch.leaf, branch.estimate + prompt_tokens, seq)
        else:
            self.candidates.pop((t, s), None)


async def _committed(conn: Conn, worker: str, tenant: str, session: str) -> tuple[Any, ...] | None:
    """The session's committed row: leaf, estimate, prompt tokens, ``compact_after``, the skipped
    estimate and the position (None: not tracked)."""
    cur = await conn.execute(
        "SELECT leaf_id, estimate, prompt_tokens, compact_after, skipped_estimate, seq FROM compactor_sessions "
        "WHERE worker = %s AND tenant = %s AND session_id = %s",
        (worker, tenant, session),
    )
    return await cur.fetchone()


async def still_due(conn: Conn, worker: str, tenant: str, session: str, seq: int) -> bool:
    """Whether a request decided at ``seq`` still stands, from the committed state: the session
    is tracked and over its threshold. A state that has not reached ``seq`` (it cannot happen
    while requests are published after their commit) cannot tell: True."""
    row = await _committed(conn, worker, tenant, session)
    if row is None:
        return False  # compaction switched off, or the session erased: nothing is due
    _, estimate, prompt_tokens, compact_after, skipped, at = row
    return int(at) < seq or is_due(int(estimate), int(prompt_tokens), compact_after, skipped)


async def pending(conn: Conn, worker: str, tenant: str, session: str, *, attempts: int) -> Candidate | None:
    """The session as a candidate, when the committed state finds it due (tracked, over its
    threshold, not held by a skip or a failure) or holds a failure series with attempts left (of
    ``attempts``: its request was naked for the failure's backoff, and the work queue goes on with
    it, waiting out that backoff): the leaf, estimate and position a request of it names (the
    decision the projector published, while the state has not moved since); None when nothing is
    due. One read of the session's row: what the work queue spends on a message on the session's
    work subject that is not a request (:func:`services.compaction.queue.subscribe`)."""
    cur = await conn.execute(
        "SELECT leaf_id, estimate, prompt_tokens, compact_after, skipped_estimate, seq, failed_attempt "
        "FROM compactor_sessions WHERE worker = %s AND tenant = %s AND session_id = %s",
        (worker, tenant, session),
    )
    row = await cur.fetchone()
    if row is None:
        return None
    leaf, estimate, prompt_tokens, compact_after, skipped, seq, failed = row
    ongoing = failed is not None and int(failed) < attempts
    if not ongoing and not is_due(int(estimate), int(prompt_tokens), compact_after, skipped):
        return None
    return Candidate(tenant, session, leaf, int(estimate) + int(prompt_tokens), int(seq))


async def series(conn: Conn, worker: str, tenant: str, session: str) -> Series:
    """The session's :class:`Series` (none for an untracked session)."""
    cur = await conn.execute(
        "SELECT failed_attempt, failed_at FROM compactor_sessions WHERE worker = %s AND tenant = %s "
        "AND session_id = %s AND failed_attempt IS NOT NULL",
        (worker, tenant, session),
    )
    row = await cur.fetchone()
    return Series(int(row[0]), row[1]) if row else Series()
