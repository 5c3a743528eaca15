"""Decode in one place: stored JSON -> upcast to the current version -> the event model.

Upcasters are small pure ``dict -> dict`` steps keyed by ``(type, from_version)``; each step
returns the next version's dict. Shipped events are never edited: add a version and a step.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, Literal

from events.catalog import EVENT_TYPES
from events.envelope import Event

Upcaster = Callable[[dict[str, Any]], dict[str, Any]]

CURRENT: dict[str, type[Event]] = {cls.TYPE: cls for cls in EVENT_TYPES}


def _message_appended_v1_to_v2(raw: dict[str, Any]) -> dict[str, Any]:
    """v1 had no row cap: every v1 body is the original, so there is no ``original_ref``."""
    return {**raw, "version": 2, "original_ref": None}


def _message_appended_v2_to_v3(raw: dict[str, Any]) -> dict[str, Any]:
    """v3 has v2's fields; it is only stored compact (a field left out is filled from the body),
    and a v2 event writes every field, so each keeps its stored value."""
    return {**raw, "version": 3}


def _message_updated_v1_to_v2(raw: dict[str, Any]) -> dict[str, Any]:
    """v2 has v1's fields, stored compact as ``message.appended`` v3."""
    return {**raw, "version": 2}


def _skill_loaded_v1_to_v2(raw: dict[str, Any]) -> dict[str, Any]:
    """v1 loads did not say which tool call loaded the skill."""
    return {**raw, "version": 2, "tool_call_id": None}


def _skill_loaded_v2_to_v3(raw: dict[str, Any]) -> dict[str, Any]:
    """v3 has v2's fields (its ``key`` may be sealed: an unsealed v2 event keeps it as it is)."""
    return {**raw, "version": 3}


def _skill_unsealed_v1_to_v2(raw: dict[str, Any]) -> dict[str, Any]:
    """``skill.indexed``, ``skill.removed`` and ``skill.unloaded`` v2 have v1's fields (some of
    them may be sealed: a v1 event, never sealed, keeps them as they are)."""
    return {**raw, "version": 2}


def _compaction_failed_v1_to_v2(raw: dict[str, Any]) -> dict[str, Any]:
    """v1 failures did not name the request's estimate or settings: they hold nothing (as a
    manual failure's)."""
    return {**raw, "version": 2, "estimate": None, "config": None}


def _session_erased_v1_to_v2(raw: dict[str, Any]) -> dict[str, Any]:
    """v1 erasures did not say who asked or why."""
    return {**raw, "version": 2, "requested_by": None, "reason": None}


def _session_erased_v2_to_v3(raw: dict[str, Any]) -> dict[str, Any]:
    """v2 erasures carried no proof that Chronicle made them."""
    return {**raw, "version": 3, "proof": None}


# (type, from_version) -> step to from_version + 1.
UPCASTERS: dict[tuple[str, int], Upcaster] = {
    ("message.appended", 1): _message_appended_v1_to_v2,
    ("message.appended", 2): _message_appended_v2_to_v3,
    ("message.updated", 1): _message_updated_v1_to_v2,
    ("skill.loaded", 1): _skill_loaded_v1_to_v2,
    ("skill.loaded", 2): _skill_loaded_v2_to_v3,
    ("skill.indexed", 1): _skill_unsealed_v1_to_v2,
    ("skill.removed", 1): _skill_unsealed_v1_to_v2,
    ("skill.unloaded", 1): _skill_unsealed_v1_to_v2,
    ("compaction.failed", 1): _compaction_failed_v1_to_v2,
    ("session.erased", 1): _session_erased_v1_to_v2,
    ("session.erased", 2): _session_erased_v2_to_v3,
}


UnknownReason = Literal["unknown_type", "newer_version", "invalid"]


class UnknownEvent(ValueError):
    """The stored type or version is not one this release can read.

    ``reason`` says which: ``unknown_type`` (a type this release does not know),
    ``newer_version`` (a known type at a version newer than this release's: a later release may
    read it), ``invalid`` (no integer version, or an old version with no upcaster).
    """

    def __init__(self, reason: UnknownReason, detail: str) -> None:
        super().__init__(detail)
        self.reason: UnknownReason = reason
        self.detail = detail


def _unknown_type(raw: dict[str, Any]) -> str:
    """What an event's type that this release does not know is, none included (no field, null, empty,
    not a string): not ``unknown event type 'None'``, as if a type were named "None"."""
    if "type" not in raw:
        return "the event has no type field"
    kind = raw["type"]
    if kind is None:
        return "the event's type is null"
    if kind == "":
        return "the event's type is empty"
    if not isinstance(kind, str):
        return f"the event's type is not a string: {json.dumps(kind)[:64]}"
    return f"unknown event type {kind[:64]!r}"


def upcast(raw: dict[str, Any]) -> dict[str, Any]:
    """Apply upcasters until ``raw`` is at the current version of its type."""
    kind = raw.get("type")
    if not isinstance(kind, str) or kind not in CURRENT:
        raise UnknownEvent("unknown_type", _unknown_type(raw))
    target = CURRENT[kind].VERSION
    version = raw.get("version")
    if not isinstance(version, int) or isinstance(version, bool):
        raise UnknownEvent("invalid", f"event {kind} has no integer version")
    while version < target:
        step = UPCASTERS.get((kind, version))
        if step is None:
            raise UnknownEvent("invalid", f"no upcaster for {kind} v{version}")
        raw = step(raw)
        version = raw["version"]
    if version != target:
        raise UnknownEvent("newer_version", f"{kind} v{version} is newer than this release (v{target})")
    return raw


def decode(data: bytes | str | dict[str, Any]) -> Event:
    raw: dict[str, Any] = json.loads(data) if isinstance(data, bytes | str) else dict(data)
    raw = upcast(raw)
    return CURRENT[raw["type"]].model_validate(raw)
