"""LLM tool sets: definitions for the OpenAI and Anthropic SDKs plus ``execute`` returning the result string."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from chronicle_sdk.errors import InvalidRequest, MalformedJson, PayloadTooLarge
from events.admission import has_bad_chars
from events.tool_names import unavailable_tool

MAX_ARGUMENT_DEPTH = 64
"""The deepest nesting of arrays and objects Chronicle takes in tool arguments (the server's
request-body limit; the arguments object itself is 1)."""

MAX_QUERY_CHARS = 1000
"""The longest search query the API takes (``GET …/search``'s ``q``)."""

Executor = Callable[[str, dict[str, Any]], Awaitable[str]]


@dataclass(frozen=True, slots=True)
class ToolDefinition:
    """One tool: its name, the reference's description, and the JSON schema of its arguments."""

    name: str
    description: str
    parameters: dict[str, Any]

    def openai(self) -> dict[str, Any]:
        """The Chat Completions ``tools`` entry (``{"type": "function", "function": {...}}``)."""
        return {
            "type": "function",
            "function": {"name": self.name, "description": self.description, "parameters": self.parameters},
        }

    def anthropic(self) -> dict[str, Any]:
        """The Messages API ``tools`` entry (``{"name", "description", "input_schema"}``)."""
        return {"name": self.name, "description": self.description, "input_schema": self.parameters}

    @classmethod
    def from_openai(cls, data: Mapping[str, Any]) -> ToolDefinition:
        """Parse an OpenAI-format definition (as the API's ``GET …/tools?format=openai`` returns)."""
        fn = data.get("function", data)
        return cls(str(fn["name"]), str(fn.get("description") or ""), dict(fn.get("parameters") or {}))


def parse_arguments(arguments: Any) -> dict[str, Any] | str:
    """The arguments object of a tool call, or an ``Error: …`` string.

    Accepts a dict, or the JSON text OpenAI puts in ``tool_calls[].function.arguments``
    (an empty string counts as ``{}``).
    """
    if arguments is None:
        return {}
    if isinstance(arguments, str):
        if not arguments.strip():
            return {}
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError as exc:
            return f"Error: tool arguments are not valid JSON: {exc.msg}"
        except RecursionError:
            return f"Error: tool arguments are nested deeper than {MAX_ARGUMENT_DEPTH} levels"
    if not isinstance(arguments, dict):
        return "Error: tool arguments must be a JSON object"
    return arguments


def arguments_error(arguments: dict[str, Any]) -> str | None:
    """The ``Error: …`` string for arguments Chronicle would refuse, or None.

    Checked before anything is sent, in the server's words: nesting deeper than
    :data:`MAX_ARGUMENT_DEPTH`, NUL characters or lone surrogates (which no JSON encoder can
    send as UTF-8), numbers that are not finite, and values JSON cannot hold.
    """
    if _too_deep(arguments, MAX_ARGUMENT_DEPTH):
        return f"Error: tool arguments are nested deeper than {MAX_ARGUMENT_DEPTH} levels"
    bad_chars = "Error: tool arguments must not contain NUL characters or lone surrogates"
    if has_bad_chars(arguments):
        return bad_chars
    try:
        json.dumps(arguments, allow_nan=False, ensure_ascii=False).encode()
    except UnicodeEncodeError:  # a lone surrogate in a tuple, which has_bad_chars does not walk
        return bad_chars
    except ValueError:
        return "Error: tool arguments are not valid JSON: numbers must be finite"
    except TypeError as exc:
        return f"Error: tool arguments are not valid JSON: {exc}"
    return None


def arguments_fault(exc: InvalidRequest) -> bool:
    """Whether the server refused a tool call for its arguments (then the call's result is
    ``Error: <detail>``): a plain ``422 invalid_request`` (the body, or the tool call id),
    ``malformed_json`` or ``413 payload_too_large``; not a bad session id (``invalid_id``), a
    builder config (``invalid_config``) or a client that does not fit the server (405, 415)."""
    return type(exc) is InvalidRequest or isinstance(exc, MalformedJson | PayloadTooLarge)


def _too_deep(value: Any, limit: int) -> bool:
    """True when ``value`` nests lists/dicts deeper than ``limit`` (iterative: any depth is safe)."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list | tuple) else None
        if children is None:
            continue
        if depth > limit:
            return True
        stack.extend((child, depth + 1) for child in children if isinstance(child, dict | list | tuple))
    return False


class Tools:
    """A tool set (reference ``ToolSet``): ``openai()``/``anthropic()`` definitions and ``execute``.

    Empty when the session has no blocks that generate tools (the reference's ``{}``), so
    ``if tools:`` works. Sets combine with ``+`` (``await session.tools() + manager.tools()``),
    as callers of the reference merge ``session.tools()`` and ``manager.tools()``.
    """

    def __init__(self, definitions: list[ToolDefinition], executors: Mapping[str, Executor]) -> None:
        self._defs = list(definitions)
        self._exec = dict(executors)

    @property
    def definitions(self) -> list[ToolDefinition]:
        """The tool definitions, in the server's order."""
        return list(self._defs)

    @property
    def names(self) -> list[str]:
        """The tool names, in order."""
        return [d.name for d in self._defs]

    def openai(self) -> list[dict[str, Any]]:
        """Definitions for ``client.chat.completions.create(tools=...)``."""
        return [d.openai() for d in self._defs]

    def anthropic(self) -> list[dict[str, Any]]:
        """Definitions for ``client.messages.create(tools=...)``."""
        return [d.anthropic() for d in self._defs]

    def get(self, name: str) -> ToolDefinition | None:
        """The definition of ``name``, or None."""
        return next((d for d in self._defs if d.name == name), None)

    async def execute(self, name: str, arguments: Any = None, *, tool_call_id: str | None = None) -> str:
        """Run a tool with the LLM's arguments (dict or JSON text); returns the result string.

        ``tool_call_id`` is the LLM's id for this call: Chronicle's tools record it, so that an
        ``unload_context`` in the same turn reclaims the ``load_context`` output even before the
        message holding it is appended (other executors are called without it).

        Like the reference, tool failures never raise: they come back as ``Error: …`` strings, so
        a model's bad call cannot orphan the conversation. That covers everything that is the
        arguments' fault: text that is not JSON or nests too deeply to parse, a value that is not
        an object, an unknown tool (any tool of a session never written, which has none), and
        for Chronicle's tools arguments the server would refuse (NUL characters, lone surrogates,
        nesting deeper than 64 levels, numbers that are not finite: checked before sending) or does refuse (any ``422``
        ``invalid_request``, ``413 payload_too_large``: :func:`chronicle_sdk.tools.arguments_fault`), and the
        tools' own failures (unknown label, read-only block, over budget …).

        What is not the arguments' fault raises :class:`~chronicle_sdk.ChronicleError` as any
        other call does: the server unreachable or answering an error status
        (:class:`~chronicle_sdk.TransientError`, after the client's retries;
        :class:`~chronicle_sdk.ServerError`), authentication (:class:`~chronicle_sdk.Unauthorized`),
        the session deleted or erased, an invalid session id, and the builder's config refused when
        it is sent before the first call. A backing service that fails while the server runs one of
        Chronicle's tools (the read model not catching up in time, object storage failing) is a
        failure of the tool, as in the reference: the server answers ``200`` and this returns
        ``Error: <the problem's title>`` (not retried; such a result does not say whether a write
        the tool was making was stored, so read the block before repeating an ``append``).
        """
        executor = self._exec.get(name)
        if executor is None:
            return unavailable_tool(name)
        args = parse_arguments(arguments)
        if isinstance(args, str):
            return args
        if tool_call_id is not None and getattr(executor, "accepts_tool_call_id", False):
            aware: Any = executor
            return str(await aware(name, args, tool_call_id=tool_call_id))
        return await executor(name, args)

    def __add__(self, other: Tools) -> Tools:
        names = {d.name for d in other._defs}
        merged = [d for d in self._defs if d.name not in names] + other._defs
        return Tools(merged, {**self._exec, **other._exec})

    def __contains__(self, name: object) -> bool:
        return any(d.name == name for d in self._defs)

    def __iter__(self) -> Iterator[str]:
        return iter(self.names)

    def __len__(self) -> int:
        return len(self._defs)

    def __bool__(self) -> bool:
        return bool(self._defs)

    def __repr__(self) -> str:
        return f"Tools({self.names!r})"


SESSION_SEARCH = ToolDefinition(
    "session_search",
    "Search past conversations for relevant context. Searches across all sessions.",
    {
        "type": "object",
        "properties": {"query": {"type": "string", "description": "Search query"}},
        "required": ["query"],
    },
)
"""The reference's ``session_search`` tool (``SessionManager.tools()``), word for word."""


__all__ = [
    "MAX_ARGUMENT_DEPTH",
    "MAX_QUERY_CHARS",
    "SESSION_SEARCH",
    "ToolDefinition",
    "Tools",
    "arguments_error",
    "arguments_fault",
    "parse_arguments",
]
