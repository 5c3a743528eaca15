"""The in-memory fold behind ``as_of_seq``: messages, overlays, unloaded outputs and context
(configuration, writable contents, searchable entries), as the projections keep them."""

from __future__ import annotations

from events.catalog import (
    CompactionRecorded,
    ContextWritten,
    MessagesCleared,
    SearchEntryIndexed,
    SessionConfigured,
    SessionDeleted,
    SkillUnloaded,
)
from events.context import SessionConfig
from projections.queries import PathRow
from projections.timetravel import SessionState
from tests.integration.helpers import appended

T, S = "acme", "chat"


def _overlay(oid: str, first: str, last: str, summary: str = "sum") -> CompactionRecorded:
    return CompactionRecorded(
        tenant=T,
        session=S,
        overlay_id=oid,
        from_message_id=first,
        to_message_id=last,
        leaf_id=last,
        summary=summary,
        tokens_before=10,
        tokens_after=2,
        summarizer="offline",
        model=None,
    )


def test_overlays_first_wins_and_come_oldest_first() -> None:
    state = SessionState()
    for i, (mid, parent) in enumerate([("m0", None), ("m1", "m0"), ("m2", "m1")]):
        ev = appended(T, S, mid, parent)
        state.apply(i + 1, ev, ev.message)
    state.apply(5, _overlay("o2", "m1", "m2"))
    state.apply(4, _overlay("o1", "m0", "m1"))
    state.apply(6, _overlay("o1", "m0", "m2", "a retry: ignored"))
    assert [o.overlay_id for o in state.overlay_list()] == ["o1", "o2"]
    assert state.overlays["o1"].to_message_id == "m1"
    assert [r.id for r in state.path_rows("m2")] == ["m0", "m1", "m2"]
    assert isinstance(state.path_rows("m2")[0], PathRow)


def test_unloaded_outputs_by_message_or_by_call_and_a_clear_forgets_them() -> None:
    state = SessionState()
    state.apply(1, SkillUnloaded(tenant=T, session=S, label="skills", key="tax", message_id="a1", tool_call_id="c1"))
    state.apply(2, SkillUnloaded(tenant=T, session=S, label="skills", key="pirate", tool_call_id="c2"))
    state.apply(3, SkillUnloaded(tenant=T, session=S, label="skills", key="none"))
    assert state.reclaimed == {("a1", "c1"): "tax", ("", "c2"): "pirate"}
    state.apply(4, _overlay("o1", "m0", "m1"))
    state.apply(5, MessagesCleared(tenant=T, session=S))
    assert (state.reclaimed, state.overlays) == ({}, {})


def test_context_folds_the_newest_config_and_contents_and_keyed_entries() -> None:
    first = SessionConfig.model_validate({"blocks": [{"label": "memory", "kind": "writable", "max_tokens": 50}]})
    second = SessionConfig.model_validate({"blocks": [{"label": "notes", "kind": "searchable"}]})
    state = SessionState()
    assert (state.config, state.contents, state.entry_counts()) == (None, {}, {})
    state.apply(1, SessionConfigured(tenant=T, session=S, config=first))
    state.apply(
        2, ContextWritten(tenant=T, session=S, label="memory", content="a", tokens=1, mode="replace", writer="api")
    )
    state.apply(
        3, ContextWritten(tenant=T, session=S, label="memory", content="a b", tokens=2, mode="append", writer="tool")
    )
    for seq, key in ((4, "k1"), (5, "k2"), (6, "k1")):  # the same key replaces its entry
        state.apply(seq, SearchEntryIndexed(tenant=T, session=S, label="notes", key=key, content=f"v{seq}"))
    assert (state.config, state.contents, state.entry_counts()) == (first, {"memory": "a b"}, {"notes": 2})
    state.apply(7, MessagesCleared(tenant=T, session=S))  # a clear keeps the context, as the projection
    state.apply(8, SessionConfigured(tenant=T, session=S, config=second))
    assert (state.config, state.contents, state.entry_counts()) == (second, {"memory": "a b"}, {"notes": 2})
    state.apply(9, SessionDeleted(tenant=T, session=S))
    assert (state.config, state.contents, state.entry_counts()) == (None, {}, {})


def test_an_append_under_an_overlays_message_id_is_not_a_message_while_the_overlay_stands() -> None:
    state = SessionState()
    first = appended(T, S, "m0", None)
    state.apply(1, first, first.message)
    state.apply(2, _overlay("ov", "m0", "m0"))
    summary = appended(T, S, "compaction_ov", "m0", "sum", "assistant")
    state.apply(3, summary, summary.message)
    assert list(state.rows) == ["m0"]
    state.apply(4, MessagesCleared(tenant=T, session=S))
    state.apply(5, summary, summary.message)  # the overlay is cleared: the id is a message's again
    assert list(state.rows) == ["compaction_ov"]


def test_a_message_under_a_left_out_summary_is_under_the_summarys_parent_until_a_clear() -> None:
    state = SessionState()
    for seq, (mid, parent) in enumerate([("m0", None), ("m1", "m0")], start=1):
        event = appended(T, S, mid, parent)
        state.apply(seq, event, event.message)
    state.apply(3, _overlay("ov", "m0", "m0"))
    state.apply(4, _overlay("ow", "m0", "m1"))
    x = appended(T, S, "compaction_ov", "m1", "sum", "assistant")
    y = appended(T, S, "compaction_ow", "compaction_ov", "sum", "assistant")  # a chain of summaries
    again = appended(T, S, "compaction_ov", "m0", "sum", "assistant")  # the first append's parent holds
    after = appended(T, S, "m2", "compaction_ow")
    for seq, event in enumerate([x, y, again, after], start=5):
        state.apply(seq, event, event.message)
    assert (list(state.rows), state.rows["m2"].parent_id) == (["m0", "m1", "m2"], "m1")
    assert [r.id for r in state.path_rows("m2")] == ["m0", "m1", "m2"]
    state.apply(9, MessagesCleared(tenant=T, session=S))
    state.apply(10, after, after.message)  # the summaries are forgotten with the overlays
    assert state.rows["m2"].parent_id == "compaction_ow"
