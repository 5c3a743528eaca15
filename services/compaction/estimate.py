"""The compactor's token estimate, pure: how appends move a session's active branch and its
running count, how a path is re-summed under its overlays, and when a session is due.

:mod:`services.compaction.state` is the SQL shell around these steps (its ``compactor_*`` tables
hold the per-message counts, the overlays and each session's leaf and estimate).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from projections.overlay_rule import in_force

Key = tuple[str, str]


@dataclass(frozen=True, slots=True)
class Branch:
    """A session's active leaf and the estimate of its compacted path (prompt not included)."""

    leaf: str | None
    estimate: int


@dataclass(frozen=True, slots=True)
class Append:
    """A message new to the state (not one it had already counted), with its token count."""

    tenant: str
    session: str
    message_id: str
    parent_id: str | None
    tokens: int


def extends(branch: Branch, parent_id: str | None) -> bool:
    """An append under ``parent_id`` continues the active branch (the first message of an empty
    session does too): its count adds to the estimate; anything else is a branch switch."""
    return branch.leaf == parent_id and (parent_id is not None or branch.estimate == 0)


def fold_appends(branches: Mapping[Key, Branch], appends: Iterable[Append]) -> tuple[dict[Key, Branch], set[Key]]:
    """Apply a run of appends, in order: each session's new branch, and the sessions whose leaf
    switched (their estimate must be re-summed from the stored counts: :func:`compacted_sum`)."""
    out = dict(branches)
    switched: set[Key] = set()
    for a in appends:
        key = (a.tenant, a.session)
        branch = out[key]
        if key not in switched and extends(branch, a.parent_id):
            out[key] = Branch(a.message_id, branch.estimate + a.tokens)
        else:
            out[key] = Branch(a.message_id, branch.estimate)
            switched.add(key)
    return out, switched


def path_from_leaf(walked: Sequence[tuple[str, int]]) -> list[tuple[str, int]]:
    """(id, tokens) from the root to the leaf, given the walk from the leaf up; a cycle (a
    message deleted and appended again under a descendant) ends the walk."""
    seen: set[str] = set()
    path: list[tuple[str, int]] = []
    for mid, n in walked:
        if mid in seen:
            break
        seen.add(mid)
        path.append((mid, n))
    path.reverse()
    return path


def compacted_sum(path: Sequence[tuple[str, int]], overlays: Sequence[tuple[str, str, int]]) -> int:
    """Sum of per-message tokens along a path with the overlays in force applied, by the readers'
    rule (:func:`projections.overlay_rule.in_force`; ``overlays``: (from id, to id, summary tokens),
    oldest first)."""
    counts = dict(path)
    view = in_force([mid for mid, _ in path], overlays, lambda ov: (ov[0], ov[1]))
    return sum(counts[item] if isinstance(item, str) else item[2] for item in view)


SKIP_GROWTH_DIVISOR = 10
"""After a skipped compaction, the session is asked again once its estimate has grown past the
skipped one by ``compact_after / SKIP_GROWTH_DIVISOR`` (:func:`skip_margin`)."""


def skip_margin(compact_after: int) -> int:
    """How far past a skipped attempt's estimate a session must grow before it is due again: a
    tenth of ``compact_after`` (rounded up). At most one summary per tenth of the budget grown,
    however many appends that takes, and never more than a tenth past the last try before the
    next one."""
    return -(-compact_after // SKIP_GROWTH_DIVISOR)


def over(estimate: int, prompt_tokens: int, compact_after: int | None) -> bool:
    """Over the threshold, strictly: the branch's estimate and the frozen prompt together."""
    return compact_after is not None and estimate + prompt_tokens > compact_after


def is_due(estimate: int, prompt_tokens: int, compact_after: int | None, skipped: int | None = None) -> bool:
    """Over the threshold and, after a skipped attempt at estimate ``skipped`` (prompt included),
    grown past it by :func:`skip_margin`: only then can a new attempt come out otherwise."""
    if compact_after is None or not over(estimate, prompt_tokens, compact_after):
        return False
    return skipped is None or estimate + prompt_tokens > skipped + skip_margin(compact_after)
