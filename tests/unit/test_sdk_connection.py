"""Sessions and the manager need only the ``Connection`` protocol, not ``ChronicleClient``."""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator, Mapping, Sequence
from typing import Any

import pytest

from chronicle_sdk import OMITTED, AppendResult, MessageNotFound, RateLimited, SessionManager, Unavailable
from chronicle_sdk import session as sdk_session
from chronicle_sdk.errors import MAX_RETRY_AFTER_S


class RecordingConnection:
    """A ``Connection`` of its own: records what it is asked and answers from a script."""

    def __init__(self, answers: Sequence[Sequence[bytes | Exception]] = ()) -> None:
        self.calls: list[tuple[Any, ...]] = []
        self.answers = list(answers)  # per stream_lines call: its lines, an exception ends it

    async def stream_lines(self, path: str, params: Mapping[str, Any]) -> AsyncGenerator[bytes, None]:
        self.calls.append(("stream_lines", path, dict(params)))
        for item in self.answers.pop(0):
            if isinstance(item, Exception):
                raise item
            yield item

    async def request(self, method: str, path: str, **options: Any) -> Any:
        self.calls.append(("request", method, path, options.get("session")))
        if "/messages/" in path:
            raise MessageNotFound("no such message", status=404)
        return {"messages": [{"id": "m1", "role": "user", "parts": []}], "seq": 7}

    async def get_optional(
        self,
        path: str,
        *,
        session: str | None = None,
        min_seq: int | None = None,
        params: Mapping[str, Any] | None = None,
    ) -> Any:
        self.calls.append(("get_optional", path, session))
        return None

    def note_seq(self, session_id: str, seq: Any) -> None:
        self.calls.append(("note_seq", session_id, seq))

    def last_seq(self, session_id: str | None = None) -> int:
        return 0

    async def append(
        self, session_id: str, message: Mapping[str, Any], parent_id: Any = OMITTED, *, via: Any = None
    ) -> AppendResult:
        self.calls.append(("append", session_id, message["id"], parent_id, via))
        return AppendResult(str(message["id"]), None, 8, True)

    async def append_chain(
        self, session_id: str, messages: Sequence[Mapping[str, Any]], parent_id: str | None = None, *, via: Any = None
    ) -> list[AppendResult]:
        raise AssertionError("not used here")


async def test_a_session_of_the_manager_runs_on_any_connection() -> None:
    connection = RecordingConnection()
    session = SessionManager(connection).get_session("a b?c")

    assert await session.get_history() == [{"id": "m1", "role": "user", "parts": []}]
    appended = await session.append_message({"id": "m2", "role": "user", "parts": []}, None, via="jetstream")
    assert await session.get_message("m9") is None

    assert appended == AppendResult("m2", None, 8, True)
    assert connection.calls == [
        ("request", "GET", "/v1/sessions/a%20b%3Fc/history", "a b?c"),
        ("append", "a b?c", "m2", None, "jetstream"),
        ("request", "GET", "/v1/sessions/a%20b%3Fc/messages/m9", "a b?c"),
    ]


def line(seq: int, kind: str = "message.appended") -> bytes:
    return json.dumps({"seq": seq, "event": {"type": kind}}).encode()


@pytest.fixture(autouse=True)
def no_pauses(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sdk_session, "_FOLLOW_PAUSE_S", 0.0)


async def test_following_resumes_after_the_last_event_given_and_ends_at_the_deletion() -> None:
    lost = Unavailable("GET …/events: the answer stopped", status=0)
    connection = RecordingConnection(
        [
            [line(3), b"", line(5), lost],  # a keep-alive, then the connection is lost
            [],  # the server ended a page (its limit): go on
            [line(8), line(9, "session.deleted")],
        ]
    )
    session = SessionManager(connection).get_session("s")
    got = [record["seq"] async for record in session.follow_events(from_seq=2)]
    assert got == [3, 5, 8, 9]
    asked = [c[2] for c in connection.calls if c[0] == "stream_lines"]
    assert asked == [
        {"from_seq": 2, "follow": "true"},
        {"from_seq": 6, "follow": "true"},
        {"from_seq": 6, "follow": "true"},
    ]
    assert ("note_seq", "s", 9) in connection.calls  # later reads wait for what was followed


async def test_following_up_to_to_seq_ends_there_and_a_lasting_outage_raises() -> None:
    connection = RecordingConnection([[line(4), line(6)]])
    session = SessionManager(connection).get_session("s")
    assert [r["seq"] async for r in session.follow_events(to_seq=6)] == [4, 6]
    assert len([c for c in connection.calls if c[0] == "stream_lines"]) == 1

    down = RecordingConnection([[Unavailable("down", status=0)] for _ in range(9)])
    with pytest.raises(Unavailable):
        async for _ in SessionManager(down).get_session("s").follow_events():
            pass


async def test_an_answer_that_ends_before_to_seq_is_not_reopened_in_a_loop() -> None:
    # to_seq names another session's event: the server ends the answer once the stream passed it
    connection = RecordingConnection([[line(4)], [], []])
    got = [r["seq"] async for r in SessionManager(connection).get_session("s").follow_events(to_seq=5)]
    assert got == [4]
    assert len([c for c in connection.calls if c[0] == "stream_lines"]) == 1


async def test_a_rate_limited_resume_is_waited_out_and_too_many_streams_raises() -> None:
    limited = RateLimited("slow down", code="rate_limited", status=429, problem={"retry_after": 0.0})
    connection = RecordingConnection([[line(3), limited], [line(4, "session.erased")]])
    got = [r["seq"] async for r in SessionManager(connection).get_session("s").follow_events()]
    assert got == [3, 4]

    full = RateLimited("no free stream", code="too_many_streams", status=429)
    with pytest.raises(RateLimited):
        async for _ in SessionManager(RecordingConnection([[full]])).get_session("s").follow_events():
            pass


async def test_a_resume_refused_for_longer_than_the_client_waits_raises_at_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A ``retry_after`` over ``MAX_RETRY_AFTER_S`` (a tenant deep in debt after a big batch) is
    raised at once, as any call raises it, not slept out in silence (it read as a hang)."""
    slept: list[float] = []

    async def sleep(seconds: float) -> None:
        slept.append(seconds)

    monkeypatch.setattr("chronicle_sdk.session.asyncio.sleep", sleep)
    limited = RateLimited(
        "deep in debt", code="rate_limited", status=429, problem={"retry_after": MAX_RETRY_AFTER_S + 1}
    )
    connection = RecordingConnection([[line(3), limited], [line(4, "session.erased")]])
    got: list[int] = []

    async def follow() -> None:
        async for record in SessionManager(connection).get_session("s").follow_events():
            got.append(record["seq"])

    with pytest.raises(RateLimited) as raised:
        await follow()
    assert raised.value is limited
    assert got == [3]
    assert slept == []
