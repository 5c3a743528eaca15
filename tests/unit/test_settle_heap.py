"""``settle_heap``: a server's start-up heap leaves the collector's generations (``gc.freeze``)
once loaded, after a collection, so later full collections do not walk it and garbage made
before it is not frozen with it."""

from __future__ import annotations

import gc
import weakref

from services.bootstrap import settle_heap


class Node:
    other: object = None


def test_settle_heap_collects_then_freezes_what_is_left() -> None:
    a, b = Node(), Node()
    a.other, b.other = b, a
    garbage = weakref.ref(a)
    del a, b  # a cycle: only the collector frees it
    kept = Node()
    before = gc.get_freeze_count()
    try:
        settle_heap()
        assert garbage() is None  # collected, not frozen
        assert gc.get_freeze_count() > before
        assert not any(o is kept for o in gc.get_objects())  # a live object is out of the generations
    finally:
        gc.unfreeze()
    assert any(o is kept for o in gc.get_objects())
