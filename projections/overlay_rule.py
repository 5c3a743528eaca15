"""The overlay in force, pure (no I/O): which summary overlays a path shows. The readers
(:mod:`projections.overlays`), the fork, time travel and the compactor's estimate all use it, so
they never disagree."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

T = TypeVar("T")


def in_force(path_ids: Sequence[str], candidates: Sequence[T], span: Callable[[T], tuple[str, str]]) -> list[str | T]:
    """The rule that picks the overlays in force on a path (every reader and the compactor use it).

    Walking the path, the candidates at an index are the overlays (``span``: their first and last
    message ids) starting there whose end is on the path at or after it. The widest wins (the
    one reaching furthest along the path), ties to the newest (``candidates`` are oldest first),
    and the walk continues after its end. The widest, not simply the newest: a sibling branch's
    later, shorter overlay over the shared prefix never rolls back the longer one of this branch.
    """
    index = {mid: i for i, mid in enumerate(path_ids)}
    out: list[str | T] = []
    i = 0
    while i < len(path_ids):
        best: T | None = None
        reach = -1
        for ov in candidates:
            first, last = span(ov)
            end = index.get(last, -1)
            if first == path_ids[i] and end >= i and end >= reach:
                best, reach = ov, end
        if best is None:
            out.append(path_ids[i])
            i += 1
        else:
            out.append(best)
            i = reach + 1
    return out
