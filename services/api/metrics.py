"""Prometheus metrics and readiness: events published, applied (checkpoints), projection lag,
quarantined events; readiness that tells the truth (:func:`assess` is its pure core)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from nats.js.errors import NotFoundError
from prometheus_client import CollectorRegistry, Counter, Gauge

from events import log as eventlog
from projections.runner import checkpoint_partition
from services.audit import quarantine
from services.audit.readers import log_mismatch
from services.bootstrap import Container

REGISTRY = CollectorRegistry()
PUBLISHED = Counter("chronicle_events_published_total", "Events published by this API", ["type"], registry=REGISTRY)
APPLIED = Gauge(
    "chronicle_events_applied", "Highest stream sequence applied, per projector", ["projector"], registry=REGISTRY
)
STREAM_LAST = Gauge("chronicle_stream_last_seq", "Last sequence in the event stream", registry=REGISTRY)
OVERLAYS = Gauge("chronicle_compactions_recorded", "Summary overlays recorded (all sessions)", registry=REGISTRY)
COMPACTION_FAILURES = Gauge(
    "chronicle_compaction_failures", "Summarizer failures recorded as compaction.failed events", registry=REGISTRY
)
LAG = Gauge(
    "chronicle_projection_lag", "Events in the stream not yet applied, per projector", ["projector"], registry=REGISTRY
)
QUARANTINED = Counter(
    "chronicle_quarantined_events",
    "Stored events no projection applies (the quarantine table), by reason",
    ["reason"],
    registry=REGISTRY,
)
HOT_PATHS = Counter(
    "chronicle_api_hot_path_requests_total",
    "Appends and history reads the hot paths looked at: served there, or handed on to the routes",
    ["route", "outcome"],
    registry=REGISTRY,
)
RATE_LIMITED = Counter(
    "chronicle_rate_limited_requests_total",
    "Requests refused because their tenant was over its limit (CHRONICLE_RATE_LIMIT), by transport",
    ["transport"],
    registry=REGISTRY,
)
SOURCES_MISSING = Counter(
    "chronicle_context_sources_missing_total",
    "Context reads and prompt renders refused because a read-only block's object is missing (409 source_missing)",
    registry=REGISTRY,
)
_counted: dict[str, int] = {}  # what QUARANTINED already holds, per reason (the table only grows)

READINESS_STALL_S = 60.0
READINESS_MAX_LAG = 100_000


def published(event_type: str) -> None:
    PUBLISHED.labels(event_type).inc()


def count_quarantined(by_reason: Mapping[str, int]) -> None:
    """Bring the counter up to the table's counts (a counter never goes down)."""
    for reason, n in by_reason.items():
        delta = n - _counted.get(reason, 0)
        if delta > 0:
            QUARANTINED.labels(reason).inc(delta)
            _counted[reason] = n


@dataclass(frozen=True, slots=True)
class Snapshot:
    """What readiness and the metrics are computed from, read once."""

    last_seq: int
    checkpoints: dict[str, tuple[int, datetime]]  # name -> (seq, updated_at)
    now: datetime
    quarantined: dict[str, int]


async def snapshot(c: Container) -> Snapshot:
    last = await eventlog.last_seq(c.js, c.layout)
    async with c.pool.connection() as conn:
        cur = await conn.execute("SELECT name, seq, updated_at FROM checkpoints")
        rows = await cur.fetchall()
        cur = await conn.execute("SELECT (SELECT count(*) FROM overlays), (SELECT count(*) FROM compaction_failures)")
        row = await cur.fetchone()
        by_reason = await quarantine.counts(conn)
        cur = await conn.execute("SELECT now()")
        now_row = await cur.fetchone()
    if row is not None:
        OVERLAYS.set(row[0])
        COMPACTION_FAILURES.set(row[1])
    assert now_row is not None
    return Snapshot(last, {str(n): (int(s), at) for n, s, at in rows}, now_row[0], by_reason)


async def refresh(c: Container) -> dict[str, int]:
    return _export(await snapshot(c))


def _export(snap: Snapshot) -> dict[str, int]:
    STREAM_LAST.set(snap.last_seq)
    count_quarantined(snap.quarantined)
    lags: dict[str, int] = {}
    for name, (seq, _) in snap.checkpoints.items():
        APPLIED.labels(name).set(seq)
        lags[name] = max(0, snap.last_seq - seq)
        LAG.labels(name).set(lags[name])
    return lags


def projector_checkpoints(
    checkpoints: Mapping[str, tuple[int, datetime]], projector: str, partitions: int
) -> dict[str, tuple[int, datetime]]:
    """The checkpoints that serve reads now: every partition's when all report, else the single
    projector's (with the partitions' that report), as the read-your-writes waiter counts them."""
    parts = {n: v for n, v in checkpoints.items() if checkpoint_partition(projector, n) is not None}
    if len(parts) == partitions or projector not in checkpoints:
        return parts
    return {projector: checkpoints[projector], **parts}


def assess(
    snap: Snapshot,
    projector: str,
    partitions: int,
    *,
    stall_s: float,
    max_lag: int,
    unapplied_since: datetime | None = None,
) -> tuple[list[str], int | None]:
    """Why the projection is not ready (empty: it is), and its lag (the stream's last sequence
    minus the lowest projector checkpoint). A consumer has stalled when events wait past its
    checkpoint and it has not moved for ``stall_s`` seconds. Before any projector checkpoint
    exists, events that have waited since ``unapplied_since`` (when readiness first saw them
    unapplied) for ``stall_s`` are a stall too: a projector that never starts is not ready; with
    no such time, nothing can be said yet (lag None). Quarantined events are never a reason."""
    points = projector_checkpoints(snap.checkpoints, projector, partitions)
    if not points:
        if not snap.last_seq or unapplied_since is None:
            return [], None
        reasons = []
        idle = (snap.now - unapplied_since).total_seconds()
        if idle > stall_s:
            reasons.append(
                f"projector {projector} has applied nothing for {idle:.0f}s with {snap.last_seq} events waiting"
            )
        if snap.last_seq > max_lag:
            reasons.append(f"projection lag {snap.last_seq} is past the threshold {max_lag}")
        return reasons, snap.last_seq
    reasons = []
    for name, (seq, at) in sorted(points.items()):
        idle = (snap.now - at).total_seconds()
        if seq < snap.last_seq and idle > stall_s:
            reasons.append(
                f"consumer {name} has not advanced for {idle:.0f}s with {snap.last_seq - seq} events waiting"
            )
    lag = max(0, snap.last_seq - min(seq for seq, _ in points.values()))
    if lag > max_lag:
        reasons.append(f"projection lag {lag} is past the threshold {max_lag}")
    return reasons, lag


_first_unapplied: dict[str, datetime] = {}  # projector -> when readiness first saw events and no checkpoint


def _unapplied_since(snap: Snapshot, projector: str, partitions: int) -> datetime | None:
    """Since when this process has seen events in the stream and no checkpoint of ``projector``."""
    if snap.last_seq and not projector_checkpoints(snap.checkpoints, projector, partitions):
        return _first_unapplied.setdefault(projector, snap.now)
    _first_unapplied.pop(projector, None)
    return None


async def readiness(c: Container, *, stall_s: float | None = None, max_lag: int | None = None) -> dict[str, Any]:
    """``ready`` is false, with ``reasons``, when NATS or Postgres does not answer, the stream is
    missing or is not the log the read models were made from (``log``: :func:`services.audit.readers.log_mismatch`), a
    projector consumer has stalled while events wait, or the lag passes the threshold
    (``stall_s``/``max_lag``, by default the settings ``readiness_stall_s``/``readiness_max_lag``).
    ``quarantined`` (counts by reason) is reported and never makes it unready."""
    out: dict[str, Any] = {
        "nats": False,
        "postgres": False,
        "stream": False,
        "log": False,
        "lag": None,
        "quarantined": {},
    }
    reasons: list[str] = []
    try:
        snap = await snapshot(c)
        out["lag"] = _export(snap)
        out["nats"] = c.nc.is_connected
        out["postgres"] = out["stream"] = True
        out["quarantined"] = snap.quarantined
        s = c.settings
        if stall_s is None:
            stall_s = float(getattr(s, "readiness_stall_s", READINESS_STALL_S))
        if max_lag is None:
            max_lag = int(getattr(s, "readiness_max_lag", READINESS_MAX_LAG))
        since = _unapplied_since(snap, s.projector_name, s.partitions)
        found, out["projection_lag"] = assess(
            snap, s.projector_name, s.partitions, stall_s=stall_s, max_lag=max_lag, unapplied_since=since
        )
        reasons.extend(found)
        mismatch = await log_mismatch(c)
        out["log"] = mismatch is None
        if mismatch is not None:
            reasons.append(f"the read models belong to another log: {mismatch.detail}")
    except NotFoundError:
        out["nats"] = c.nc.is_connected
        reasons.append(f"stream {c.layout.stream} is missing")
    except Exception as exc:  # readiness reports, it does not raise
        out["error"] = f"{type(exc).__name__}: {exc}"
        reasons.append(out["error"])
    if not out["nats"] and out["stream"]:
        reasons.append("NATS is not connected")
    out["reasons"] = reasons
    out["ready"] = not reasons
    return out
