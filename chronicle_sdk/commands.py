"""Writes as NATS commands: which command (events/commands.py) does what an API write request does,
and with what request body. The server runs the same code for both (its own decisions: the SDK
decides nothing), so a command's reply is the HTTP answer's body, or the HTTP problem with its
status in the ``Chronicle-Status`` header.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote

from events.commands import BY_NAME, STATUS_HEADER, Command

Payload = dict[str, Any]


@dataclass(frozen=True, slots=True)
class Routed:
    """An API write as a command: the command and its request body."""

    command: Command
    payload: Payload


def _seg(name: str) -> str:
    return rf"(?P<{name}>[^/]+)"


_S = "/v1/sessions/" + _seg("sid")
Build = Callable[[dict[str, str], Any, Mapping[str, Any], Mapping[str, str]], Payload]


def _body(body: Any) -> Payload:
    return dict(body) if isinstance(body, Mapping) else {}


def _with_session(p: dict[str, str], body: Any, _q: Mapping[str, Any], _h: Mapping[str, str]) -> Payload:
    return {"session_id": p["sid"], **_body(body)}


def _keyed(p: dict[str, str], body: Any, _q: Mapping[str, Any], h: Mapping[str, str]) -> Payload:
    key = {k.lower(): v for k, v in h.items()}.get("idempotency-key")
    return {"session_id": p["sid"], **_body(body), **({"idempotency_key": key} if key else {})}


def _config(p: dict[str, str], body: Any, _q: Mapping[str, Any], _h: Mapping[str, str]) -> Payload:
    return {"session_id": p["sid"], "config": body}


def _block(p: dict[str, str], body: Any, _q: Mapping[str, Any], _h: Mapping[str, str]) -> Payload:
    return {"session_id": p["sid"], "label": p["label"], **_body(body)}


def _tool(p: dict[str, str], body: Any, q: Mapping[str, Any], _h: Mapping[str, str]) -> Payload:
    call = q.get("tool_call_id")
    return {
        "session_id": p["sid"],
        "name": p["name"],
        "arguments": body,
        **({"tool_call_id": str(call)} if call is not None else {}),
    }


def _create(_p: dict[str, str], body: Any, _q: Mapping[str, Any], _h: Mapping[str, str]) -> Payload:
    return _body(body)


ROUTES: tuple[tuple[str, re.Pattern[str], str, Build], ...] = tuple(
    (method, re.compile(pattern + "$"), name, build)
    for method, pattern, name, build in (
        ("POST", "/v1/sessions", "session.create", _create),
        ("PATCH", _S, "session.rename", _with_session),
        ("DELETE", _S, "session.delete", _with_session),
        ("POST", _S + "/usage", "session.usage", _keyed),
        ("POST", _S + ":end", "session.end", _with_session),
        ("POST", _S + "/fork", "session.fork", _with_session),
        ("POST", _S + "/messages", "append", _keyed),
        ("POST", _S + "/messages:batch", "append_batch", _keyed),
        ("PUT", _S + "/messages/" + _seg("mid"), "update", _with_session),
        ("POST", _S + "/messages:delete", "delete", _with_session),
        ("POST", _S + "/messages:clear", "clear", _with_session),
        ("POST", _S + "/compact", "compact", _with_session),
        ("PUT", _S + "/config", "config.put", _config),
        ("PUT", _S + "/context/" + _seg("label"), "context.write", _block),
        ("POST", _S + "/tools/" + _seg("name"), "tool", _tool),
        ("POST", _S + "/system-prompt:refresh", "prompt.refresh", _with_session),
    )
)


def route(method: str, path: str, body: Any, query: Mapping[str, Any], headers: Mapping[str, str]) -> Routed | None:
    """The command that does what ``method path`` does over HTTP; None for a request that has none
    (every read, and the writes no command offers)."""
    for m, pattern, name, build in ROUTES:
        found = pattern.match(path) if m == method else None
        if found is not None:
            params = {k: unquote(v) for k, v in found.groupdict().items()}
            return Routed(BY_NAME[name], build(params, body, query, headers))
    return None


def reply_status(headers: Mapping[str, str] | None) -> int:
    """The HTTP status a command's reply carries (``Chronicle-Status``); 0 when it has none."""
    value = (headers or {}).get(STATUS_HEADER, "")
    return int(value) if value.isdigit() else 0


__all__ = ["ROUTES", "Routed", "reply_status", "route"]
