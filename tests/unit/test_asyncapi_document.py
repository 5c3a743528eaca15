"""docs/asyncapi.yaml is generated from the FastStream brokers and must not be stale; it lists every
event type with its subject pattern, schema and version, and every command with request and reply."""

from __future__ import annotations

from typing import Any

import yaml

from events.catalog import EVENT_TYPES, WORK_TYPES
from events.commands import COMMANDS, STATUS_HEADER
from services.commands_nats import asyncapi


def _doc() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(asyncapi.DOC_PATH.read_text(encoding="utf-8"))
    return loaded


def test_docs_asyncapi_yaml_is_up_to_date() -> None:
    assert asyncapi.DOC_PATH.exists(), "run: python -m services.commands_nats.asyncapi"
    assert asyncapi.DOC_PATH.read_text(encoding="utf-8") == asyncapi.render(), (
        "docs/asyncapi.yaml is stale: run python -m services.commands_nats.asyncapi"
    )
    assert asyncapi.main(["--check"]) == 0


def test_every_event_type_has_its_subject_pattern_schema_and_version() -> None:
    doc = _doc()
    for event in EVENT_TYPES:
        channel = doc["channels"][f"{event.TYPE}.v{event.VERSION}"]
        assert channel["address"] == "chronicle.ev.{tenant}.{partition}.{session}"
        assert set(channel["parameters"]) == {"tenant", "partition", "session"}
        message = doc["components"]["messages"][f"{event.TYPE}.v{event.VERSION}:Message"]
        schema = doc["components"]["schemas"][message["payload"]["$ref"].rsplit("/", 1)[1]]
        assert schema["properties"]["type"]["const"] == event.TYPE
        assert schema["properties"]["version"]["const"] == event.VERSION
        assert doc["operations"][f"{event.TYPE}.v{event.VERSION}"]["action"] == "send"


def test_every_command_has_its_subject_request_and_reply() -> None:
    doc = _doc()
    schemas = doc["components"]["schemas"]
    for command in COMMANDS:
        name = f"cmd.{command.name}"
        assert doc["channels"][name]["address"] == f"chronicle.cmd.{{tenant}}.{command.name}"
        operation = doc["operations"][name]
        assert operation["action"] == "receive"
        request = doc["components"]["messages"][f"{name}:SubscribeMessage"]["payload"]
        assert set(schemas[request["$ref"].rsplit("/", 1)[1]]["properties"]) == set(command.request.model_fields)
        reply = doc["components"]["messages"][f"{name}:Reply"]
        assert reply["headers"]["required"] == [STATUS_HEADER]
        refs = [r["$ref"].rsplit("/", 1)[1] for r in reply["payload"]["anyOf"]]
        assert refs == [command.reply.__name__, "Problem"]
        assert set(schemas[command.reply.__name__]["properties"]) == set(command.reply.model_fields)
        assert operation["reply"]["channel"] == {"$ref": f"#/channels/{name}:Reply"}


def test_every_reference_resolves() -> None:
    doc = _doc()
    missing: list[str] = []

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            ref = node.get("$ref")
            if isinstance(ref, str):
                target: Any = doc
                for part in ref.removeprefix("#/").split("/"):
                    target = target.get(part) if isinstance(target, dict) else None
                if target is None:
                    missing.append(ref)
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(doc)
    assert missing == []


def test_the_compaction_work_queue_is_documented_with_its_payload() -> None:
    doc = _doc()
    for item in WORK_TYPES:
        sent = doc["channels"][f"{item.TYPE}.v{item.VERSION}"]
        assert sent["address"] == "chronicle.ev-work.compaction.{tenant}.{session}"
        received = doc["components"]["messages"][f"{item.TYPE}:SubscribeMessage"]
        assert received["payload"] == {"$ref": f"#/components/schemas/{item.__name__}"}
        assert doc["operations"][item.TYPE]["action"] == "receive"
