"""Commands over NATS request/reply answer as the HTTP API does: the same result body, the same
problem for each refusal, the same idempotency; and a tenant may request on its own command subjects
only. Real parts: a nats-server configured from the settings (operator + tenant NKeys), Postgres, a
projector, `chronicle commands`' broker, and the HTTP API served by uvicorn on a port."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import nats.errors
import pytest
from nats.aio.client import Client as NatsClient

from events import log as eventlog
from events.admission import MAX_WRITTEN_BYTES
from events.catalog import MessageAppended
from events.commands import COMMANDS, STATUS_HEADER
from events.credentials import tenant_inbox_prefix, tenant_nkey_seed
from services.api.app import build_app
from services.bootstrap import Container
from services.commands_nats.app import serving_commands
from services.settings import Settings
from tests.conftest import KEYS, running_stack, tenant_nats_settings
from tests.e2e.context_support import new_bucket, put_object
from tests.integration.helpers import appended, logged_message, summary_recorded
from tests.support import served

Reply = tuple[int, dict[str, Any]]


@pytest.fixture(scope="module")
def settings(tmp_path_factory: pytest.TempPathFactory, pg_admin: str, s3_endpoint: str) -> Iterator[Settings]:
    tmp = tmp_path_factory.mktemp("cmd-nats")
    with tenant_nats_settings(tmp, pg_admin, s3_endpoint, max_message_bytes=4096, payload_limit_bytes=2048) as s:
        yield s


@pytest.fixture(scope="module")
async def stack(settings: Settings) -> AsyncIterator[Container]:
    async with running_stack(settings) as c, serving_commands(settings, c):
        yield c


@pytest.fixture(scope="module")
async def http(settings: Settings, stack: Container) -> AsyncIterator[httpx.AsyncClient]:
    """tenant-a over real HTTP: the API with the same container, served by uvicorn on a port."""
    headers = {"Authorization": f"Bearer {KEYS['tenant-a']}"}
    async with (
        served(build_app(settings, stack)) as url,
        httpx.AsyncClient(base_url=url, headers=headers, timeout=30) as client,
    ):
        yield client


@contextlib.asynccontextmanager
async def connected(settings: Settings, tenant: str) -> AsyncIterator[tuple[NatsClient, list[str]]]:
    """``tenant``'s NATS connection (its credentials, its inbox) and the server's permission errors."""
    violations: list[str] = []

    async def on_error(exc: Exception) -> None:
        violations.append(str(exc).lower())

    nc = await nats.connect(
        settings.nats_url,
        nkeys_seed_str=tenant_nkey_seed(KEYS[tenant]),
        inbox_prefix=tenant_inbox_prefix(tenant),
        error_cb=on_error,
        allow_reconnect=False,
    )
    try:
        yield nc, violations
    finally:
        await nc.close()


@pytest.fixture
async def tenant_a(settings: Settings, stack: Container) -> AsyncIterator[NatsClient]:
    async with connected(settings, "tenant-a") as (nc, _):
        yield nc


async def request(nc: NatsClient, settings: Settings, command: str, body: Any, tenant: str = "tenant-a") -> Reply:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    msg = await nc.request(settings.layout().command_subject(tenant, command), data, timeout=15)
    return int((msg.headers or {})[STATUS_HEADER]), json.loads(msg.data)


def message(mid: str, text: str = "hello", role: str = "user") -> dict[str, Any]:
    return {"id": mid, "role": role, "parts": [{"type": "text", "text": text}]}


async def created_session(http: httpx.AsyncClient) -> str:
    sid = "s-" + uuid.uuid4().hex[:10]
    assert (await http.post("/v1/sessions", json={"id": sid})).status_code == 201
    return sid


async def test_an_append_over_nats_answers_like_http_and_is_read_back(
    http: httpx.AsyncClient, tenant_a: NatsClient, settings: Settings
) -> None:
    via_http, via_nats = await created_session(http), await created_session(http)
    h = await http.post(f"/v1/sessions/{via_http}/messages", json={"message": message("m1")})
    status, body = await request(tenant_a, settings, "append", {"session_id": via_nats, "message": message("m1")})
    assert (status, {**body, "seq": 0}) == (h.status_code, {**h.json(), "seq": 0}) == (201, {**body, "seq": 0})
    assert body == {"id": "m1", "parent_id": None, "seq": body["seq"], "created": True}

    # the latest leaf is the parent when none is named, as over HTTP; the same message again: 200
    status, child = await request(tenant_a, settings, "append", {"session_id": via_nats, "message": message("m2")})
    assert (status, child["parent_id"]) == (201, "m1")
    again = await request(tenant_a, settings, "append", {"session_id": via_nats, "message": message("m2")})
    h_again = await http.post(f"/v1/sessions/{via_http}/messages", json={"message": message("m1")})
    assert again == (200, {**child, "created": False})
    assert h_again.status_code == 200
    assert h_again.json()["created"] is False

    # read-your-writes: the seq of the reply is what a read waits for
    history = await http.get(f"/v1/sessions/{via_nats}/history", params={"min_seq": child["seq"]})
    assert [m["id"] for m in history.json()["messages"]] == ["m1", "m2"]


REFUSALS: list[tuple[str, str, dict[str, Any], str, dict[str, Any] | bytes]] = [
    # (case, HTTP method and path tail, HTTP body, NATS command, NATS request) — {sid} is a live session
    (
        "unknown parent",
        "POST /messages",
        {"message": message("m1"), "parent_id": "nope"},
        "append",
        {"session_id": "{sid}", "message": message("m1"), "parent_id": "nope"},
    ),
    (
        "invalid message",
        "POST /messages",
        {"message": {"id": "m1", "parts": []}},
        "append",
        {"session_id": "{sid}", "message": {"id": "m1", "parts": []}},
    ),
    (
        "too large",
        "POST /messages",
        {"message": message("big", "x" * 5000)},
        "append",
        {"session_id": "{sid}", "message": message("big", "x" * 5000)},
    ),
    (
        "invalid id",
        "POST /messages",
        {"message": message("m 1\x7f")},
        "append",
        {"session_id": "{sid}", "message": message("m 1\x7f")},
    ),
    (
        "text part's text a number",
        "POST /messages",
        {"message": {"id": "m1", "role": "user", "parts": [{"type": "text", "text": 123}]}},
        "append",
        {"session_id": "{sid}", "message": {"id": "m1", "role": "user", "parts": [{"type": "text", "text": 123}]}},
    ),
    (
        "dot message id",
        "POST /messages",
        {"message": message(".")},
        "append",
        {"session_id": "{sid}", "message": message(".")},
    ),
    (
        "dot-dot message id in a batch",
        "POST /messages:batch",
        {"messages": [message("m1"), message("..")]},
        "append_batch",
        {"session_id": "{sid}", "messages": [message("m1"), message("..")]},
    ),
    (
        "message id with a slash",
        "POST /messages",
        {"message": message("a/b")},
        "append",
        {"session_id": "{sid}", "message": message("a/b")},
    ),
    (
        "message id with a slash in a batch",
        "POST /messages:batch",
        {"messages": [message("m1"), message("x/..")]},
        "append_batch",
        {"session_id": "{sid}", "messages": [message("m1"), message("x/..")]},
    ),
    (
        "unknown session",
        "DELETE ",
        {},
        "session.delete",
        {"session_id": "never-created"},
    ),
    (
        "unknown message",
        "PUT /messages/ghost",
        {"message": message("ghost")},
        "update",
        {"session_id": "{sid}", "message": message("ghost")},
    ),
    (
        "unknown block",
        "PUT /context/nope",
        {"content": "x"},
        "context.write",
        {"session_id": "{sid}", "label": "nope", "content": "x"},
    ),
    (
        "invalid config",
        "PUT /config",
        {"blocks": [{"label": "x", "kind": "no-such-kind"}]},
        "config.put",
        {"session_id": "{sid}", "config": {"blocks": [{"label": "x", "kind": "no-such-kind"}]}},
    ),
    (
        "NUL in content",
        "PUT /context/notes",
        {"content": "a\x00b"},
        "context.write",
        {"session_id": "{sid}", "label": "notes", "content": "a\x00b"},
    ),
    (
        "unknown session (usage)",
        "POST /usage",
        {"input_tokens": 1},
        "session.usage",
        {"session_id": "never-created", "input_tokens": 1},
    ),
    (
        "negative tokens",
        "POST /usage",
        {"input_tokens": -1},
        "session.usage",
        {"session_id": "{sid}", "input_tokens": -1},
    ),
    (
        "unknown session (end)",
        "POST :end",
        {"reason": "done"},
        "session.end",
        {"session_id": "never-created", "reason": "done"},
    ),
    (
        "NUL in the end reason",
        "POST :end",
        {"reason": "a\x00b"},
        "session.end",
        {"session_id": "{sid}", "reason": "a\x00b"},
    ),
    (
        "over-long end reason",
        "POST :end",
        {"reason": "x" * 257},
        "session.end",
        {"session_id": "{sid}", "reason": "x" * 257},
    ),
    ("compact a session never created", "POST /compact", {}, "compact", {"session_id": "never-created"}),
    (
        "compact at an unknown leaf",
        "POST /compact",
        {"leaf_id": "nope"},
        "compact",
        {"session_id": "{sid}", "leaf_id": "nope"},
    ),
    (
        "compact at an overlay's message id",
        "POST /compact",
        {"leaf_id": "compaction_x"},
        "compact",
        {"session_id": "{sid}", "leaf_id": "compaction_x"},
    ),
]


def from_request_root(http_detail: str) -> str:
    """An HTTP problem's detail as a command's reads: a field FastAPI names under ``body.`` is
    named from the request's root over NATS."""
    return re.sub(r"(^|; )body\.", r"\1", http_detail)


@pytest.mark.parametrize(("case", "route", "http_body", "command", "nats_body"), REFUSALS, ids=[r[0] for r in REFUSALS])
async def test_each_refusal_replies_with_the_problem_http_answers(
    http: httpx.AsyncClient,
    tenant_a: NatsClient,
    settings: Settings,
    case: str,
    route: str,
    http_body: dict[str, Any],
    command: str,
    nats_body: dict[str, Any],
) -> None:
    sid = await created_session(http)
    method, tail = route.split(" ")
    sid_path = "never-created" if nats_body.get("session_id") == "never-created" else sid
    target = f"/v1/sessions/{sid_path}{tail}"
    h = await (http.request(method, target, json=http_body) if http_body else http.request(method, target))
    filled = json.loads(json.dumps(nats_body).replace("{sid}", sid))
    status, problem = await request(tenant_a, settings, command, filled)
    assert h.status_code >= 400, h.text
    expected = h.json()
    assert (status, problem["status"], problem["code"], problem["detail"]) == (
        h.status_code,
        expected["status"],
        expected["code"],
        from_request_root(expected["detail"]),
    )
    assert problem["type"] == expected["type"]
    assert problem["title"] == expected["title"]


async def test_a_new_message_id_with_a_slash_is_refused_over_nats_and_nothing_is_written(
    http: httpx.AsyncClient, tenant_a: NatsClient, settings: Settings, stack: Container
) -> None:
    sid = await created_session(http)
    before = await eventlog.last_seq(stack.js, stack.layout)
    for command, body in (
        ("append", {"session_id": sid, "message": message("a/b")}),
        ("append_batch", {"session_id": sid, "messages": [message("m1"), message("/m2")]}),
        ("append", {"session_id": "s-never-" + uuid.uuid4().hex[:8], "message": message("a/")}),
    ):
        status, problem = await request(tenant_a, settings, command, body)
        assert (status, problem["code"]) == (422, "invalid_id"), problem
        assert "message id must not contain '/'" in problem["detail"], problem
    status, legit = await request(tenant_a, settings, "append", {"session_id": sid, "message": message("m1")})
    assert (status, legit["seq"]) == (201, before + 1)  # the legit append is the only event since
    history = await http.get(f"/v1/sessions/{sid}/history", params={"min_seq": legit["seq"]})
    assert [m["id"] for m in history.json()["messages"]] == ["m1"]


async def test_requests_the_api_would_refuse_as_bodies_are_refused_alike(
    http: httpx.AsyncClient, tenant_a: NatsClient, settings: Settings
) -> None:
    sid = await created_session(http)
    # not JSON: 400 malformed_json on both
    h = await http.post(
        f"/v1/sessions/{sid}/messages", content=b"{not json", headers={"content-type": "application/json"}
    )
    assert (
        (await request(tenant_a, settings, "append", b"{not json"))[1]["code"] == h.json()["code"] == "malformed_json"
    )
    # a field the request does not have: 422 invalid_request on both
    h = await http.post(f"/v1/sessions/{sid}/messages", json={"message": message("m1"), "extra": 1})
    status, problem = await request(
        tenant_a, settings, "append", {"session_id": sid, "message": message("m1"), "extra": 1}
    )
    assert (status, problem["code"]) == (h.status_code, h.json()["code"]) == (422, "invalid_request")
    # a message of the wrong shape: 422 invalid_request on both, its errors naming the field
    # (over HTTP under "body", as every validation error there; a command's from the request's root)
    bad = {"id": "m1", "parts": []}
    h = await http.post(f"/v1/sessions/{sid}/messages", json={"message": bad})
    status, problem = await request(tenant_a, settings, "append", {"session_id": sid, "message": bad})
    assert (status, problem["code"]) == (h.status_code, h.json()["code"]) == (422, "invalid_request")
    assert problem["detail"] == h.json()["detail"] == "message.role: Field required"
    assert [e["loc"] for e in problem["errors"]] == [["message", "role"]]
    assert [e["loc"] for e in h.json()["errors"]] == [["body", "message", "role"]]
    # NaN is not JSON Chronicle stores: 422 invalid_request on both
    raw = b'{"session_id": "%s", "message": {"id": "m1", "role": "user", "parts": [], "n": NaN}}' % sid.encode()
    h = await http.post(
        f"/v1/sessions/{sid}/messages",
        content=b'{"message": {"id": "m1", "role": "user", "parts": [], "n": NaN}}',
        headers={"content-type": "application/json"},
    )
    status, problem = await request(tenant_a, settings, "append", raw)
    assert (status, problem["code"], problem["detail"]) == (h.status_code, h.json()["code"], h.json()["detail"])
    # an integer Python will not read (over 4,300 digits): 422 invalid_request on both, not a 500
    huge = b"9" * 5000
    raw = b'{"session_id": "%s", "input_tokens": %s}' % (sid.encode(), huge)
    h = await http.post(
        f"/v1/sessions/{sid}/usage",
        content=b'{"input_tokens": %s}' % huge,
        headers={"content-type": "application/json"},
    )
    status, problem = await request(tenant_a, settings, "session.usage", raw)
    assert (status, problem["code"], problem["detail"]) == (h.status_code, h.json()["code"], h.json()["detail"])
    assert (status, problem["code"]) == (422, "invalid_request")
    # a key twice in one object: 422 invalid_request on both, whichever level it is at
    raw = b'{"session_id": "%s", "message": {"id": "m1", "role": "user", "parts": [], "id": "m2"}}' % sid.encode()
    h = await http.post(
        f"/v1/sessions/{sid}/messages",
        content=b'{"message": {"id": "m1", "role": "user", "parts": [], "id": "m2"}}',
        headers={"content-type": "application/json"},
    )
    status, problem = await request(tenant_a, settings, "append", raw)
    assert (status, problem["code"], problem["detail"]) == (h.status_code, h.json()["code"], h.json()["detail"])
    assert (status, problem["code"]) == (422, "invalid_request")
    assert "'id'" in problem["detail"], problem
    # the same id with another body: 409 message_conflict on both
    await http.post(f"/v1/sessions/{sid}/messages", json={"message": message("m1")})
    h = await http.post(f"/v1/sessions/{sid}/messages", json={"message": message("m1", "other")})
    status, problem = await request(
        tenant_a, settings, "append", {"session_id": sid, "message": message("m1", "other")}
    )
    assert (status, problem["code"]) == (h.status_code, h.json()["code"]) == (409, "message_conflict")
    # an existing session created otherwise (another name): 409 session_exists on both
    h = await http.post("/v1/sessions", json={"id": sid, "name": "another"})
    status, problem = await request(tenant_a, settings, "session.create", {"id": sid, "name": "another"})
    assert (status, problem["code"], problem["detail"]) == (409, h.json()["code"], h.json()["detail"])


@pytest.mark.parametrize("command", [c.name for c in COMMANDS])
async def test_a_commands_validation_errors_name_fields_from_the_request_root(
    tenant_a: NatsClient, settings: Settings, command: str
) -> None:
    """A field missing or unknown at the request's top level is named from the request's root, as
    a nested one is (``["message", "role"]``): never under HTTP's ``"body"``."""
    status, problem = await request(tenant_a, settings, command, {"zz_unknown": 1})
    assert (status, problem["code"]) == (422, "invalid_request"), problem
    locs = [e["loc"] for e in problem["errors"]]
    assert ["zz_unknown"] in locs, problem
    assert all(loc and loc[0] != "body" for loc in locs), problem
    assert "zz_unknown: Extra inputs are not permitted" in problem["detail"], problem
    assert "body" not in problem["detail"], problem


async def test_an_append_missing_a_top_level_field_names_it_from_the_request_root(
    http: httpx.AsyncClient, tenant_a: NatsClient, settings: Settings
) -> None:
    sid = await created_session(http)
    status, problem = await request(tenant_a, settings, "append", {"session_id": sid})
    assert (status, problem["code"], problem["detail"]) == (422, "invalid_request", "message: Field required")
    assert problem["errors"] == [{"loc": ["message"], "msg": "Field required", "type": "missing"}]
    status, problem = await request(tenant_a, settings, "append", {"message": message("m1")})
    assert (status, problem["detail"]) == (422, "session_id: Field required")
    assert [e["loc"] for e in problem["errors"]] == [["session_id"]]
    # a request that is no object at all: its error is the request's own, not "body"'s
    status, problem = await request(tenant_a, settings, "append", [1])
    assert (status, problem["code"]) == (422, "invalid_request"), problem
    assert [e["loc"] for e in problem["errors"]] == [[]], problem
    assert problem["detail"].startswith("request: "), problem


async def test_the_same_create_again_answers_200_with_the_first_answer_as_over_http(
    http: httpx.AsyncClient, tenant_a: NatsClient, settings: Settings
) -> None:
    """A ``session.create`` that got no reply in time (the command service stopped, then went on)
    may have been carried out: its retry, the same create, answers as the first did (status
    ``200`` where it was ``201``, nothing published) instead of ``409 session_exists``; one that
    differs is still ``409``, and a session an append made is no create of it."""
    sid = "s-" + uuid.uuid4().hex[:10]
    body = {"id": sid, "name": "retried", "metadata": {"k": "v"}}
    first = await request(tenant_a, settings, "session.create", body)
    assert first[0] == 201, first
    again = await request(tenant_a, settings, "session.create", body)
    assert again == (200, first[1])
    h = await http.post("/v1/sessions", json=body)
    assert (h.status_code, h.json()) == again
    last = await http.get(f"/v1/sessions/{sid}/last-seq")
    assert last.json()["seq"] == first[1]["seq"], last.text  # nothing published by either repeat
    status, problem = await request(tenant_a, settings, "session.create", {**body, "metadata": {}})
    assert (status, problem["code"]) == (409, "session_exists")
    made = "s-" + uuid.uuid4().hex[:10]
    assert (await http.post(f"/v1/sessions/{made}/messages", json={"message": message("m1")})).status_code == 201
    status, problem = await request(tenant_a, settings, "session.create", {"id": made})
    assert (status, problem["code"]) == (409, "session_exists")


async def test_a_retried_append_is_idempotent(
    http: httpx.AsyncClient, tenant_a: NatsClient, settings: Settings
) -> None:
    sid = await created_session(http)
    keyed = {"session_id": sid, "message": message("m1"), "idempotency_key": uuid.uuid4().hex}
    first = await request(tenant_a, settings, "append", keyed)
    retried = await request(tenant_a, settings, "append", keyed)
    # the retry of a stored request answers as the first one did (created: it was this request)
    assert first == retried
    assert first[0] == 201
    # without a key, the same message id and body again is a repeat: the first seq, created false
    unkeyed = await request(tenant_a, settings, "append", {"session_id": sid, "message": message("m1")})
    assert unkeyed == (200, {**first[1], "created": False})
    batch = {"session_id": sid, "messages": [message("m2"), message("m3")], "parent_id": "m1"}
    b1, b2 = (
        await request(tenant_a, settings, "append_batch", batch),
        await request(tenant_a, settings, "append_batch", batch),
    )
    assert [m["seq"] for m in b1[1]["messages"]] == [m["seq"] for m in b2[1]["messages"]]
    assert [m["created"] for m in b2[1]["messages"]] == [False, False]
    history = await http.get(f"/v1/sessions/{sid}/history", params={"min_seq": b1[1]["seq"]})
    assert [m["id"] for m in history.json()["messages"]] == ["m1", "m2", "m3"]


async def test_a_retried_batch_with_its_key_answers_what_it_stored_as_created_over_nats_and_http(
    http: httpx.AsyncClient, tenant_a: NatsClient, settings: Settings
) -> None:
    sid = await created_session(http)
    key = uuid.uuid4().hex
    batch = {"session_id": sid, "messages": [message("b1"), message("b2")], "parent_id": None}
    first = await request(tenant_a, settings, "append_batch", {**batch, "idempotency_key": key})
    retried = await request(tenant_a, settings, "append_batch", {**batch, "idempotency_key": key})
    assert first[0] == retried[0] == 201
    assert retried[1] == first[1]  # the same seqs, and created: this batch stored them
    assert [m["created"] for m in retried[1]["messages"]] == [True, True]
    # another key, or none, did not store them: a repeat, created false; over HTTP alike
    other = await request(tenant_a, settings, "append_batch", {**batch, "idempotency_key": uuid.uuid4().hex})
    assert [m["created"] for m in other[1]["messages"]] == [False, False]
    path = f"/v1/sessions/{sid}/messages:batch"
    body = {"messages": batch["messages"], "parent_id": None}
    keyed = await http.post(path, json=body, headers={"Idempotency-Key": key})
    unkeyed = await http.post(path, json=body)
    assert keyed.json() == first[1]
    assert [m["created"] for m in unkeyed.json()["messages"]] == [False, False]
    events = await http.get(f"/v1/sessions/{sid}/events", params={"from_seq": 1})
    appended = [json.loads(line)["event"] for line in events.text.splitlines() if line.strip()]
    assert [e.get("message_id") or e["message"]["id"] for e in appended if e["type"] == "message.appended"] == [
        "b1",
        "b2",
    ]  # stored once, however many retries


async def test_usage_with_a_key_is_idempotent_and_a_reused_key_is_refused_alike(
    http: httpx.AsyncClient, tenant_a: NatsClient, settings: Settings
) -> None:
    sid = await created_session(http)
    key = uuid.uuid4().hex
    keyed = {"session_id": sid, "input_tokens": 5, "output_tokens": 1, "cost": 0.5, "idempotency_key": key}
    first = await request(tenant_a, settings, "session.usage", keyed)
    retried = await request(tenant_a, settings, "session.usage", keyed)
    assert first == retried
    assert first[0] == 200
    # the same key over HTTP is the same request: the first answer
    h = await http.post(
        f"/v1/sessions/{sid}/usage",
        json={"input_tokens": 5, "output_tokens": 1, "cost": 0.5},
        headers={"Idempotency-Key": key},
    )
    assert (h.status_code, h.json()) == first
    # the same key with other amounts: refused alike, nothing written
    h = await http.post(f"/v1/sessions/{sid}/usage", json={"input_tokens": 6}, headers={"Idempotency-Key": key})
    status, problem = await request(tenant_a, settings, "session.usage", {**keyed, "input_tokens": 6})
    assert (status, problem["code"], problem["detail"]) == (h.status_code, h.json()["code"], h.json()["detail"])
    assert status == 422
    assert problem["code"] == "idempotency_key_reused"
    got = await http.get(f"/v1/sessions/{sid}", params={"min_seq": first[1]["seq"]})
    assert (got.json()["input_tokens"], got.json()["seq"]) == (5, first[1]["seq"])


async def test_every_write_the_sdk_uses_runs_over_nats(
    http: httpx.AsyncClient, tenant_a: NatsClient, settings: Settings
) -> None:
    sid = "s-" + uuid.uuid4().hex[:10]
    fork_id = sid + "-fork"
    config = {"blocks": [{"label": "notes", "kind": "writable", "max_tokens": 200}]}
    steps: list[tuple[str, dict[str, Any], int]] = [
        ("session.create", {"id": sid, "name": "n"}, 201),
        ("session.rename", {"session_id": sid, "name": "renamed"}, 200),
        ("session.usage", {"session_id": sid, "input_tokens": 5, "cost": 0.5, "idempotency_key": "u1"}, 200),
        ("session.end", {"session_id": sid, "reason": "compaction"}, 200),
        ("config.put", {"session_id": sid, "config": config}, 200),
        ("append", {"session_id": sid, "message": message("m1")}, 201),
        ("append_batch", {"session_id": sid, "messages": [message("m2"), message("m3")]}, 201),
        ("update", {"session_id": sid, "message": message("m2", "changed")}, 200),
        ("context.write", {"session_id": sid, "label": "notes", "content": "Fridays", "mode": "append"}, 200),
        ("tool", {"session_id": sid, "name": "set_context", "arguments": {"label": "notes", "content": "Mon"}}, 200),
        ("prompt.refresh", {"session_id": sid}, 200),
        ("compact", {"session_id": sid}, 200),
        ("session.fork", {"session_id": sid, "at_message_id": "m2", "id": fork_id}, 201),
        ("delete", {"session_id": sid, "ids": ["m3"]}, 200),
        ("clear", {"session_id": fork_id}, 200),
        ("session.delete", {"session_id": sid}, 200),
    ]
    assert {name for name, _, _ in steps} == {c.name for c in COMMANDS}
    answers: dict[str, dict[str, Any]] = {}
    for name, body, expected in steps:
        if name == "session.delete":  # read what the steps before it did while the session is there
            seen = await http.get(f"/v1/sessions/{sid}", params={"min_seq": answers["session.end"]["seq"]})
            assert (seen.json()["input_tokens"], seen.json()["estimated_cost"], seen.json()["end_reason"]) == (
                5,
                0.5,
                "compaction",
            )
        status, answers[name] = await request(tenant_a, settings, name, body)
        assert status == expected, (name, answers[name])
    assert answers["append_batch"]["messages"][0]["parent_id"] == "m1"
    assert answers["context.write"]["content"] == "Fridays"
    assert answers["session.fork"]["messages"] == 2
    assert answers["delete"]["deleted"] == ["m3"]
    assert answers["tool"]["result"].startswith("Written to notes"), answers["tool"]
    gone = await http.get(f"/v1/sessions/{sid}", params={"min_seq": answers["session.delete"]["seq"]})
    assert gone.status_code == 404
    fork = await http.get(f"/v1/sessions/{fork_id}/history", params={"min_seq": answers["clear"]["seq"]})
    assert fork.json()["messages"] == []


async def test_a_tenant_requests_on_its_own_command_subjects_only(
    http: httpx.AsyncClient, settings: Settings, stack: Container
) -> None:
    sid = "s-" + uuid.uuid4().hex[:10]
    subject = settings.layout().command_subject("tenant-a", "session.create")
    async with connected(settings, "tenant-b") as (nc, violations):
        with pytest.raises((nats.errors.TimeoutError, nats.errors.NoRespondersError)):
            await nc.request(subject, json.dumps({"id": sid}).encode(), timeout=2)
        for _ in range(100):
            if any("permissions violation" in v and subject.lower() in v for v in violations):
                break
            await asyncio.sleep(0.02)
        else:
            raise AssertionError(f"no permissions violation for {subject}: {violations}")
        # its own subjects answer, as tenant-b
        status, body = await request(nc, settings, "session.create", {"id": sid}, tenant="tenant-b")
        assert status == 201
    # the session exists for tenant-b and not for tenant-a
    assert (await http.get(f"/v1/sessions/{sid}", params={"min_seq": body["seq"]})).status_code == 404
    b = {"Authorization": f"Bearer {KEYS['tenant-b']}"}
    assert (await http.get(f"/v1/sessions/{sid}", params={"min_seq": body["seq"]}, headers=b)).status_code == 200


async def test_replies_arrive_only_on_the_requesters_inbox(settings: Settings, stack: Container) -> None:
    """A tenant cannot listen under another tenant's inbox (where that tenant's replies arrive)."""
    async with connected(settings, "tenant-b") as (nc, violations):
        other = tenant_inbox_prefix("tenant-a") + ".>"
        await nc.subscribe(other)
        await nc.flush()
        for _ in range(100):
            if any("permissions violation" in v and other.lower() in v for v in violations):
                return
            await asyncio.sleep(0.02)
    raise AssertionError(f"no permissions violation for subscribing to {other}: {violations}")


async def test_a_request_naming_a_reply_subject_outside_its_tenants_inbox_is_dropped_unanswered(
    http: httpx.AsyncClient,
    tenant_a: NatsClient,
    settings: Settings,
    stack: Container,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The operator answers only under the requester's inbox: a valid append whose reply subject is
    another tenant's event subject (or inbox, or a lookalike prefix) runs nothing and publishes nothing."""
    caplog.set_level(logging.WARNING, logger="chronicle.commands")
    sid = await created_session(http)
    b = {"Authorization": f"Bearer {KEYS['tenant-b']}"}
    victim = await http.post("/v1/sessions", json={"id": "s-" + uuid.uuid4().hex[:10]}, headers=b)
    assert victim.status_code == 201
    victim_subject = settings.layout().session_subject("tenant-b", victim.json()["id"])
    foreign = [
        victim_subject,  # stored under tenant-b if answered
        tenant_inbox_prefix("tenant-b") + ".x",  # another tenant's replies
        tenant_inbox_prefix("tenant-a") + "x.y",  # a lookalike: the inbox of a tenant "tenant-ax"
        tenant_inbox_prefix("tenant-a"),  # the prefix itself, not under it
    ]
    async with connected(settings, "tenant-b") as (nc_b, _):
        to_b = await nc_b.subscribe(tenant_inbox_prefix("tenant-b") + ".>")
        await nc_b.flush()
        before = await eventlog.last_seq(stack.js, stack.layout)
        subject = settings.layout().command_subject("tenant-a", "append")
        for i, reply_to in enumerate(foreign):
            body = {"session_id": sid, "message": message(f"foreign-{i}")}
            await tenant_a.publish(subject, json.dumps(body).encode(), reply=reply_to)
        await tenant_a.flush()
        for _ in range(500):  # the positive signal: the service has decided on every one of them
            dropped = [r.getMessage() for r in caplog.records if r.getMessage().startswith("command dropped")]
            if len(dropped) == len(foreign):
                break
            await asyncio.sleep(0.02)
        assert len(dropped) == len(foreign), dropped
        assert all(any(f"the reply subject {r}," in line for line in dropped) for r in foreign), dropped

        status, legit = await request(tenant_a, settings, "append", {"session_id": sid, "message": message("m1")})
        assert (status, legit["seq"]) == (201, before + 1)  # the legit append is the only event since
        assert await eventlog.last_seq(stack.js, stack.layout) == before + 1
        assert to_b.pending_msgs == 0
    history = await http.get(f"/v1/sessions/{sid}/history", params={"min_seq": legit["seq"]})
    assert [m["id"] for m in history.json()["messages"]] == ["m1"]
    assert await eventlog.last_seq(stack.js, stack.layout, victim_subject) == victim.json()["seq"]


def commands_on(sid: str) -> list[tuple[str, dict[str, Any]]]:
    """Every command but create, on ``sid`` (a session holding ``m1`` and the block ``notes``)."""
    return [
        ("session.rename", {"session_id": sid, "name": "renamed"}),
        ("session.usage", {"session_id": sid, "input_tokens": 5}),
        ("session.end", {"session_id": sid, "reason": "done"}),
        ("config.put", {"session_id": sid, "config": {"blocks": [{"label": "notes", "kind": "writable"}]}}),
        ("append", {"session_id": sid, "message": message("m9")}),
        ("append_batch", {"session_id": sid, "messages": [message("m8")]}),
        ("update", {"session_id": sid, "message": message("m1", "changed")}),
        ("context.write", {"session_id": sid, "label": "notes", "content": "after"}),
        ("tool", {"session_id": sid, "name": "set_context", "arguments": {"label": "notes", "content": "after"}}),
        ("prompt.refresh", {"session_id": sid}),
        ("compact", {"session_id": sid}),
        ("session.fork", {"session_id": sid, "at_message_id": "m1", "id": sid + "-fork"}),
        ("delete", {"session_id": sid, "ids": ["m1"]}),
        ("clear", {"session_id": sid}),
        ("session.delete", {"session_id": sid}),
    ]


@pytest.mark.parametrize(
    ("ending", "expected"), [("erase", (410, "session_erased")), ("delete", (404, "session_not_found"))]
)
async def test_every_command_to_an_erased_or_deleted_session_is_refused_and_records_nothing(
    http: httpx.AsyncClient, tenant_a: NatsClient, settings: Settings, ending: str, expected: tuple[int, str]
) -> None:
    sid = await created_session(http)
    config = {"blocks": [{"label": "notes", "kind": "writable"}]}
    assert (await http.put(f"/v1/sessions/{sid}/config", json=config)).status_code == 200
    assert (await http.post(f"/v1/sessions/{sid}/messages", json={"message": message("m1")})).status_code == 201
    ended = await (http.post(f"/v1/sessions/{sid}:erase") if ending == "erase" else http.delete(f"/v1/sessions/{sid}"))
    assert ended.status_code == 200, ended.text
    commands = commands_on(sid)
    assert {name for name, _ in commands} == {c.name for c in COMMANDS} - {"session.create"}
    answers = {}
    for name, body in commands:
        status, answer = await request(tenant_a, settings, name, body)
        answers[name] = (status, answer.get("code"))
    assert answers == dict.fromkeys(answers, expected)
    events = await http.get(f"/v1/sessions/{sid}/events")
    assert [json.loads(line)["seq"] for line in events.text.splitlines()][-1] == ended.json()["seq"]


# -- a deleted message's id re-used: never under its own descendants ----------------------------

ROUTES = {"append": "messages", "append_batch": "messages:batch", "delete": "messages:delete"}


async def write(
    via: str, http: httpx.AsyncClient, nc: NatsClient, settings: Settings, command: str, sid: str, body: Any
) -> Reply:
    """``command`` on the session over HTTP or NATS: (status, answer)."""
    if via == "http":
        r = await http.post(f"/v1/sessions/{sid}/{ROUTES[command]}", json=body)
        return r.status_code, r.json()
    return await request(nc, settings, command, {"session_id": sid, **body})


async def logged_seqs(http: httpx.AsyncClient, sid: str) -> list[int]:
    r = await http.get(f"/v1/sessions/{sid}/events")
    assert r.status_code == 200, r.text
    return [json.loads(line)["seq"] for line in r.text.splitlines()]


async def path(http: httpx.AsyncClient, sid: str, seq: int, leaf_id: str | None = None) -> tuple[str | None, list[str]]:
    params: dict[str, Any] = {"min_seq": seq} | ({"leaf_id": leaf_id} if leaf_id is not None else {})
    r = await http.get(f"/v1/sessions/{sid}/history", params=params)
    assert r.status_code == 200, r.text
    return r.json()["leaf_id"], [m["id"] for m in r.json()["messages"]]


@pytest.mark.parametrize("via", ["http", "nats"])
async def test_a_deleted_id_appended_under_its_own_descendant_is_refused_and_writes_nothing(
    http: httpx.AsyncClient, tenant_a: NatsClient, settings: Settings, via: str
) -> None:
    """The outside-in trial's two forms, single and batch: m, k (under m), m deleted, m again
    under the latest leaf (k) or under k by name; a, b, c, a deleted, a again under c. Each is
    409 parent_cycle, the log is unchanged, and the history still reads."""

    async def send(command: str, sid: str, body: Any) -> Reply:
        return await write(via, http, tenant_a, settings, command, sid, body)

    sid = await created_session(http)
    assert (await send("append", sid, {"message": message("m")}))[0] == 201
    assert (await send("append", sid, {"message": message("k")}))[1]["parent_id"] == "m"
    status, deleted = await send("delete", sid, {"ids": ["m"]})
    assert status == 200, deleted
    before = await logged_seqs(http, sid)
    refusals = [
        ("append", {"message": message("m", "again")}, "the latest leaf 'k'"),
        ("append", {"message": message("m", "again"), "parent_id": "k"}, "parent 'k'"),
        ("append_batch", {"messages": [message("m", "again"), message("n")]}, "the latest leaf 'k'"),
        ("append_batch", {"messages": [message("m", "again")], "parent_id": "k"}, "parent 'k'"),
    ]
    for command, body, named in refusals:
        status, problem = await send(command, sid, body)
        assert (status, problem["code"]) == (409, "parent_cycle"), (command, body, problem)
        assert problem["detail"].startswith(named), problem
        assert "own ancestor" in problem["detail"]
    assert await logged_seqs(http, sid) == before
    assert await path(http, sid, deleted["seq"]) == ("k", ["k"])

    sid = await created_session(http)
    status, batch = await send("append_batch", sid, {"messages": [message("a"), message("b"), message("c")]})
    assert status == 201, batch
    status, deleted = await send("delete", sid, {"ids": ["a"]})
    assert status == 200, deleted
    before = await logged_seqs(http, sid)
    for parent in ("c", "b"):
        status, problem = await send("append", sid, {"message": message("a", "again"), "parent_id": parent})
        assert (status, problem["code"]) == (409, "parent_cycle"), problem
    assert await logged_seqs(http, sid) == before
    assert await path(http, sid, deleted["seq"]) == ("c", ["b", "c"])
    leaf = await http.get(f"/v1/sessions/{sid}/leaf", params={"min_seq": deleted["seq"]})
    assert leaf.json()["leaf_id"] == "c"


async def test_a_batch_failing_part_way_replies_what_it_wrote_as_http_answers(
    http: httpx.AsyncClient, tenant_a: NatsClient, settings: Settings
) -> None:
    """The same partial batch over HTTP and as the ``append_batch`` command: a cycle at its second
    message, a conflict at its second, a conflict at its first. Each reply is the HTTP problem,
    ``failed_index`` and ``written`` (the messages stored before the failure) included, and the
    log holds exactly what ``written`` lists."""
    answers: dict[str, list[Reply]] = {}
    for via in ("http", "nats"):

        async def send(command: str, sid: str, body: Any, via: str = via) -> Reply:
            return await write(via, http, tenant_a, settings, command, sid, body)

        got: list[Reply] = []
        sid = await created_session(http)
        roots = {"parent_id": None, "messages": [message("a"), message("b")]}
        assert (await send("append_batch", sid, roots))[0] == 201
        assert (await send("delete", sid, {"ids": ["a"]}))[0] == 200
        before = await logged_seqs(http, sid)
        got.append(await send("append_batch", sid, {"parent_id": "b", "messages": [message("c"), message("a")]}))
        assert await logged_seqs(http, sid) == [*before, got[-1][1]["written"][0]["seq"]]
        got.append(await send("append_batch", sid, {"messages": [message("d"), message("b", "other"), message("e")]}))
        got.append(await send("append_batch", sid, {"messages": [message("b", "other"), message("f")]}))
        assert await path(http, sid, got[1][1]["written"][0]["seq"]) == ("d", ["b", "c", "d"])
        answers[via] = got

    def seqless(reply: Reply) -> Reply:
        status, problem = reply
        return status, {**problem, "written": [{**w, "seq": 0} for w in problem["written"]]}

    assert [seqless(r) for r in answers["nats"]] == [seqless(r) for r in answers["http"]]
    cycle, conflict, first = answers["nats"]
    assert (cycle[0], cycle[1]["code"], cycle[1]["failed_index"]) == (409, "parent_cycle", 1)
    assert [(w["id"], w["parent_id"], w["created"]) for w in cycle[1]["written"]] == [("c", "b", True)]
    assert "nothing was written" not in cycle[1]["detail"].lower()
    assert (conflict[0], conflict[1]["code"], conflict[1]["failed_index"]) == (409, "message_conflict", 1)
    assert [w["id"] for w in conflict[1]["written"]] == ["d"]
    assert (first[1]["code"], first[1]["failed_index"], first[1]["written"]) == ("message_conflict", 0, [])
    assert first[1]["detail"].endswith("nothing of the batch was written.")


@pytest.mark.parametrize("via", ["http", "nats"])
async def test_a_deleted_id_is_appended_again_where_it_makes_no_cycle(
    http: httpx.AsyncClient, tenant_a: NatsClient, settings: Settings, via: str
) -> None:
    """m deleted (its child k keeps parent_id m) and appended again: under its old parent r, as a
    batch under r, under the latest leaf when that is on another branch, or as a new root. Its
    children then hang under it again."""

    async def send(command: str, sid: str, body: Any) -> Reply:
        return await write(via, http, tenant_a, settings, command, sid, body)

    async def deleted_m(*extra: str) -> str:
        """r, m (under r), k (under m), then ``extra`` under r; m deleted."""
        sid = await created_session(http)
        assert (await send("append_batch", sid, {"messages": [message("r"), message("m"), message("k")]}))[0] == 201
        for mid in extra:
            assert (await send("append", sid, {"message": message(mid), "parent_id": "r"}))[0] == 201
        assert (await send("delete", sid, {"ids": ["m"]}))[0] == 200
        return sid

    sid = await deleted_m()
    status, out = await send("append", sid, {"message": message("m", "again"), "parent_id": "r"})
    assert (status, out["parent_id"]) == (201, "r")
    assert await path(http, sid, out["seq"]) == ("k", ["r", "m", "k"])

    sid = await deleted_m()
    status, out = await send("append_batch", sid, {"messages": [message("m", "again"), message("n")], "parent_id": "r"})
    assert status == 201, out
    assert await path(http, sid, out["seq"]) == ("n", ["r", "m", "n"])
    assert await path(http, sid, out["seq"], "k") == ("k", ["r", "m", "k"])

    sid = await deleted_m("x")  # the latest leaf, x, is not below m
    status, out = await send("append", sid, {"message": message("m", "again")})
    assert (status, out["parent_id"]) == (201, "x")
    assert await path(http, sid, out["seq"]) == ("k", ["r", "x", "m", "k"])

    sid = await deleted_m()
    status, out = await send("append", sid, {"message": message("m", "again"), "parent_id": None})
    assert (status, out["parent_id"]) == (201, None)
    assert await path(http, sid, out["seq"], "k") == ("k", ["m", "k"])


async def test_a_cycle_already_in_the_log_reads_forks_and_takes_appends(
    http: httpx.AsyncClient, stack: Container
) -> None:
    """A cycle the append refuses may still be in the log: published straight to the stream by a
    tenant (or stored before the refusal). The projection applies it as it is; every read of
    the session ends, a fork of the cycle's branch does not copy the cycle, and appends go on."""
    sid = await created_session(http)
    for mid in ("a", "b"):
        assert (await http.post(f"/v1/sessions/{sid}/messages", json={"message": message(mid)})).status_code == 201
    assert (await http.post(f"/v1/sessions/{sid}/messages:delete", json={"ids": ["a"]})).status_code == 200
    last = await stack.publisher.last_subject_seq("tenant-a", sid)
    cyc = await stack.publisher.publish(appended("tenant-a", sid, "a", "b", "again"), expected_last_subject_seq=last)
    seq = {"min_seq": cyc.seq}

    # no message is without a child: no latest leaf, and the default history is empty
    assert await path(http, sid, cyc.seq) == (None, [])
    assert (await http.get(f"/v1/sessions/{sid}/leaf", params=seq)).json()["leaf_id"] is None
    assert (await http.get(f"/v1/sessions/{sid}/path-length", params=seq)).json() == {"leaf_id": None, "length": 0}
    # each message's path ends where the walk comes back to its start
    assert await path(http, sid, cyc.seq, "a") == ("a", ["b", "a"])
    assert await path(http, sid, cyc.seq, "b") == ("b", ["a", "b"])
    length = await http.get(f"/v1/sessions/{sid}/path-length", params={**seq, "leaf_id": "a"})
    assert length.json() == {"leaf_id": "a", "length": 2}
    stats = await http.get(f"/v1/sessions/{sid}/history/stats", params={**seq, "leaf_id": "b"})
    assert [r["id"] for r in stats.json()["rows"]] == ["a", "b"]
    children = await http.get(f"/v1/sessions/{sid}/messages/a/children", params=seq)
    assert [m["id"] for m in children.json()["messages"]] == ["b"]

    forked = await http.post(f"/v1/sessions/{sid}/fork", json={"at_message_id": "b"})
    assert forked.status_code == 201, forked.text
    fork = forked.json()
    assert await path(http, fork["id"], fork["seq"]) == ("b", ["a", "b"])
    copies = await http.get(f"/v1/sessions/{fork['id']}/events")
    logged = [json.loads(line)["event"] for line in copies.text.splitlines()]
    copied = [logged_message(e) for e in logged if e["type"] == "message.appended"]
    assert {e.message_id: e.parent_id for e in copied if isinstance(e, MessageAppended)} == {"a": None, "b": "a"}

    # a new id has no children: appended under the cycle, it is the latest leaf again
    c = await http.post(f"/v1/sessions/{sid}/messages", json={"message": message("c"), "parent_id": "b"})
    assert (c.status_code, c.json()["parent_id"]) == (201, "b")
    assert await path(http, sid, c.json()["seq"]) == ("c", ["a", "b", "c"])


async def test_a_tool_call_to_a_session_never_written_is_404_over_nats_as_over_http(
    http: httpx.AsyncClient, tenant_a: NatsClient, settings: Settings, stack: Container
) -> None:
    """The ``tool`` command on a session neither configured nor written is ``404
    session_not_found`` (not deleted), as ``GET …/tools`` of it is; nothing recorded."""
    sid = "s-" + uuid.uuid4().hex[:10]
    body = {"session_id": sid, "name": "set_context", "arguments": {"label": "notes", "content": "x"}}
    status, answer = await request(tenant_a, settings, "tool", body)
    assert (status, answer.get("code"), answer.get("deleted")) == (404, "session_not_found", None), answer
    assert await eventlog.last_seq(stack.js, stack.layout, stack.layout.session_subject("tenant-a", sid)) == 0


async def test_a_tool_call_meeting_a_destroyed_key_is_410_over_http_and_nats_and_records_nothing(
    http: httpx.AsyncClient, tenant_a: NatsClient, settings: Settings, stack: Container
) -> None:
    """A tool call racing ``:erase``: the session's row is still there (its ``session.erased`` not
    applied: here not published, the erasure stopped after its first step) but its key is destroyed,
    so the tool's publish meets ``KeyDestroyed``: the call is ``410 session_erased`` as every other
    write, never an ``Error: …`` result."""
    sid = await created_session(http)
    bucket = new_bucket(settings)
    put_object(settings, bucket, "tax", "Tax rules")
    blocks = [{"label": "notes", "kind": "writable"}, {"label": "skills", "kind": "skills", "bucket": bucket}]
    assert (await http.put(f"/v1/sessions/{sid}/config", json={"blocks": blocks})).status_code == 200
    last = (await http.post(f"/v1/sessions/{sid}/messages", json={"message": message("m1")})).json()["seq"]
    assert await stack.keys.erase("tenant-a", [sid]) == [sid]  # the erasure's first step; then it stopped
    calls = [
        ("set_context", {"label": "notes", "content": "after"}),
        ("load_context", {"label": "skills", "key": "tax"}),
    ]
    answers = {}
    for name, arguments in calls:
        r = await http.post(f"/v1/sessions/{sid}/tools/{name}", json=arguments)
        answers[f"HTTP {name}"] = (r.status_code, r.json().get("code"))
        body = {"session_id": sid, "name": name, "arguments": arguments}
        status, answer = await request(tenant_a, settings, "tool", body)
        answers[f"NATS {name}"] = (status, answer.get("code"))
    assert answers == dict.fromkeys(answers, (410, "session_erased"))
    assert await eventlog.last_seq(stack.js, stack.layout, stack.layout.session_subject("tenant-a", sid)) == last


async def test_a_refresh_of_a_prompt_too_large_to_store_replies_with_the_block_size_and_limit_as_http(
    http: httpx.AsyncClient, tenant_a: NatsClient, settings: Settings
) -> None:
    """An object behind a read-only block grown in storage after the config was taken: the refresh
    over NATS is ``409 prompt_unstorable`` with the problem's own members (``block``, ``size``,
    ``limit``) as well as its detail, the same as HTTP's answer."""
    sid = await created_session(http)
    bucket = new_bucket(settings)
    put_object(settings, bucket, "big.md", "x" * 1000)
    blocks = [{"kind": "readonly", "label": "big", "source": {"bucket": bucket, "key": "big.md"}}]
    assert (await http.put(f"/v1/sessions/{sid}/config", json={"blocks": blocks})).status_code == 200
    put_object(settings, bucket, "big.md", "x" * (MAX_WRITTEN_BYTES + 1))

    h = await http.post(f"/v1/sessions/{sid}/system-prompt:refresh")
    status, problem = await request(tenant_a, settings, "prompt.refresh", {"session_id": sid})
    assert (h.status_code, h.json()["code"]) == (409, "prompt_unstorable"), h.text
    assert (status, problem["code"]) == (409, "prompt_unstorable"), problem
    assert problem["block"] == "big"
    assert problem["size"] > MAX_WRITTEN_BYTES
    assert problem["limit"] == MAX_WRITTEN_BYTES
    assert problem == h.json()


async def test_a_compaction_summary_sent_back_over_nats_is_a_replay_and_never_a_message(
    http: httpx.AsyncClient, tenant_a: NatsClient, settings: Settings, stack: Container
) -> None:
    """The ``append`` and ``append_batch`` commands decide a summary's id as HTTP does: history's
    summary sent back is a replay (a chain goes on after the last message it covers), another body
    under its id is ``409 message_conflict``, an id in its form no overlay has ``422 invalid_id``."""
    sid = await created_session(http)
    chain = {"messages": [message(f"r{i}") for i in range(4)]}
    assert (await request(tenant_a, settings, "append_batch", {"session_id": sid, **chain}))[0] == 201
    recorded = summary_recorded("tenant-a", sid, "r1", "r2", "r1 and r2")
    overlay_id = recorded.overlay_id
    seq = (await stack.publisher.publish(recorded)).seq
    history = (await http.get(f"/v1/sessions/{sid}/history", params={"min_seq": seq})).json()["messages"]
    summary = history[1]
    assert [m["id"] for m in history] == ["r0", f"compaction_{overlay_id}", "r3"]

    one = await request(tenant_a, settings, "append", {"session_id": sid, "message": summary})
    assert one == (200, {"id": summary["id"], "parent_id": "r0", "seq": seq, "created": False})
    status, batch = await request(
        tenant_a,
        settings,
        "append_batch",
        {"session_id": sid, "messages": [*history, message("new")], "parent_id": None},
    )
    assert status == 201
    assert [(a["id"], a["parent_id"], a["created"]) for a in batch["messages"]][1:] == [
        (summary["id"], "r0", False),
        ("r3", "r2", False),
        ("new", "r3", True),
    ]
    before = await eventlog.last_seq(stack.js, stack.layout)
    for body, code in (
        ({**summary, "parts": [{"type": "text", "text": "edited"}]}, (409, "message_conflict")),
        ({**summary, "id": f"compaction_{uuid.uuid4()}"}, (422, "invalid_id")),
    ):
        status, problem = await request(tenant_a, settings, "append", {"session_id": sid, "message": body})
        assert (status, problem["code"]) == code, problem
    assert await eventlog.last_seq(stack.js, stack.layout) == before  # nothing written
    history = (await http.get(f"/v1/sessions/{sid}/history", params={"min_seq": batch["seq"]})).json()["messages"]
    assert [m["id"] for m in history] == ["r0", summary["id"], "r3", "new"]
