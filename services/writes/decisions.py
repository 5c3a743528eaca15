"""Pure decisions of the state-dependent commands: given what the read model says, what to do."""

from __future__ import annotations

from dataclasses import dataclass

from events.omitted import Omitted, ParentId
from services.errors import ErasedSession, InvalidId, MessageConflict, ParentCycle, SessionNotFound, UnknownParent

ParentSpec = ParentId


@dataclass(frozen=True, slots=True)
class Existing:
    """An already-stored message with the same id: what the first append answered."""

    parent_id: str | None
    seq: int
    body_sha256: str


@dataclass(frozen=True, slots=True)
class Summary:
    """A compaction overlay of the session whose message id (``compaction_<overlay id>``, as history
    shows it) is the appended message's: what history shows there is not a stored message."""

    parent_id: str | None  # the parent of its first message: where history shows it
    seq: int
    body_sha256: str  # the hash of the message history shows for it
    last_id: str  # the last message it covers: where a chain sent back from history goes on


@dataclass(frozen=True, slots=True)
class AppendState:
    session_deleted: bool
    existing: Existing | None
    latest_leaf: str | None
    parent_exists: bool
    session_erased: bool = False  # its erasure is recorded (by this process or any other)
    # descendants of the (new) message id: messages stored under it although no message has it
    # (a deleted message's id, re-used while its children keep it as their parent). At least the
    # parent the append would take (given, or the latest leaf) when it is one; the read model is
    # asked about that parent only, never for the whole subtree. Empty for any other id, which is
    # every append of a new id but that rare one
    descendants: frozenset[str] = frozenset()
    # the latest leaf is under the parent given (a batch's previous message: another writer
    # appended onto its line meanwhile); asked only by a batch's next message (``follow``)
    leaf_follows: bool = False
    # the overlay whose message id the appended id is (asked only for an id with its prefix)
    summary: Summary | None = None
    # the id has the form of an overlay's message id (``compaction_`` and a UUID, as every overlay
    # Chronicle records has) and no overlay of the session has it
    summary_like: bool = False


@dataclass(frozen=True, slots=True)
class Replay:
    """Idempotent repeat: answer as the first append did, publish nothing."""

    parent_id: str | None
    seq: int
    # the id a chain's next message goes under: the message's own, or, for a compaction summary
    # sent back as history showed it, the last message it covers (None: the message's own)
    tail: str | None = None


@dataclass(frozen=True, slots=True)
class Append:
    parent_id: str | None


def decide_append(state: AppendState, body_sha256: str, parent: ParentSpec, *, follow: bool = False) -> Replay | Append:
    """Reference rules, made explicit: omitted parent -> latest leaf, ``None`` -> new root,
    an id -> that message, which must exist in this session (no silent fallback to root).

    ``follow`` (a batch's next message, ``parent`` the batch's previous one): the latest leaf
    instead when it is under ``parent`` (:attr:`AppendState.leaf_follows`). Another writer's
    append without a parent may have attached to the batch's previous message meanwhile; the
    batch continues after it, so the session stays one chain and that append stays on the
    latest leaf's path. A leaf on another branch does not move the batch there.

    The message must not become its own ancestor: under one of its id's descendants (a deleted
    message's id re-used, its children still stored) the append is refused, whichever way the
    parent was chosen, and nothing is written (the tree would lose its leaf: every message of a
    cycle has a child).

    A compaction summary is not a message (:class:`Summary`): sent back exactly as history showed
    it, it is a replay (nothing written; a chain goes on after the last message it covers); with
    another body, a conflict, as a message's id taken by another body is. An id in the form of a
    summary's that no overlay of the session has (another session's, or one cleared since) is
    refused: stored, it would read as a summary to every reader that tells them by their id."""
    if state.session_erased:
        raise ErasedSession("the session was erased")
    if state.session_deleted:
        raise SessionNotFound("the session was deleted", deleted=True)
    if state.existing is not None:
        if state.existing.body_sha256 != body_sha256:
            raise MessageConflict("a message with this id and a different body exists")
        return Replay(state.existing.parent_id, state.existing.seq)
    if state.summary is not None:
        if state.summary.body_sha256 != body_sha256:
            raise MessageConflict(
                "this id is a compaction summary's (an overlay of this session, as history shows it), and the "
                "message is not that summary as history shows it: a summary cannot be stored as a message. "
                "Nothing was written; send history's messages unchanged, or give the message another id"
            )
        return Replay(state.summary.parent_id, state.summary.seq, state.summary.last_id)
    if state.summary_like:
        raise InvalidId(
            "this id has the form of a compaction summary's id (compaction_ and a UUID), and no overlay of this "
            "session has it (another session's summary, or one cleared since): stored as a message it would read "
            "as a summary. Nothing was written; give the message another id"
        )
    if parent is None:
        return Append(None)
    if isinstance(parent, Omitted):
        pid = state.latest_leaf
        chosen = f"the latest leaf {pid!r} (the parent when none is given)"
    elif not state.parent_exists:
        raise UnknownParent(f"parent message {parent!r} is not in this session")
    elif follow and state.leaf_follows and state.latest_leaf is not None:
        pid = state.latest_leaf
        chosen = f"the latest leaf {pid!r} (appended under the batch's previous message {parent!r})"
    elif follow:
        pid, chosen = parent, f"the batch's previous message {parent!r}"
    else:
        pid, chosen = parent, f"parent {parent!r}"
    if pid is not None and pid in state.descendants:
        # a batch's next message was not written, but the batch's messages before it were: what
        # the batch stored is the batch's answer to say (services/requests/problems.py)
        remedy = (
            "It was not written; use another message id"
            if follow
            else "Nothing was written; give another parent_id, null for a new root, or use another message id"
        )
        raise ParentCycle(
            f"{chosen} descends from a deleted message with this id (its children still name the id as "
            f"their parent): appended there, the message would be its own ancestor. {remedy}"
        )
    return Append(pid)
