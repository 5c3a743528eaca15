"""Tools.execute hands the LLM's tool call id to executors that take it, and only to them; the
SDK's argument checks use the server's limits."""

from __future__ import annotations

from typing import Any, get_args

from chronicle_sdk.tools import MAX_ARGUMENT_DEPTH, MAX_QUERY_CHARS, ToolDefinition, Tools, parse_arguments
from services.api.deps import SearchQuery
from services.requests.strict_json import MAX_JSON_DEPTH


class _Aware:
    accepts_tool_call_id = True

    def __init__(self) -> None:
        self.calls: list[tuple[str, dict[str, Any], str | None]] = []

    async def __call__(self, name: str, args: dict[str, Any], tool_call_id: str | None = None) -> str:
        self.calls.append((name, args, tool_call_id))
        return "ok"


def _definition(name: str) -> ToolDefinition:
    return ToolDefinition.from_openai(
        {"type": "function", "function": {"name": name, "description": "d", "parameters": {"type": "object"}}}
    )


async def test_the_tool_call_id_reaches_aware_executors_only() -> None:
    aware = _Aware()
    plain: list[tuple[str, dict[str, Any]]] = []

    async def local(name: str, args: dict[str, Any]) -> str:
        plain.append((name, args))
        return "local"

    tools = Tools([_definition("load_context"), _definition("mine")], {"load_context": aware, "mine": local})
    assert await tools.execute("load_context", '{"key": "k"}', tool_call_id="call-1") == "ok"
    assert await tools.execute("load_context", {"key": "k"}) == "ok"
    assert await tools.execute("mine", {"a": 1}, tool_call_id="call-2") == "local"
    assert aware.calls == [("load_context", {"key": "k"}, "call-1"), ("load_context", {"key": "k"}, None)]
    assert plain == [("mine", {"a": 1})]


def test_the_sdk_checks_arguments_against_the_servers_own_limits() -> None:
    """The SDK's local checks are the server's limits, not a guess beside them."""
    lengths = [m.max_length for m in get_args(SearchQuery)[1].metadata if hasattr(m, "max_length")]
    assert lengths == [MAX_QUERY_CHARS]
    assert MAX_ARGUMENT_DEPTH == MAX_JSON_DEPTH


def test_parse_arguments_answers_text_too_deep_for_the_parser() -> None:
    assert parse_arguments("[" * 100_000) == "Error: tool arguments are nested deeper than 64 levels"
    assert parse_arguments('{"a": 1}') == {"a": 1}
