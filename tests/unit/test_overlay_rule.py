"""The overlay in force on a path, pure: the widest overlay starting at a message wins, ties to the
newest; overlays not wholly on the path never apply; the auditor's view agrees."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from projections.overlay_rule import in_force

Span = tuple[str, str, str]  # (from id, to id, name)


def _view(path: list[str], overlays: list[Span]) -> list[str]:
    return [x if isinstance(x, str) else x[2] for x in in_force(path, overlays, lambda o: (o[0], o[1]))]


MAIN = [f"a{i}" for i in range(12)]
BRANCH = [*MAIN[:6], "b6"]


def test_a_sibling_branchs_newer_narrower_overlay_does_not_roll_back_this_branchs() -> None:
    overlays = [("a1", "a9", "main"), ("a1", "a4", "branch")]  # oldest first: the branch's is newer
    assert _view(MAIN, overlays) == ["a0", "main", "a10", "a11"]
    assert _view(BRANCH, overlays) == ["a0", "branch", "a5", "b6"]  # a9 is not on the branch


def test_the_widest_wins_whatever_its_age_and_equal_ranges_go_to_the_newest() -> None:
    assert _view(MAIN, [("a1", "a4", "old"), ("a1", "a9", "new")]) == ["a0", "new", "a10", "a11"]
    assert _view(MAIN, [("a1", "a9", "old"), ("a1", "a9", "new")]) == ["a0", "new", "a10", "a11"]


def test_overlays_side_by_side_both_apply_and_one_off_the_path_never_does() -> None:
    overlays = [("a5", "a8", "late"), ("a1", "a4", "early"), ("a1", "b6", "elsewhere"), ("a10", "a9", "backwards")]
    assert _view(MAIN, overlays) == ["a0", "early", "late", "a9", "a10", "a11"]


TREE_JS = Path(__file__).resolve().parents[2] / "services/api/auditor_static/tree.js"
CASES: list[tuple[list[str], list[Span]]] = [
    (MAIN, [("a1", "a9", "main"), ("a1", "a4", "branch")]),
    (BRANCH, [("a1", "a9", "main"), ("a1", "a4", "branch")]),
    (MAIN, [("a1", "a9", "old"), ("a1", "a9", "new")]),
    (MAIN, [("a5", "a8", "late"), ("a1", "a4", "early"), ("a1", "b6", "elsewhere")]),
]


@pytest.mark.skipif(shutil.which("node") is None, reason="no node to run the auditor view's script")
def test_the_auditor_view_applies_the_same_rule() -> None:
    """services/api/auditor_static/tree.js draws the overlays in force itself: it must agree."""
    script = (
        f"import {{ applyOverlays }} from {json.dumps(TREE_JS.as_uri())};\n"
        f"const cases = {json.dumps(CASES)};\n"
        "console.log(JSON.stringify(cases.map(([path, ovs]) => applyOverlays(path, ovs.map(([f, t, id], seq) =>"
        " ({ from_message_id: f, to_message_id: t, id, seq }))).map((x) => x.id ?? x.overlay.id))));\n"
    )
    out = subprocess.run(
        ["node", "--input-type=module", "-e", script], capture_output=True, text=True, check=True, timeout=30
    )
    assert json.loads(out.stdout) == [_view(path, ovs) for path, ovs in CASES]
