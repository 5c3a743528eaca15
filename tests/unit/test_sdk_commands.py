"""The SDK's route from an API write to its NATS command: every command is reachable, and the
request body the SDK builds is the one the command's model accepts."""

from __future__ import annotations

from typing import Any

import pytest

from chronicle_sdk.commands import ROUTES, reply_status, route
from events.commands import COMMANDS, STATUS_HEADER

M = {"id": "m/1", "role": "user", "parts": [{"type": "text", "text": "hi"}]}
CASES: list[tuple[str, str, Any, dict[str, Any], dict[str, str], str, dict[str, Any]]] = [
    ("POST", "/v1/sessions", {"id": "s"}, {}, {}, "session.create", {"id": "s"}),
    ("PATCH", "/v1/sessions/a%2Fb", {"name": "n"}, {}, {}, "session.rename", {"session_id": "a/b", "name": "n"}),
    ("DELETE", "/v1/sessions/s", None, {}, {}, "session.delete", {"session_id": "s"}),
    (
        "POST",
        "/v1/sessions/s/usage",
        {"input_tokens": 3, "output_tokens": 4, "cost": 0.5},
        {},
        {"idempotency-key": "u1"},
        "session.usage",
        {"session_id": "s", "input_tokens": 3, "output_tokens": 4, "cost": 0.5, "idempotency_key": "u1"},
    ),
    ("POST", "/v1/sessions/s:end", {"reason": "done"}, {}, {}, "session.end", {"session_id": "s", "reason": "done"}),
    (
        "POST",
        "/v1/sessions/s/fork",
        {"at_message_id": "m1", "name": None},
        {},
        {},
        "session.fork",
        {"session_id": "s", "at_message_id": "m1", "name": None},
    ),
    (
        "POST",
        "/v1/sessions/s/messages",
        {"message": M},
        {},
        {"Idempotency-Key": "k1"},
        "append",
        {"session_id": "s", "message": M, "idempotency_key": "k1"},
    ),
    (
        "POST",
        "/v1/sessions/s/messages:batch",
        {"messages": [M], "parent_id": None},
        {},
        {"Idempotency-Key": "b1"},
        "append_batch",
        {"session_id": "s", "messages": [M], "parent_id": None, "idempotency_key": "b1"},
    ),
    ("PUT", "/v1/sessions/s/messages/m%2F1", {"message": M}, {}, {}, "update", {"session_id": "s", "message": M}),
    ("POST", "/v1/sessions/s/messages:delete", {"ids": ["m1"]}, {}, {}, "delete", {"session_id": "s", "ids": ["m1"]}),
    ("POST", "/v1/sessions/s/messages:clear", None, {}, {}, "clear", {"session_id": "s"}),
    ("POST", "/v1/sessions/s/compact", {}, {}, {}, "compact", {"session_id": "s"}),
    (
        "PUT",
        "/v1/sessions/s/config",
        {"blocks": []},
        {},
        {},
        "config.put",
        {"session_id": "s", "config": {"blocks": []}},
    ),
    (
        "PUT",
        "/v1/sessions/s/context/notes",
        {"content": "x", "mode": "append"},
        {},
        {},
        "context.write",
        {"session_id": "s", "label": "notes", "content": "x", "mode": "append"},
    ),
    (
        "POST",
        "/v1/sessions/s/tools/set_context",
        {"label": "notes"},
        {"tool_call_id": "c1"},
        {},
        "tool",
        {"session_id": "s", "name": "set_context", "arguments": {"label": "notes"}, "tool_call_id": "c1"},
    ),
    ("POST", "/v1/sessions/s/system-prompt:refresh", None, {}, {}, "prompt.refresh", {"session_id": "s"}),
]


@pytest.mark.parametrize(("method", "path", "body", "query", "headers", "name", "payload"), CASES)
def test_a_write_routes_to_its_command_with_a_valid_request(
    method: str, path: str, body: Any, query: dict[str, Any], headers: dict[str, str], name: str, payload: Any
) -> None:
    routed = route(method, path, body, query, headers)
    assert routed is not None
    assert (routed.command.name, routed.payload) == (name, payload)
    routed.command.request.model_validate(routed.payload)


def test_every_command_has_a_route_and_reads_have_none() -> None:
    assert sorted(name for _, _, name, _ in ROUTES) == sorted(c.name for c in COMMANDS)
    assert {c[5] for c in CASES} == {c.name for c in COMMANDS}
    assert route("GET", "/v1/sessions/s/history", None, {}, {}) is None
    assert route("GET", "/v1/sessions", None, {}, {}) is None
    assert route("DELETE", "/v1/sessions/s/messages", None, {"ids": "m1"}, {}) is None


def test_the_reply_status_header() -> None:
    assert reply_status({STATUS_HEADER: "422"}) == 422
    assert reply_status({}) == 0
    assert reply_status(None) == 0
