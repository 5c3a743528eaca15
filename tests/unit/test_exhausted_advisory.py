"""The advisory JetStream sends when it gives up a compaction request (services/compaction/worker.py
``exhausted_of``): only a ``max_deliver`` advisory names a request to delete. The subject is outside
every tenant's publish permissions, but a tenant can have the server publish a reply there (the
ack of its own event): such a body names nothing."""

from __future__ import annotations

import json

from services.compaction.worker import exhausted_of

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
