"""Per-tenant request limits over HTTP (services/requests/limits.py): a tenant over its limit gets
``429 rate_limited`` with ``Retry-After`` before anything reads its request."""

from __future__ import annotations

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
        await self.app(scope, receive, send)
