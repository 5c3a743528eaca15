"""Schemathesis against the running `chronicle api` (real NATS and Postgres), as tenant-a: the
examples, coverage, fuzzing and stateful phases (OpenAPI links lead from a created session or
message to the routes that read and change it). No request may get a 5xx, an undocumented status
or content type, or a body that contradicts its schema; and a request the document calls valid
must not be refused as malformed (``422 invalid_request``/``invalid_id``, ``400``).

Bounded for ``make test`` (seeded, deterministic, 30 examples per operation, 30 stateful steps:
about a minute); ``CHRONICLE_FUZZ_EXAMPLES=200 CHRONICLE_FUZZ_SEED=7`` makes a longer or another
run."""

from __future__ import annotations

import json
import os
from typing import Any, Literal

import httpx
import pytest
import schemathesis
from hypothesis import strategies as st
from schemathesis.config import SchemathesisConfig
from schemathesis.engine import Status, events, from_schema

from events import ids
from tests.conftest import KEYS

CHECKS = [
    "not_a_server_error",
    "status_code_conformance",
    "content_type_conformance",
    "response_schema_conformance",
    "response_headers_conformance",
    "valid_input_is_well_formed",
]
TIMEOUT_S = 300
"""A runaway guard: the bounded run takes about a minute here. (Not schemathesis's ``max-time``:
with one, it repeats the fuzzing and stateful phases until the time is up.)"""
MALFORMED = frozenset({"invalid_request", "invalid_id", "malformed_json"})
"""Codes that mean 'the request breaks the rules': a schema-valid request must never get one
(``unknown_parent``, ``budget_exceeded``, ``invalid_config`` for a missing bucket, … are about
what exists, which no schema can say)."""
BEYOND_SCHEMA = (
    "message.id: must equal the id in the path",
    "message ids in a batch must be distinct",
    "must not contain NUL characters or lone surrogates",
    "levels",  # "nested deeper than 64 levels"
    "is below from_seq",  # an events range the wrong way round (to_seq < from_seq)
    "deleted=true lists by creation only",  # deleted sessions with order=recent
)
"""Rules JSON Schema cannot state (docs/http-api.md states them): between two values, and about
every string or the body's depth. The generator is told (``codec``, ``allow-x00``), but the
coverage phase still tries NUL at times."""


def _id(max_size: int, exclude: str = "") -> st.SearchStrategy[str]:
    """What events/ids.py admits: no Unicode category C, no surrounding whitespace."""
    # typed as hypothesis' category literal: its decorators drop the context a bare ("C",) is inferred in
    control: tuple[Literal["C"]] = ("C",)
    chars = st.characters(exclude_categories=control, exclude_characters=exclude)
    return st.text(chars, min_size=1, max_size=max_size).filter(lambda s: s == s.strip())


schemathesis.openapi.format(
    "chronicle-session-id", _id(128, exclude="/").filter(lambda s: s not in ids.UNREACHABLE_SESSION_IDS)
)
schemathesis.openapi.format("chronicle-message-id", _id(256))
schemathesis.openapi.format(
    "chronicle-new-message-id", _id(256, exclude="/").filter(lambda s: s not in ids.UNREACHABLE_MESSAGE_IDS)
)
schemathesis.openapi.format(
    "chronicle-message-id-list", st.lists(_id(64, exclude=","), min_size=1, max_size=4).map(",".join)
)


@schemathesis.check
def valid_input_is_well_formed(ctx: Any, response: Any, case: Any) -> None:
    meta = case.meta
    if meta is None or not meta.generation.mode.is_positive or response.status_code not in (400, 422):
        return
    try:
        code = json.loads(response.content).get("code")
    except ValueError:
        code = None
    if any(rule in response.text for rule in BEYOND_SCHEMA):
        return
    assert code not in MALFORMED, f"a schema-valid request was refused as malformed: {response.text[:500]}"


def _config(base_url: str, seed: int, max_examples: int, max_steps: int) -> SchemathesisConfig:
    config = SchemathesisConfig.from_dict(
        {
            "base-url": base_url,
            "seed": seed,
            "headers": {"Authorization": f"Bearer {KEYS['tenant-a']}"},
            "workers": 1,
            "request-timeout": 30,
            "generation": {
                "max-examples": max_examples,
                "deterministic": True,
                "database": "none",
                # JSON Schema cannot say "no lone surrogates, no NUL": the server refuses both (422)
                "codec": "utf-8",
                "allow-x00": False,
            },
            "phases": {
                "examples": {"enabled": True},
                "coverage": {"enabled": True},
                "fuzzing": {"enabled": True},
                "stateful": {"enabled": True, "max-steps": max_steps},
            },
        }
    )
    config.projects.override.checks.update(included_check_names=CHECKS)
    return config


def without_follow(document: dict[str, Any]) -> dict[str, Any]:
    """The document without ``GET …/events``' ``follow``: a followed answer never ends by itself,
    and every fuzzed request must (tests/integration/test_follow_events.py follows it)."""
    for item in document["paths"].values():
        for operation in item.values():
            if isinstance(operation, dict) and "parameters" in operation:
                operation["parameters"] = [p for p in operation["parameters"] if p.get("name") != "follow"]
    return document


def _findings(stream: Any) -> tuple[list[str], dict[str, int]]:
    found: list[str] = []
    cases: dict[str, int] = {}
    for event in stream:
        if isinstance(event, events.FatalError | events.NonFatalError):
            found.append(f"{type(event).__name__}: {event!r}"[:2000])
        if isinstance(event, events.ScenarioFinished):
            cases[event.phase.value] = cases.get(event.phase.value, 0) + len(event.recorder.cases)
            for checks in event.recorder.checks.values():
                for check in checks:
                    if check.status == Status.FAILURE and check.failure_info is not None:
                        f = check.failure_info.failure
                        found.append(
                            f"[{event.phase.value}] {event.recorder.label}: {check.name}: {f.title}\n"
                            f"{f.message}\n{check.failure_info.code_sample}"
                        )
    return found, cases


@pytest.mark.timeout(TIMEOUT_S)
def test_openapi_fuzz(api_url: str) -> None:
    config = _config(
        api_url,
        seed=int(os.environ.get("CHRONICLE_FUZZ_SEED", "1")),
        max_examples=int(os.environ.get("CHRONICLE_FUZZ_EXAMPLES", "30")),
        max_steps=30,
    )
    raw = httpx.get(f"{api_url}/openapi.json", timeout=30).json()
    schema = schemathesis.openapi.from_dict(without_follow(raw), config=config)
    found, cases = _findings(from_schema(schema).execute())
    assert all(cases.get(phase) for phase in ("examples", "coverage", "fuzzing", "stateful")), cases
    assert not found, f"{cases}\n\n" + "\n\n".join(dict.fromkeys(found))
