"""Prometheus metrics and readiness: events published, applied (checkpoints), projection lag."""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge

from events import log as eventlog
from projections import queries
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


def published(event_type: str) -> None:
    PUBLISHED.labels(event_type).inc()


async def refresh(c: Container) -> dict[str, int]:
    last = await eventlog.last_seq(c.js, c.layout)
    async with c.pool.connection() as cx:
        points = await queries.checkpoints(cx)
        cur = await cx.execute("SELECT (SELECT count(*) FROM overlays), (SELECT count(*) FROM compaction_failures)")
        row = await cur.fetchone()
    if row is not None:
        OVERLAYS.set(row[0])
        COMPACTION_FAILURES.set(row[1])
    STREAM_LAST.set(last)
    lags: dict[str, int] = {}
    for name, seq in points.items():
        APPLIED.labels(name).set(seq)
        lags[name] = max(0, last - seq)
        LAG.labels(name).set(lags[name])
    return lags


async def readiness(c: Container) -> dict[str, Any]:
    out: dict[str, Any] = {"nats": False, "postgres": False, "lag": None}
    try:
        out["lag"] = await refresh(c)
        out["nats"] = c.nc.is_connected
        out["postgres"] = True
    except Exception as exc:  # readiness reports, it does not raise
        out["error"] = f"{type(exc).__name__}: {exc}"
    out["ready"] = bool(out["nats"] and out["postgres"])
    return out
