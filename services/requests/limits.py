"""Per-tenant request limits: one token bucket per tenant, in each API or ``chronicle commands``
process (a tenant's ceiling over N processes is N times its rate).

A token is one event a request may publish. A tenant may make ``burst`` requests at once, then
``per_s`` a second. A request needs one token to start (:meth:`TenantLimits.admit`, before its body
is read); a request over the limit is refused there, before it does anything (``429 rate_limited``,
with the seconds until one would be admitted), so it is always safe to send again.

A request that publishes more than one event (a batch of N messages, a fork copying N events) is
charged the rest once it knows how many (:meth:`TenantLimits.charge`), before it publishes any (and
given back what it will not publish after all: a batch that fails at a message, a fork refused
before its first event):
the bucket may go into debt, so one request larger than the burst is never refused for its size,
and the tenant's next requests wait until the debt is paid at its rate. A charge that finds the
bucket in debt already (another request of the tenant, admitted at the same moment, charged first)
and would leave it owing more than its burst is refused (``429``, nothing published): concurrent
requests cannot each take the tenant deep into debt.

A request's body is weighed too (:class:`RequestCharge`): it counts at least one token per
``token_bytes`` of its body begun (``CHRONICLE_RATE_LIMIT_TOKEN_BYTES``, 64 KiB), the larger of
that and its events, taken before the body is read (a body of unknown length as it arrives).
Reading, parsing and checking a body costs the process in proportion to its bytes, on the event
loop every tenant's requests share: a 95 MB batch that fails validation at its last message cost
one token and ~2 s of the API's loop, so a tenant within a limit of 50 a second could keep the
API from answering anyone.

The buckets are a pure core: the clock is passed in.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from services.errors import RateLimited
from services.settings import Settings

MAX_BUCKETS = 10_000
"""Buckets kept before the full ones (a tenant idle for a while) are dropped: a full bucket is
what a tenant never seen gets, so dropping it changes no decision."""
REPORT_EVERY_S = 60.0
"""A tenant's refusals are logged at most once in this many seconds."""

Charge = Callable[[int], None]
"""A request's charge for the events it is about to publish beyond its first (``charge(n)``):
taken from its tenant's bucket, or :class:`RateLimited` raised before anything is published;
``charge(-n)`` gives back ``n`` of what it took for events it did not publish after all (never
refused). None where no limit applies: nothing to call."""

log = logging.getLogger("chronicle.limits")


@dataclass(frozen=True, slots=True)
class Rate:
    """``per_s`` tokens (events) a second after a ``burst`` of them at once."""

    per_s: float
    burst: float

    @classmethod
    def of(cls, per_s: float, burst: int = 0) -> Rate | None:
        """The rate, None for no limit (``per_s`` 0); a ``burst`` of 0 is one second's worth."""
        if per_s <= 0:
            return None
        return cls(per_s, float(burst or max(1, math.ceil(per_s))))


def body_weight(size: int, token_bytes: int) -> int:
    """The tokens a request body of ``size`` bytes weighs: one per ``token_bytes`` begun, at least
    one (the request's own); one whatever its size when ``token_bytes`` is 0 (bodies not weighed)."""
    if token_bytes <= 0 or size <= token_bytes:
        return 1
    return -(-size // token_bytes)


@dataclass(slots=True)
class _Bucket:
    tokens: float
    at: float

    def level(self, rate: Rate, now: float) -> float:
        return min(rate.burst, self.tokens + (now - self.at) * rate.per_s)


class TenantLimits:
    """The buckets of every tenant: ``default`` for a tenant ``overrides`` does not name (None in
    either: no limit)."""

    def __init__(
        self,
        default: Rate | None,
        overrides: Mapping[str, Rate | None] | None = None,
        clock: Callable[[], float] = time.monotonic,
        token_bytes: int = 0,
    ) -> None:
        """``token_bytes``: the body bytes one token pays for (:func:`body_weight`; 0: bodies are
        not weighed)."""
        self.token_bytes = token_bytes
        self._default = default
        self._overrides = dict(overrides or {})
        self._clock = clock
        self._buckets: dict[str, _Bucket] = {}
        self._reported: dict[str, float] = {}

    def rate_of(self, tenant: str) -> Rate | None:
        return self._overrides.get(tenant, self._default)

    def _refilled(self, tenant: str, rate: Rate) -> _Bucket:
        """``tenant``'s bucket, its tokens brought to now (a full one for a tenant not seen)."""
        now = self._clock()
        bucket = self._buckets.get(tenant)
        if bucket is None:
            if len(self._buckets) >= MAX_BUCKETS:
                self._drop_full(now)
            bucket = self._buckets[tenant] = _Bucket(rate.burst, now)
        bucket.tokens, bucket.at = bucket.level(rate, now), now
        return bucket

    def wait_s(self, tenant: str) -> float:
        """0 when ``tenant`` may make a request now (its token is taken); otherwise the seconds
        until it may (the bucket holds a whole token again: a debt is paid first)."""
        rate = self.rate_of(tenant)
        if rate is None:
            return 0.0
        bucket = self._refilled(tenant, rate)
        if bucket.tokens >= 1.0:
            bucket.tokens -= 1.0
            return 0.0
        return (1.0 - bucket.tokens) / rate.per_s

    def charge_wait_s(self, tenant: str, tokens: int, own: int = 0) -> float:
        """0 when ``tokens`` more are taken from ``tenant``'s bucket for a request it admitted
        (into debt if need be); otherwise, when the bucket was in debt already and would owe more
        than its burst, nothing is taken and the seconds until a request would be admitted again.
        ``own``: what the request's earlier charges took (its body's weight): a debt of its own
        making is not one found (others' requests, admitted at the same moment, charged first).
        A negative ``tokens`` gives them back (a charge's events not published), up to the burst."""
        rate = self.rate_of(tenant)
        if rate is None or tokens == 0:
            return 0.0
        bucket = self._refilled(tenant, rate)
        if tokens < 0:
            bucket.tokens = min(rate.burst, bucket.tokens - tokens)
            return 0.0
        if bucket.tokens + own < 0.0 and bucket.tokens - tokens < -rate.burst:
            return (1.0 - bucket.tokens) / rate.per_s
        bucket.tokens -= tokens
        return 0.0

    def admit(self, tenant: str) -> None:
        """Count a request of ``tenant``, or raise :class:`RateLimited` when it is over its limit
        (logged once in :data:`REPORT_EVERY_S` per tenant)."""
        self._refuse(tenant, self.wait_s(tenant))

    def charge(self, tenant: str, tokens: int, what: str = "events", own: int = 0) -> None:
        """Charge an admitted request of ``tenant`` ``tokens`` more (:meth:`charge_wait_s`, ``own``
        its earlier charges), or raise :class:`RateLimited` when that is refused (logged as
        :meth:`admit` logs)."""
        why = f": the {tokens} more {what} of this request find the bucket owing more than it may"
        self._refuse(tenant, self.charge_wait_s(tenant, tokens, own), why)

    def charger(self, tenant: str, weighed: int = 0) -> RequestCharge | None:
        """What charges an admitted request of ``tenant`` (:class:`RequestCharge`), its body of
        ``weighed`` bytes already weighed (:meth:`RequestCharge.weigh`: its weight taken); None when
        the tenant has no limit."""
        if self.rate_of(tenant) is None:
            return None
        charge = RequestCharge(self, tenant)
        charge.weight = body_weight(weighed, self.token_bytes)
        return charge

    def _refuse(self, tenant: str, wait: float, why: str = "") -> None:
        if wait > 0:
            refused = RateLimited(wait, f"tenant {tenant!r} is over its limit of {self._described(tenant)}{why}")
            if self.first_refusal(tenant):
                log.warning("rate limit: refusing requests of tenant %r (%s)", tenant, refused.detail)
            raise refused

    def first_refusal(self, tenant: str) -> bool:
        """True for the first refusal of ``tenant`` in :data:`REPORT_EVERY_S`."""
        now = self._clock()
        if now - self._reported.get(tenant, -math.inf) < REPORT_EVERY_S:
            return False
        if len(self._reported) >= MAX_BUCKETS:
            self._reported = {t: at for t, at in self._reported.items() if now - at < REPORT_EVERY_S}
        self._reported[tenant] = now
        return True

    def _described(self, tenant: str) -> str:
        rate = self.rate_of(tenant)
        assert rate is not None
        return (
            f"{rate.per_s:g} requests/s (bursts of {rate.burst:g}) per process, "
            "a request counting once per event it publishes"
        )

    def _drop_full(self, now: float) -> None:
        def full(tenant: str, bucket: _Bucket) -> bool:
            rate = self.rate_of(tenant)
            return rate is None or bucket.level(rate, now) >= rate.burst

        self._buckets = {t: b for t, b in self._buckets.items() if not full(t, b)}


class RequestCharge:
    """One admitted request's charge (a :data:`Charge`): the larger of the events it publishes and
    its body's weight (:func:`body_weight`), its admission's token included. ``charge(n)`` counts
    ``n`` more events (``-n``: fewer, given back), :meth:`weigh` the body's bytes so far; each takes
    from the bucket only what raises the larger of the two (gives back what lowers it), so a batch
    of N small messages still counts N, and one of a few large ones its bytes, never both. A
    refusal (:class:`RateLimited`) takes and changes nothing."""

    def __init__(self, limits: TenantLimits, tenant: str) -> None:
        self._limits = limits
        self._tenant = tenant
        self.events = 1
        self.weight = 1

    def __call__(self, tokens: int) -> None:
        self._take(self.events + tokens, self.weight, "events")

    def weigh(self, size: int) -> None:
        """The body has ``size`` bytes (so far): the tokens that weighs past what was taken."""
        weight = max(self.weight, body_weight(size, self._limits.token_bytes))
        self._take(self.events, weight, f"tokens its body of {size} bytes weighs")

    def read(self, size: int) -> None:
        """The body read was ``size`` bytes in the end, less than weighed before it was read (a
        request refused unread, a client gone mid-body): the weight of what was not read is given
        back, never what its events took."""
        weight = min(self.weight, max(1, body_weight(size, self._limits.token_bytes)))
        self._take(self.events, weight, "tokens")

    def _take(self, events: int, weight: int, what: str) -> None:
        taken = max(self.events, self.weight)
        more = max(events, weight) - taken
        if more:
            self._limits.charge(self._tenant, more, what, own=taken - 1)
        self.events, self.weight = events, weight


def limits_of(settings: Settings) -> TenantLimits | None:
    """The process's limits from ``rate_limit``, ``rate_limit_burst`` and ``rate_limits`` (a
    tenant's own rate takes the same burst setting: 0 is one second of its own rate); None when
    no tenant has one (nothing to check per request)."""
    default = Rate.of(settings.rate_limit, settings.rate_limit_burst)
    overrides = {t: Rate.of(per_s, settings.rate_limit_burst) for t, per_s in settings.rate_limits.items()}
    if default is None and not any(overrides.values()):
        return None
    return TenantLimits(default, overrides, token_bytes=settings.rate_limit_token_bytes)
