"""The OpenAPI document states the rules the server checks: id schemas agree with the request checks,
bodies the routes validate themselves carry their model's schema, errors are problems, and links
lead from created sessions and messages to the routes that use them."""

from __future__ import annotations

import re
from functools import partial
from typing import Any

import pytest

from events import ids
from services.api.app import build_app
from services.errors import InvalidId, InvalidRequest
from services.requests.checks import check_id, checked_message
from services.settings import Settings

SAMPLES = [
    ".",
    "..",
    "...",
    ".a",
    "a.",
    "a",
    "a b",
    "é-ü",
    "~x",
    "a.b",
    " a",
    "a ",
    "a/b",
    "/",
    "/a",
    "a/",
    "a/..",
    "\x00",
    "a\x7fb",
    "a\u200bb",
    "\u00a0a",
    "a\n",
    "x" * 300,
]


def _new_message_id(value: str) -> None:
    """What an append admits as its message's id (services/requests/checks.py)."""
    checked_message({"id": value, "role": "user", "parts": []}, new=True)


def _admitted(check: Any, value: str) -> bool:
    try:
        check(value)
    except (ids.InvalidId, InvalidId, InvalidRequest):
        return False
    return True


@pytest.mark.parametrize(
    ("schema", "check"),
    [
        (ids.SESSION_ID_SCHEMA, partial(check_id, "session")),
        (ids.MESSAGE_ID_SCHEMA, ids.check_message_id),
        (ids.NEW_MESSAGE_ID_SCHEMA, _new_message_id),
    ],
)
def test_id_schemas_admit_only_what_the_checks_admit(schema: dict[str, Any], check: Any) -> None:
    for value in SAMPLES:
        in_schema = (
            schema["minLength"] <= len(value) <= schema["maxLength"] and re.search(schema["pattern"], value) is not None
        )
        if _admitted(check, value):
            assert in_schema, value
        elif in_schema:  # only the category-C rule is left to the format
            assert any(ch not in " " and not ch.isprintable() for ch in value), value


@pytest.fixture(scope="module")
def doc() -> dict[str, Any]:
    return build_app(Settings(api_keys=[])).openapi()


def test_bodies_validated_by_the_route_carry_their_schema(doc: dict[str, Any]) -> None:
    schemas = doc["components"]["schemas"]
    assert schemas["AppendBody"]["properties"]["message"] == {"$ref": "#/components/schemas/UIMessage"}
    assert schemas["AppendBatchBody"]["properties"]["messages"]["items"] == {"$ref": "#/components/schemas/UIMessage"}
    assert schemas["UIMessage"]["required"] == ["id", "role", "parts"]
    assert schemas["UIMessage"]["properties"]["id"]["maxLength"] == ids.MAX_MESSAGE_ID_LEN
    put_config = doc["paths"]["/v1/sessions/{sid}/config"]["put"]["requestBody"]["content"]["application/json"]
    assert put_config["schema"] == {"$ref": "#/components/schemas/SessionConfig"}
    assert "ReadonlyBlock" in schemas
    assert "HTTPValidationError" not in schemas


def test_parameters_carry_the_id_rules_and_bounds(doc: dict[str, Any]) -> None:
    history = {p["name"]: p for p in doc["paths"]["/v1/sessions/{sid}/history"]["get"]["parameters"]}
    assert history["sid"]["schema"]["pattern"] == ids.SESSION_ID_PATTERN
    assert history["sid"]["schema"]["format"] == "chronicle-session-id"
    assert history["leaf_id"]["schema"]["anyOf"][0]["maxLength"] == ids.MAX_MESSAGE_ID_LEN
    assert history["limit"]["schema"]["maximum"] == 100_000
    assert history["min_seq"]["schema"]["anyOf"][0]["maximum"] == 2**63 - 1
    delete = {p["name"]: p for p in doc["paths"]["/v1/sessions/{sid}/messages"]["delete"]["parameters"]}
    assert delete["ids"]["required"] is True
    assert delete["ids"]["schema"]["maxItems"] == 1000


def test_errors_are_problems_and_the_key_is_declared(doc: dict[str, Any]) -> None:
    assert doc["components"]["securitySchemes"]["bearer"]["scheme"] == "bearer"
    for path, item in doc["paths"].items():
        for op in item.values():
            if not path.startswith("/v1/"):
                continue
            assert op["security"] == [{"bearer": []}]
            for status in ("401", "404", "422", "500", "503"):
                assert "application/problem+json" in op["responses"][status]["content"], (path, status)
    events = doc["paths"]["/v1/sessions/{sid}/events"]["get"]["responses"]["200"]["content"]
    assert list(events) == ["application/x-ndjson"]


def test_links_lead_to_sessions_and_messages(doc: dict[str, Any]) -> None:
    created = doc["paths"]["/v1/sessions"]["post"]["responses"]["201"]["links"]
    assert created["get_session_v1_sessions__sid__get"]["parameters"] == {"path.sid": "$response.body#/id"}
    appended = doc["paths"]["/v1/sessions/{sid}/messages"]["post"]["responses"]["201"]["links"]
    assert appended["get_message_v1_sessions__sid__messages__mid__get"]["parameters"] == {
        "path.sid": "$request.path.sid",
        "path.mid": "$response.body#/id",
    }
    assert appended["fork_session_v1_sessions__sid__fork_post"]["requestBody"] == {
        "at_message_id": "$response.body#/id"
    }
    for read in ("history_v1_sessions__sid__history_get", "history_stats_v1_sessions__sid__history_stats_get"):
        assert appended[read]["parameters"] == {"path.sid": "$request.path.sid", "query.leaf_id": "$response.body#/id"}


def test_row_stats_answer_is_described(doc: dict[str, Any]) -> None:
    stats = doc["paths"]["/v1/sessions/{sid}/history/stats"]["get"]
    assert {p["name"] for p in stats["parameters"]} == {"sid", "leaf_id", "min_seq"}
    answer = stats["responses"]["200"]["content"]["application/json"]["schema"]
    assert answer == {"$ref": "#/components/schemas/HistoryRowStats"}
    schemas = doc["components"]["schemas"]
    assert schemas["HistoryRowStats"]["required"] == ["leaf_id", "rows"]
    assert schemas["RowStat"]["required"] == ["id", "role", "bytes"]
