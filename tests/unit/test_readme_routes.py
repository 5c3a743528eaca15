"""The README's route summary (its "HTTP API" list) names routes and fields the OpenAPI document
has: each route it writes as ``METHOD path`` is one of the document's operations, each field it
puts in braces after one (``POST …:end {reason}``) is a field of that route's body, each
``?name=`` a query parameter of it, each name alone in parentheses after one a field of its
request; and every other field it names is one the document knows."""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from services.api.app import build_app
from services.settings import Settings

README = Path(__file__).resolve().parents[2] / "README.md"
METHODS = ("GET", "POST", "PUT", "PATCH", "DELETE")
ROUTE = re.compile(
    r"^(?P<methods>(?:GET|POST|PUT|PATCH|DELETE)(?:/(?:GET|POST|PUT|PATCH|DELETE))*) "
    r"(?P<path>[^\s?\[]+)(?P<query>\S*?)(?: \{(?P<fields>[^}]*)\})?$"
)
NAME = re.compile(r"^[a-z][a-z0-9_]*$")
TOOLS = {"load_context", "unload_context", "set_context", "search_context", "session_search"}
"""Names of the tools the summary mentions (a value of ``tools/{name}``, not a field)."""


def summary() -> str:
    """The README's list of routes: from ``## HTTP API`` to its first subsection."""
    text = README.read_text(encoding="utf-8")
    start = text.index("\n## HTTP API\n")
    return text[start : text.index("\n### ", start)]


def spans(text: str) -> list[str]:
    return re.findall(r"`([^`]+)`", text)


@cache
def document() -> dict[str, Any]:
    return build_app(Settings(api_keys=[])).openapi()


def _schema(node: dict[str, Any]) -> dict[str, Any]:
    ref = node.get("$ref")
    return document()["components"]["schemas"][ref.rsplit("/", 1)[1]] if ref else node


def _properties(node: dict[str, Any]) -> set[str]:
    """The property names of a schema, through references and ``anyOf``/``oneOf``/``allOf``."""
    node = _schema(node)
    found = set(node.get("properties", {}))
    for key in ("anyOf", "oneOf", "allOf"):
        for part in node.get(key, []):
            found |= _properties(part)
    return found


def operation(method: str, path: str) -> tuple[str, dict[str, Any]]:
    """The one operation ``METHOD path`` names: ``path`` is the document's path, or its tail
    after ``…`` or without the leading ``/v1/sessions/{sid}/``; any ``{name}`` stands for any."""
    tail = re.sub(r"\{\w+\}", "{}", path.removeprefix("…"))
    found = []
    for known, ops in document()["paths"].items():
        plain = re.sub(r"\{\w+\}", "{}", known)
        if method.lower() in ops and (plain == tail or plain.endswith(tail if tail[:1] in "/:" else "/" + tail)):
            found.append((known, ops[method.lower()]))
    assert len(found) == 1, f"`{method} {path}` names {[k for k, _ in found] or 'no route'}"
    return found[0]


def query_names(op: dict[str, Any]) -> set[str]:
    return {p["name"] for p in op.get("parameters", []) if p["in"] == "query"}


def body_names(op: dict[str, Any]) -> set[str]:
    content = op.get("requestBody", {}).get("content", {})
    return set().union(*(_properties(c.get("schema", {})) for c in content.values()))


def known_names() -> set[str]:
    """Every name the document gives a parameter, a property of any schema or a path segment
    (``children``, ``leaf``: the summary names routes by them too), and JSON's literals."""
    names = {"null", "true", "false"}
    for path, ops in document()["paths"].items():
        names |= set(re.split(r"[/:]", path))
        for op in ops.values():
            names |= {p["name"] for p in op.get("parameters", [])}
    for schema in document()["components"]["schemas"].values():
        names |= _properties(schema)
    return names


ROUTES = [s for s in spans(summary()) if s.startswith(METHODS)]


def test_the_summary_names_routes() -> None:
    assert len(ROUTES) > 20, ROUTES


@pytest.mark.parametrize("span", ROUTES)
def test_each_route_of_the_readme_is_in_the_openapi_document_with_its_fields(span: str) -> None:
    m = ROUTE.match(span)
    assert m is not None, f"`{span}` is not written `METHOD path[?query] [{{fields}}]`"
    for method in m["methods"].split("/"):
        _, op = operation(method, m["path"])
        for name in re.findall(r"[?&](\w+)=", m["query"]):
            assert name in query_names(op), f"`{span}`: {name} is no query parameter of it"
        for field in filter(None, (f.strip().rstrip("?") for f in (m["fields"] or "").split(","))):
            assert field in body_names(op), f"`{span}`: {field} is no field of its body"


def test_fields_in_parentheses_after_a_route_are_its_request_fields() -> None:
    """``POST …:end (`reason`)``, a route followed by nothing but field names in parentheses,
    lists what its request takes: each is a field of its body or a query parameter."""
    listed = re.findall(
        r"`((?:GET|POST|PUT|PATCH|DELETE)[^`]*)` \(((?:`[a-z][a-z0-9_]*`(?:, )?)+)\)", summary().replace("\n", " ")
    )
    wrong = []
    for span, names in listed:
        m = ROUTE.match(span)
        assert m is not None, span
        for method in m["methods"].split("/"):
            _, op = operation(method, m["path"])
            wrong += [(span, n) for n in spans(names) if n not in body_names(op) | query_names(op)]
    assert wrong == []


def test_every_field_the_summary_names_is_one_the_openapi_document_knows() -> None:
    names = {s for s in spans(summary()) if NAME.match(s)}
    names |= {f.strip().rstrip("?") for s in spans(summary()) for f in re.findall(r"\{([^}]*)\}", s)[-1:]}
    names = {n for n in names if NAME.match(n)} - TOOLS
    assert names - known_names() == set()


def test_a_field_put_on_the_wrong_route_is_found() -> None:
    """The check itself: the README's earlier ``POST …:end {end_reason}`` (the answer's field,
    not the body's) fails it."""
    with pytest.raises(AssertionError, match="end_reason is no field of its body"):
        test_each_route_of_the_readme_is_in_the_openapi_document_with_its_fields("POST …:end {end_reason}")
