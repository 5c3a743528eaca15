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
from services.requests.limits import Rate, TenantLimits, body_weight, limits_of
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
    limits.charge("a", -50)  # never more than the burst (a request's own charge gives back only what it took)
    assert [limits.wait_s("a") for _ in range(3)] == [0.0, 0.0, 0.0]
    assert limits.wait_s("a") > 0


@pytest.mark.parametrize(
    ("size", "token_bytes", "weight"),
    [(0, 1024, 1), (1024, 1024, 1), (1025, 1024, 2), (10 * 1024, 1024, 10), (95_000_000, 65536, 1450), (10**9, 0, 1)],
)
def test_a_body_weighs_a_token_per_token_bytes_begun(size: int, token_bytes: int, weight: int) -> None:
    assert body_weight(size, token_bytes) == weight


def weighing(per_s: float = 1.0, burst: int = 3, token_bytes: int = 1000) -> tuple[TenantLimits, Clock]:
    clock = Clock()
    return TenantLimits(Rate.of(per_s, burst), clock=clock, token_bytes=token_bytes), clock


def level(limits: TenantLimits, tenant: str) -> float:
    """The tokens ``tenant``'s bucket holds (negative: owed), taking none."""
    return limits._buckets[tenant].tokens


def test_a_request_counts_the_larger_of_its_events_and_its_bodys_weight_never_both() -> None:
    """(A body was not weighed: a 95 MB request that failed validation cost one token.) A body of
    5 units weighs 5 tokens, taken before the body is read; a batch of 3 events in it adds
    nothing; one of 8 adds the 3 past the weight; giving events back stops at the weight."""
    limits, _ = weighing(per_s=1.0, burst=10)
    limits.admit("a")  # 10 -> 9
    charge = limits.charger("a")
    assert charge is not None
    charge.weigh(4_001)  # 5 units: 4 more
    assert level(limits, "a") == 5
    charge(2)  # 3 events, fewer than its weight: nothing more
    assert level(limits, "a") == 5
    charge(5)  # 8 events: 3 past its weight
    assert level(limits, "a") == 2
    charge(-7)  # 1 event: back to its weight, not below
    assert level(limits, "a") == 5
    charge.weigh(2_000)  # a smaller size later (what arrived so far) lowers nothing
    assert level(limits, "a") == 5
    charge.weigh(6_500)  # more of the body arrived: 7 units
    assert level(limits, "a") == 3


def test_a_body_is_never_refused_for_its_size_but_one_weighed_in_debt_is_and_takes_nothing() -> None:
    limits, _ = weighing(per_s=1.0, burst=3)
    for _ in range(3):
        limits.admit("a")  # three requests admitted at once: 0 left
    first, second = limits.charger("a"), limits.charger("a")
    assert first is not None
    assert second is not None
    first.weigh(100_000)  # 100 units, owing nothing before: taken whole (0 -> -99)
    with pytest.raises(RateLimited) as caught:
        second.weigh(2_500)  # 3 units in debt past the burst: refused
    assert "its body of 2500 bytes" in caught.value.detail
    assert (second.events, second.weight) == (1, 1)  # nothing taken, nothing counted
    assert limits.wait_s("a") == pytest.approx(100.0)


def test_a_charger_for_a_body_weighed_at_admission_takes_its_weight_again_never() -> None:
    """A command is weighed as it is admitted, and its handler's charge made later: told the
    body's size, it counts that weight as taken."""
    limits, _ = weighing(per_s=1.0, burst=3)
    limits.admit("a")
    admitted = limits.charger("a")
    assert admitted is not None
    admitted.weigh(4_001)  # 2 -> -2
    handler = limits.charger("a", weighed=4_001)
    assert handler is not None
    handler(4)  # a batch of 5 messages in it: as many as its weight
    assert limits.wait_s("a") == pytest.approx(3.0)
    handler(1)  # 6: one more
    assert limits.wait_s("a") == pytest.approx(4.0)


def test_settings_weigh_bodies_by_64_kib_unless_told_otherwise() -> None:
    default = limits_of(Settings(rate_limit=10))
    assert default is not None
    assert default.token_bytes == 65536
    off = limits_of(Settings(rate_limit=10, rate_limit_token_bytes=0))
    assert off is not None
    assert off.token_bytes == 0


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


def test_a_debt_of_the_requests_own_body_is_not_one_it_finds() -> None:
    """A batch of 1,000 small messages in an 80 KB body: its weight (20) took the bucket into debt
    as it was read; its 980 events past that are still taken (they were refused, the request's own
    debt taken for another's); a second request's charge in that debt is refused."""
    limits, _ = weighing(per_s=1.0, burst=3, token_bytes=4096)
    limits.admit("a")
    limits.admit("a")  # another request, admitted at the same moment
    batch, other = limits.charger("a"), limits.charger("a")
    assert batch is not None
    assert other is not None
    batch.weigh(80_000)  # 20 units: 1 -> -18
    batch(999)  # 1,000 events: 980 more, its own debt notwithstanding
    assert level(limits, "a") == -998
    with pytest.raises(RateLimited):
        other(1)
