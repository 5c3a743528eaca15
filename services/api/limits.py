"""Per-tenant request limits over HTTP (services/requests/limits.py): a tenant over its limit gets
``429 rate_limited`` with ``Retry-After`` before anything reads its request. A request of a limited
tenant carries its charge (``scope["state"]["charge"]``, :data:`services.requests.limits.Charge`)
for the routes that publish more than one event (a batch, a fork: :func:`services.api.deps.charge_of`)."""

from __future__ import annotations

from functools import partial

from starlette.types import ASGIApp, Receive, Scope, Send

from services.api.metrics import RATE_LIMITED
from services.api.problems import as_response
from services.errors import RateLimited
from services.requests.limits import TenantLimits
from services.requests.problems import problem_of


class TenantRateLimit:
    """ASGI middleware inside the key check (the tenant is known): counts each ``/v1`` request
    against its tenant's bucket and refuses the ones over the limit."""

    def __init__(self, app: ASGIApp, limits: TenantLimits) -> None:
        self.app = app
        self.limits = limits

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        tenant = scope.get("state", {}).get("tenant") if scope["type"] == "http" else None
        if tenant is not None:
            try:
                self.limits.admit(tenant)
            except RateLimited as exc:
                RATE_LIMITED.labels("http").inc()
                body = problem_of(exc)
                assert body is not None
                await as_response(body)(scope, receive, send)
                return
            if self.limits.rate_of(tenant) is not None:
                scope["state"]["charge"] = partial(self._charge, tenant)
        await self.app(scope, receive, send)

    def _charge(self, tenant: str, tokens: int) -> None:
        """The tenant's charge (:meth:`TenantLimits.charge`), its refusals counted as the others."""
        try:
            self.limits.charge(tenant, tokens)
        except RateLimited:
            RATE_LIMITED.labels("http").inc()
            raise
