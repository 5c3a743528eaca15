"""The advisory JetStream sends when it gives up a compaction request (services/compaction/exhausted.py
``exhausted_of``): only a ``max_deliver`` advisory names a request to delete. The subject is outside
every tenant's publish permissions, but a tenant can have the server publish a reply there (the
ack of its own event): such a body names nothing."""

from __future__ import annotations

import asyncio
import json
from typing import Any, cast

import pytest

from events.subjects import SubjectLayout
from services.compaction.exhausted import exhausted_of, request_in
from services.compaction.queue import KIND, DeliveriesExhausted, exhausted_failure_id, request
from services.compaction.worker import Compactor

ADVISORY = {
    "type": "io.nats.jetstream.advisory.v1.max_deliver",
    "id": "AohTCHOa05Z12YL1EaRqVn",
    "timestamp": "2026-12-07T14:32:08.340074089Z",
    "stream": "W",
    "consumer": "c",
    "stream_seq": 7,
    "deliveries": 9,
}


def test_a_max_deliver_advisory_names_the_request_and_its_deliveries() -> None:
    assert exhausted_of(json.dumps(ADVISORY).encode()) == (7, 9)


def test_anything_else_on_the_subject_names_nothing() -> None:
    assert exhausted_of(b'{"stream": "T1", "seq": 7}') is None  # a publish ack reflected there
    assert exhausted_of(json.dumps({**ADVISORY, "type": "io.nats.jetstream.api.v1.pub_ack"}).encode()) is None
    assert exhausted_of(json.dumps({k: v for k, v in ADVISORY.items() if k != "type"}).encode()) is None
    assert exhausted_of(json.dumps({**ADVISORY, "stream_seq": 0}).encode()) is None
    assert exhausted_of(b"not json") is None
    assert exhausted_of(b"[7]") is None


def test_only_a_request_of_its_subjects_session_is_recorded_as_given_up() -> None:
    layout = SubjectLayout()
    req = request("t", "s", "m9", 500, 3)
    assert request_in(layout, layout.work_subject(KIND, "t", "s"), req.to_json()) == req
    assert request_in(layout, layout.work_subject(KIND, "t", "other"), req.to_json()) is None
    assert request_in(layout, layout.work_subject(KIND, "t", "s"), b'{"stream": "T1", "seq": 7}') is None


def test_the_failure_of_a_given_up_request_says_what_happened_and_has_one_id_per_request() -> None:
    assert str(DeliveriesExhausted(1)) == "the compactor stopped answering on its last allowed delivery (1 delivery)"
    assert "(17 deliveries)" in str(DeliveriesExhausted(17))
    assert exhausted_failure_id("r", 7) == exhausted_failure_id("r", 7)
    assert exhausted_failure_id("r", 7) not in (exhausted_failure_id("r", 8), exhausted_failure_id("q", 7))


async def test_a_stop_cancelled_while_advisories_settle_stays_cancelled() -> None:
    """The compactor's stop waits for its advisory tasks to end; a cancellation of that stop
    (its caller's) is not swallowed with theirs."""
    compactor = Compactor(*cast(Any, [None] * 6))
    closing = asyncio.Event()

    async def settling() -> None:
        try:
            await asyncio.Event().wait()
        finally:
            closing.set()
            await asyncio.sleep(0.05)  # its cleanup takes a moment

    task = asyncio.create_task(settling())
    compactor.given_up._settling.add(task)
    await asyncio.sleep(0)
    stopping = asyncio.create_task(compactor._unwatch())
    await closing.wait()
    stopping.cancel()
    with pytest.raises(asyncio.CancelledError):
        await stopping
    assert task.done()
