"""The AsyncAPI document of Chronicle on NATS, generated from the FastStream brokers: every event
type of the log (its subject pattern, schema and version, from events/catalog.py) and every command
subject with its request and its reply. A developer in any language can publish events and send
commands from it alone. It is committed as docs/asyncapi.yaml (a test fails when that is stale)
and served by the API (``GET /asyncapi.yaml``, for the server's own settings).

Regenerate with ``python -m services.commands_nats.asyncapi`` (``--check`` tells whether the
committed file is current). Every registration in :data:`REGISTERED` is documented: a room that
adds FastStream subscribers or publishers adds the call that registers them there.
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import yaml
from faststream.nats import NatsBroker, NatsRouter
from faststream.specification import AsyncAPI
from pydantic import BaseModel

from events.catalog import EVENT_TYPES, WORK_TYPES
from events.commands import COMMANDS, STATUS_HEADER, Problem, model_refs
from events.context import SessionConfig
from events.credentials import TENANT_INBOX_ROOT
from events.messages import UIMessage
from events.sealing import SEALED, SEALED_FIELDS
from events.subjects import SubjectLayout
from services.bootstrap import Container
from services.commands_nats.app import command_router, operation_name
from services.compaction.queue import KIND, subscribe
from services.compaction.service import CompactionService
from services.settings import Settings

DOC_PATH = Path(__file__).resolve().parents[2] / "docs" / "asyncapi.yaml"
REF = "#/components/schemas/{model}"
TITLE = "Chronicle on NATS"
VERSION = "1.0"


def _sealed_note(event_type: str) -> str:
    """How the event travels where the deployment seals (``CHRONICLE_ENCRYPTION``): the schema
    shows the readable form; the personal fields then travel inside ``sealed``."""
    fields = SEALED_FIELDS.get(event_type)
    if not fields:
        return ""
    named = ", ".join(f"`{f}`" for f in fields)
    return (
        f" Where the deployment seals (CHRONICLE_ENCRYPTION), the personal fields ({named}) are removed and travel "
        f'in `"{SEALED}": {{"kid", "nonce", "ct"}}`: `ct` is the AES-256-GCM ciphertext (base64, the 12-byte '
        "`nonce` too) of their JSON object, under the session's data key (`GET /v1/sessions/{sid}/data-key`; a "
        "tenant-level event's, session `\"\"`, under the tenant scope's, which Chronicle alone holds), with "
        "the event's `id`, `type`, `version`, `tenant` and `session` joined by newlines as associated data "
        "(events/sealing.py; docs/security.md)."
    )


def event_router(layout: SubjectLayout) -> NatsRouter:
    """One documented publisher per event type: what a direct publisher sends to the stream."""
    router = NatsRouter()
    subject = f"{layout.prefix}.{{tenant}}.{{partition}}.{{session}}"
    for event in EVENT_TYPES:
        doc = " ".join((event.__doc__ or "").split())
        router.publisher(
            subject,
            schema=event,
            title=f"{event.TYPE}.v{event.VERSION}",
            description=f"`{event.TYPE}`, version {event.VERSION}, published to JetStream stream `{layout.stream}` "
            f"on `{subject}` (partition: `p` + three digits, crc32(tenant NUL session) mod {layout.partitions}; "
            "tokens encoded as events/ids.py encodes them), with the event id as `Nats-Msg-Id`."
            + (f" {doc}" if doc and not doc.startswith("Envelope fields") else "")
            + _sealed_note(event.TYPE),
        )
    work = f"{layout.work_prefix}.{KIND}.{{tenant}}.{{session}}"
    for item in WORK_TYPES:
        doc = " ".join((item.__doc__ or "").split())
        router.publisher(
            work,
            schema=item,
            title=f"{item.TYPE}.v{item.VERSION}",
            description=f"`{item.TYPE}`, version {item.VERSION}, on the work-queue stream `{layout.work_stream}` "
            f"(`{work}`; Chronicle's own processes only: no tenant may publish or read there). {doc}",
        )
    return router


Registration = Callable[[NatsBroker, Settings], object]
"""Puts one room's subscribers or publishers on a broker, as that room's process does."""


def _no_container() -> Container:
    raise RuntimeError("a broker built for its document answers no requests")


def _work_queue(broker: NatsBroker, s: Settings) -> None:
    """The compaction work queue's subscriber, as ``Container.compactor`` registers it."""
    subscribe(
        broker,
        s.layout(),
        cast("CompactionService", None),  # never called: the document's broker is not started
        durable=s.compaction_queue,
        concurrency=s.compactor_concurrency,
        attempts=s.compaction_attempts,
        backoff_s=s.compaction_backoff_s,
    )


REGISTERED: list[Registration] = [
    lambda broker, s: broker.include_router(event_router(s.layout())),
    lambda broker, s: broker.include_router(command_router(s.layout(), _no_container)),
    _work_queue,
]
"""Every FastStream subscriber and publisher of Chronicle: a room that adds some adds its
registration here (the same call its process makes, with placeholders for what only runs)."""


def brokers(settings: Settings) -> list[NatsBroker]:
    """Every FastStream broker of Chronicle, as its processes build them (not connected)."""
    broker = NatsBroker(settings.nats_servers())  # no credentials: a document holds no secret
    for register in REGISTERED:
        register(broker, settings)
    return [broker]


def _schemas(models: list[type[BaseModel]]) -> dict[str, Any]:
    schemas: dict[str, Any] = {}
    for model in models:
        schema = model.model_json_schema(ref_template=REF)
        schemas.update(schema.pop("$defs", {}))
        schemas[model.__name__] = schema
    return schemas


def _with_replies(doc: dict[str, Any]) -> dict[str, Any]:
    """Each command's operation gets its reply (AsyncAPI 3 ``reply``: the answer on the
    requester's inbox, the result or a problem), and the schemas the documents refer to."""
    components = doc.setdefault("components", {})
    schemas = components.setdefault("schemas", {})
    for name, schema in _schemas([UIMessage, SessionConfig, Problem, *(c.reply for c in COMMANDS)]).items():
        if schemas.setdefault(name, schema).get("properties", {}).keys() != schema.get("properties", {}).keys():
            raise ValueError(f"two schemas are named {name!r}: rename one (events/commands.py, events/catalog.py)")
    messages = components.setdefault("messages", {})
    channels = doc.setdefault("channels", {})
    operations = doc.setdefault("operations", {})
    for command in COMMANDS:
        operation = operations.get(operation_name(command))
        if operation is None:
            raise LookupError(f"no operation documents command {command.name!r}")
        name = f"{operation_name(command)}:Reply"
        messages[name] = {
            "title": name,
            "summary": f"`{command.reply.__name__}`, or a `Problem` (the same as HTTP's for the same request)",
            "headers": {
                "type": "object",
                "properties": {
                    STATUS_HEADER: {"type": "string", "description": "the HTTP status of the same request over HTTP"}
                },
                "required": [STATUS_HEADER],
            },
            "payload": {
                "anyOf": [{"$ref": REF.format(model=command.reply.__name__)}, {"$ref": REF.format(model="Problem")}]
            },
        }
        channels[name] = {
            "address": None,
            "description": f"the requester's inbox (under `{TENANT_INBOX_ROOT}.<tenant>`)",
            "messages": {"Reply": {"$ref": f"#/components/messages/{name}"}},
        }
        operation["reply"] = {
            "channel": {"$ref": f"#/channels/{name}"},
            "messages": [{"$ref": f"#/channels/{name}/messages/Reply"}],
        }
    return doc


def document(settings: Settings) -> dict[str, Any]:
    """The AsyncAPI 3.0 document for ``settings`` (subjects, stream, servers)."""
    spec = AsyncAPI(
        *brokers(settings),
        title=TITLE,
        version=VERSION,
        description=(
            "Events: what a tenant publishes straight to JetStream (with its NATS credentials) and what the log "
            "holds. Commands: requests over core NATS (`<commands>.<tenant>.<command>`, reply to the tenant's "
            f"inbox `{TENANT_INBOX_ROOT}.<tenant>.>`); each does what the HTTP route it names does and answers "
            "with the same body or the same problem."
        ),
        schema_version="3.0.0",
    )
    doc: dict[str, Any] = model_refs(copy.deepcopy(spec.to_specification().to_jsonable()), REF)
    return _in_order(_with_security(_with_parameters(_with_work_payloads(_with_replies(doc)))))


def _with_work_payloads(doc: dict[str, Any]) -> dict[str, Any]:
    """A work-queue subscriber reads its raw message (it acks, naks and rejects it itself), so
    FastStream documents no payload: it is the work type's schema, as its publisher says."""
    messages = doc["components"]["messages"]
    for item in WORK_TYPES:
        received = messages.get(f"{item.TYPE}:SubscribeMessage")
        if received is not None:
            received["payload"] = {"$ref": REF.format(model=item.__name__)}
    if REF.format(model="EmptyPayload") not in json.dumps(doc):
        doc["components"]["schemas"].pop("EmptyPayload", None)
    return doc


def _with_security(doc: dict[str, Any]) -> dict[str, Any]:
    """How a tenant connects: its NKey user (never anonymous), its inbox prefix."""
    doc.setdefault("components", {})["securitySchemes"] = {
        "tenant-nkey": {
            "type": "asymmetricEncryption",
            "description": "The tenant's NATS NKey user: seed HMAC-SHA256(api_key, 'chronicle/nats-nkey/v1') "
            "(events/credentials.py; `chronicle keygen --tenant` prints it). It may publish on its own event and "
            f"command subjects and subscribe under its inbox prefix `{TENANT_INBOX_ROOT}.<tenant>` only: connect "
            "with that inbox prefix. An external NATS cluster with its own accounts gives a .creds file instead.",
        }
    }
    for server in doc.get("servers", {}).values():
        server["security"] = [{"$ref": "#/components/securitySchemes/tenant-nkey"}]
    return doc


PARAMETERS = {
    "tenant": "the tenant, encoded as a subject token (events/ids.py encode_token)",
    "partition": "`p` and the session's partition in three digits",
    "session": "the session id, encoded as a subject token",
}


def _with_parameters(doc: dict[str, Any]) -> dict[str, Any]:
    """The parameters of each channel address (``{tenant}``, …), as AsyncAPI 3 wants them declared."""
    for channel in doc["channels"].values():
        address = channel.get("address") or ""
        found = {name: {"description": text} for name, text in PARAMETERS.items() if f"{{{name}}}" in address}
        if found:
            channel["parameters"] = found
    return doc


def _in_order(doc: dict[str, Any]) -> dict[str, Any]:
    """Channels, operations and components sorted by name: the document does not depend on the
    order subscribers were registered in."""
    for key in ("channels", "operations"):
        doc[key] = dict(sorted(doc.get(key, {}).items()))
    for key, value in doc.get("components", {}).items():
        doc["components"][key] = dict(sorted(value.items()))
    return doc


def reference_settings() -> Settings:
    """The settings the committed document is made for: the defaults, one local server."""
    return Settings.model_validate(
        {"nats_url": "nats://127.0.0.1:4222", "data_dir": "/nonexistent", "api_keys": []},
    )


def render(settings: Settings | None = None) -> str:
    return yaml.safe_dump(document(settings or reference_settings()), sort_keys=False, allow_unicode=True, width=110)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m services.commands_nats.asyncapi")
    parser.add_argument("--check", action="store_true", help="exit 1 when docs/asyncapi.yaml is stale")
    args = parser.parse_args(argv)
    text = render()
    if args.check:
        current = DOC_PATH.read_text(encoding="utf-8") if DOC_PATH.exists() else ""
        if current != text:
            print(f"{DOC_PATH} is stale: run python -m services.commands_nats.asyncapi", file=sys.stderr)
            return 1
        return 0
    DOC_PATH.write_text(text, encoding="utf-8")
    print(f"wrote {DOC_PATH}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
