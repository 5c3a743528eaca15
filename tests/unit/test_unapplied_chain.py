"""The chain of unapplied appends a process remembers per session (services.writes.optimistic.UnappliedChain)."""

from __future__ import annotations

from typing import Any

from events.catalog import MessageAppended, MessagesCleared
from services.writes import optimistic
from services.writes.optimistic import OptimisticWriter
from tests.integration.helpers import appended

T, S = "acme", "chat"
KEY = (T, S)


def _cond() -> OptimisticWriter:
    none: Any = None
    return OptimisticWriter(none, none, none, attempts=3, turn_timeout_s=5)


def _ev(mid: str, parent: str | None = None) -> MessageAppended:
    return appended(T, S, mid, parent)


def test_a_chain_grows_only_when_each_append_expected_the_previous_one() -> None:
    c = _cond()
    c._remember(KEY, 0, 5, _ev("m1"), True)
    c._remember(KEY, 5, 9, _ev("m2", "m1"), True)
    tip = c._chains[KEY]
    assert (tip.base, tip.last, [a.message_id for a in tip.appends]) == (0, 9, ["m1", "m2"])
    c._remember(KEY, 12, 14, _ev("m3", "m2"), True)  # expected 12: someone else wrote 10..12
    tip = c._chains[KEY]
    assert (tip.base, tip.last, [a.message_id for a in tip.appends]) == (12, 14, ["m3"])


def test_anything_but_a_new_append_ends_the_chain() -> None:
    c = _cond()
    c._remember(KEY, 0, 5, _ev("m1"), True)
    c._remember(KEY, 5, 6, MessagesCleared(tenant=T, session=S), False)
    assert KEY not in c._chains
    c._remember(KEY, 0, 5, _ev("m1"), True)
    c._remember(KEY, 5, 5, _ev("m1"), True)  # a duplicate publish answers the old sequence
    assert KEY not in c._chains


def test_unapplied_is_what_the_read_model_lacks_or_none_when_it_lacks_more() -> None:
    c = _cond()
    c._remember(KEY, 4, 7, _ev("m1"), True)
    c._remember(KEY, 7, 9, _ev("m2", "m1"), True)
    tip = c._chains[KEY]
    assert tip.unapplied(3) is None  # behind the chain's start: the chain cannot complete it
    assert [a.message_id for a in tip.unapplied(4) or []] == ["m1", "m2"]
    assert [a.message_id for a in tip.unapplied(7) or []] == ["m2"]
    assert tip.unapplied(9) == []
    c.trim(T, S, 7)
    assert (tip.base, [a.seq for a in tip.appends]) == (7, [9])
    c.trim(T, S, 20)  # someone else's events applied after the chain: nothing left to remember
    assert (tip.base, tip.appends) == (9, [])


def test_chains_and_sessions_are_bounded(monkeypatch: Any) -> None:
    monkeypatch.setattr(optimistic, "MAX_CHAIN", 2)
    monkeypatch.setattr(optimistic, "MAX_CHAINS", 2)
    c = _cond()
    c._remember(KEY, 0, 1, _ev("m1"), True)
    c._remember(KEY, 1, 2, _ev("m2", "m1"), True)
    c._remember(KEY, 2, 3, _ev("m3", "m2"), True)  # a third unapplied append: forget the session
    assert KEY not in c._chains
    for i in range(3):
        c._remember((T, f"s{i}"), 0, 1, _ev("m1"), True)
    assert list(c._chains) == [(T, "s1"), (T, "s2")]  # the least recently appended to went first


def test_a_chain_that_learns_the_ids_keeps_them_instead_of_its_appends() -> None:
    c = _cond()
    c._remember(KEY, 4, 7, _ev("m1"), True)
    c.know(T, S, c._chains[KEY], {"m0", "m1"}, "m1")
    tip = c._chains[KEY]
    assert (tip.ids, tip.leaf, tip.appends, tip.base) == ({"m0", "m1"}, "m1", [], 7)
    c._remember(KEY, 7, 9, _ev("m2", "m1"), True)
    assert (tip.ids, tip.leaf, tip.appends, tip.last) == ({"m0", "m1", "m2"}, "m2", [], 9)
    assert c._known_ids == 3
    c._remember(KEY, 12, 14, _ev("m3"), True)  # someone else wrote 10..12: a new chain, ids unknown
    assert (c._chains[KEY].ids, c._known_ids) == (None, 0)


def test_a_chain_that_learns_the_ids_keeps_the_dangling_parent_ids_too() -> None:
    """The ids messages name as their parent but the session lacks (deleted ones'): a new
    message with one of them is the only append of a new id that could close a cycle."""
    c = _cond()
    c._remember(KEY, 4, 7, _ev("k", "m"), True)
    tip = c._chains[KEY]
    c.know(T, S, tip, {"k"}, "k", {"m"})
    assert (tip.ids, tip.dangling) == ({"k"}, frozenset({"m"}))
    c._remember(KEY, 7, 9, _ev("x", "k"), True)  # appends of the chain keep them
    assert (tip.ids, tip.dangling) == ({"k", "x"}, frozenset({"m"}))
    c.know(T, S, tip, {"k", "x", "y"}, "y", {"z"})  # learnt once: a second read teaches nothing
    assert tip.dangling == frozenset({"m"})


def test_a_session_over_the_cap_is_asked_for_its_ids_once() -> None:
    c = _cond()
    c._remember(KEY, 4, 7, _ev("m1"), True)
    c.know(T, S, c._chains[KEY], None, "m1")
    tip = c._chains[KEY]
    assert (tip.ids, tip.ids_tried) == (None, True)
    c._remember(KEY, 7, 9, _ev("m2", "m1"), True)
    assert [a.message_id for a in tip.appends] == ["m1", "m2"]  # the chain keeps its appends


def test_the_ids_budget_forgets_the_least_recently_appended_chains(monkeypatch: Any) -> None:
    monkeypatch.setattr(optimistic, "MAX_KNOWN_IDS", 5)
    c = _cond()
    for s in ("a", "b"):
        c._remember((T, s), 0, 1, appended(T, s, "m1", None), True)
        c.know(T, s, c._chains[(T, s)], {"m1", "x", "y"}, "m1")
    assert c._known_ids == 6  # over, until the next append is remembered
    c._remember((T, "b"), 1, 2, appended(T, "b", "m2", "m1"), True)
    assert list(c._chains) == [(T, "b")]
    assert c._known_ids == 4


def test_ids_read_for_a_chain_that_ended_meanwhile_are_not_taught_to_the_next_one() -> None:
    """The read of a chain's ids is awaited; if meanwhile another append of this process ended the
    chain and began a new one (a conflict, then a slow-path append), the ids and the leaf read
    for the old chain are not the new chain's end: taught to it, the next append would take the
    old leaf as parent while expecting the new end, and the log would accept a second child."""
    c = _cond()
    c._remember(KEY, 4, 7, _ev("m1"), True)
    old = c._chains[KEY]
    c._forget(KEY)  # another coroutine's publish conflicted
    c._remember(KEY, 7, 8, _ev("m2", "m1"), True)  # ... and its slow-path append began a new chain
    new = c._chains[KEY]
    c.know(T, S, old, {"m0", "m1"}, "m1")  # the awaited read, for the old chain, comes back
    assert (new.ids, new.leaf, new.ids_tried, [a.message_id for a in new.appends]) == (None, None, False, ["m2"])
    assert c._known_ids == 0
    c.know(T, S, new, {"m0", "m1", "m2"}, "m2")  # read for the new chain: learnt
    assert (new.ids, new.leaf) == ({"m0", "m1", "m2"}, "m2")


def test_above_follows_the_chains_parents_to_the_first_id_the_read_model_holds() -> None:
    """What a parent among the chain's appends descends from outside them: the read model is
    asked about that id only (whether it is under a re-used id); None for a root of the chain's
    or an id the chain does not hold."""
    tip = optimistic.UnappliedChain(base=3, last=8)
    for seq, mid, pid in [(4, "a", "k"), (5, "b", "a"), (6, "r", None), (7, "c", "b"), (8, "s", "r")]:
        tip.appends.append(optimistic.Appended(seq, mid, pid, "h"))
    assert [tip.above(m) for m in ("a", "b", "c")] == ["k", "k", "k"]
    assert (tip.above("r"), tip.above("s")) == (None, None)  # a new root of the chain's
    assert tip.above("k") is None  # not an append of the chain: the read model answers alone
    looped = optimistic.UnappliedChain(base=0, last=2)  # never made by one process; still ends
    looped.appends += [optimistic.Appended(1, "p", "q", "h"), optimistic.Appended(2, "q", "p", "h")]
    assert looped.above("p") == "p"
