"""History to provider messages: AI SDK UIMessage parts to OpenAI Chat Completions and Anthropic Messages."""

from __future__ import annotations

from typing import Any

import pytest

from chronicle_sdk import UnconvertibleMessage, to_anthropic_messages, to_openai_messages


def user(mid: str, text: str) -> dict[str, Any]:
    return {"id": mid, "role": "user", "parts": [{"type": "text", "text": text}]}


def tool_part(call_id: str, state: str = "output-available", **extra: Any) -> dict[str, Any]:
    part: dict[str, Any] = {
        "type": "tool-set_context",
        "toolCallId": call_id,
        "state": state,
        "input": {"label": "memory", "content": "fact"},
    }
    if state == "output-available":
        part["output"] = "Written to memory. Usage: 1 tokens"
    part.update(extra)
    return part


HISTORY: list[dict[str, Any]] = [
    user("u1", "Remember fact"),
    {
        "id": "a1",
        "role": "assistant",
        "parts": [
            {"type": "step-start"},
            {"type": "reasoning", "text": "I should save it"},
            {"type": "text", "text": "Saving."},
            tool_part("call_1"),
            {"type": "step-start"},
            {"type": "text", "text": "Saved "},
            {"type": "text", "text": "it."},
        ],
    },
]


def test_openai_text_tools_and_reasoning_dropped() -> None:
    out = to_openai_messages(HISTORY, "SYSTEM")
    assert out == [
        {"role": "system", "content": "SYSTEM"},
        {"role": "user", "content": "Remember fact"},
        {
            "role": "assistant",
            "content": "Saving.",
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "set_context", "arguments": '{"label": "memory", "content": "fact"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "Written to memory. Usage: 1 tokens"},
        {"role": "assistant", "content": "Saved it."},
    ]


def test_openai_without_or_with_empty_system_prompt() -> None:
    assert to_openai_messages([user("u", "hi")]) == [{"role": "user", "content": "hi"}]
    assert to_openai_messages([user("u", "hi")], "") == [{"role": "user", "content": "hi"}]


def test_incomplete_tool_calls_are_dropped() -> None:
    history = [
        user("u1", "go"),
        {
            "id": "a1",
            "role": "assistant",
            "parts": [
                tool_part("pending", "input-available"),
                tool_part("streaming", "input-streaming"),
                tool_part("done"),
            ],
        },
        {"id": "a2", "role": "assistant", "parts": [tool_part("orphan", "input-available")]},
    ]
    openai = to_openai_messages(history)
    assert [m["role"] for m in openai] == ["user", "assistant", "tool"]
    assert [c["id"] for c in openai[1]["tool_calls"]] == ["done"]
    anthropic = to_anthropic_messages(history)
    assert [m["role"] for m in anthropic] == ["user", "assistant", "user"]
    assert [b["id"] for b in anthropic[1]["content"]] == ["done"]


def test_output_error_and_dynamic_tools_and_stateless_outputs() -> None:
    history = [
        {
            "id": "a1",
            "role": "assistant",
            "parts": [
                {
                    "type": "dynamic-tool",
                    "toolName": "lookup",
                    "toolCallId": "d1",
                    "state": "output-error",
                    "input": {"q": "x"},
                    "errorText": "boom",
                },
                {"type": "tool-search", "toolCallId": "s1", "input": {}, "output": {"hits": [1, 2]}},
                {
                    "type": "tool-invocation",
                    "toolInvocation": {
                        "state": "result",
                        "toolCallId": "v4",
                        "toolName": "old",
                        "args": {"a": 1},
                        "result": "r",
                    },
                },
                {
                    "type": "tool-invocation",
                    "toolInvocation": {"state": "call", "toolCallId": "v4b", "toolName": "old"},
                },
            ],
        }
    ]
    openai = to_openai_messages(history)
    assert [c["function"]["name"] for c in openai[0]["tool_calls"]] == ["lookup", "search", "old"]
    assert openai[1:] == [
        {"role": "tool", "tool_call_id": "d1", "content": "boom"},
        {"role": "tool", "tool_call_id": "s1", "content": '{"hits": [1, 2]}'},
        {"role": "tool", "tool_call_id": "v4", "content": "r"},
    ]
    anthropic = to_anthropic_messages(history)
    results = anthropic[1]["content"]
    assert results[0] == {"type": "tool_result", "tool_use_id": "d1", "content": "boom", "is_error": True}
    assert "is_error" not in results[1]


@pytest.mark.parametrize(
    ("raw", "sent"),
    [
        ('{"q": 5', {"raw_input": '{"q": 5'}),  # JSON the model broke off: kept, wrapped
        ('{"q": 5}', {"q": 5}),  # the text of an object (it failed the tool's schema): that object
        ("[1, 2]", {"raw_input": "[1, 2]"}),
        ([1, 2], {"raw_input": [1, 2]}),
        (7, {"raw_input": 7}),
        (None, {}),
    ],
)
def test_anthropic_keeps_a_tool_input_that_is_no_object_inside_one(raw: Any, sent: dict[str, Any]) -> None:
    """The Messages API takes only an object as a ``tool_use`` input; an ``output-error`` call's
    ``rawInput`` (what the model wrote, unparsed) is sent as the object it spells, or wrapped as
    ``{"raw_input": …}``, never replaced by ``{}``."""
    part = {"type": "tool-lookup", "toolCallId": "c1", "state": "output-error", "errorText": "Invalid input"}
    if raw is not None:
        part["rawInput"] = raw
    (call, result) = to_anthropic_messages([{"id": "a1", "role": "assistant", "parts": [part]}])
    assert call["content"] == [{"type": "tool_use", "id": "c1", "name": "lookup", "input": sent}]
    assert result["content"][0]["is_error"] is True


def test_text_after_a_tool_call_starts_a_new_step() -> None:
    history = [{"id": "a", "role": "assistant", "parts": [tool_part("c1"), {"type": "text", "text": "after"}]}]
    assert [m["role"] for m in to_openai_messages(history)] == ["assistant", "tool", "assistant"]
    assert [m["role"] for m in to_anthropic_messages(history)] == ["assistant", "user", "assistant"]


def test_compaction_overlay_is_plain_assistant_text() -> None:
    overlay = {
        "id": "compaction_123",
        "role": "assistant",
        "parts": [{"type": "text", "text": "Summary of earlier turns"}],
        "createdAt": "2026-01-01T00:00:00Z",
    }
    assert to_openai_messages([user("u0", "first"), overlay, user("u5", "next")]) == [
        {"role": "user", "content": "first"},
        {"role": "assistant", "content": "Summary of earlier turns"},
        {"role": "user", "content": "next"},
    ]
    assert to_anthropic_messages([overlay]) == [
        {"role": "assistant", "content": [{"type": "text", "text": "Summary of earlier turns"}]}
    ]


def test_anthropic_tool_use_results_and_role_merging() -> None:
    out = to_anthropic_messages([*HISTORY, user("u2", "thanks")])
    assert out == [
        {"role": "user", "content": [{"type": "text", "text": "Remember fact"}]},
        {
            "role": "assistant",
            "content": [
                {"type": "text", "text": "Saving."},
                {
                    "type": "tool_use",
                    "id": "call_1",
                    "name": "set_context",
                    "input": {"label": "memory", "content": "fact"},
                },
            ],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "call_1", "content": "Written to memory. Usage: 1 tokens"}
            ],
        },
        {"role": "assistant", "content": [{"type": "text", "text": "Saved "}, {"type": "text", "text": "it."}]},
        {"role": "user", "content": [{"type": "text", "text": "thanks"}]},
    ]


def test_anthropic_thinking_needs_a_signature() -> None:
    history = [
        {
            "id": "a",
            "role": "assistant",
            "parts": [
                {"type": "reasoning", "text": "unsigned"},
                {"type": "reasoning", "text": "signed", "providerMetadata": {"anthropic": {"signature": "sig"}}},
                {"type": "reasoning", "text": "", "providerMetadata": {"anthropic": {"redactedData": "xyz"}}},
                {
                    "type": "reasoning",
                    "reasoning": "v4",
                    "details": [{"type": "text", "text": "v4", "signature": "s4"}],
                },
                {"type": "text", "text": "answer"},
            ],
        }
    ]
    [message] = to_anthropic_messages(history)
    assert message["content"] == [
        {"type": "thinking", "thinking": "signed", "signature": "sig"},
        {"type": "redacted_thinking", "data": "xyz"},
        {"type": "thinking", "thinking": "v4", "signature": "s4"},
        {"type": "text", "text": "answer"},
    ]
    assert to_openai_messages(history) == [{"role": "assistant", "content": "answer"}]


def test_system_messages_images_and_unknown_parts() -> None:
    history: list[dict[str, Any]] = [
        {"id": "s", "role": "system", "parts": [{"type": "text", "text": "Be brief."}]},
        {
            "id": "u",
            "role": "user",
            "parts": [
                {"type": "text", "text": "look"},
                {"type": "file", "mediaType": "image/png", "url": "https://example.com/a.png"},
                {"type": "file", "mediaType": "image/png", "url": "data:image/png;base64,AAAA"},
                {"type": "file", "mediaType": "application/pdf", "url": "https://example.com/a.pdf"},
                {"type": "data-weather", "data": {}},
            ],
        },
        {"id": "e", "role": "assistant", "parts": [{"type": "step-start"}]},
    ]
    assert to_openai_messages(history) == [
        {"role": "system", "content": "Be brief."},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "look"},
                {"type": "image_url", "image_url": {"url": "https://example.com/a.png"}},
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
            ],
        },
    ]
    assert to_anthropic_messages(history[1:]) == [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "look"},
                {"type": "image", "source": {"type": "url", "url": "https://example.com/a.png"}},
                {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"}},
            ],
        }
    ]


def test_openai_keeps_a_mid_history_system_message_where_it_was() -> None:
    history = [user("u1", "Hi"), {"id": "s1", "role": "system", "parts": [{"type": "text", "text": "Be brief."}]}]
    assert to_openai_messages(history, "SYSTEM") == [
        {"role": "system", "content": "SYSTEM"},
        {"role": "user", "content": "Hi"},
        {"role": "system", "content": "Be brief."},
    ]


@pytest.mark.parametrize("at", [0, 1])
def test_anthropic_raises_for_a_system_message_with_text_naming_it(at: int) -> None:
    history = [user("u1", "Hi"), user("u2", "Bye")]
    history.insert(at, {"id": "s1", "role": "system", "parts": [{"type": "text", "text": "Be brief."}]})
    with pytest.raises(UnconvertibleMessage) as raised:
        to_anthropic_messages(history)
    assert isinstance(raised.value, ValueError)
    assert (raised.value.index, raised.value.message_id, raised.value.role) == (at, "s1", "system")
    assert "'s1'" in str(raised.value)
    assert "system=" in str(raised.value)  # says where its text goes instead


def test_anthropic_skips_a_system_message_without_text() -> None:
    history = [{"id": "s1", "role": "system", "parts": []}, user("u1", "Hi")]
    assert to_anthropic_messages(history) == [{"role": "user", "content": [{"type": "text", "text": "Hi"}]}]


@pytest.mark.parametrize("convert", [to_openai_messages, to_anthropic_messages])
@pytest.mark.parametrize("role", ["data", "tool", None])
def test_an_unknown_role_raises_naming_the_role_and_the_message(convert: Any, role: str | None) -> None:
    odd: dict[str, Any] = {"id": "x1", "parts": [{"type": "text", "text": "lost?"}]}
    if role is not None:
        odd["role"] = role
    with pytest.raises(UnconvertibleMessage) as raised:
        convert([user("u1", "Hi"), odd])
    assert (raised.value.index, raised.value.message_id, raised.value.role) == (1, "x1", role)
    assert repr(role) in str(raised.value)
    assert "'x1'" in str(raised.value)
