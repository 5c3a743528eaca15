"""The OpenAPI document, made to say what the server accepts and answers: the message and config
schemas the routes validate with, problem+json errors, the bearer key, and links that lead a
stateful client from a created session or message to the routes that read and change it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

from events.commands import Problem, model_refs
from events.context import SessionConfig
from events.messages import UIMessage

REF = "#/components/schemas/{model}"


_WHEN = {
    400: "The body is not JSON or not UTF-8 (`malformed_json`), or more than one Idempotency-Key header "
    "(`ambiguous_idempotency_key`)",
    401: "Missing or unknown API key (`unauthorized`), or more than one Authorization header (`ambiguous_credentials`)",
    404: "Unknown session, message, block or route",
    408: "The body did not arrive whole in time (`request_timeout`, `Connection: close`); nothing was done",
    409: "Conflicts with what exists (`session_exists`, `message_conflict`, `parent_cycle`, a read-only block, …)",
    410: "The session is erased (`session_erased`): it takes no writes, its id cannot be used again",
    413: "The body, or an event it makes, is over its limit (`payload_too_large`)",
    415: "The body is not sent as JSON (`unsupported_media_type`): `Content-Type: application/json`; or is sent "
    "with a content coding (`unsupported_content_encoding`): send it without `Content-Encoding`",
    422: "The request breaks a rule (`invalid_request`, `invalid_id`, `unknown_parent`, `invalid_config`, …)",
    431: "The request line and headers are over the server's bound (`header_too_large`); nothing was read",
    429: "The tenant is over its request limit (`rate_limited`; `retry_after` seconds, `Retry-After`); nothing done",
    500: "A bug (`internal_error`); the connection stays usable",
    502: "The summarizer failed (`summarizer_failed`)",
    503: "A backing service is unavailable or the read model is behind; retry",
}
_PROBLEM_CONTENT = {"application/problem+json": {"schema": {"$ref": REF.format(model="Problem")}}}


def _statuses(path: str, op: dict[str, Any]) -> list[int]:
    if not path.startswith("/v1/"):
        return [401] if path in ("/readyz", "/metrics") else []
    statuses = [401, 404, 409, 422, 429, 431, 500, 503]
    if "requestBody" in op:
        statuses += [400, 408, 413, 415]
    if path.endswith("/compact"):
        statuses.append(502)
    if path.startswith("/v1/sessions"):  # a write or a read of an erased session
        statuses.append(410)
    return sorted(statuses)


def _links(paths: dict[str, Any]) -> None:
    """OpenAPI links: a created (or forked) session's id feeds every session route; an appended
    message's id feeds every message route, ``leaf_id`` of the path reads and a fork's
    ``at_message_id``; the first id of a batch feeds the message routes."""
    ops = {(path, method): op for path, item in paths.items() for method, op in item.items()}

    def to(where: Callable[[str, str], bool], **link: Any) -> dict[str, Any]:
        return {
            op["operationId"]: {"operationId": op["operationId"], **link} for (p, m), op in ops.items() if where(p, m)
        }

    def links(path: str, method: str, status: str, found: dict[str, Any]) -> None:
        ops[(path, method)]["responses"][status]["links"] = found

    in_session = to(lambda p, _: "{sid}" in p and "{mid}" not in p, parameters={"path.sid": "$response.body#/id"})
    links("/v1/sessions", "post", "201", in_session)
    links("/v1/sessions/{sid}/fork", "post", "201", in_session)
    sid = "$request.path.sid"
    appended = (
        to(lambda p, _: "{mid}" in p, parameters={"path.sid": sid, "path.mid": "$response.body#/id"})
        | to(
            lambda p, m: m == "get" and p.endswith(("/history", "/history/stats", "/path-length")),
            parameters={"path.sid": sid, "query.leaf_id": "$response.body#/id"},
        )
        | to(
            lambda p, m: m == "post" and p.endswith("/fork"),
            parameters={"path.sid": sid},
            requestBody={"at_message_id": "$response.body#/id"},
        )
    )
    links("/v1/sessions/{sid}/messages", "post", "201", appended)
    links("/v1/sessions/{sid}/messages", "post", "200", appended)
    first = to(lambda p, _: "{mid}" in p, parameters={"path.sid": sid, "path.mid": "$response.body#/messages/0/id"})
    links("/v1/sessions/{sid}/messages:batch", "post", "201", first)


def document(app: FastAPI) -> dict[str, Any]:
    """FastAPI's document, completed: shared schemas, the bearer key, problem responses, links."""
    doc: dict[str, Any] = model_refs(get_openapi(title=app.title, version=app.version, routes=app.routes))
    components = doc.setdefault("components", {})
    schemas = components.setdefault("schemas", {})
    for model in (UIMessage, SessionConfig, Problem):
        schema = model.model_json_schema(ref_template=REF)
        schemas.update(schema.pop("$defs", {}))
        schemas[model.__name__] = schema
    for name in ("HTTPValidationError", "ValidationError"):  # FastAPI's 422 shape: ours is a problem
        schemas.pop(name, None)
    components["securitySchemes"] = {"bearer": {"type": "http", "scheme": "bearer", "description": "An API key"}}
    for path, item in doc["paths"].items():
        for op in item.values():
            if path.startswith("/v1/"):
                op["security"] = [{"bearer": []}]
            responses = op["responses"]
            responses.pop("422", None)
            for status in _statuses(path, op):
                responses.setdefault(str(status), {"description": _WHEN[status], "content": _PROBLEM_CONTENT})
    delete = doc["paths"]["/v1/sessions/{sid}/messages"]["delete"]
    for param in delete["parameters"]:  # None by default only so that its absence gets a pointed 422
        if param["name"] == "ids":
            param["required"] = True
            param["schema"] = param["schema"]["anyOf"][0]
    delete["responses"]["400"] = {
        "description": "The request line is over the HTTP server's 64 KiB: use POST …/messages:delete",
        "content": {"text/plain": {"schema": {"type": "string"}}},
    }
    _links(doc["paths"])
    return doc


def install(app: FastAPI) -> None:
    """Serve :func:`document` (built once) as the app's ``/openapi.json``."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = document(app)
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
