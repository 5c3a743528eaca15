"""Every transient 503 says when to ask again: ``retry_after`` 1 in the problem and ``Retry-After: 1``
on the HTTP answer. An SRE trial of a three-node cluster saw ``503 unavailable`` (the event log:
a publish timed out, no responders during a leader election) and ``503 projection_timeout`` without
either, while the database's ``503 unavailable`` carried both: one code, two answers."""

from __future__ import annotations

import nats.errors
import psycopg
import pytest

from events.blobs import BlobNotFound
from events.publisher import PublishFailed
from services.api.problems import as_response
from services.errors import BatchFailed, ContentionExhausted, ProjectionTimeout, SearchTimeout, Unavailable
from services.requests.problems import problem_of

TRANSIENT: list[BaseException] = [
    PublishFailed("publish of message.appended e1 failed: Timeout"),
    nats.errors.TimeoutError(),
    nats.errors.NoRespondersError(),
    ProjectionTimeout("the read model has not applied sequence 7 yet"),
    ContentionExhausted(),
    Unavailable(),
    psycopg.OperationalError("the connection is lost"),
]


@pytest.mark.parametrize("exc", TRANSIENT, ids=lambda e: type(e).__name__)
def test_a_transient_503_says_retry_after_one_second(exc: BaseException) -> None:
    found = problem_of(exc)
    assert found is not None
    assert found["status"] == 503
    assert found.get("retry_after") == 1, found
    assert as_response(found).headers.get("retry-after") == "1"


def test_a_search_timeout_still_says_no_retry_after() -> None:
    found = problem_of(SearchTimeout(3.0))
    assert found is not None
    assert "retry_after" not in found
    assert as_response(found).headers.get("retry-after") is None


def test_a_missing_blob_keeps_503_unavailable_without_retry_after() -> None:
    """A claim-checked body that is not in object storage is answered ``503 unavailable`` (as
    before) but is missing, not passing: asking again a second later finds it missing again."""
    missing = BlobNotFound("no object sha256:ab… in the bucket")
    for exc in (missing, BatchFailed(missing, 1, "m1", [{"id": "m0"}])):
        found = problem_of(exc)
        assert found is not None
        assert (found["status"], found["code"]) == (503, "unavailable")
        assert "retry_after" not in found, found
        assert as_response(found).headers.get("retry-after") is None
