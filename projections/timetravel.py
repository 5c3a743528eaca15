"""Time travel: one session's history and context as they were after stream sequence N.

A pure, in-memory fold of the session's events (read back from the log) with the same rules as
the history and context projections: first append of an id wins, updates replace the body,
deletes and clears remove rows, a deleted session has no messages; the newest configuration and
each writable block's newest content stand, searchable entries are keyed. Tests check it agrees
with the live read models.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from events.catalog import (
    CompactionRecorded,
    ContextWritten,
    MessageAppended,
    MessagesCleared,
    MessagesDeleted,
    MessageUpdated,
    SearchEntryIndexed,
    SessionConfigured,
    SessionDeleted,
    SkillUnloaded,
    overlay_id_in,
)
from events.context import SessionConfig
from events.envelope import Event
from events.messages import JsonObject, stored_json
from projections.overlays import Overlay, overlay_of
from projections.queries import PathRow


@dataclass
class _Row:
    id: str
    parent_id: str | None
    content: str
    seq: int


@dataclass
class SessionState:
    """Messages of one session after folding events in stream order, with its summary overlays
    and unloaded-skill outputs (as the overlay and context projections keep them), and its
    context: the configuration, writable blocks' contents, searchable entries' keys."""

    rows: dict[str, _Row] = field(default_factory=dict)
    deleted: bool = False
    overlays: dict[str, Overlay] = field(default_factory=dict)
    reclaimed: dict[tuple[str, str], str] = field(default_factory=dict)
    config: SessionConfig | None = None
    contents: dict[str, str] = field(default_factory=dict)
    entries: dict[str, set[str]] = field(default_factory=dict)
    # appends of a summary's id left out: the parent each was (first) appended under, resolved
    left_out: dict[str, str | None] = field(default_factory=dict)

    def apply(self, seq: int, event: Event, body: JsonObject | None = None) -> None:
        match event:
            case SessionDeleted():
                self.deleted = True
                self.rows.clear()
                self.overlays.clear()
                self.reclaimed.clear()
                self.left_out.clear()
                self.config = None
                self.contents.clear()
                self.entries.clear()
            case MessageAppended() if not self.deleted and self.summary(event.message_id):
                self.left_out.setdefault(event.message_id, self.parent_of(event.parent_id))
            case MessageAppended() if not self.deleted and event.message_id not in self.rows:
                assert body is not None
                parent = self.parent_of(event.parent_id)
                self.rows[event.message_id] = _Row(event.message_id, parent, stored_json(body), seq)
            case MessageUpdated() if event.message_id in self.rows:
                assert body is not None
                self.rows[event.message_id].content = stored_json(body)
            case MessagesDeleted():
                for mid in event.message_ids:
                    self.rows.pop(mid, None)
            case MessagesCleared():
                self.rows.clear()
                self.overlays.clear()
                self.reclaimed.clear()
                self.left_out.clear()
            case CompactionRecorded() if event.overlay_id not in self.overlays:
                self.overlays[event.overlay_id] = overlay_of(event, seq)
            case SkillUnloaded() if event.tool_call_id is not None:
                self.reclaimed.setdefault((event.message_id or "", event.tool_call_id), event.key)
            case SessionConfigured():
                self.config = event.config
            case ContextWritten():
                self.contents[event.label] = event.content
            case SearchEntryIndexed():
                self.entries.setdefault(event.label, set()).add(event.key)
            case _:
                pass

    def summary(self, message_id: str) -> bool:
        """Whether history shows an overlay under ``message_id``: an append of it is not stored
        (projections/history.py, :func:`~projections.history.summaries_in`)."""
        overlay_id = overlay_id_in(message_id)
        return overlay_id is not None and overlay_id in self.overlays

    def parent_of(self, parent_id: str | None) -> str | None:
        """The parent a message appended under ``parent_id`` is stored under: a left-out summary's
        own (projections/history.py, :func:`~projections.history.settle_summaries`)."""
        return self.left_out.get(parent_id, parent_id) if parent_id is not None else None

    def entry_counts(self) -> dict[str, int]:
        """Entries per searchable block label, as the context read model counts them."""
        return {label: len(keys) for label, keys in self.entries.items()}

    def overlay_list(self) -> list[Overlay]:
        """The overlays oldest first, as :func:`projections.overlays.overlays` returns them."""
        return sorted(self.overlays.values(), key=lambda o: o.seq)

    def latest_leaf(self) -> str | None:
        parents = {r.parent_id for r in self.rows.values()}
        leaves = [r for r in self.rows.values() if r.id not in parents]
        return max(leaves, key=lambda r: r.seq).id if leaves else None

    def path_rows(self, leaf_id: str | None) -> list[PathRow]:
        """The root-to-leaf path; stops at a deleted ancestor, as the projection."""
        out: list[PathRow] = []
        seen: set[str] = set()
        current = self.rows.get(leaf_id) if leaf_id else None
        while current is not None and current.id not in seen:
            seen.add(current.id)
            out.append(PathRow(current.id, current.content))
            current = self.rows.get(current.parent_id) if current.parent_id else None
        out.reverse()
        return out

    def path(self, leaf_id: str | None) -> list[str]:
        """Stored JSON of the root-to-leaf path."""
        return [r.content for r in self.path_rows(leaf_id)]
