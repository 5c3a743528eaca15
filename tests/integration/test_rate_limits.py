"""Per-tenant request limits (``CHRONICLE_RATE_LIMIT``): a tenant over its limit gets ``429
rate_limited`` with the time to wait, over HTTP and over NATS commands alike; what it was refused
did not happen; other tenants and tenant-less routes go on. A request is weighed by the events it
publishes: a batch of N messages, or a fork copying N events, takes as many tokens as N single
requests would, so the tenant's next request waits for them; a charge that is refused publishes
nothing. Real parts: a nats-server configured
from the settings (tenant credentials), Postgres, a projector, `chronicle commands`' broker, and
the API served by uvicorn. Each test serves a fresh app or broker: fresh buckets."""

from __future__ import annotations

import asyncio
import json
import logging
import math
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest
from nats.errors import NoRespondersError

from chronicle_sdk import ChronicleClient
from chronicle_sdk import RateLimited as SdkRateLimited
from chronicle_sdk.errors import MAX_RETRY_AFTER_S
from events.commands import STATUS_HEADER
from events.omitted import OMITTED
from services.api import app as app_module
from services.api.app import build_app
from services.api.metrics import REGISTRY
from services.bootstrap import Container
from services.commands_nats.app import serving_commands
from services.errors import BatchFailed, ObjectStorageError, RateLimited
from services.requests import writes
from services.requests.limits import Rate, TenantLimits
from services.settings import Settings
from services.writes.decisions import ParentSpec
from tests import raw_http
from tests.conftest import KEYS, running_stack, tenant_nats, tenant_nats_settings
from tests.support import served

RATE, BURST = 1.0, 3  # tenant-a: 3 requests at once, then 1 a second (the margin of every test); tenant-b: no limit
TOKEN_BYTES = 4096  # a body counts a token per 4 KiB begun (every other test's bodies are smaller than their events)
SLACK_S = 0.002  # retry_after is given in whole milliseconds, rounded up


@pytest.fixture(scope="module")
def settings(tmp_path_factory: pytest.TempPathFactory, pg_admin: str, s3_endpoint: str) -> Iterator[Settings]:
    tmp = tmp_path_factory.mktemp("limits-nats")
    limits = {
        "rate_limit": RATE,
        "rate_limit_burst": BURST,
        "rate_limits": {"tenant-b": 0},
        "rate_limit_token_bytes": TOKEN_BYTES,
    }
    with tenant_nats_settings(tmp, pg_admin, s3_endpoint, **limits) as s:
        yield s


@pytest.fixture(scope="module")
async def stack(settings: Settings) -> AsyncIterator[Container]:
    async with running_stack(settings) as c:
        yield c


@pytest.fixture
async def api(settings: Settings, stack: Container) -> AsyncIterator[str]:
    """A fresh API (fresh buckets) over real HTTP; its base URL."""
    async with served(build_app(settings, stack)) as url:
        yield url


def client(url: str, tenant: str) -> httpx.AsyncClient:
    return httpx.AsyncClient(base_url=url, headers={"Authorization": f"Bearer {KEYS[tenant]}"}, timeout=30)


def message(mid: str) -> dict[str, Any]:
    return {"id": mid, "role": "user", "parts": [{"type": "text", "text": f"text of {mid}"}]}


async def exhausted(http: httpx.AsyncClient) -> httpx.Response:
    """Requests until one is refused (at most the burst and what refills meanwhile); that answer."""
    for _ in range(BURST + 10):
        resp = await http.get("/v1/sessions")
        if resp.status_code == 429:
            return resp
        assert resp.status_code == 200, resp.text
    raise AssertionError("never refused")


async def test_a_tenant_over_its_limit_gets_429_with_retry_after_and_the_append_did_not_happen(api: str) -> None:
    sid = "s-" + uuid.uuid4().hex[:10]
    async with client(api, "tenant-a") as http:
        assert (await http.post("/v1/sessions", json={"id": sid})).status_code == 201
        seqs = []
        for mid in ("m1", "m2"):  # the burst's other two
            resp = await http.post(f"/v1/sessions/{sid}/messages", json={"message": message(mid)})
            assert resp.status_code == 201, resp.text
            seqs.append(resp.json()["seq"])

        refused = await http.post(f"/v1/sessions/{sid}/messages", json={"message": message("m3")})
        assert refused.status_code == 429, refused.text
        assert refused.headers["content-type"] == "application/problem+json"
        body = refused.json()
        assert body["code"] == "rate_limited"
        assert body["status"] == 429
        assert 0 < body["retry_after"] <= 1 / RATE
        assert refused.headers["retry-after"] == "1"  # whole seconds, rounded up
        assert "tenant-a" in body["detail"]

        await asyncio.sleep(
            body["retry_after"]
        )  # then one request is admitted: the same append, on the same connection
        again = await http.post(f"/v1/sessions/{sid}/messages", json={"message": message("m3")})
        assert again.status_code == 201, again.text
        assert again.json()["created"] is True  # the refused one stored nothing
        assert again.json()["seq"] > max(seqs)


def refused_over_http() -> float:
    """The HTTP requests the API refused as over a limit, from its registry's public samples."""
    return REGISTRY.get_sample_value("chronicle_rate_limited_requests_total", {"transport": "http"}) or 0.0


async def test_a_refused_tenant_does_not_slow_another_nor_the_tenantless_routes(api: str) -> None:
    before = refused_over_http()
    async with client(api, "tenant-a") as a, client(api, "tenant-b") as b:
        await exhausted(a)
        for _ in range(BURST * 4):  # tenant-b has no limit (rate_limits: 0)
            assert (await b.get("/v1/sessions")).status_code == 200
        assert (await a.get("/healthz")).status_code == 200  # no tenant: not counted
        assert (await a.get("/v1/sessions")).status_code == 429  # still over: nothing above refilled it
        metrics = (await a.get("/metrics")).text
    # exactly tenant-a's two refusals were counted; tenant-b's and /healthz's requests were not
    assert refused_over_http() - before == 2
    assert 'chronicle_rate_limited_requests_total{transport="http"}' in metrics


async def test_a_command_over_nats_over_its_limit_is_refused_with_the_same_problem(
    settings: Settings, stack: Container, api: str
) -> None:
    sids = ["s-" + uuid.uuid4().hex[:10] for _ in range(BURST + 1)]
    subject = settings.layout().command_subject("tenant-a", "session.create")
    nc = await tenant_nats(settings.nats_url, "tenant-a")
    try:
        async with serving_commands(settings, stack):  # its own buckets
            replies = []
            for data in [json.dumps({"id": sid}).encode() for sid in sids] + [b"{not json"]:
                replies.append(await request(nc, subject, data))
    finally:
        await nc.close()
    # over the limit, a body that is not even JSON is refused as over the limit: checked first
    assert [status for status, _ in replies] == [201] * BURST + [429, 429]
    refusal = replies[BURST][1]
    assert refusal["code"] == "rate_limited"
    assert 0 < refusal["retry_after"] <= 1 / RATE
    async with client(api, "tenant-a") as http:  # the API's buckets are its own
        admitted = await http.post("/v1/sessions", json={"id": sids[0]})
        assert admitted.status_code == 200, admitted.text  # the same create again: answered as a replay
        refused = await http.post("/v1/sessions", json={"id": sids[-1]})
        assert refused.status_code == 201, refused.text  # the refused command created nothing


async def test_the_sdk_waits_out_a_refusal_and_every_append_lands_once(api: str) -> None:
    before = refused_over_http()
    async with ChronicleClient(api, KEYS["tenant-a"]) as sdk:
        session = sdk.session("s-" + uuid.uuid4().hex[:10])
        texts = [f"message {i}" for i in range(BURST + 3)]  # past the burst: some answers are 429s
        for text in texts:
            await session.append_message(
                {"id": uuid.uuid4().hex, "role": "user", "parts": [{"type": "text", "text": text}]}
            )
        history = await session.get_history()
    assert refused_over_http() > before  # the server did refuse some
    assert [m["parts"][0]["text"] for m in history] == texts  # each exactly once, in order


async def test_append_all_refused_after_its_first_request_says_what_it_stored_and_going_on_stores_the_rest(
    settings: Settings, stack: Container, api: str
) -> None:
    """A chain of 1,001 messages is two requests; at 1 message a second the first (1,000) takes
    the bucket 1,000 s into debt, past what the SDK waits out, so the second is refused at once.
    The error says how much of the chain is stored and how to go on from there; sending the whole
    chain again is a replay of the 1,000 (nothing twice) but is charged for them again, so it is
    refused at the same place; going on as the error says stores the rest."""
    chain = messages(1001)
    sid = new_id()
    async with ChronicleClient(api, KEYS["tenant-a"]) as sdk:
        with pytest.raises(SdkRateLimited) as raised:
            await sdk.session(sid).append_all(chain)
    err = raised.value
    assert err.retry_after is not None
    assert err.retry_after > MAX_RETRY_AFTER_S
    assert err.failed_index == 1000
    assert [w.id for w in err.written] == [m["id"] for m in chain[:1000]]
    assert "1000 of the chain's 1001 messages are stored" in str(err)
    assert "append_all(messages[1000:], parent_id='m999')" in str(err)

    async with served(build_app(settings, stack)) as fresh, ChronicleClient(fresh, KEYS["tenant-a"]) as sdk:
        with pytest.raises(SdkRateLimited) as again:  # the whole chain again, with a full bucket
            await sdk.session(sid).append_all(chain)
    assert again.value.failed_index == 1000
    assert [w.created for w in again.value.written] == [False] * 1000  # replayed, not stored twice

    async with served(build_app(settings, stack)) as fresh, ChronicleClient(fresh, KEYS["tenant-a"]) as sdk:
        session = sdk.session(sid)
        rest = await session.append_all(chain[err.failed_index :], parent_id=err.written[-1].id)
        history = await session.get_history()
    assert [(r.id, r.parent_id, r.created) for r in rest] == [("m1000", "m999", True)]
    assert [m["id"] for m in history] == [m["id"] for m in chain]


# -- weighed by the events a request publishes ----------------------------------------------


def new_id() -> str:
    return "s-" + uuid.uuid4().hex[:10]


def messages(n: int) -> list[dict[str, Any]]:
    return [message(f"m{i}") for i in range(n)]


async def long_session(stack: Container, n: int) -> str:
    """A session of tenant-a holding ``n`` messages, written past every limit (straight through
    the writes both transports call); its id."""
    sid = new_id()
    await writes.create_session(stack, "tenant-a", sid, "long", None, {})
    await writes.append_batch(stack, "tenant-a", sid, messages(n), OMITTED)
    return sid


def assert_waits_for(problem: dict[str, Any], tokens: int, elapsed_s: float) -> None:
    """``problem`` is the refusal of a tenant that has taken ``tokens`` from its fresh bucket
    within ``elapsed_s``: it owes ``tokens - BURST``, and its next request needs one token more,
    so it waits ``(tokens + 1 - BURST) / RATE`` less what came back meanwhile."""
    assert problem["code"] == "rate_limited", problem
    assert problem["status"] == 429
    owed_s = (tokens + 1 - BURST) / RATE
    assert owed_s - elapsed_s - SLACK_S <= problem["retry_after"] <= owed_s + SLACK_S


def assert_http_waits_for(resp: httpx.Response, tokens: int, elapsed_s: float) -> None:
    assert resp.status_code == 429, resp.text
    assert_waits_for(resp.json(), tokens, elapsed_s)
    assert resp.headers["retry-after"] == str(math.ceil(resp.json()["retry_after"]))


async def test_a_batch_of_n_messages_takes_n_tokens_and_the_next_request_waits_them_out(api: str) -> None:
    n = 4  # with the session's creation 5 tokens, 2 past the burst: unweighed, the next request would be admitted
    sid = new_id()
    async with client(api, "tenant-a") as http:
        started = time.monotonic()
        assert (await http.post("/v1/sessions", json={"id": sid})).status_code == 201
        batch = await http.post(f"/v1/sessions/{sid}/messages:batch", json={"messages": messages(n)})
        assert batch.status_code == 201, batch.text  # never refused for being larger than the burst
        assert len(batch.json()["messages"]) == n
        refused = await http.get("/v1/sessions")
        assert_http_waits_for(refused, 1 + n, time.monotonic() - started)

        await asyncio.sleep(refused.json()["retry_after"])  # then one request is admitted again
        again = await http.get(f"/v1/sessions/{sid}/history", params={"min_seq": batch.json()["seq"]})
        assert again.status_code == 200, again.text
        assert [m["id"] for m in again.json()["messages"]] == [m["id"] for m in messages(n)]


async def test_a_fork_of_a_long_session_takes_a_token_per_event_it_copies(api: str, stack: Container) -> None:
    n = 200  # 199 s of debt at 1 a second: it is not waited out here
    source = await long_session(stack, n)
    async with client(api, "tenant-a") as http:
        started = time.monotonic()
        forked = await http.post(f"/v1/sessions/{source}/fork", json={"at_message_id": f"m{n - 1}"})
        assert forked.status_code == 201, forked.text
        assert forked.json()["messages"] == n
        refused = await http.get("/v1/sessions")
        # the fork published n + 1 events: its session's creation (the request's token) and n copies
        assert_http_waits_for(refused, 1 + n, time.monotonic() - started)


class ObservedLimits(TenantLimits):
    """The settings' limits (tenant-a: RATE and BURST; tenant-b: none), an event set when a
    request is admitted (the server has read its head), and the charges asked of them."""

    def __init__(self) -> None:
        super().__init__(Rate(RATE, BURST), {"tenant-b": None})
        self.token_bytes = TOKEN_BYTES
        self.admitted = asyncio.Event()
        self.charged: list[tuple[str, int]] = []

    def admit(self, tenant: str) -> None:
        super().admit(tenant)
        self.admitted.set()

    def charge(self, tenant: str, tokens: int, what: str = "events", own: int = 0) -> None:
        self.charged.append((tenant, tokens))
        super().charge(tenant, tokens, what, own)


@pytest.fixture
async def observed(
    settings: Settings, stack: Container, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[tuple[str, ObservedLimits]]:
    """A fresh API, as ``api``, whose limits say when they admit a request; its URL and limits."""
    limits = ObservedLimits()
    monkeypatch.setattr(app_module, "limits_of", lambda _: limits)
    async with served(build_app(settings, stack)) as url:
        yield url, limits


async def test_a_batch_admitted_beside_one_that_took_the_bucket_into_debt_is_refused_with_nothing_written(
    observed: tuple[str, ObservedLimits], stack: Container
) -> None:
    api, limits = observed
    first, other = new_id(), new_id()
    body = json.dumps({"messages": messages(2)}).encode()
    head = raw_http.head("POST", f"/v1/sessions/{first}/messages:batch", length=len(body))
    before = refused_over_http()
    reader, writer = await raw_http.connect(api)
    try:
        started = time.monotonic()
        writer.write(head)  # admitted on its head (3 -> 2 tokens); its body, and so its charge, later
        await writer.drain()
        await asyncio.wait_for(limits.admitted.wait(), timeout=10)  # the server has read the head
        async with client(api, "tenant-a") as http:  # meanwhile a batch of 10: its token and 9 more (2 -> -8)
            other_batch = await http.post(f"/v1/sessions/{other}/messages:batch", json={"messages": messages(10)})
        assert other_batch.status_code == 201, other_batch.text
        writer.write(body)  # its charge of 1 finds 8 owed, and would leave more than the burst owed
        await writer.drain()
        status, headers, problem = await raw_http.answer(reader)
        elapsed = time.monotonic() - started
    finally:
        writer.close()
    assert status == 429, problem
    # 11 tokens taken, the first batch's own among them (a refusal when it was admitted would say
    # 1 s less: it would not have taken it); its charge took nothing
    assert elapsed < 1 / RATE
    assert_waits_for(problem, 11, elapsed)
    assert headers["retry-after"] == str(math.ceil(problem["retry_after"]))
    assert refused_over_http() - before == 1
    assert await stack.publisher.last_subject_seq("tenant-a", first) == 0  # not one of its messages
    assert len(other_batch.json()["messages"]) == 10


async def test_a_tenant_without_a_limit_is_not_charged(observed: tuple[str, ObservedLimits]) -> None:
    """(Its next request being admitted showed no more than a charge under the limit.) In the app
    that charges tenant-a's batch, tenant-b's batch and fork of 200 ask its limits for nothing,
    and it has no bucket."""
    api, limits = observed
    sid = new_id()
    async with client(api, "tenant-b") as http:
        batch = await http.post(f"/v1/sessions/{sid}/messages:batch", json={"messages": messages(200)})
        assert batch.status_code == 201, batch.text
        forked = await http.post(f"/v1/sessions/{sid}/fork", json={"at_message_id": "m199"})
        assert forked.status_code == 201, forked.text
    async with client(api, "tenant-a") as http:
        batch = await http.post(f"/v1/sessions/{new_id()}/messages:batch", json={"messages": messages(2)})
        assert batch.status_code == 201, batch.text
    assert limits.charged == [("tenant-a", 1)]
    assert "tenant-b" not in limits._buckets  # never counted either


async def command(nc: Any, subject: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    return await request(nc, subject, json.dumps(body).encode())


async def request(nc: Any, subject: str, data: bytes) -> tuple[int, dict[str, Any]]:
    """A command's status and answer. Under heavy load the first request after `serving_commands`
    was answered "no responders" a few times (the service's subscriptions were on its connection,
    which had flushed them, and the same request a moment later was answered; cause not found):
    such a request reached no service, so nothing was charged, and sending it again tests the same
    thing."""
    for _ in range(50):
        try:
            msg = await nc.request(subject, data, timeout=30)
        except NoRespondersError:
            await asyncio.sleep(0.1)
            continue
        return int((msg.headers or {})[STATUS_HEADER]), json.loads(msg.data)
    raise AssertionError(f"no commands service answered {subject} in 5 s")


async def test_over_nats_a_batch_and_a_fork_are_weighed_as_over_http(settings: Settings, stack: Container) -> None:
    layout = settings.layout()
    n = 100
    source = await long_session(stack, n)
    nc = await tenant_nats(settings.nats_url, "tenant-a")
    try:
        async with serving_commands(settings, stack):  # fresh buckets
            started = time.monotonic()
            status, out = await command(
                nc,
                layout.command_subject("tenant-a", "append_batch"),
                {"session_id": new_id(), "messages": messages(n)},
            )
            assert status == 201, out
            status, refusal = await command(nc, layout.command_subject("tenant-a", "session.create"), {"id": new_id()})
            assert status == 429
            assert_waits_for(refusal, n, time.monotonic() - started)
        async with serving_commands(settings, stack):  # fresh buckets again
            started = time.monotonic()
            status, out = await command(
                nc,
                layout.command_subject("tenant-a", "session.fork"),
                {"session_id": source, "at_message_id": f"m{n - 1}"},
            )
            assert status == 201, out
            assert out["messages"] == n
            status, refusal = await command(nc, layout.command_subject("tenant-a", "session.create"), {"id": new_id()})
            assert status == 429
            assert_waits_for(refusal, 1 + n, time.monotonic() - started)
    finally:
        await nc.close()


async def test_a_refused_charge_publishes_nothing_of_a_batch_or_a_fork(stack: Container) -> None:
    source = await long_session(stack, 3)
    # a bucket that requests of the tenant admitted at the same moment took a burst into debt
    # after this one was admitted: whatever more it owed would be more than its burst
    limits = TenantLimits(Rate(RATE, BURST), clock=lambda: 0.0)
    for _ in range(BURST):
        limits.admit("tenant-a")
    limits.charge("tenant-a", BURST)
    charge = limits.charger("tenant-a")
    before = await stack.publisher.last_subject_seq("tenant-a", source)

    with pytest.raises(RateLimited):  # its second message, charged once the batch is checked
        await writes.append_batch(stack, "tenant-a", source, [message("x0"), message("x1")], OMITTED, None, charge)
    assert await stack.publisher.last_subject_seq("tenant-a", source) == before

    fork = new_id()
    with pytest.raises(RateLimited):  # its 3 copies, charged once the source is read
        await writes.fork_session(stack, "tenant-a", source, "m2", fork, None, charge)
    assert await stack.publisher.last_subject_seq("tenant-a", fork) == 0  # not even the new session


def tokens_left(limits: TenantLimits, tenant: str) -> int:
    """The whole tokens ``tenant``'s bucket holds (the clock stands still): the requests admitted
    before one is refused (it takes them)."""
    n = 0
    while limits.wait_s(tenant) == 0.0:
        n += 1
    return n


def still_limits() -> TenantLimits:
    """tenant-a's bucket, full, on a clock that stands still, the request's own token taken."""
    limits = TenantLimits(Rate(RATE, BURST), clock=lambda: 0.0)
    limits.admit("tenant-a")
    return limits


async def test_a_batch_refused_at_its_first_message_costs_its_one_token(stack: Container) -> None:
    """(It kept its charge for every message, though it published none.) An unknown parent, a
    deleted session: refused at the first message, the rest of the charge given back."""
    source = await long_session(stack, 1)
    deleted = await long_session(stack, 1)
    await writes.delete_session(stack, "tenant-a", deleted)
    refusals: list[tuple[str, ParentSpec, str]] = [
        (source, "no-such-message", "unknown_parent"),
        (deleted, OMITTED, "session_not_found"),
    ]
    for sid, parent, code in refusals:
        limits = still_limits()
        with pytest.raises(BatchFailed) as failed:
            await writes.append_batch(
                stack, "tenant-a", sid, [message(f"x{i}") for i in range(5)], parent, None, limits.charger("tenant-a")
            )
        assert (failed.value.failed_index, getattr(failed.value.cause, "code", None)) == (0, code)
        assert tokens_left(limits, "tenant-a") == BURST - 1  # the request's token alone


async def test_a_batch_failing_at_a_message_is_charged_the_messages_it_reached(stack: Container) -> None:
    """The third message's id is taken by another body (409): the two before it are stored, the
    third refused, the two after it never sent: 3 of the 5 tokens taken."""
    sid = new_id()
    await writes.append(stack, "tenant-a", sid, {**message("m2"), "role": "assistant"}, OMITTED, None)
    limits = still_limits()
    with pytest.raises(BatchFailed) as failed:
        await writes.append_batch(stack, "tenant-a", sid, messages(5), OMITTED, None, limits.charger("tenant-a"))
    assert (failed.value.failed_index, getattr(failed.value.cause, "code", None)) == (2, "message_conflict")
    assert tokens_left(limits, "tenant-a") == 0  # 3 - 1 (its token, m0) - 2 (m1, m2): none left
    assert limits.wait_s("tenant-a") == pytest.approx(1 / RATE)  # owing nothing: one token away


async def test_a_refused_fork_charge_packs_no_copy(stack: Container, monkeypatch: pytest.MonkeyPatch) -> None:
    """(The copies were packed first: a claim-checked body uploaded, an original stored again, the
    fork's data key made, for a fork then refused.)"""
    source = await long_session(stack, 3)
    limits = TenantLimits(Rate(RATE, BURST), clock=lambda: 0.0)
    for _ in range(BURST):
        limits.admit("tenant-a")
    limits.charge("tenant-a", BURST)  # in debt past the burst: the fork's charge is refused
    packed: list[str] = []
    pack = stack.commands._pack

    async def counting(tenant: str, session: str, body: Any, digest: str | None = None) -> dict[str, Any]:
        packed.append(session)
        return await pack(tenant, session, body, digest)

    monkeypatch.setattr(stack.commands, "_pack", counting)
    with pytest.raises(RateLimited):
        await writes.fork_session(stack, "tenant-a", source, "m2", new_id(), None, limits.charger("tenant-a"))
    assert packed == []


async def test_a_fork_failing_before_its_first_event_is_given_its_charge_back(
    stack: Container, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Object storage fails while a copy is packed: nothing published, nothing charged past the
    request's own token."""
    source = await long_session(stack, 3)
    limits = still_limits()

    async def failing(
        tenant: str, session: str, body: Any, digest: str | None = None, own: Any = None
    ) -> dict[str, Any]:
        raise ObjectStorageError("down")

    monkeypatch.setattr(stack.commands, "_pack", failing)
    fork = new_id()
    with pytest.raises(ObjectStorageError):
        await writes.fork_session(stack, "tenant-a", source, "m2", fork, None, limits.charger("tenant-a"))
    assert await stack.publisher.last_subject_seq("tenant-a", fork) == 0
    assert tokens_left(limits, "tenant-a") == BURST - 1


async def test_a_fork_that_another_call_completed_meanwhile_is_given_its_charge_back(
    stack: Container, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A client's retry racing the first call: the other call creates the fork and copies it all
    before this one's creation; this one publishes nothing and answers from the fork's log, as a
    complete fork is answered uncharged."""
    source, fork = await long_session(stack, 3), new_id()
    limits = still_limits()
    create = stack.commands.create_session

    async def raced(*args: Any, **kwargs: Any) -> Any:
        monkeypatch.setattr(stack.commands, "create_session", create)
        await writes.fork_session(stack, "tenant-a", source, "m2", fork, None)  # the other call, complete
        return await create(*args, **kwargs)  # session_exists: the other call made it

    monkeypatch.setattr(stack.commands, "create_session", raced)
    forked = await writes.fork_session(stack, "tenant-a", source, "m2", fork, None, limits.charger("tenant-a"))
    assert forked["messages"] == 3
    assert tokens_left(limits, "tenant-a") == BURST - 1


async def test_acks_another_tenant_has_jetstream_reflect_onto_a_command_subject_cost_its_tenant_nothing(
    settings: Settings, stack: Container, caplog: pytest.LogCaptureFixture
) -> None:
    """JetStream sends a publish ack to whatever reply subject the publisher names, as the server:
    tenant-b, publishing its own event again and again under one ``Nats-Msg-Id`` (one stored, the
    others answered "duplicate"), had an ack land on tenant-a's ``session.create`` subject each
    time, with no reply subject. Each was admitted against tenant-a's limit before its body was
    read: tenant-a's own requests were then refused ``429``. A request with no reply subject
    is now dropped before its limit or its body is looked at (``command dropped``)."""
    caplog.set_level(logging.WARNING, logger="chronicle.commands")
    target = settings.layout().command_subject("tenant-a", "session.create")
    own = settings.layout().session_subject("tenant-b", "s-" + uuid.uuid4().hex[:10])
    reflected = BURST * 2
    b = await tenant_nats(settings.nats_url, "tenant-b")
    a = await tenant_nats(settings.nats_url, "tenant-a")
    try:
        async with serving_commands(settings, stack):  # its own buckets: tenant-a's is full
            seen = await stack.nc.subscribe(target)  # the operator sees what reaches the service
            await stack.nc.flush()
            msg_id = uuid.uuid4().hex
            for _ in range(reflected):
                await b.publish(own, b"{}", reply=target, headers={"Nats-Msg-Id": msg_id})
            await b.flush()
            acks = [await seen.next_msg(timeout=5) for _ in range(reflected)]  # delivered before what follows
            await seen.unsubscribe()
            assert all(json.loads(m.data)["stream"] == settings.stream and not m.reply for m in acks)
            replies = [await request(a, target, json.dumps({"id": uuid.uuid4().hex}).encode()) for _ in range(BURST)]
    finally:
        await a.close()
        await b.close()
    assert [status for status, _ in replies] == [201] * BURST, replies  # its whole burst is its own
    dropped = [r.getMessage() for r in caplog.records if "no reply subject" in r.getMessage()]
    assert len(dropped) == reflected, dropped
    assert all(target in line for line in dropped), dropped


# -- weighed by the bytes of a request's body -----------------------------------------------


def sized(mid: str, units: float) -> dict[str, Any]:
    """A message whose request body weighs ``units`` tokens (a little less than as many 4 KiB)."""
    return {"id": mid, "role": "user", "parts": [{"type": "text", "text": "x" * int(units * TOKEN_BYTES - 200)}]}


async def test_a_body_counts_a_token_per_token_bytes_and_the_next_request_waits_them_out(api: str) -> None:
    """(A body was not weighed: an append of any size cost one token, so a tenant within its limit
    could have the API read and parse 95 MB bodies at its request rate, on the loop every tenant
    shares.) One append of a 5-unit body takes 5 tokens."""
    sid = new_id()
    async with client(api, "tenant-a") as http:
        started = time.monotonic()
        appended = await http.post(f"/v1/sessions/{sid}/messages", json={"message": sized("big", 5)})
        assert appended.status_code == 201, appended.text  # never refused for its size
        assert 4 * TOKEN_BYTES < len(appended.request.content) <= 5 * TOKEN_BYTES
        refused = await http.get("/v1/sessions")
        assert_http_waits_for(refused, 5, time.monotonic() - started)


async def test_a_declared_body_is_weighed_before_it_is_read(observed: tuple[str, ObservedLimits]) -> None:
    """The head of an append declaring a 5-unit body is admitted and its weight taken at once:
    another request sent before the body is refused, waiting for those 5 tokens; the body sent
    then is appended."""
    api, limits = observed
    sid = new_id()
    body = json.dumps({"message": sized("m0", 5)}).encode()
    head = raw_http.head("POST", f"/v1/sessions/{sid}/messages", length=len(body))
    reader, writer = await raw_http.connect(api)
    try:
        started = time.monotonic()
        writer.write(head)
        await writer.drain()
        await asyncio.wait_for(limits.admitted.wait(), timeout=10)  # the server has read the head
        async with client(api, "tenant-a") as http:
            refused = await http.get("/v1/sessions")
        assert_http_waits_for(refused, 5, time.monotonic() - started)
        writer.write(body)
        await writer.drain()
        status, _, appended = await raw_http.answer(reader)
    finally:
        writer.close()
    assert status == 201, appended
    assert limits.charged == [("tenant-a", 4)]  # its weight past the admission's token, before the body


@pytest.mark.parametrize(
    ("method", "extra", "size", "status"),
    [
        ("POST", "", 2**62, 413),  # over the body limit: refused unread
        ("POST", "Content-Encoding: gzip\r\n", 5 * TOKEN_BYTES, 415),  # a coded body: refused unread
        ("GET", "", 5 * TOKEN_BYTES, 200),  # no route reads a GET's body
    ],
    ids=["over-the-limit", "coded", "get"],
)
async def test_a_declared_body_that_is_never_read_is_not_weighed(
    observed: tuple[str, ObservedLimits], method: str, extra: str, size: int, status: int
) -> None:
    """What a head claims costs nothing by itself: a Content-Length of 2**62 put the tenant in
    debt for ~10**12 s (every later request 429, a read-only key's request too), though the 413
    read none of it; a 415's body and a GET's were weighed in full too."""
    api, limits = observed
    path = "/v1/sessions" if method == "GET" else f"/v1/sessions/{new_id()}/messages"
    head = raw_http.head(method, path, length=size, extra=extra)
    reader, writer = await raw_http.connect(api)
    try:
        writer.write(head + (b"x" * size if size < TOKEN_BYTES * 10 and method == "GET" else b""))
        await writer.drain()
        answered, _, _ = await raw_http.answer(reader)
    finally:
        writer.close()
    assert answered == status
    assert limits.charged == []  # no weight taken for it
    async with client(api, "tenant-a") as http:
        assert (await http.get("/v1/sessions")).status_code == 200  # the bucket owes nothing


async def test_a_weighed_body_the_route_never_reads_is_given_back(observed: tuple[str, ObservedLimits]) -> None:
    """A body weighed before it is read, then refused unread on its path (here a session id that
    is not UTF-8 once decoded: ``422``) and never sent: its weight is given back when the request
    ends (it was kept: a read-only key could send such heads, each leaving ~1,500 tokens of debt,
    ~30 s of 429 for every writer of its tenant)."""
    api, limits = observed
    head = raw_http.head("POST", "/v1/sessions/%FF/messages", length=5 * TOKEN_BYTES)
    reader, writer = await raw_http.connect(api)
    try:
        writer.write(head)  # the body is never sent
        await writer.drain()
        answered, _, _ = await raw_http.answer(reader)
    finally:
        writer.close()
    assert answered == 422
    async with asyncio.timeout(5):  # given back as the request ends, after its answer
        while limits.charged != [("tenant-a", 4), ("tenant-a", -4)]:
            await asyncio.sleep(0.01)
    async with client(api, "tenant-a") as http:
        assert (await http.get("/v1/sessions")).status_code == 200  # the bucket owes nothing


async def test_a_chunked_body_is_weighed_as_it_arrives_and_refused_once_the_bucket_may_owe_no_more(
    observed: tuple[str, ObservedLimits], stack: Container
) -> None:
    """A chunked append is admitted on its head (3 -> 2 tokens); a batch of 10 then takes the
    bucket into debt (2 -> -8); the append's first chunk, over 2 units, would owe more than the
    burst: 429, the connection closed, nothing of it written. Unweighed, it was appended."""
    api, limits = observed
    sid = new_id()
    body = json.dumps({"message": sized("m0", 3)}).encode()
    head = raw_http.head("POST", f"/v1/sessions/{sid}/messages", extra="Transfer-Encoding: chunked\r\n")
    before = refused_over_http()
    reader, writer = await raw_http.connect(api)
    try:
        writer.write(head)
        await writer.drain()
        await asyncio.wait_for(limits.admitted.wait(), timeout=10)
        async with client(api, "tenant-a") as http:
            batch = await http.post(f"/v1/sessions/{new_id()}/messages:batch", json={"messages": messages(10)})
        assert batch.status_code == 201, batch.text
        first = body[: 2 * TOKEN_BYTES + 100]
        writer.write(f"{len(first):x}\r\n".encode() + first + b"\r\n")
        await writer.drain()
        status, headers, problem = await raw_http.answer(reader)
    finally:
        writer.close()
    assert status == 429, problem
    assert problem["code"] == "rate_limited"
    assert "its body of" in problem["detail"]
    assert headers["connection"] == "close"
    assert refused_over_http() - before == 1
    assert await stack.publisher.last_subject_seq("tenant-a", sid) == 0  # nothing of it


async def test_a_batch_counts_the_larger_of_its_messages_and_its_bodys_weight(api: str) -> None:
    """Two messages of 2.5 units each: a 5-unit body, 2 events: 5 tokens, not 6 or 7."""
    sid = new_id()
    async with client(api, "tenant-a") as http:
        started = time.monotonic()
        batch = await http.post(
            f"/v1/sessions/{sid}/messages:batch", json={"messages": [sized("m0", 2.5), sized("m1", 2.5)]}
        )
        assert batch.status_code == 201, batch.text
        assert 4 * TOKEN_BYTES < len(batch.request.content) <= 5 * TOKEN_BYTES
        refused = await http.get("/v1/sessions")
        assert_http_waits_for(refused, 5, time.monotonic() - started)


async def test_over_nats_a_command_is_weighed_by_its_payload_as_over_http(settings: Settings, stack: Container) -> None:
    layout = settings.layout()
    nc = await tenant_nats(settings.nats_url, "tenant-a")
    try:
        async with serving_commands(settings, stack):  # fresh buckets
            started = time.monotonic()
            data = json.dumps({"session_id": new_id(), "message": sized("m0", 5)}).encode()
            assert 4 * TOKEN_BYTES < len(data) <= 5 * TOKEN_BYTES
            status, out = await request(nc, layout.command_subject("tenant-a", "append"), data)
            assert status == 201, out
            status, refusal = await command(nc, layout.command_subject("tenant-a", "session.create"), {"id": new_id()})
            assert status == 429
            assert_waits_for(refusal, 5, time.monotonic() - started)
        async with serving_commands(settings, stack):  # a batch: the larger of its events and its weight
            started = time.monotonic()
            status, out = await command(
                nc,
                layout.command_subject("tenant-a", "append_batch"),
                {"session_id": new_id(), "messages": [sized("m0", 2.5), sized("m1", 2.5)]},
            )
            assert status == 201, out
            status, refusal = await command(nc, layout.command_subject("tenant-a", "session.create"), {"id": new_id()})
            assert status == 429
            assert_waits_for(refusal, 5, time.monotonic() - started)
    finally:
        await nc.close()
