"""Tool definitions (pure): which tools exist per block kind, their descriptions and JSON schemas,
and the provider-specific shapes."""

from __future__ import annotations

from typing import Any

import pytest

from events.context import SessionConfig
from services.context.tool_specs import ToolSpec, blocks_of, tool_specs

SOUL: dict[str, Any] = {"kind": "readonly", "label": "soul", "content": "You are helpful."}
MEMORY: dict[str, Any] = {"kind": "writable", "label": "memory", "description": "Learned facts", "max_tokens": 100}
SKILLS: dict[str, Any] = {"kind": "skills", "label": "skills", "description": "Loadable docs", "bucket": "sk-bucket"}
KNOWLEDGE: dict[str, Any] = {"kind": "searchable", "label": "knowledge", "description": "Searchable docs"}


def config(*blocks: dict[str, Any], history: str | None = None) -> SessionConfig:
    return SessionConfig.model_validate({"blocks": list(blocks), "searchable_history": history})


def specs(*blocks: dict[str, Any], history: str | None = None, loaded: list[str] | None = None) -> dict[str, ToolSpec]:
    return {s.name: s for s in tool_specs(config(*blocks, history=history), loaded or [])}


def test_only_readonly_blocks_give_no_tools() -> None:
    assert tool_specs(config(SOUL), []) == []
    assert tool_specs(config(), []) == []
    src = {"kind": "readonly", "label": "doc", "source": {"bucket": "docs-bucket", "key": "a.md"}}
    assert tool_specs(config(SOUL, src), []) == []


@pytest.mark.parametrize(
    ("blocks", "history", "names"),
    [
        ([MEMORY], None, ["set_context"]),
        ([SOUL, MEMORY], None, ["set_context"]),
        ([SKILLS], None, ["set_context", "load_context", "unload_context"]),
        ([KNOWLEDGE], None, ["set_context", "search_context"]),
        ([SOUL], "history", ["search_context", "session_search"]),
        (
            [SOUL, MEMORY, SKILLS, KNOWLEDGE],
            "history",
            ["set_context", "load_context", "unload_context", "search_context", "session_search"],
        ),
    ],
)
def test_tools_per_block_kind(blocks: list[dict[str, Any]], history: str | None, names: list[str]) -> None:
    assert [s.name for s in tool_specs(config(*blocks, history=history), [])] == names


def test_set_context_description_lists_writable_blocks_with_their_kind() -> None:
    tool = specs(SOUL, MEMORY, SKILLS, KNOWLEDGE)["set_context"]
    lines = tool.description.split("\n")
    assert lines[0] == "Write to a context block. Available blocks:"
    assert lines[1:4] == [
        '- "memory" (writable): Learned facts',
        '- "skills" (skill collection, keyed entries): Loadable docs',
        '- "knowledge" (searchable, keyed entries): Searchable docs',
    ]
    assert lines[4:6] == [
        "",
        "Writes are durable. Skill collections are shared: other sessions list and load what is written to "
        "them; the other blocks persist in this session only.",
    ]
    assert "metadata: { title, description }" in tool.description
    assert '"soul"' not in tool.description


def test_an_empty_description_stays_empty_as_the_references_nullish_default() -> None:
    """``description ?? "no description"``: only a block without one says "no description"."""
    tool = specs(SOUL, {"kind": "writable", "label": "scratch", "description": ""})["set_context"]
    assert tool.description.split("\n")[1] == '- "scratch" (writable): '


def test_set_context_without_keyed_blocks() -> None:
    tool = specs(SOUL, MEMORY, {"kind": "writable", "label": "scratch"})["set_context"]
    assert tool.description == (
        "Write to a context block. Available blocks:\n"
        '- "memory" (writable): Learned facts\n'
        '- "scratch" (writable): no description\n'
        "\n"
        "Writes are durable and persist in this session only."
    )
    assert "metadata" not in tool.parameters["properties"]
    assert tool.parameters == {
        "type": "object",
        "properties": {
            "label": {"type": "string", "enum": ["memory", "scratch"], "description": "Block label to write to"},
            "content": {"type": "string", "description": "The main content to write to the block."},
            "action": {"type": "string", "enum": ["replace", "append"], "description": "replace (default) or append"},
        },
        "required": ["label", "content"],
    }


@pytest.mark.parametrize("keyed", [SKILLS, KNOWLEDGE])
def test_metadata_property_only_with_a_keyed_block(keyed: dict[str, Any]) -> None:
    params = specs(MEMORY, keyed)["set_context"].parameters
    assert params["required"] == ["label", "content"]
    assert params["properties"]["label"]["enum"] == ["memory", keyed["label"]]
    meta = params["properties"]["metadata"]
    assert meta["type"] == "object"
    assert set(meta["properties"]) == {"title", "description"}
    assert all(p["type"] == "string" for p in meta["properties"].values())
    assert "same title" in meta["properties"]["title"]["description"]
    assert f'"{keyed["label"]}"' in meta["description"]


def test_history_block_is_not_writable() -> None:
    assert "set_context" not in specs(SOUL, history="past")


def test_load_and_unload_context() -> None:
    other = {**SKILLS, "label": "recipes", "description": None}
    tools = specs(MEMORY, SKILLS, other)
    load, unload = tools["load_context"], tools["unload_context"]
    assert load.description == (
        'Load a document from a skill block by key. Available skill blocks: "skills", "recipes". '
        "Check the system prompt for available keys."
    )
    for tool in (load, unload):
        assert tool.parameters["required"] == ["label", "key"]
        assert tool.parameters["properties"]["label"]["enum"] == ["skills", "recipes"]
        assert tool.parameters["properties"]["key"]["type"] == "string"
    assert unload.description == (
        "Unload a previously loaded skill to free context space. The skill remains available for re-loading. "
        "No skills currently loaded."
    )


def test_unload_description_lists_the_loaded_skills() -> None:
    unload = specs(SKILLS, loaded=["skills:pirate", "skills:tax"])["unload_context"]
    assert unload.description.endswith(" Currently loaded: skills:pirate, skills:tax.")


def test_no_skill_tools_without_skill_blocks() -> None:
    tools = specs(MEMORY, KNOWLEDGE, loaded=["skills:pirate"])
    assert "load_context" not in tools
    assert "unload_context" not in tools


def test_search_context_with_searchable_and_history_blocks() -> None:
    tool = specs(MEMORY, KNOWLEDGE, history="past")["search_context"]
    assert tool.description == (
        'Search for information in a searchable context block. ONLY these blocks are searchable: "knowledge", '
        '"past". Other blocks cannot be searched.'
    )
    assert tool.parameters["required"] == ["label", "query"]
    assert tool.parameters["properties"]["label"]["enum"] == ["knowledge", "past"]
    assert tool.parameters["properties"]["query"]["type"] == "string"
    assert "search_context" not in specs(MEMORY, SKILLS)


def test_session_search_only_with_searchable_history() -> None:
    tool = specs(SOUL, history="past")["session_search"]
    assert tool.description == "Search past conversations for relevant context. Searches across all sessions."
    assert tool.parameters["required"] == ["query"]
    assert list(tool.parameters["properties"]) == ["query"]
    assert "session_search" not in specs(MEMORY, KNOWLEDGE, SKILLS)


def test_provider_shapes() -> None:
    tool = specs(MEMORY)["set_context"]
    assert tool.to("openai") == {
        "type": "function",
        "function": {"name": "set_context", "description": tool.description, "parameters": tool.parameters},
    }
    assert tool.to("anthropic") == {
        "name": "set_context",
        "description": tool.description,
        "input_schema": tool.parameters,
    }


def test_blocks_of_appends_the_history_block_last() -> None:
    infos = blocks_of(config(MEMORY, SOUL, history="past"))
    assert [(b.label, b.kind) for b in infos] == [("memory", "writable"), ("soul", "readonly"), ("past", "history")]
    assert infos[-1].description == "Cross-session conversation history"
