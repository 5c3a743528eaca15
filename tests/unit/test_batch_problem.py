"""What a batch that failed part-way answers (services/requests/problems.py ``batch_problem``): a
refusal says the failing message was not written; a failure below (5xx) says it may have been,
since it may have been stored with its answer lost."""

from __future__ import annotations

from events.publisher import PublishFailed
from services.errors import BatchFailed, MessageConflict
from services.requests.problems import batch_problem

WRITTEN = [{"id": "n1", "parent_id": None, "seq": 7, "created": True}]


def test_a_refusal_says_the_failing_message_was_not_written() -> None:
    body = batch_problem(BatchFailed(MessageConflict("other body"), 1, "ex", WRITTEN))
    assert (body["status"], body["failed_index"], body["written"]) == (409, 1, WRITTEN)
    assert "stored before it (`written`), it was not, nor the messages after it" in str(body["detail"])
    first = batch_problem(BatchFailed(MessageConflict("other body"), 0, "ex", []))
    assert str(first["detail"]).endswith("nothing of the batch was written.")


def test_a_failure_below_says_the_failing_message_may_have_been_stored() -> None:
    body = batch_problem(BatchFailed(PublishFailed("retries spent"), 1, "n2", WRITTEN))
    assert body["status"] == 503
    assert "stored before it (`written`), and it may have been" in str(body["detail"])
    assert "was not" not in str(body["detail"])
    first = batch_problem(BatchFailed(PublishFailed("retries spent"), 0, "n1", []))
    assert "no message before it was written, and it may have been" in str(first["detail"])
    assert "nothing of the batch was written" not in str(first["detail"])
