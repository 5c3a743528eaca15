"""Quarantine on real NATS and Postgres: bad events never stop anybody, and decide the same again.

Tenant B publishes each kind of bad event straight to JetStream (bypassing the contract) while
tenant A keeps appending; the projector (one, or a worker per partition) serves A, records every
bad event once with its reason, and rebuild/verify reproduce the quarantine exactly.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator
from datetime import datetime
from pathlib import Path
from typing import Any

import psycopg
import pytest

from events import log as eventlog
from events.catalog import ContextWritten, SessionRenamed
from events.envelope import Event
from events.subjects import partition_of
from projections.quarantine import RAW_KEPT, Quarantined, _chunks
from projections.rebuild import quarantine_rows, rebuild_into
from projections.runner import ProjectorRunner
from services.api import metrics
from services.audit import quarantine as ops
from services.audit import readers as audit
from services.bootstrap import Container
from services.ops.localstack import free_port
from services.ops.natsconf import NatsAccess
from services.settings import Settings
from tests.conftest import make_settings, operator_nats, running_stack
from tests.integration.helpers import appended, text_message
from tests.integration.test_partitions import projector_of
from tests.support import nats_server


def raw(event: Event, **fields: Any) -> bytes:
    return json.dumps({**json.loads(event.to_json()), **fields}).encode()


def bad_events(c: Container) -> list[tuple[str, bytes, str]]:
    """(subject, bytes, expected reason) of every kind of bad event, all from tenant B."""
    layout = c.layout
    subject = layout.session_subject("tenant-b", "b-1")
    renamed = SessionRenamed(tenant="tenant-b", session="b-1", name="x")
    part = partition_of("tenant-b", "b-1", layout.partitions)
    wrong_part = subject.replace(f".p{part:03d}.", f".p{(part + 1) % layout.partitions:03d}.")
    nul_session = "b\x00x"
    return [
        (subject, b"this is not json", "not_json"),
        (subject, raw(renamed, type="evil.happened"), "unknown_type"),
        (subject, raw(renamed, version=99), "newer_version"),
        (layout.session_subject("tenant-b", nul_session), raw(renamed, session=nul_session), "invalid"),
        (subject, raw(renamed, tenant="tenant-a"), "subject_mismatch"),
        (wrong_part, renamed.to_json(), "subject_mismatch"),
        # another partition's subject decides before the version (it was quarantined newer_version)
        (wrong_part, raw(renamed, version=99), "subject_mismatch"),
        # stored compact, its message_id left out, and a body with no id to give it
        (subject, raw(appended("tenant-b", "b-1", "m1", None), message={"role": "user", "parts": []}), "invalid"),
    ]


@contextlib.asynccontextmanager
async def projectors(c: Container, settings: Settings, shares: list[list[int] | None]) -> AsyncIterator[list[Any]]:
    stop = asyncio.Event()
    runners = [projector_of(c, settings, parts) for parts in shares]
    tasks = [asyncio.create_task(r.run(stop)) for r in runners]
    try:
        yield runners
    finally:
        stop.set()
        for t in tasks:
            await asyncio.wait_for(t, 15)


async def quarantined(conninfo: str) -> list[tuple[int, str]]:
    async with await psycopg.AsyncConnection.connect(conninfo) as conn:
        cur = await conn.execute("SELECT seq, reason FROM quarantine ORDER BY seq")
        return [(int(s), str(r)) for s, r in await cur.fetchall()]


@pytest.mark.parametrize("shares", [[None], [[0], [1]]], ids=["one-projector", "partition-workers"])
async def test_tenant_a_is_served_while_tenant_b_publishes_every_kind_of_bad_event(
    nats_url: str, fresh_db: str, s3_endpoint: str, shares: list[list[int] | None]
) -> None:
    settings = make_settings(nats_url, fresh_db, s3_endpoint=s3_endpoint, partitions=2)
    async with running_stack(settings, projector=False) as c, projectors(c, settings, shares) as runners:
        expected: list[tuple[int, str]] = []
        last = 0
        for i, (subject, data, reason) in enumerate(bad_events(c)):
            r = await c.commands.append("tenant-a", "a-1", text_message(f"m{i}", f"before bad event {i}"), None)
            ack = await c.js.publish(subject, data, stream=settings.stream)
            expected.append((ack.seq, reason))
            last = r.seq
        r = await c.commands.append("tenant-a", "a-1", text_message("last", "after every bad event"), None)
        last = r.seq
        await c.waiter.wait_all(last, timeout_s=20)
        async with c.pool.connection() as conn:
            cur = await conn.execute("SELECT count(*) FROM messages WHERE tenant = 'tenant-a' AND session_id = 'a-1'")
            assert await cur.fetchone() == (9,)
            cur = await conn.execute("SELECT count(*) FROM sessions WHERE tenant <> 'tenant-a'")
            assert await cur.fetchone() == (0,)  # nothing of B's was applied, nothing landed in A
            by_reason = await ops.counts(conn)
            listed = await ops.list_quarantined(conn, c.layout, tenant="tenant-b")
            shown = await ops.show(conn, c.layout, expected[0][0])
        assert await quarantined(fresh_db) == expected  # each exactly once, with its reason
        assert sum(r.stats.quarantined for r in runners) == len(expected)
        assert by_reason == {
            "invalid": 2,
            "newer_version": 1,
            "not_json": 1,
            "subject_mismatch": 3,
            "unknown_type": 1,
        }
        assert [e.seq for e in listed] == sorted((s for s, _ in expected), reverse=True)
        assert shown is not None
        assert shown["raw"] == {"text": "this is not json"}
        ready = await metrics.readiness(c)
        assert ready["ready"], ready  # quarantines are reported, never an outage
        assert ready["quarantined"] == by_reason
        report = await audit.verify(c)
        assert report.ok, report.differences
        assert report.live["quarantine"][0] == len(expected)


async def test_a_data_error_is_quarantined_and_the_rest_of_its_batch_applied(
    nats_url: str, fresh_db: str, s3_endpoint: str
) -> None:
    settings = make_settings(nats_url, fresh_db, s3_endpoint=s3_endpoint)
    async with running_stack(settings, projector=False) as c:
        too_many_tokens = ContextWritten(
            tenant="tenant-a", session="d-1", label="notes", content="x", tokens=2**31, mode="replace", writer="api"
        )  # admitted by the contract; the tokens column is a Postgres integer
        events = [
            appended("tenant-a", "d-1", "m0", None),
            too_many_tokens,
            appended("tenant-a", "d-1", "m1", "m0"),
        ]
        seqs = [p.seq for p in await c.publisher.publish_many(events)]
        async with projectors(c, settings, [None]) as runners:  # started after: one batch
            await c.waiter.wait_all(seqs[-1], timeout_s=20)
        assert runners[0].stats.batches == 1
        assert await quarantined(fresh_db) == [(seqs[1], "data_error")]
        async with c.pool.connection() as conn:
            cur = await conn.execute("SELECT id FROM messages WHERE session_id = 'd-1' ORDER BY seq")
            assert [r[0] for r in await cur.fetchall()] == ["m0", "m1"]
            shown = await ops.show(conn, c.layout, seqs[1])
        assert shown is not None
        assert "NumericValueOutOfRange" in shown["detail"]
        assert json.loads(shown["raw"]["text"])["tokens"] == 2**31
        # the same bytes decide the same on a rebuild
        await rebuild_into(c.js, c.layout, fresh_db, "shadow", c.projections(), settings.projector_name, keys=c.keys)
        async with await psycopg.AsyncConnection.connect(fresh_db) as conn:
            assert await quarantine_rows(conn, "shadow") == await quarantine_rows(conn, "public")
        assert (await audit.verify(c)).ok


class Records(logging.Handler):
    """Collects log records and wakes a waiter once ``wanted`` have arrived."""

    def __init__(self, wanted: int) -> None:
        super().__init__(logging.WARNING)
        self.records: list[logging.LogRecord] = []
        self.wanted = wanted
        self.enough = asyncio.Event()

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)
        if len(self.records) >= self.wanted:
            self.enough.set()


async def failing_retries(c: Container, name: str, wanted: int, **overrides: Any) -> list[logging.LogRecord]:
    """A projector of ``c``'s stack with ``overrides`` (what makes it fail), run until it has
    logged ``wanted`` warnings: its retry lines."""
    runner = ProjectorRunner(
        **{
            "js": c.js,
            "pool": c.pool,
            "conninfo": c.settings.database_url,
            "layout": c.layout,
            "projections": c.projections(),
            "name": name,
            "retry_base_s": 0.05,
            "retry_cap_s": 0.4,
            **overrides,
        }
    )
    records = Records(wanted=wanted)
    logger = logging.getLogger("chronicle.projector")
    logger.addHandler(records)
    stop = asyncio.Event()
    task = asyncio.create_task(runner.run(stop))
    try:
        await asyncio.wait_for(records.enough.wait(), timeout=30)
    finally:
        stop.set()
        await asyncio.wait_for(task, 15)
        logger.removeHandler(records)
    return [r for r in records.records if r.getMessage().startswith(f"projector {name} failed")]


async def test_a_projector_whose_database_is_down_retries_with_growing_delays_and_one_line_each(
    nats_url: str, fresh_db: str
) -> None:
    settings = make_settings(nats_url, fresh_db)
    async with running_stack(settings, projector=False) as c:
        dead = f"postgresql://postgres@127.0.0.1:{free_port()}/nowhere?connect_timeout=2"
        retries = await failing_retries(c, "backoff-test", 6, conninfo=dead)
    delays = [r.args[-1] for r in retries[:6] if isinstance(r.args, tuple)]
    assert delays == [0.05, 0.1, 0.2, 0.4, 0.4, 0.4]
    assert "OperationalError" in retries[0].getMessage()
    # one line each, the first included (docs/reliability.md); the traceback is at DEBUG
    assert [bool(r.exc_info) for r in retries[:3]] == [False, False, False]


async def test_a_projector_whose_nats_connection_fails_logs_one_line_without_a_traceback(
    nats_url: str, fresh_db: str
) -> None:
    """A NATS failure (a node failing over: a timeout, a connection lost) is expected on a cluster:
    one line, even the first time (it was a WARNING with the whole nats traceback)."""
    settings = make_settings(nats_url, fresh_db)
    async with running_stack(settings, projector=False) as c:
        gone = await operator_nats(nats_url)
        await gone.close()  # every JetStream call through it now fails with a NATS error
        retries = await failing_retries(c, "nats-gone-test", 2, js=gone.jetstream())
    assert len(retries) == 2
    assert "ConnectionClosedError" in retries[0].getMessage()
    assert [bool(r.exc_info) for r in retries] == [False, False]


async def test_an_event_over_the_size_limit_is_quarantined_where_the_server_accepts_it(
    tmp_path: Path, fresh_db: str
) -> None:
    """NATS's default max_payload (1 MiB) is the contract's limit, so only a server configured for
    more stores such an event; the projector then quarantines it."""
    port = free_port()
    settings = make_settings(f"nats://127.0.0.1:{port}", fresh_db)
    access = NatsAccess.of(settings)
    with nats_server(tmp_path, access, port=port, extra={"max_payload": 4 * 1024 * 1024}):
        async with running_stack(settings) as c:
            big = raw(SessionRenamed(tenant="tenant-b", session="big", name="x"), name="x" * (1024 * 1024 + 1))
            ack = await c.js.publish(c.layout.session_subject("tenant-b", "big"), big, stream=settings.stream)
            r = await c.commands.append("tenant-a", "after-big", text_message("m0", "still served"), None)
            await c.waiter.wait_all(r.seq, timeout_s=20)
            assert await quarantined(fresh_db) == [(ack.seq, "too_large")]


async def test_large_junk_is_quarantined_in_bounded_inserts_keeping_64_kib_of_each(
    nats_url: str, fresh_db: str
) -> None:
    """(A tenant's flood of ~1 MB junk events made one quarantine insert over Postgres's 1 GB
    message limit: every tenant's projector halted, and each row kept the whole megabyte.)"""
    settings = make_settings(nats_url, fresh_db)
    junk = b"\xff" + b"x" * 900_000
    async with running_stack(settings, projector=False) as c:
        subject = c.layout.session_subject("tenant-b", "junk")
        acks = [await c.js.publish(subject, junk) for _ in range(40)]  # one backlog: a batch of ~36 MB of junk
        async with projectors(c, settings, [None]):
            r = await c.commands.append("tenant-a", "after-junk", text_message("m0", "still served"), None)
            await c.waiter.wait_all(r.seq, timeout_s=60)
        async with await psycopg.AsyncConnection.connect(fresh_db) as conn:
            cur = await conn.execute("SELECT seq, octet_length(raw), size FROM quarantine ORDER BY seq")
            assert await cur.fetchall() == [(a.seq, RAW_KEPT, len(junk)) for a in acks]
            shown = await ops.show(conn, c.layout, acks[0].seq)
        assert shown is not None
        assert (shown["size"], shown["raw_kept"]) == (len(junk), RAW_KEPT)
        await rebuild_into(c.js, c.layout, fresh_db, "shadow", c.projections(), settings.projector_name, keys=c.keys)
        async with await psycopg.AsyncConnection.connect(fresh_db) as conn:
            assert await quarantine_rows(conn, "shadow") == await quarantine_rows(conn, "public")


def test_quarantine_inserts_are_cut_by_the_bytes_they_keep() -> None:
    item = Quarantined(1, "s", "not_json", "d", b"x" * (RAW_KEPT * 2))
    chunks = _chunks([item] * 600)  # 600 x 64 KiB kept: 37.5 MiB
    assert [len(c) for c in chunks] == [256, 256, 88]
    assert _chunks([Quarantined(1, "s", "not_json", "d", b"x")]) == [[Quarantined(1, "s", "not_json", "d", b"x")]]


async def test_readiness_fails_with_the_reason_when_the_projector_stops_while_events_wait(
    nats_url: str, fresh_db: str
) -> None:
    settings = make_settings(nats_url, fresh_db)
    async with running_stack(settings, projector=False) as c:
        async with projectors(c, settings, [None]):
            r = await c.commands.append("tenant-a", "ready-1", text_message("m0", "applied"), None)
            await c.waiter.wait_all(r.seq, timeout_s=20)
            ready = await metrics.readiness(c, stall_s=0, max_lag=0)
            assert ready["ready"], ready  # caught up: however old its last move, not stalled
        await c.publisher.publish(appended("tenant-a", "ready-1", "m1", "m0"))  # waits: nobody applies it
        ready = await metrics.readiness(c, stall_s=0, max_lag=10)
        assert not ready["ready"]
        assert [x for x in ready["reasons"] if "not advanced" in x and settings.projector_name in x], ready
        ready = await metrics.readiness(c, stall_s=3600, max_lag=0)
        assert ready["reasons"] == ["projection lag 1 is past the threshold 0"]
        assert (await metrics.readiness(c, stall_s=3600, max_lag=10))["ready"]


async def test_readiness_fails_when_the_stream_is_missing(nats_url: str, fresh_db: str) -> None:
    settings = make_settings(nats_url, fresh_db)
    async with running_stack(settings, projector=False) as c:
        await c.js.delete_stream(settings.stream)
        ready = await metrics.readiness(c)
        assert not ready["ready"]
        assert ready["reasons"] == [f"stream {settings.stream} is missing"]


async def recorded_times(conninfo: str) -> dict[int, datetime]:
    async with await psycopg.AsyncConnection.connect(conninfo) as conn:
        cur = await conn.execute("SELECT seq, recorded_at FROM quarantine ORDER BY seq")
        return {int(s): t for s, t in await cur.fetchall()}


@pytest.mark.parametrize("shares", [[None], [[0], [1]]], ids=["one-projector", "partition-workers"])
async def test_a_rebuild_keeps_when_each_quarantined_event_was_stored(
    nats_url: str, fresh_db: str, s3_endpoint: str, shares: list[list[int] | None]
) -> None:
    """A quarantine row's ``recorded_at`` is when the stream stored the event (``replay``'s
    ``stored_at``), for a refusal of the contract and a data error alike, as the live projector
    records it and as ``chronicle rebuild`` records it again (it set every row's to the time of the
    rebuild, so ``quarantine list`` and ``log show`` lost when each event was first seen)."""
    settings = make_settings(nats_url, fresh_db, s3_endpoint=s3_endpoint, partitions=2)
    async with running_stack(settings, projector=False) as c:
        too_many_tokens = ContextWritten(
            tenant="tenant-a", session="t-1", label="notes", content="x", tokens=2**31, mode="replace", writer="api"
        )
        seqs = [(await c.js.publish(s, data, stream=settings.stream)).seq for s, data, _ in bad_events(c)[:3]]
        seqs += [p.seq for p in await c.publisher.publish_many([appended("tenant-a", "t-1", "m0", None)])]
        seqs += [p.seq for p in await c.publisher.publish_many([too_many_tokens])]
        async with projectors(c, settings, shares):
            await c.waiter.wait_all(seqs[-1], timeout_s=20)
        stored = {s.seq: s.time async for s in eventlog.read(c.js, c.layout, None, 1, seqs[-1])}
        expected = {seq: stored[seq] for seq in [*seqs[:3], seqs[-1]]}
        assert await recorded_times(fresh_db) == expected
        await audit.rebuild_and_swap(c)
        assert await recorded_times(fresh_db) == expected
        async with c.pool.connection() as conn:
            listed = await ops.list_quarantined(conn, c.layout)
        assert {e.seq: e.recorded_at for e in listed} == expected
        report = await audit.verify(c)
        assert report.ok, report.differences
