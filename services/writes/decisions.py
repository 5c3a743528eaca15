"""Pure decisions of the state-dependent commands: given what the read model says, what to do."""

from __future__ import annotations

from dataclasses import dataclass

from events.omitted import Omitted, ParentId
from services.errors import ErasedSession, MessageConflict, SessionNotFound, UnknownParent

ParentSpec = ParentId


@dataclass(frozen=True, slots=True)
class Existing:
    """An already-stored message with the same id: what the first append answered."""

    parent_id: str | None
    seq: int
    body_sha256: str


@dataclass(frozen=True, slots=True)
class AppendState:
    session_deleted: bool
    existing: Existing | None
    latest_leaf: str | None
    parent_exists: bool
    session_erased: bool = False  # its erasure is recorded (by this process or any other)


@dataclass(frozen=True, slots=True)
class Replay:
    """Idempotent repeat: answer as the first append did, publish nothing."""

    parent_id: str | None
    seq: int


@dataclass(frozen=True, slots=True)
class Append:
    parent_id: str | None


def decide_append(state: AppendState, body_sha256: str, parent: ParentSpec) -> Replay | Append:
    """Reference rules, made explicit: omitted parent -> latest leaf, ``None`` -> new root,
    an id -> that message, which must exist in this session (no silent fallback to root)."""
    if state.session_erased:
        raise ErasedSession("the session was erased")
    if state.session_deleted:
        raise SessionNotFound("the session was deleted")
    if state.existing is not None:
        if state.existing.body_sha256 != body_sha256:
            raise MessageConflict("a message with this id and a different body exists")
        return Replay(state.existing.parent_id, state.existing.seq)
    if isinstance(parent, Omitted):
        return Append(state.latest_leaf)
    if parent is None:
        return Append(None)
    if not state.parent_exists:
        raise UnknownParent(f"parent message {parent!r} is not in this session")
    return Append(parent)
