"""decide_append: the reference's parent rules and idempotent message ids, as pure decisions."""

from __future__ import annotations

from dataclasses import replace

import pytest

from events.omitted import OMITTED
from services.errors import ErasedSession, InvalidId, MessageConflict, ParentCycle, SessionNotFound, UnknownParent
from services.writes.decisions import Append, AppendState, Existing, ParentSpec, Replay, Summary, decide_append

HASH = "a" * 64
OTHER_HASH = "b" * 64


def state(
    *,
    deleted: bool = False,
    existing: Existing | None = None,
    leaf: str | None = None,
    parent_exists: bool = False,
    descendants: frozenset[str] = frozenset(),
) -> AppendState:
    return AppendState(
        session_deleted=deleted,
        existing=existing,
        latest_leaf=leaf,
        parent_exists=parent_exists,
        descendants=descendants,
    )


def test_omitted_parent_appends_to_the_latest_leaf() -> None:
    assert decide_append(state(leaf="m3"), HASH, OMITTED) == Append("m3")


def test_omitted_parent_in_an_empty_session_starts_a_root() -> None:
    assert decide_append(state(leaf=None), HASH, OMITTED) == Append(None)


def test_none_parent_starts_a_new_root_even_with_a_leaf() -> None:
    assert decide_append(state(leaf="m3", parent_exists=True), HASH, None) == Append(None)


def test_explicit_existing_parent_is_used() -> None:
    assert decide_append(state(leaf="m3", parent_exists=True), HASH, "m1") == Append("m1")


def test_unknown_parent_is_an_error_not_a_fallback() -> None:
    with pytest.raises(UnknownParent, match="'m9'") as info:
        decide_append(state(leaf="m3", parent_exists=False), HASH, "m9")
    assert info.value.status == 422
    assert info.value.code == "unknown_parent"


@pytest.mark.parametrize("parent", [OMITTED, None, "m1", "m-unknown"])
def test_same_id_same_body_replays_the_first_answer(parent: ParentSpec) -> None:
    first = Existing(parent_id="m0", seq=42, body_sha256=HASH)
    decision = decide_append(state(existing=first, leaf="m7", parent_exists=False), HASH, parent)
    assert decision == Replay(parent_id="m0", seq=42)


def test_replay_of_a_root_message_keeps_parent_none() -> None:
    first = Existing(parent_id=None, seq=1, body_sha256=HASH)
    assert decide_append(state(existing=first, leaf="m7"), HASH, OMITTED) == Replay(None, 1)


@pytest.mark.parametrize("parent", [OMITTED, None, "m0"])
def test_same_id_other_body_is_a_conflict(parent: ParentSpec) -> None:
    first = Existing(parent_id="m0", seq=42, body_sha256=HASH)
    with pytest.raises(MessageConflict) as info:
        decide_append(state(existing=first, parent_exists=True), OTHER_HASH, parent)
    assert info.value.status == 409


@pytest.mark.parametrize("parent", [OMITTED, None, "m1"])
def test_deleted_session_is_not_found(parent: ParentSpec) -> None:
    with pytest.raises(SessionNotFound) as info:
        decide_append(state(deleted=True, leaf="m3", parent_exists=True), HASH, parent)
    assert info.value.status == 404


def test_deleted_session_wins_over_replay() -> None:
    first = Existing(parent_id="m0", seq=42, body_sha256=HASH)
    with pytest.raises(SessionNotFound):
        decide_append(state(deleted=True, existing=first), HASH, OMITTED)


def test_omitted_is_distinct_from_none() -> None:
    """An omitted parent attaches to the latest leaf; ``None`` starts a new root."""
    assert decide_append(state(leaf="m3"), HASH, OMITTED) != decide_append(state(leaf="m3"), HASH, None)
    assert repr(OMITTED) == "OMITTED"


@pytest.mark.parametrize("parent", [OMITTED, None, "m1"])
def test_an_erased_session_takes_no_append_not_even_a_replay(parent: ParentSpec) -> None:
    erased = AppendState(
        session_erased=True,
        session_deleted=False,
        existing=Existing(None, 3, HASH),
        latest_leaf=None,
        parent_exists=True,
    )
    with pytest.raises(ErasedSession):
        decide_append(erased, HASH, parent)


# -- a deleted message's id re-used: never under its own descendants --------------------------

UNDER = frozenset({"k", "k2"})  # the new id's descendants: its children (kept since its delete) and theirs


@pytest.mark.parametrize(("parent", "leaf"), [(OMITTED, "k2"), ("k", "x"), ("k2", "k2")])
def test_an_id_appended_under_its_own_descendant_is_a_parent_cycle(parent: ParentSpec, leaf: str) -> None:
    """Explicit or omitted (the latest leaf), a parent among the id's descendants is refused."""
    with pytest.raises(ParentCycle) as info:
        decide_append(state(leaf=leaf, parent_exists=True, descendants=UNDER), HASH, parent)
    assert (info.value.status, info.value.code) == (409, "parent_cycle")
    named = leaf if parent is OMITTED else parent
    assert f"{named!r}" in info.value.detail
    assert ("latest leaf" in info.value.detail) is (parent is OMITTED)


@pytest.mark.parametrize(
    ("parent", "leaf", "expected"),
    [(None, "k2", Append(None)), ("x", "k2", Append("x")), (OMITTED, "x", Append("x")), (OMITTED, None, Append(None))],
)
def test_an_id_with_descendants_is_appended_anywhere_else(
    parent: ParentSpec, leaf: str | None, expected: Append
) -> None:
    """A new root, another branch, or a latest leaf that is not below it: no cycle, appended."""
    assert decide_append(state(leaf=leaf, parent_exists=True, descendants=UNDER), HASH, parent) == expected


def test_an_unknown_parent_is_refused_as_such_even_for_an_id_with_descendants() -> None:
    with pytest.raises(UnknownParent):
        decide_append(state(leaf="k2", parent_exists=False, descendants=UNDER), HASH, "gone")


def test_a_replay_of_a_stored_id_is_not_a_cycle() -> None:
    first = Existing(parent_id="k", seq=9, body_sha256=HASH)
    assert decide_append(state(existing=first, leaf="k2", descendants=UNDER), HASH, OMITTED) == Replay("k", 9)


def follows(
    leaf: str | None, under: bool, *, existing: Existing | None = None, descendants: frozenset[str] = frozenset()
) -> AppendState:
    """The state a batch's next message sees: its previous message (``b1``) exists; ``under``:
    the latest leaf is below it (another writer appended onto the batch's line)."""
    s = state(leaf=leaf, parent_exists=True, existing=existing, descendants=descendants)
    return replace(s, leaf_follows=under)


def test_a_batch_message_follows_a_leaf_appended_under_its_previous() -> None:
    assert decide_append(follows("w", True), HASH, "b1", follow=True) == Append("w")


def test_a_batch_message_continues_after_its_previous_when_the_leaf_is_elsewhere() -> None:
    assert decide_append(follows("u", False), HASH, "b1", follow=True) == Append("b1")
    assert decide_append(follows("b1", False), HASH, "b1", follow=True) == Append("b1")


def test_only_a_batch_message_follows_the_leaf() -> None:
    """An append with a given parent takes that parent, whatever the leaf (``follow`` unset)."""
    assert decide_append(follows("w", True), HASH, "b1") == Append("b1")


def test_a_batch_message_that_exists_replays_where_it_was_appended() -> None:
    s = follows("w", True, existing=Existing("b1", 7, HASH))
    assert decide_append(s, HASH, "b1", follow=True) == Replay("b1", 7)


def test_a_followed_leaf_under_the_new_id_is_a_parent_cycle() -> None:
    with pytest.raises(ParentCycle, match="batch's previous message"):
        decide_append(follows("w", True, descendants=frozenset({"w"})), HASH, "b1", follow=True)


def test_a_batch_message_under_its_own_descendant_never_claims_nothing_was_written() -> None:
    """A batch's next message (``follow``): the messages before it were written; its refusal says
    only that it was not (the batch's answer says what was)."""
    with pytest.raises(ParentCycle) as info:
        decide_append(follows("b1", False, descendants=frozenset({"b1"})), HASH, "b1", follow=True)
    assert info.value.detail.startswith("the batch's previous message 'b1' descends")
    assert "It was not written; use another message id" in info.value.detail
    assert "Nothing was written" not in info.value.detail
    with pytest.raises(ParentCycle, match="Nothing was written; give another parent_id"):
        decide_append(state(leaf="x", parent_exists=True, descendants=UNDER), HASH, "k")


def test_a_batch_message_whose_previous_is_gone_is_refused() -> None:
    s = AppendState(session_deleted=False, existing=None, latest_leaf="w", parent_exists=False, leaf_follows=True)
    with pytest.raises(UnknownParent):
        decide_append(s, HASH, "b1", follow=True)


# -- a compaction summary's id (what history shows an overlay as) ---------------------------------

SUMMARY = Summary(parent_id="r0", seq=42, body_sha256=HASH, last_id="r6")


def test_a_summary_sent_back_as_history_showed_it_is_a_replay_that_a_chain_goes_on_after() -> None:
    s = replace(state(leaf="r7", parent_exists=True), summary=SUMMARY)
    for parent in (OMITTED, None, "r0"):
        assert decide_append(s, HASH, parent) == Replay("r0", 42, tail="r6")


def test_a_summarys_id_with_another_body_is_a_conflict() -> None:
    s = replace(state(leaf="r7"), summary=SUMMARY)
    with pytest.raises(MessageConflict, match="compaction summary"):
        decide_append(s, OTHER_HASH, OMITTED)


def test_an_id_in_a_summarys_form_that_no_overlay_has_is_refused() -> None:
    with pytest.raises(InvalidId, match="no overlay of this session has it"):
        decide_append(replace(state(leaf="r7"), summary_like=True), HASH, OMITTED)


def test_a_stored_message_under_a_summarys_id_decides_as_a_message() -> None:
    """A message stored with the id before summaries were told apart (an earlier release) keeps it."""
    s = replace(state(existing=Existing("r0", 7, HASH)), summary=SUMMARY)
    assert decide_append(s, HASH, OMITTED) == Replay("r0", 7)


def test_an_erased_session_is_refused_before_a_summary_is_looked_at() -> None:
    s = replace(state(), summary=SUMMARY, session_erased=True)
    with pytest.raises(ErasedSession):
        decide_append(s, HASH, OMITTED)
