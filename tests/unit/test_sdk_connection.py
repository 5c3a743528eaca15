"""Sessions and the manager need only the ``Connection`` protocol, not ``ChronicleClient``."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from chronicle_sdk import OMITTED, AppendResult, SessionManager


class RecordingConnection:
    """A ``Connection`` of its own: records what it is asked and answers from a script."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []

    async def request(self, method: str, path: str, **options: Any) -> Any:
        self.calls.append(("request", method, path, options.get("session")))
        return {"messages": [{"id": "m1", "role": "user", "parts": []}], "seq": 7}

    async def get_optional(self, path: str, *, session: str | None = None, min_seq: int | None = None) -> Any:
        self.calls.append(("get_optional", path, session))
        return None

    def note_seq(self, session_id: str, seq: Any) -> None:
        self.calls.append(("note_seq", session_id, seq))

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
    session = SessionManager(connection).get_session("a/b")

    assert await session.get_history() == [{"id": "m1", "role": "user", "parts": []}]
    appended = await session.append_message({"id": "m2", "role": "user", "parts": []}, None, via="jetstream")
    assert await session.get_message("m9") is None

    assert appended == AppendResult("m2", None, 8, True)
    assert connection.calls == [
        ("request", "GET", "/v1/sessions/a%2Fb/history", "a/b"),
        ("append", "a/b", "m2", None, "jetstream"),
        ("get_optional", "/v1/sessions/a%2Fb/messages/m9", "a/b"),
    ]
