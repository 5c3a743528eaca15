"""The message shape a request may send (events/messages.py): strings where the AI SDK's parts
have strings, anything in a tool's input and output, and no new message whose id no URL could name
(``.``, ``..``, or one holding a ``/``)."""

from __future__ import annotations

from typing import Any

import pytest

from services.errors import InvalidId, InvalidRequest
from services.requests.checks import checked_message


def _message(*parts: dict[str, Any], mid: str = "m") -> dict[str, Any]:
    return {"id": mid, "role": "assistant", "parts": list(parts)}


@pytest.mark.parametrize(
    "part",
    [
        {"type": "text", "text": 123},
        {"type": "text", "text": None},
        {"type": "text"},
        {"type": "text", "text": "a", "state": 1},
        {"type": "reasoning", "text": {"t": "x"}},
        {"type": "reasoning", "reasoning": 5},
        {"type": "file", "url": "u", "mediaType": 3},
        {"type": "source-url", "sourceId": "s", "url": "u", "title": False},
        {"type": "source-document", "sourceId": 1, "mediaType": "text/plain", "title": "t"},
        {"type": "tool-lookup", "toolCallId": 7},
        {"type": "tool-lookup", "toolCallId": "c", "errorText": ["e"]},
        {"type": "dynamic-tool", "toolCallId": "c", "toolName": None},
    ],
)
def test_a_part_field_the_sdk_types_as_a_string_must_be_one(part: dict[str, Any]) -> None:
    with pytest.raises(InvalidRequest, match=r"must be a string|needs text"):
        checked_message(_message(part), new=True)


@pytest.mark.parametrize(
    "part",
    [
        {"type": "text", "text": ""},
        {"type": "reasoning", "reasoning": "AI SDK 4", "details": [{"type": "text", "text": "x"}]},
        {"type": "reasoning", "text": "AI SDK 5", "providerMetadata": {"a": {"b": [1, None]}}},
        {"type": "tool-lookup", "toolCallId": "c", "state": "output-available", "input": 1, "output": [None, {}]},
        {"type": "dynamic-tool", "toolCallId": "c", "toolName": "t", "input": None, "output": 2.5},
        {"type": "tool-invocation", "toolInvocation": {"toolCallId": 1, "args": {}}},
        {"type": "data-weather", "data": [1], "title": 2},
        {"type": "step-start"},
        {"type": "something-new", "text": 1, "url": {}},
    ],
)
def test_other_parts_and_arbitrary_tool_json_are_kept_as_sent(part: dict[str, Any]) -> None:
    message = _message(part)
    assert checked_message(message, new=True) is message


@pytest.mark.parametrize("mid", [".", ".."])
def test_a_new_message_may_not_be_named_by_a_dot_segment(mid: str) -> None:
    with pytest.raises(InvalidId, match=f"must not be {mid!r}"):
        checked_message(_message(mid=mid), new=True)
    assert checked_message(_message(mid=mid), new=False)["id"] == mid  # an update names a stored message


@pytest.mark.parametrize("mid", ["a/b", "/", "a/..", "../a", "/m"])
def test_a_new_message_may_not_hold_a_slash_in_its_id(mid: str) -> None:
    with pytest.raises(InvalidId, match="must not contain '/'"):
        checked_message(_message(mid=mid), new=True)
    assert checked_message(_message(mid=mid), new=False)["id"] == mid  # an update names a stored message


@pytest.mark.parametrize("mid", ["...", ".a", "a.", "..a", "a..", "a\\.."])
def test_ids_with_more_than_a_dot_segment_are_fine(mid: str) -> None:
    assert checked_message(_message(mid=mid), new=True)["id"] == mid
