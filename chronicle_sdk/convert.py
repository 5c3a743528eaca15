"""History (AI SDK ``UIMessage`` parts) to provider messages, like ``convertToModelMessages``.

Both converters behave as ``convertToModelMessages(messages, {ignoreIncompleteToolCalls: true})``
followed by the provider's own conversion:

* ``text`` parts become text; ``file`` parts with an ``image/*`` media type become images on user
  messages (other files are dropped).
* A tool part (``tool-<name>`` or ``dynamic-tool``; the AI SDK 4 ``tool-invocation`` shape is read
  too) becomes a tool call plus its result. Only *complete* calls are kept: ``state`` is
  ``output-available`` (the result is ``output``) or ``output-error`` (the result is
  ``errorText``, flagged as an error); a part with no ``state`` counts as complete when it has
  an ``output``. Calls in ``input-streaming``/``input-available`` are dropped, so no orphaned
  tool call ever reaches the provider.
  A call's input is its ``input``, or, when it has none (an ``output-error`` call whose input
  did not parse), its ``rawInput``: Chat Completions gets it as JSON ``arguments``; the Messages
  API takes only an object, so :func:`to_anthropic_messages` sends a text that spells an object
  as that object and wraps anything else that is no object as ``{"raw_input": <it>}`` (never
  ``{}``, which would lose what the model wrote).
* An assistant message is split into steps at ``step-start`` parts, and also where text follows
  a tool call, so that each provider message holds the calls whose results come right after it.
* Compaction overlays need nothing special: they are plain assistant messages with one text part.
* ``reasoning`` parts: OpenAI Chat Completions has no way to send them back, so they are
  dropped. Anthropic accepts earlier thinking only with its signature, so a reasoning part
  becomes a ``thinking`` block when it carries one (``providerMetadata.anthropic.signature``,
  or ``signature`` on the part or its AI SDK 4 ``details``), a ``redacted_thinking`` block when
  it carries ``providerMetadata.anthropic.redactedData``, and is skipped otherwise.
* Unknown part types (``data-*``, ``source-url``, ``step-start`` itself) are skipped.
* A message is never dropped whole without saying so: a role other than ``system``, ``user`` and
  ``assistant`` (or none) raises :class:`UnconvertibleMessage` naming it, in both converters.
  ``system`` messages stay where they are in Chat Completions, which takes them anywhere; the
  Messages API has no system role (only its ``system=`` parameter), so
  :func:`to_anthropic_messages` raises for one that holds text, wherever it is: put its text in
  ``system=`` (beside the frozen prompt) or leave it out of the history you convert.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

Part = Mapping[str, Any]


class UnconvertibleMessage(ValueError):
    """A history message that the target format cannot carry, which a converter raises rather
    than drop its content: ``index`` (its place in the history), ``message_id`` and ``role``
    (``None`` when it has none)."""

    def __init__(self, index: int, message: Mapping[str, Any], why: str) -> None:
        self.index = index
        mid = message.get("id")
        self.message_id: str | None = mid if isinstance(mid, str) else None
        role = message.get("role")
        self.role: str | None = role if isinstance(role, str) else None
        super().__init__(f"message {index} ({self.message_id!r}, role {self.role!r}): {why}")


@dataclass(frozen=True, slots=True)
class _Call:
    id: str
    name: str
    input: Any
    output: Any
    error: bool


def _tool_call(part: Part) -> _Call | None:
    """A complete tool call of a tool part, or None (not a tool part, or incomplete)."""
    kind = part.get("type")
    if kind == "tool-invocation":  # AI SDK 4
        inv = part.get("toolInvocation")
        if not isinstance(inv, Mapping) or inv.get("state") != "result":
            return None
        return _Call(str(inv.get("toolCallId")), str(inv.get("toolName")), inv.get("args"), inv.get("result"), False)
    if kind == "dynamic-tool":
        name = part.get("toolName")
    elif isinstance(kind, str) and kind.startswith("tool-"):
        name = kind[len("tool-") :]
    else:
        return None
    call_id = part.get("toolCallId")
    if not isinstance(name, str) or not name or not isinstance(call_id, str):
        return None
    state = part.get("state")
    tool_input = part.get("input")
    if tool_input is None:
        tool_input = part.get("rawInput")
    if state == "output-available" or (state is None and "output" in part):
        return _Call(call_id, name, tool_input, part.get("output"), False)
    if state == "output-error":
        return _Call(call_id, name, tool_input, part.get("errorText") or "", True)
    return None


def _is_tool_part(part: Part) -> bool:
    kind = part.get("type")
    return isinstance(kind, str) and (kind.startswith("tool-") or kind == "dynamic-tool")


def _steps(parts: Iterable[Any]) -> list[list[Part]]:
    """Assistant parts grouped into steps (see the module docstring)."""
    steps: list[list[Part]] = []
    current: list[Part] = []
    has_call = False
    for part in parts:
        if not isinstance(part, Mapping):
            continue
        kind = part.get("type")
        if kind == "step-start" or (kind == "text" and has_call):
            if current:
                steps.append(current)
            current, has_call = [], False
            if kind == "step-start":
                continue
        if _is_tool_part(part):
            has_call = True
        current.append(part)
    if current:
        steps.append(current)
    return steps


def _output_text(output: Any) -> str:
    if isinstance(output, str):
        return output
    return json.dumps(output, ensure_ascii=False)


def _image(part: Part) -> tuple[str, str] | None:
    """(media type, url) of an image file part."""
    media = part.get("mediaType") or part.get("mimeType")
    url = part.get("url")
    if part.get("type") == "file" and isinstance(media, str) and media.startswith("image/") and isinstance(url, str):
        return media, url
    return None


def _texts(parts: Iterable[Any]) -> list[str]:
    return [
        str(p["text"])
        for p in parts
        if isinstance(p, Mapping) and p.get("type") == "text" and isinstance(p.get("text"), str)
    ]


def _unknown_role(index: int, message: Mapping[str, Any]) -> UnconvertibleMessage:
    return UnconvertibleMessage(index, message, "not a system, user or assistant message, which is all a history holds")


def _parts(message: Mapping[str, Any]) -> list[Any]:
    parts = message.get("parts")
    return list(parts) if isinstance(parts, list) else []


# -- OpenAI Chat Completions -------------------------------------------------------------------


def to_openai_messages(history: Sequence[Mapping[str, Any]], system_prompt: str | None = None) -> list[dict[str, Any]]:
    """Chat Completions ``messages`` for a history, with the frozen prompt as the first system message.

    ``system_prompt`` (e.g. ``await session.freeze_system_prompt()``) is sent when non-empty.
    Reasoning parts are dropped (Chat Completions cannot take them back); incomplete tool calls
    are dropped; each complete call becomes an assistant ``tool_calls`` entry followed by a
    ``tool`` message with its result text. A ``system`` message of the history stays a system
    message where it is; a message of any other role than these three raises
    :class:`UnconvertibleMessage`.
    """
    out: list[dict[str, Any]] = []
    if system_prompt:
        out.append({"role": "system", "content": system_prompt})
    for index, message in enumerate(history):
        role = message.get("role")
        parts = _parts(message)
        if role == "system":
            text = "".join(_texts(parts))
            if text:
                out.append({"role": "system", "content": text})
        elif role == "user":
            content: list[dict[str, Any]] = []
            for p in parts:
                if not isinstance(p, Mapping):
                    continue
                if p.get("type") == "text" and isinstance(p.get("text"), str):
                    content.append({"type": "text", "text": p["text"]})
                elif (image := _image(p)) is not None:
                    content.append({"type": "image_url", "image_url": {"url": image[1]}})
            if len(content) == 1 and content[0]["type"] == "text":
                out.append({"role": "user", "content": content[0]["text"]})
            elif content:
                out.append({"role": "user", "content": content})
        elif role == "assistant":
            for step in _steps(parts):
                text = "".join(_texts(step))
                calls = [c for c in (_tool_call(p) for p in step) if c is not None]
                if not text and not calls:
                    continue
                msg: dict[str, Any] = {"role": "assistant", "content": text or None}
                if calls:
                    msg["tool_calls"] = [
                        {
                            "id": c.id,
                            "type": "function",
                            "function": {"name": c.name, "arguments": json.dumps(c.input or {}, ensure_ascii=False)},
                        }
                        for c in calls
                    ]
                out.append(msg)
                out.extend({"role": "tool", "tool_call_id": c.id, "content": _output_text(c.output)} for c in calls)
        else:
            raise _unknown_role(index, message)
    return out


# -- Anthropic Messages ------------------------------------------------------------------------


def _signature(part: Part) -> str | None:
    meta = part.get("providerMetadata") or part.get("providerOptions")
    if isinstance(meta, Mapping) and isinstance(meta.get("anthropic"), Mapping):
        sig = meta["anthropic"].get("signature")
        if isinstance(sig, str) and sig:
            return sig
    if isinstance(part.get("signature"), str) and part["signature"]:
        return str(part["signature"])
    details = part.get("details")
    if isinstance(details, list):
        for d in details:
            if isinstance(d, Mapping) and isinstance(d.get("signature"), str) and d["signature"]:
                return str(d["signature"])
    return None


def _redacted(part: Part) -> str | None:
    meta = part.get("providerMetadata") or part.get("providerOptions")
    if isinstance(meta, Mapping) and isinstance(meta.get("anthropic"), Mapping):
        data = meta["anthropic"].get("redactedData")
        if isinstance(data, str) and data:
            return data
    return None


def _reasoning_text(part: Part) -> str:
    for key in ("text", "reasoning"):
        if isinstance(part.get(key), str):
            return str(part[key])
    details = part.get("details")
    if isinstance(details, list):
        return "".join(str(d.get("text", "")) for d in details if isinstance(d, Mapping))
    return ""


def _anthropic_image(media: str, url: str) -> dict[str, Any]:
    if url.startswith("data:") and ";base64," in url:
        head, data = url.split(",", 1)
        media_type = head[len("data:") :].split(";", 1)[0] or media
        return {"type": "image", "source": {"type": "base64", "media_type": media_type, "data": data}}
    return {"type": "image", "source": {"type": "url", "url": url}}


def _anthropic_input(value: Any) -> Mapping[str, Any]:
    """A tool call's input as a ``tool_use`` input, which must be an object: an object as it is,
    none as ``{}``, the text of an object as that object, anything else (what the model wrote
    that is no object, unparsed) as ``{"raw_input": value}``."""
    if isinstance(value, Mapping):
        return value
    if value is None:
        return {}
    if isinstance(value, str):
        try:
            parsed = json.loads(value)
        except ValueError:
            parsed = None
        if isinstance(parsed, dict):
            return parsed
    return {"raw_input": value}


def to_anthropic_messages(history: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Messages API ``messages`` for a history; pass the frozen prompt as ``system=`` yourself.

    Tool calls become ``tool_use`` blocks and their results ``tool_result`` blocks in the next
    user turn (``is_error`` for ``output-error``); incomplete calls are dropped. A ``tool_use``
    input must be an object: a call's input that is no object (such as an ``output-error`` call's
    ``rawInput``, what the model wrote, unparsed) is sent as the object its text spells, else
    wrapped as ``{"raw_input": <it>}``, never dropped; no input at all is ``{}``. Reasoning is
    kept only with a signature (see the module docstring). Consecutive messages of one role are
    merged, as the API requires alternating roles; empty text is skipped.

    The Messages API has no system role in ``messages``, so a ``system`` message of the history
    that holds text raises :class:`UnconvertibleMessage` (naming it), wherever it is, rather than
    lose it: pass its text in ``system=`` (with the frozen prompt) and convert the history
    without it. One with no text is skipped. A message of another role than ``system``,
    ``user`` and ``assistant`` raises too.
    """
    out: list[dict[str, Any]] = []

    def emit(role: str, content: list[dict[str, Any]]) -> None:
        if not content:
            return
        if out and out[-1]["role"] == role:
            out[-1]["content"].extend(content)
        else:
            out.append({"role": role, "content": content})

    for index, message in enumerate(history):
        role = message.get("role")
        parts = _parts(message)
        if role == "system":
            if "".join(_texts(parts)):
                raise UnconvertibleMessage(
                    index,
                    message,
                    "the Messages API has no system role in messages: pass its text in system= "
                    "(with the frozen prompt) and convert the history without it",
                )
        elif role == "user":
            blocks: list[dict[str, Any]] = []
            for p in parts:
                if not isinstance(p, Mapping):
                    continue
                if p.get("type") == "text" and isinstance(p.get("text"), str) and p["text"]:
                    blocks.append({"type": "text", "text": p["text"]})
                elif (image := _image(p)) is not None:
                    blocks.append(_anthropic_image(*image))
            emit("user", blocks)
        elif role == "assistant":
            for step in _steps(parts):
                content: list[dict[str, Any]] = []
                results: list[dict[str, Any]] = []
                for p in step:
                    kind = p.get("type")
                    if kind == "text" and isinstance(p.get("text"), str) and p["text"]:
                        content.append({"type": "text", "text": p["text"]})
                    elif kind == "reasoning":
                        if (sig := _signature(p)) is not None:
                            content.append({"type": "thinking", "thinking": _reasoning_text(p), "signature": sig})
                        elif (data := _redacted(p)) is not None:
                            content.append({"type": "redacted_thinking", "data": data})
                    elif (call := _tool_call(p)) is not None:
                        tool_input = _anthropic_input(call.input)
                        content.append({"type": "tool_use", "id": call.id, "name": call.name, "input": tool_input})
                        result: dict[str, Any] = {
                            "type": "tool_result",
                            "tool_use_id": call.id,
                            "content": _output_text(call.output),
                        }
                        if call.error:
                            result["is_error"] = True
                        results.append(result)
                emit("assistant", content)
                emit("user", results)
        else:
            raise _unknown_role(index, message)
    return out


__all__ = ["UnconvertibleMessage", "to_anthropic_messages", "to_openai_messages"]
