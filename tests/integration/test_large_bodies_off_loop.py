"""A large body's heavy steps (its parse, its message checks, its hash and serialisations) run off
the event loop (services/offload.py): while one of them runs, another request is served. Each step
is held, for a large body, until a small request's own pass through that step lets it go; on the
loop, the held step would stop every request, the small one included, and the hold would run out
(bounded: the test then fails saying so). Over HTTP (hot path and routes) and NATS commands, the
same answers as ever, refusals included. Real parts: uvicorn, NATS, Postgres."""

from __future__ import annotations

import asyncio
import json
import threading
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import httpx
import nats
import pytest
from nats.aio.client import Client as NatsClient

from events.commands import STATUS_HEADER
from events.credentials import tenant_inbox_prefix, tenant_nkey_seed
from events.messages import body_hash
from services.api import hot
from services.api import strict_json as api_strict_json
from services.api.app import build_app
from services.bootstrap import Container
from services.commands_nats import app as commands_app
from services.commands_nats.app import serving_commands
from services.offload import OFF_LOOP_BYTES
from services.requests import writes
from services.requests.checks import checked_message
from services.settings import Settings
from services.writes import commands
from tests.conftest import KEYS, running_stack, tenant_nats_settings
from tests.support import served

HOLD_S = 10.0
"""How long a held step waits for the small request (it is let go at once when off the loop)."""
BIG_TEXT = "x" * OFF_LOOP_BYTES  # the body holding it is over the threshold
BIG = "big"  # the id of the large message


def _message(mid: str, text: str = "hello") -> dict[str, Any]:
    return {"id": mid, "role": "user", "parts": [{"type": "text", "text": text}]}


class Hold:
    """A step held for a large body until a small body passes through the same step."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.released = threading.Event()
        self.ran_out = False

    def wrap(self, fn: Callable[..., Any], is_big: Callable[..., bool]) -> Callable[..., Any]:
        def step(*args: Any, **kwargs: Any) -> Any:
            if is_big(*args, **kwargs):
                self.entered.set()
                if not self.released.wait(HOLD_S):
                    self.ran_out = True
            else:
                self.released.set()
            return fn(*args, **kwargs)

        return step


def _big_bytes(body: bytes) -> bool:
    return len(body) >= OFF_LOOP_BYTES


def _big_message(message: dict[str, Any], **_: Any) -> bool:
    return message.get("id") == BIG


STEPS = ["parse", "checks", "hash"]
"""The strict parse (services/requests/strict_json.py), the message checks
(services/requests/checks.py) and the body's hash, with the append's serialisations
(services/writes/commands.py)."""


def held_step(monkeypatch: pytest.MonkeyPatch, step: str) -> Hold:
    hold = Hold()
    if step == "parse":
        for module in (hot, api_strict_json, commands_app):
            monkeypatch.setattr(module, "strict_loads", hold.wrap(module.strict_loads, _big_bytes))
    elif step == "checks":
        monkeypatch.setattr(writes, "checked_message", hold.wrap(checked_message, _big_message))
    else:
        monkeypatch.setattr(commands, "body_hash", hold.wrap(body_hash, _big_message))
    return hold


async def both_served(hold: Hold, big: Any, small: Callable[[], Any]) -> tuple[Any, Any]:
    """``big`` (a started request) and ``small``'s answers, ``small`` sent once ``big`` is held."""
    big_task = asyncio.ensure_future(big)
    assert await asyncio.to_thread(hold.entered.wait, 30), "the large body never reached the held step"
    small_answer = await small()
    big_answer = await big_task
    assert not hold.ran_out, (
        "the large body's step held the event loop: no other request was served while it ran "
        f"(the small request reached the step only after the {HOLD_S:g} s hold ran out)"
    )
    return big_answer, small_answer


@pytest.fixture(scope="module")
def settings(tmp_path_factory: pytest.TempPathFactory, pg_admin: str, s3_endpoint: str) -> Iterator[Settings]:
    with tenant_nats_settings(tmp_path_factory.mktemp("off-loop"), pg_admin, s3_endpoint) as s:
        yield s


@pytest.fixture(scope="module")
async def stack(settings: Settings) -> AsyncIterator[Container]:
    async with running_stack(settings) as c, serving_commands(settings, c):
        yield c


@pytest.fixture(params=[True, False], ids=["hot-paths", "routes"])
async def http(
    request: pytest.FixtureRequest, settings: Settings, stack: Container
) -> AsyncIterator[httpx.AsyncClient]:
    app_settings = settings.model_copy(update={"api_hot_paths": request.param})
    headers = {"Authorization": f"Bearer {KEYS['tenant-a']}"}
    async with (
        served(build_app(app_settings, stack)) as url,
        httpx.AsyncClient(base_url=url, headers=headers, timeout=60) as client,
    ):
        yield client


async def _session(http: httpx.AsyncClient) -> str:
    sid = "s-" + uuid.uuid4().hex[:10]
    assert (await http.post("/v1/sessions", json={"id": sid})).status_code == 201
    return sid


@pytest.mark.parametrize("step", STEPS)
async def test_a_large_append_over_http_leaves_the_loop_to_other_requests(
    http: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch, step: str
) -> None:
    big_sid, small_sid = await _session(http), await _session(http)
    hold = held_step(monkeypatch, step)
    big, small = await both_served(
        hold,
        http.post(f"/v1/sessions/{big_sid}/messages", json={"message": _message(BIG, BIG_TEXT)}),
        lambda: http.post(f"/v1/sessions/{small_sid}/messages", json={"message": _message("small")}),
    )
    assert (big.status_code, small.status_code) == (201, 201), (big.text[:300], small.text[:300])
    history = await http.get(f"/v1/sessions/{big_sid}/history", params={"min_seq": big.json()["seq"]})
    assert [m["parts"][0]["text"] for m in history.json()["messages"]] == [BIG_TEXT]


async def test_a_large_batch_and_update_over_http_leave_the_loop_to_other_requests(
    http: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    big_sid, small_sid = await _session(http), await _session(http)
    hold = held_step(monkeypatch, "hash")
    batch = {"messages": [_message("m0"), _message(BIG, BIG_TEXT)]}
    big, small = await both_served(
        hold,
        http.post(f"/v1/sessions/{big_sid}/messages:batch", json=batch),
        lambda: http.post(f"/v1/sessions/{small_sid}/messages", json={"message": _message("small")}),
    )
    assert (big.status_code, small.status_code) == (201, 201), (big.text[:300], small.text[:300])

    hold = held_step(monkeypatch, "hash")  # an update
    updated = _message(BIG, BIG_TEXT + "!")
    big, small = await both_served(
        hold,
        http.put(f"/v1/sessions/{big_sid}/messages/{BIG}", json={"message": updated}),
        lambda: http.post(f"/v1/sessions/{small_sid}/messages", json={"message": _message("small2")}),
    )
    assert (big.status_code, small.status_code) == (200, 201), (big.text[:300], small.text[:300])
    read = await http.get(f"/v1/sessions/{big_sid}/messages/{BIG}", params={"min_seq": big.json()["seq"]})
    assert read.json() == updated


async def test_a_large_batch_of_small_messages_leaves_the_loop_for_its_parse_not_for_each_message(
    http: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each message of a batch is measured (hashed, serialised) where its own size says: a batch
    of 300 messages of ~1 KB, a body over the threshold, sent every message's step through the
    two off-loop threads (a hop each, queued behind other tenants' large bodies)."""
    sid = await _session(http)
    threads: list[str] = []
    measured = commands.Commands._measured

    def observed(self: commands.Commands, body: Any) -> Any:
        threads.append(threading.current_thread().name)
        return measured(self, body)

    monkeypatch.setattr(commands.Commands, "_measured", observed)
    batch = {"messages": [_message(f"m{i}", "y" * 1000) for i in range(300)]}
    assert len(json.dumps(batch)) >= OFF_LOOP_BYTES
    answer = await http.post(f"/v1/sessions/{sid}/messages:batch", json=batch)
    assert answer.status_code == 201, answer.text[:300]
    assert len(threads) == 300
    assert not [t for t in threads if t.startswith("chronicle-off-loop")]


async def test_a_large_bodys_refusals_are_the_small_ones(http: httpx.AsyncClient) -> None:
    sid = await _session(http)
    pad = "x" * OFF_LOOP_BYTES
    for small, large in [
        # a key twice in one object: the strict parse's refusal
        (b'{"message": {"id": "m1", "id": "m2"}}', b'{"pad": "' + pad.encode() + b'", "pad": 1}'),
        # a message without its role: the message checks' refusal, naming the field
        (
            json.dumps({"message": {"id": "m1", "parts": [{"type": "text", "text": "a"}]}}).encode(),
            json.dumps({"message": {"id": "m1", "parts": [{"type": "text", "text": pad}]}}).encode(),
        ),
    ]:
        answers = []
        for body in (small, large):
            r = await http.post(
                f"/v1/sessions/{sid}/messages", content=body, headers={"Content-Type": "application/json"}
            )
            answers.append((r.status_code, {k: v for k, v in r.json().items() if k not in ("detail", "instance")}))
        assert answers[0] == answers[1]
        assert answers[0][0] == 422
    assert (await http.get(f"/v1/sessions/{sid}/history")).json()["messages"] == []


async def _nats_request(nc: NatsClient, settings: Settings, command: str, body: Any) -> tuple[int, dict[str, Any]]:
    msg = await nc.request(
        settings.layout().command_subject("tenant-a", command), json.dumps(body).encode(), timeout=30
    )
    return int((msg.headers or {})[STATUS_HEADER]), json.loads(msg.data)


@pytest.mark.parametrize("step", STEPS)
async def test_a_large_append_over_nats_leaves_the_loop_to_other_requests(
    settings: Settings, stack: Container, monkeypatch: pytest.MonkeyPatch, step: str
) -> None:

    nc = await nats.connect(
        settings.nats_url,
        nkeys_seed_str=tenant_nkey_seed(KEYS["tenant-a"]),
        inbox_prefix=tenant_inbox_prefix("tenant-a"),
        allow_reconnect=False,
    )
    try:
        big_sid, small_sid = ("s-" + uuid.uuid4().hex[:10] for _ in range(2))
        for sid in (big_sid, small_sid):
            assert (await _nats_request(nc, settings, "session.create", {"id": sid}))[0] == 201
        hold = held_step(monkeypatch, step)
        big, small = await both_served(
            hold,
            _nats_request(nc, settings, "append", {"session_id": big_sid, "message": _message(BIG, BIG_TEXT)}),
            lambda: _nats_request(nc, settings, "append", {"session_id": small_sid, "message": _message("small")}),
        )
        assert (big[0], small[0]) == (201, 201), (big, small)
    finally:
        await nc.close()
