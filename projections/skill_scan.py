"""Which skills a session's history shows loaded: the reference's restore scan
(``Session._scanHistoryForLoadedSkills``, docs/reference.md §2 "Restore after hibernation"),
over stored messages as history reads show them (unloaded outputs as ``[skill unloaded: key]``).
Pure: the rows come from :func:`projections.context_queries.history_loaded_skills`."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

from events.tool_names import unavailable_tool
from projections.reclaimed import Reclaimed

UNLOADED_MARK = "[skill unloaded:"
"""How an unloaded skill's tool output starts (:func:`projections.reclaimed.reclaim`)."""


def tool_name(part: dict[str, Any]) -> str | None:
    """A tool part's tool: ``toolName`` (dynamic tool parts) or the ``tool-<name>`` of its type
    (AI SDK static parts; the reference's scan matched only the former, see its §7.6.2)."""
    name = part.get("toolName")
    if isinstance(name, str):
        return name
    kind = part.get("type")
    return kind[5:] if isinstance(kind, str) and kind.startswith("tool-") else None


def _skill_parts(rows: list[tuple[str, str]], unloaded: Reclaimed) -> Iterator[tuple[str, str, str, str, Any, Any]]:
    """(message id, tool, label, key, tool call id, output as history reads show it) of each
    ``load_context``/``unload_context`` part with its output (``state: "output-available"``) and
    a non-empty label and key in its input, in ``rows`` (assistant messages' (id, stored JSON),
    oldest first) order."""
    for mid, content in rows:
        parts = json.loads(content).get("parts")
        if not isinstance(parts, list):  # a message published straight to the log
            continue
        outputs = unloaded.outputs(mid, content)
        for part in parts:
            if not isinstance(part, dict) or part.get("state") != "output-available":
                continue
            name, inp = tool_name(part), part.get("input")
            if name not in ("load_context", "unload_context") or not isinstance(inp, dict):
                continue
            label, key = inp.get("label"), inp.get("key")
            if not (isinstance(label, str) and label and isinstance(key, str) and key):
                continue
            call = part.get("toolCallId")
            output = part.get("output")
            if isinstance(call, str) and call in outputs:
                output = f"[skill unloaded: {outputs[call]}]"
            yield mid, name, label, key, call, output


def _shown_unloaded(output: Any) -> bool:
    return isinstance(output, str) and output.startswith(UNLOADED_MARK)


TOOL_FAILED = "Error: the tool failed unexpectedly; try again later"
"""What an LLM is told of an unexpected failure of a tool (services/context/tools.py)."""
ARGS_NOT_AN_OBJECT = "Error: tool arguments must be a JSON object"
ARGS_BAD_CHARS = "Error: tool arguments must not contain NUL characters or lone surrogates"
FAILURE_TITLES = frozenset(
    {
        "A backing service is unavailable",
        "Internal error",
        "Object storage failed",
        "The read model did not catch up in time",
        "The search took too long",
        "The summarizer failed; recorded, retry later",
        "Too many concurrent writers; retry",
    }
)
"""The titles of the errors a tool shows an LLM as ``Error: <title>`` (a backing service's,
status 5xx: its detail is for the log); a unit test holds it to services/errors.py."""
_QUOTED = r"(?:'[^'\n]*'|\"[^\"\n]*\")"
_BUCKET_FAILURE = re.compile(
    rf"Error: (?:bucket {_QUOTED} is reserved for Chronicle's own data"
    rf"|invalid bucket name {_QUOTED}: object storage takes no request for it"
    rf"|bucket {_QUOTED} does not exist)"
)
_TOO_LARGE = re.compile(r"Error: content too large to store \([^\n]*\); write a shorter text")
# the object is named as stored, the block's prefix before the key (services/context/blocks.py)
_NOT_TEXT = re.compile(rf"Error: object [^\n]+ in bucket {_QUOTED} is not UTF-8 text; upload it as text")


def loaded_nothing(label: str, key: str, output: Any) -> bool:
    """Whether a ``load_context`` output of ``label``/``key`` is the tool's answer for a load
    that loaded nothing: ``Not found: <key>`` (no such document, or one the block's ``keys``
    leave out) or one of the ``Error: …`` results services/context/tools.py gives a load
    (worded exactly as it words them). The live tool adds no skill then, but the reference's
    restore scan took every output for a load, so a failed load read back from history listed a
    skill that was never loaded (and an unload "reclaimed" its error). A loaded document is
    returned unchanged, so one that merely starts with ``Error: `` is a load."""
    if not isinstance(output, str):
        return False
    if output in (f"Not found: {key}", TOOL_FAILED, ARGS_NOT_AN_OBJECT, ARGS_BAD_CHARS):
        return True
    if output == unavailable_tool("load_context") or output == f'Error: Block "{label}" is not a skill provider':
        return True
    if output.startswith(f'Error: "{label}" is not a skill block. Skill blocks: ') and "\n" not in output:
        return True
    if output.startswith("Error: ") and output[len("Error: ") :] in FAILURE_TITLES:
        return True
    return any(p.fullmatch(output) for p in (_BUCKET_FAILURE, _TOO_LARGE, _NOT_TEXT))


def scan_loaded(rows: list[tuple[str, str]], unloaded: Reclaimed) -> dict[tuple[str, str], tuple[str, str]]:
    """(label, key) -> (message id, tool call id) of the output that keeps it loaded, in the order
    the reference's set gets them: ``rows`` are assistant messages' (id, stored JSON), oldest
    first. A ``load_context`` part with its output (``state: "output-available"``) and a
    non-empty label and key in its input loads the skill, unless its output, as a history read
    shows it, starts with ``[skill unloaded:`` (then it unloads it) or is the tool's answer for a
    load that loaded nothing (:func:`loaded_nothing`: passed over); an ``unload_context`` part
    with its output unloads it. A load part without a string ``toolCallId`` is passed over: an
    unload could not reclaim it (reclaimed outputs are named by tool call), so it would stay
    loaded for good."""
    loaded: dict[tuple[str, str], tuple[str, str]] = {}
    for mid, name, label, key, call, output in _skill_parts(rows, unloaded):
        if name == "load_context" and loaded_nothing(label, key, output):
            continue
        if name == "unload_context" or _shown_unloaded(output):
            loaded.pop((label, key), None)
        elif isinstance(call, str):
            loaded[(label, key)] = (mid, call)  # a set's order: a key loaded again keeps its place
    return loaded


def load_outputs(rows: list[tuple[str, str]], unloaded: Reclaimed, label: str, key: str) -> list[tuple[str, str]]:
    """(message id, tool call id) of every ``load_context`` output of ``label``/``key`` in
    ``rows`` (as :func:`scan_loaded` takes them) that history reads still show whole (not
    ``[skill unloaded: …]``), oldest first: what an unload reclaims. A skill loaded twice holds
    its text twice; the reference's unload rewrites the newest output only, and the older one
    kept the whole text in the context while the tools said the skill was unloaded."""
    return [
        (mid, call)
        for mid, name, lab, k, call, output in _skill_parts(rows, unloaded)
        if name == "load_context"
        and (lab, k) == (label, key)
        and isinstance(call, str)
        and not _shown_unloaded(output)
        and not loaded_nothing(lab, k, output)
    ]
