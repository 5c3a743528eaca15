"""Context memory, pure parts: config validation, the projection's plan per event type, the
append rule, the read-time rewrite of unloaded skills' tool outputs and the scan of history for
loaded skills."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from psycopg.types.json import Jsonb
from pydantic import ValidationError

import services.api.app  # noqa: F401  (every error class defined, for the titles test)
from events.catalog import (
    ContextWritten,
    MessageAppended,
    MessagesCleared,
    PromptRendered,
    SearchEntryIndexed,
    SessionConfigured,
    SessionDeleted,
    SessionRenamed,
    SkillIndexed,
    SkillLoaded,
    SkillRemoved,
    SkillUnloaded,
)
from events.context import ReadonlyBlock, SearchableBlock, SessionConfig, SkillsBlock, WritableBlock
from events.ids import TENANT_SCOPE
from projections.context import SESSION_TABLES, plan
from projections.reclaimed import reclaim, reclaimed_in
from projections.skill_scan import FAILURE_TITLES, load_outputs, scan_loaded
from services.context.rules import joined
from services.errors import ChronicleError

T, S = "acme", "chat-1"

# -- SessionConfig ------------------------------------------------------------------------


def valid_config() -> dict[str, Any]:
    return {
        "blocks": [
            {"kind": "readonly", "label": "soul", "content": "Be kind."},
            {"kind": "readonly", "label": "policy", "source": {"bucket": "docs-bucket", "key": "policy.md"}},
            {"kind": "writable", "label": "memory", "description": "Learned facts", "max_tokens": 100},
            {"kind": "searchable", "label": "knowledge"},
            {"kind": "skills", "label": "skills", "bucket": "skills-bucket", "prefix": "skills/", "keys": ["tax"]},
        ],
        "compaction": {"compact_after": 1000},
        "searchable_history": "history",
    }


def test_a_full_config_parses_in_order() -> None:
    config = SessionConfig.model_validate(valid_config())
    assert [type(b) for b in config.blocks] == [
        ReadonlyBlock,
        ReadonlyBlock,
        WritableBlock,
        SearchableBlock,
        SkillsBlock,
    ]
    assert [b.label for b in config.blocks] == ["soul", "policy", "memory", "knowledge", "skills"]
    assert config.searchable_history == "history"
    assert config.compaction is not None
    assert config.compaction.protect_head == 3
    assert SessionConfig.model_validate(config.model_dump(mode="json")) == config


def test_empty_config_is_valid() -> None:
    assert SessionConfig.model_validate({}).blocks == []


def _with_block(block: dict[str, Any], **top: Any) -> dict[str, Any]:
    return {"blocks": [{"kind": "writable", "label": "memory"}, block], **top}


@pytest.mark.parametrize(
    ("raw", "needle"),
    [
        (_with_block({"kind": "writable", "label": "memory"}), "duplicate block labels: memory"),
        (_with_block({"kind": "readonly", "label": "soul"}, searchable_history="memory"), "duplicate"),
        (_with_block({"kind": "episodic", "label": "x"}), "kind"),
        (_with_block({"label": "x"}), "kind"),
        (_with_block({"kind": "writable", "label": "x", "max_tokens": -5}), "greater than or equal to 1"),
        (_with_block({"kind": "writable", "label": "x", "max_tokens": 0}), "greater than or equal to 1"),
        (_with_block({"kind": "skills", "label": "x"}), "bucket"),
        (_with_block({"kind": "skills", "label": "x", "bucket": "Bad_Bucket"}), "invalid bucket name"),
        (_with_block({"kind": "skills", "label": "x", "bucket": "-leading"}), "invalid bucket name"),
        (
            _with_block({"kind": "readonly", "label": "x", "source": {"bucket": "Bad_B", "key": "k"}}),
            "invalid bucket name",
        ),
        (_with_block({"kind": "skills", "label": "x", "bucket": "ab"}), "at least 3"),
        (_with_block({"kind": "skills", "label": "x", "bucket": "b" * 64}), "at most 63"),
        (
            _with_block(
                {"kind": "readonly", "label": "x", "content": "a", "source": {"bucket": "docs-bucket", "key": "k"}}
            ),
            "either content or source",
        ),
        (_with_block({"kind": "writable", "label": "has space"}), "pattern"),
        (_with_block({"kind": "writable", "label": ""}), "pattern"),
        (_with_block({"kind": "writable", "label": "x", "color": "red"}), "Extra inputs"),
        (_with_block({"kind": "readonly", "label": "x", "max_tokens": "many"}), "integer"),
        ({"blocks": [], "searchable_history": "bad label"}, "pattern"),
        ({"blocks": [], "unknown": 1}, "Extra inputs"),
        ({"blocks": "memory"}, "list"),
    ],
)
def test_invalid_configs_are_rejected(raw: dict[str, Any], needle: str) -> None:
    with pytest.raises(ValidationError) as info:
        SessionConfig.model_validate(raw)
    assert needle in str(info.value)


def test_duplicate_message_names_every_duplicate_once() -> None:
    raw = {
        "blocks": [
            {"kind": "writable", "label": "b"},
            {"kind": "writable", "label": "a"},
            {"kind": "searchable", "label": "b"},
            {"kind": "readonly", "label": "a"},
        ]
    }
    with pytest.raises(ValidationError, match="duplicate block labels: a, b"):
        SessionConfig.model_validate(raw)


def test_labels_are_case_sensitive() -> None:
    config = SessionConfig.model_validate(
        {"blocks": [{"kind": "writable", "label": "Memory"}, {"kind": "writable", "label": "memory"}]}
    )
    assert len(config.blocks) == 2


# -- projection plan ----------------------------------------------------------------------


def tables(statements: list[tuple[str, tuple[Any, ...]]]) -> list[str]:
    out = []
    for sql, _ in statements:
        words = sql.split()
        verb = words[0]
        out.append(f"{verb} {words[2] if verb in ('INSERT', 'DELETE') else words[1]}")
    return out


def test_plan_session_configured() -> None:
    config = SessionConfig.model_validate(valid_config())
    [(sql, params)] = plan(SessionConfigured(tenant=T, session=S, config=config), 7)
    assert sql.startswith("INSERT INTO session_configs")
    assert "ON CONFLICT (tenant, session_id) DO UPDATE" in sql
    assert params[:2] == (T, S)
    assert params[3] == 7
    assert isinstance(params[2], Jsonb)
    assert params[2].obj == config.model_dump(mode="json")


def test_plan_context_written_stores_the_full_content() -> None:
    event = ContextWritten(tenant=T, session=S, label="memory", content="a\nb", tokens=3, mode="append", writer="tool")
    [(sql, params)] = plan(event, 9)
    assert sql.startswith("INSERT INTO context_blocks")
    assert "DO UPDATE" in sql
    assert params == (T, S, "memory", "a\nb", 3, 9)


def test_plan_search_entry_upserts_by_key() -> None:
    [(sql, params)] = plan(SearchEntryIndexed(tenant=T, session=S, label="kb", key="deploy", content="Friday"), 11)
    assert sql.startswith("INSERT INTO search_entries")
    assert "ON CONFLICT (tenant, session_id, label, key) DO UPDATE" in sql
    assert "created_seq = " not in sql.split("DO UPDATE")[1]  # the first index keeps its created_seq
    assert params == (T, S, "kb", "deploy", "Friday", 11, 11)


def test_plan_skill_index_is_tenant_scoped() -> None:
    ev = SkillIndexed(
        tenant=T, session=TENANT_SCOPE, bucket="b1", key="skills/tax", description="Tax", etag="e", size=3
    )
    [(sql, params)] = plan(ev, 12)
    assert sql.startswith("INSERT INTO skills_index")
    assert "ON CONFLICT (tenant, bucket, key) DO UPDATE" in sql
    assert params == (T, "b1", "skills/tax", "Tax", "e", 3, 12)
    [(sql, params)] = plan(SkillRemoved(tenant=T, session=TENANT_SCOPE, bucket="b1", key="skills/tax"), 13)
    assert sql.startswith("DELETE FROM skills_index")
    assert params == (T, "b1", "skills/tax")


def test_plan_skill_loaded_and_unloaded() -> None:
    [(sql, params)] = plan(SkillLoaded(tenant=T, session=S, label="skills", key="tax"), 14)
    assert sql.startswith("INSERT INTO loaded_skills")
    assert "DO UPDATE" in sql
    assert params == (T, S, "skills", "tax", 14, None)
    [(_, params)] = plan(SkillLoaded(tenant=T, session=S, label="skills", key="tax", tool_call_id="c0"), 14)
    assert params == (T, S, "skills", "tax", 14, "c0")

    bare = plan(SkillUnloaded(tenant=T, session=S, label="skills", key="tax"), 15)
    assert tables(bare) == ["DELETE loaded_skills"]
    assert bare[0][1] == (T, S, "skills", "tax")

    full = plan(SkillUnloaded(tenant=T, session=S, label="skills", key="tax", message_id="m1", tool_call_id="c1"), 16)
    assert tables(full) == ["DELETE loaded_skills", "INSERT reclaimed_outputs"]
    assert full[1][1] == (T, S, "m1", "c1", "tax", 16)
    assert "DO NOTHING" in full[1][0]

    half = plan(SkillUnloaded(tenant=T, session=S, label="skills", key="tax", message_id="m1"), 17)
    assert tables(half) == ["DELETE loaded_skills"]

    # the load's call id, its message not stored yet: '' stands for whichever message carries it
    early = plan(SkillUnloaded(tenant=T, session=S, label="skills", key="tax", tool_call_id="c0"), 18)
    assert tables(early) == ["DELETE loaded_skills", "INSERT reclaimed_outputs"]
    assert early[1][1] == (T, S, "", "c0", "tax", 18)


def test_plan_prompt_rendered_keeps_every_version() -> None:
    event = PromptRendered(tenant=T, session=S, text="P", tokens=1, version_no=3, reason="clear")
    [(sql, params)] = plan(event, 18)
    assert sql.startswith("INSERT INTO prompts")
    assert "DO NOTHING" in sql
    assert params == (T, S, 3, "P", 1, "clear", 18)


def test_plan_clear_forgets_loaded_skills_but_keeps_blocks_and_prompts() -> None:
    statements = plan(MessagesCleared(tenant=T, session=S), 19)
    assert tables(statements) == ["DELETE loaded_skills", "DELETE reclaimed_outputs"]
    assert all(params == (T, S) for _, params in statements)


def test_plan_session_deleted_drops_every_session_table() -> None:
    statements = plan(SessionDeleted(tenant=T, session=S), 20)
    assert tables(statements) == [f"DELETE {t}" for t in SESSION_TABLES]
    assert "skills_index" not in SESSION_TABLES  # tenant-scoped, outlives sessions
    assert all(params == (T, S) for _, params in statements)


def test_plan_ignores_history_events() -> None:
    body = {"id": "m1", "role": "user", "parts": []}
    appended = MessageAppended(
        tenant=T, session=S, message_id="m1", role="user", body_sha256="x" * 64, message=body, parent_id=None
    )
    assert plan(appended, 1) == []
    assert plan(SessionRenamed(tenant=T, session=S, name="n"), 2) == []


# -- append rule --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("current", "addition", "expected"),
    [
        ("", "fact1", "fact1"),
        ("fact1", "fact2", "fact1\nfact2"),
        ("fact1", "\nfact2", "fact1\nfact2"),
        ("", "\nfact2", "\nfact2"),
        ("fact1\n", "fact2", "fact1\n\nfact2"),
        ("fact1", "", "fact1\n"),
        ("", "", ""),
        ("a", "\r\nb", "a\n\r\nb"),
    ],
)
def test_joined(current: str, addition: str, expected: str) -> None:
    assert joined(current, addition) == expected


# -- reclaim ------------------------------------------------------------------------------


def test_reclaim_replaces_only_the_named_tool_outputs() -> None:
    body: dict[str, Any] = {
        "id": "a1",
        "role": "assistant",
        "parts": [
            {"type": "text", "text": "Loading"},
            {
                "type": "tool-load_context",
                "toolCallId": "c1",
                "state": "output-available",
                "input": {"label": "skills", "key": "pirate"},
                "output": "# Pirate\nArr — matey",
            },
            {
                "type": "tool-load_context",
                "toolCallId": "c2",
                "state": "output-available",
                "input": {"label": "skills", "key": "tax"},
                "output": "Tax doc",
            },
        ],
        "metadata": {"note": "日本"},
    }
    out = json.loads(reclaim(json.dumps(body), {"c1": "pirate"}))
    assert out["parts"][1]["output"] == "[skill unloaded: pirate]"
    assert out["parts"][2]["output"] == "Tax doc"
    assert out["parts"][0] == body["parts"][0]
    assert out["metadata"] == {"note": "日本"}
    assert {k: v for k, v in out.items() if k != "parts"} == {k: v for k, v in body.items() if k != "parts"}


def test_reclaim_keeps_non_ascii_and_tolerates_odd_parts() -> None:
    body = {"id": "a1", "role": "assistant", "parts": ["not a dict", {"type": "text", "text": "é"}]}
    out = reclaim(json.dumps(body), {"c1": "k"})
    assert "é" in out
    assert json.loads(out) == body
    assert json.loads(reclaim(json.dumps({"id": "x", "role": "assistant"}), {"c1": "k"})) == {
        "id": "x",
        "role": "assistant",
    }


PART_FIELDS = ("type", "toolName", "toolCallId", "state", "input", "output")


def _load(call: Any, key: str, output: Any, tool: str = "load_context") -> dict[str, Any]:
    """A dynamic tool part of ``tool`` with its output, for skills block ``skills``."""
    values = ("dynamic-tool", tool, call, "output-available", {"label": "skills", "key": key}, output)
    return dict(zip(PART_FIELDS, values, strict=True))


def test_scan_loaded_follows_the_reference_order() -> None:
    """Loads in history order; a key loaded again keeps its place and names the newer output; an
    output shown as unloaded (stored so, or reclaimed by message or by call) unloads; an
    ``unload_context`` output unloads; a load without a tool call id, a part of another state or
    with no key, and parts that are no list load nothing."""
    m1 = {
        "parts": [
            _load("c1", "a", "A"),
            {
                "type": "tool-load_context",
                "toolCallId": "c2",
                "state": "output-available",
                "input": {"label": "skills", "key": "b"},
                "output": "B",
            },
            _load(None, "nocall", "X"),
            {**_load("c3", "pending", None), "state": "input-available"},
            {**_load("c4", "", "X")},
            _load("c5", "c", "C"),
            _load("c6", "d", "D"),
            _load("c7", "e", "E"),
        ]
    }
    m2 = {
        "parts": [
            _load("c8", "a", "A again"),
            _load("c9", "c", "[skill unloaded: c]"),
            _load("c10", "d", "Unloaded", "unload_context"),
        ]
    }
    m3 = {"parts": 7}
    rows = [(mid, json.dumps(body, separators=(",", ":"))) for mid, body in (("m1", m1), ("m2", m2), ("m3", m3))]
    unloaded = reclaimed_in({("m1", "c2"): "b", ("", "c7"): "e"})
    assert scan_loaded(rows, unloaded) == {("skills", "a"): ("m2", "c8")}
    assert list(scan_loaded(rows, reclaimed_in({}))) == [("skills", "a"), ("skills", "b"), ("skills", "e")]


def test_scan_loaded_passes_over_a_load_that_loaded_nothing() -> None:
    """A ``load_context`` output that is the tool's answer for a load that loaded nothing
    (``Not found: <key>``, an ``Error: …``) leaves the skill unloaded, as the live tool does:
    otherwise the next turn's ``unload_context`` lists a skill that was never loaded."""
    m1 = {
        "parts": [
            _load("c1", "nosuch", "Not found: nosuch"),
            _load("c2", "broken", "Error: the tool failed unexpectedly; try again later"),
            _load("c3", "tax", "# Tax\nNot found: nosuch is fine inside a document"),
            _load("c4", "other", "Not found: nosuch"),
        ]
    }
    rows = [("m1", json.dumps(m1))]
    assert scan_loaded(rows, reclaimed_in({})) == {("skills", "tax"): ("m1", "c3"), ("skills", "other"): ("m1", "c4")}
    # nor is such an output what an unload of a skill loaded elsewhere reclaims
    m2 = {"parts": [_load("c5", "tax", "Not found: tax"), _load("c6", "tax", "Error: Object storage failed")]}
    rows.append(("m2", json.dumps(m2)))
    assert load_outputs(rows, reclaimed_in({}), "skills", "tax") == [("m1", "c3")]
    assert scan_loaded(rows, reclaimed_in({}))[("skills", "tax")] == ("m1", "c3")


def test_scan_loaded_counts_a_loaded_document_that_starts_with_error() -> None:
    """A loaded document is the tool's output unchanged: one that starts with ``Error: `` (a
    runbook of error messages, say) is a load, and only the tool's own failure wordings are not."""
    doc = "Error: connection refused\n\nWhat to do when the API answers this: check the proxy."
    m1 = {
        "parts": [
            _load("c1", "runbook", doc),
            _load("c2", "title", "Error: Internal error is what a 500 says"),
            _load("c3", "x", 'Error: "skills" is not a skill block. Skill blocks: a'),
            _load("c4", "y", "Error: bucket 'chronicle' is reserved for Chronicle's own data"),
            _load("c5", "z", "Error: object 'z' in bucket 'b' is not UTF-8 text; upload it as text"),
            _load("c6", "w", 'Error: tool "load_context" is not available in this session'),
            # a block with a prefix names the object as stored, the prefix before the key
            _load("c7", "v", "Error: object 'team/skills/v' in bucket 'b' is not UTF-8 text; upload it as text"),
        ]
    }
    rows = [("m1", json.dumps(m1))]
    assert list(scan_loaded(rows, reclaimed_in({}))) == [("skills", "runbook"), ("skills", "title")]
    assert load_outputs(rows, reclaimed_in({}), "skills", "runbook") == [("m1", "c1")]


def test_the_failure_titles_a_load_may_show_are_the_errors_titles() -> None:
    """``Error: <title>`` of every error of status 5xx (tools.py shows its title, not its detail)."""

    def subclasses(c: type[ChronicleError]) -> Iterator[type[ChronicleError]]:
        for sub in c.__subclasses__():
            yield sub
            yield from subclasses(sub)

    classes: list[type[ChronicleError]] = [ChronicleError, *subclasses(ChronicleError)]
    titles = {c.title for c in classes if c.status >= 500}
    assert titles == FAILURE_TITLES
