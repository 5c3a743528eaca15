"""The per-tenant token buckets (services/requests/limits.py), their settings, and how a refusal
reads as a problem and an HTTP answer. The clock is a variable: no test waits."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest
from pydantic import ValidationError
from starlette.requests import Request
from starlette.types import Message, Receive, Scope, Send

from services.api.app import build_app
from services.api.deps import charge_of
from services.api.limits import TenantRateLimit
from services.api.problems import as_response
from services.errors import RateLimited
from services.requests import limits as limits_module
from services.requests.limits import Rate, TenantLimits, limits_of
from services.requests.problems import problem_of
from services.settings import Settings


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def limited(per_s: float = 2.0, burst: int = 3, **overrides: Rate | None) -> tuple[TenantLimits, Clock]:
    clock = Clock()
    return TenantLimits(Rate.of(per_s, burst), overrides, clock=clock), clock


def test_a_tenant_gets_its_burst_at_once_then_waits_for_the_next_token() -> None:
    limits, _ = limited(per_s=2.0, burst=3)
    assert [limits.wait_s("a") for _ in range(3)] == [0.0, 0.0, 0.0]
    assert limits.wait_s("a") == pytest.approx(0.5)


def test_tokens_come_back_at_the_rate_up_to_the_burst() -> None:
    limits, clock = limited(per_s=2.0, burst=3)
    for _ in range(3):
        limits.wait_s("a")
    clock.now += 0.25
    assert limits.wait_s("a") == pytest.approx(0.25)  # half a token back
    clock.now += 0.25
    assert limits.wait_s("a") == 0.0  # one token: admitted
    clock.now += 60
    assert [limits.wait_s("a") for _ in range(4)][-1] == pytest.approx(0.5)  # refilled to 3, not more


def test_a_refused_request_takes_no_token() -> None:
    limits, clock = limited(per_s=1.0, burst=1)
    assert limits.wait_s("a") == 0.0
    for _ in range(5):
        assert limits.wait_s("a") == pytest.approx(1.0)
    clock.now += 1.0
    assert limits.wait_s("a") == 0.0


def test_each_tenant_has_its_own_bucket_and_overrides_replace_the_default() -> None:
    limits, _ = limited(per_s=1.0, burst=1, vip=Rate.of(100.0), free=None)
    assert limits.wait_s("a") == 0.0
    assert limits.wait_s("a") > 0
    assert limits.wait_s("b") == 0.0  # another tenant, a full bucket
    assert all(limits.wait_s("vip") == 0.0 for _ in range(100))  # a burst of one second's worth
    assert limits.wait_s("vip") > 0
    assert all(limits.wait_s("free") == 0.0 for _ in range(10_000))  # no limit


def test_a_burst_of_zero_is_one_seconds_worth_and_a_rate_of_zero_no_limit() -> None:
    assert Rate.of(2.5) == Rate(2.5, 3.0)
    assert Rate.of(0.2) == Rate(0.2, 1.0)
    assert Rate.of(5, burst=7) == Rate(5, 7.0)
    assert Rate.of(0) is None


def test_admit_raises_rate_limited_with_the_wait() -> None:
    limits, _ = limited(per_s=4.0, burst=1)
    limits.admit("a")
    with pytest.raises(RateLimited) as caught:
        limits.admit("a")
    assert caught.value.retry_after_s == pytest.approx(0.25)
    assert "'a'" in caught.value.detail
    assert "4 requests/s" in caught.value.detail


def test_a_charge_takes_the_bucket_into_debt_and_the_next_request_waits_until_it_is_paid() -> None:
    limits, clock = limited(per_s=2.0, burst=3)
    limits.admit("a")  # a batch of 10 messages: one token to start (3 -> 2) ...
    limits.charge("a", 9)  # ... and 9 once its size is known: 7 owed
    assert limits.wait_s("a") == pytest.approx(4.0)  # (1 + 7) / 2: the debt, then one token
    assert limits.wait_s("b") == 0.0  # another tenant's bucket is its own
    clock.now += 3.9
    with pytest.raises(RateLimited) as caught:
        limits.admit("a")
    assert caught.value.retry_after_s == pytest.approx(0.1)
    clock.now += 0.1
    assert limits.wait_s("a") == 0.0


def test_a_charge_larger_than_the_burst_is_taken_whole_from_a_bucket_that_owes_nothing() -> None:
    limits, _ = limited(per_s=1.0, burst=3)
    for _ in range(3):
        limits.admit("a")  # empty, not in debt
    limits.charge("a", 999)  # a batch of 1,000 could never fit the burst: it is not refused for its size
    assert limits.wait_s("a") == pytest.approx(1000.0)


def test_a_charge_that_finds_the_bucket_in_debt_is_refused_past_the_burst_and_takes_nothing() -> None:
    limits, clock = limited(per_s=2.0, burst=3)
    for _ in range(3):
        limits.admit("a")  # three requests admitted at once
    limits.charge("a", 1)  # the first to charge takes the bucket into debt: 1 owed
    limits.charge("a", 2)  # the second stays within the burst of debt: 3 owed
    with pytest.raises(RateLimited) as caught:
        limits.charge("a", 1)  # the third would owe 4, more than the burst: refused, nothing taken
    assert caught.value.retry_after_s == pytest.approx(2.0)  # (1 + 3) / 2: when a request is admitted again
    assert limits.charge_wait_s("a", 1) == pytest.approx(2.0)  # still 3 owed: the refusal took nothing
    clock.now += 2.0
    assert limits.wait_s("a") == 0.0


def test_a_charge_of_nothing_or_for_a_tenant_without_a_limit_costs_nothing() -> None:
    limits, _ = limited(per_s=1.0, burst=1, free=None)
    limits.admit("a")
    limits.charge("a", 0)  # a batch of one message
    assert [limits.charge_wait_s("free", 1_000) for _ in range(3)] == [0.0, 0.0, 0.0]
    assert limits.charger("free") is None  # nothing for its requests to call
    charge = limits.charger("a")
    assert charge is not None
    assert limits.wait_s("a") == pytest.approx(1.0)  # the charge of 0 took nothing
    charge(1)  # its bucket owed nothing: taken
    assert limits.wait_s("a") == pytest.approx(2.0)
    assert limits.charge_wait_s("a", 1) == pytest.approx(2.0)  # owing 1, 2 would be more than the burst


def test_a_negative_charge_gives_back_what_was_taken_up_to_the_burst() -> None:
    """A request that publishes fewer events than it was charged (a batch failing at a message)
    gives the rest back: ``charge(-n)``, never refused."""
    limits, _ = limited(per_s=1.0, burst=3)
    limits.admit("a")
    charge = limits.charger("a")
    assert charge is not None
    charge(9)  # 2 -> -7
    charge(-9)  # -7 -> 2: the request's own token stays taken
    assert [limits.wait_s("a") for _ in range(2)] == [0.0, 0.0]
    assert limits.wait_s("a") == pytest.approx(1.0)
    charge(-50)  # never more than the burst
    assert [limits.wait_s("a") for _ in range(3)] == [0.0, 0.0, 0.0]
    assert limits.wait_s("a") > 0


def test_a_refused_charge_is_logged_as_a_refused_request(caplog: pytest.LogCaptureFixture) -> None:
    limits, _ = limited(per_s=1.0, burst=1)
    limits.admit("a")
    limits.charge("a", 5)
    with caplog.at_level("WARNING", logger="chronicle.limits"), pytest.raises(RateLimited) as caught:
        limits.charge("a", 5)
    assert caught.value.retry_after_s == pytest.approx(6.0)
    assert "once per event it publishes" in caught.value.detail
    assert caught.value.detail.endswith(": the 5 more events of this request find the bucket owing more than it may")
    assert ["'a'" in r.getMessage() for r in caplog.records] == [True]


def test_a_bucket_in_debt_is_never_dropped(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(limits_module, "MAX_BUCKETS", 2)
    limits, _ = limited(per_s=1.0, burst=1)
    limits.admit("busy")
    limits.charge("busy", 50)
    for t in ("t1", "t2", "t3"):
        limits.wait_s(t)
    assert "busy" in limits._buckets
    assert limits.wait_s("busy") == pytest.approx(51.0)


async def test_without_a_limit_the_api_has_no_limit_layer_and_a_batch_or_fork_gets_no_charge() -> None:
    def layers(settings: Settings) -> list[object]:
        return [m.cls for m in build_app(settings).user_middleware]

    assert TenantRateLimit not in layers(Settings(rate_limit=0))  # the hot paths run as without limits
    assert TenantRateLimit in layers(Settings(rate_limit=5))
    assert await charge_of(Request({"type": "http", "state": {"tenant": "t"}})) is None  # no layer: no charge


async def test_through_the_limit_layer_a_tenant_without_a_rate_gets_no_charge_and_one_with_a_rate_does() -> None:
    """(Checked on a request no layer had seen, ``charge_of`` was None whatever the layer does.)
    The same layer, the same requests: the limited tenant's route is handed a charge that takes
    from its bucket, the free tenant's none, and the free tenant gets no bucket at all."""
    limits, _ = limited(per_s=1.0, burst=3, free=None)
    seen: dict[str, Callable[[int], None] | None] = {}

    async def route(scope: Scope, receive: Receive, send: Send) -> None:
        seen[scope["state"]["tenant"]] = await charge_of(Request(scope))

    async def nothing() -> Message:
        return {"type": "http.request", "body": b""}

    async def ignore(message: Message) -> None:
        return None

    layer = TenantRateLimit(route, limits)
    for tenant in ("free", "a"):
        await layer({"type": "http", "state": {"tenant": tenant}}, nothing, ignore)
    assert seen["free"] is None
    charge = seen["a"]
    assert charge is not None
    charge(2)  # 3 - 1 (its admission) - 2
    assert limits.wait_s("a") == pytest.approx(1.0)
    assert "free" not in limits._buckets  # never counted, never charged


def test_dropping_full_buckets_changes_no_decision(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(limits_module, "MAX_BUCKETS", 4)
    limits, clock = limited(per_s=1.0, burst=2)
    limits.wait_s("busy")
    limits.wait_s("busy")  # empty
    for t in ("t1", "t2", "t3"):
        limits.wait_s(t)
    clock.now += 1.0  # t1..t3 full again (2 tokens), busy at 1
    limits.wait_s("new")  # over MAX_BUCKETS: the full ones go, busy stays
    assert set(limits._buckets) == {"busy", "new"}
    assert limits.wait_s("busy") == 0.0  # its one token
    assert limits.wait_s("busy") == pytest.approx(1.0)  # and no more: its bucket was kept
    assert limits.wait_s("t1") == 0.0
    assert limits.wait_s("t1") == 0.0


def test_a_tenants_refusals_are_logged_once_a_minute(caplog: pytest.LogCaptureFixture) -> None:
    limits, clock = limited(per_s=1.0, burst=1)

    def refusals(tenant: str, n: int) -> None:
        for _ in range(n):
            with pytest.raises(RateLimited):
                limits.admit(tenant)

    limits.admit("a")
    limits.admit("b")
    with caplog.at_level("WARNING", logger="chronicle.limits"):
        refusals("a", 5)
        refusals("b", 2)
        clock.now += limits_module.REPORT_EVERY_S  # the buckets refill too: empty them again
        limits.admit("a")
        refusals("a", 3)
    logged = [r.getMessage() for r in caplog.records]
    assert len(logged) == 3
    assert ["'a'" in m for m in logged] == [True, False, True]


def test_settings_make_limits_only_when_a_tenant_has_one() -> None:
    assert limits_of(Settings(rate_limit=0)) is None
    assert limits_of(Settings(rate_limit=0, rate_limits={"t": 0})) is None
    only_t = limits_of(Settings(rate_limit=0, rate_limits={"t": 5}))
    assert only_t is not None
    assert only_t.rate_of("t") == Rate(5, 5.0)
    assert only_t.rate_of("other") is None
    every = limits_of(Settings(rate_limit=10, rate_limit_burst=20, rate_limits={"t": 0}))
    assert every is not None
    assert every.rate_of("x") == Rate(10, 20.0)
    assert every.rate_of("t") is None


@pytest.mark.parametrize(
    "fields",
    [{"rate_limit": -1}, {"rate_limit_burst": -1}, {"rate_limits": {"t": -1}}, {"rate_limits": {"bad tenant!": 1}}],
)
def test_settings_refuse_negative_rates_and_names_that_are_not_tenants(fields: dict[str, object]) -> None:
    with pytest.raises(ValidationError):
        Settings.model_validate(fields)


@pytest.mark.parametrize(
    ("wait", "header", "seconds"),
    [(0.00001, "1", 0.001), (0.0012, "1", 0.002), (0.5, "1", 0.5), (1.0, "1", 1.0), (1.2, "2", 1.2), (7.9, "8", 7.9)],
)
def test_a_refusal_is_a_429_problem_with_the_wait_and_retry_after_in_whole_seconds(
    wait: float, header: str, seconds: float
) -> None:
    body = problem_of(RateLimited(wait, "tenant 't' is over its limit"))
    assert body is not None
    assert body["status"] == 429
    assert body["code"] == "rate_limited"
    assert body["retry_after"] == seconds  # never less than the wait: waiting it is enough
    resp = as_response(body)
    assert resp.status_code == 429
    assert resp.headers["retry-after"] == header
    assert resp.media_type == "application/problem+json"
    assert json.loads(bytes(resp.body))["detail"] == "tenant 't' is over its limit"
