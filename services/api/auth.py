"""The API key check: every ``/v1`` request names its tenant by its key; the ops key guards
the operator routes."""

import hmac

from starlette.types import ASGIApp, Receive, Scope, Send

from services.api.deps import tenant_for
from services.api.problems import from_error
from services.errors import ChronicleError, Unauthorized

OPS_PATHS = frozenset(
    {"/metrics", "/readyz", "/docs", "/docs/oauth2-redirect", "/redoc", "/openapi.json", "/asyncapi.yaml"}
)
"""Operator routes: they show every tenant's totals, so ``CHRONICLE_OPS_KEY`` guards them."""


class ApiKeyAuth:
    """Checks the API key before anything reads the body (a bad key is 401 whatever the body) and
    puts the tenant in the request state; with an ops key, the operator routes need it. Plain ASGI:
    no response buffering or copying."""

    def __init__(self, app: ASGIApp, keys: dict[str, str], ops_key: str | None = None) -> None:
        self.app = app
        self.keys = keys
        self.ops_key = ops_key

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and self.ops_key is not None and scope["path"] in OPS_PATHS:
            header = next((v for k, v in scope["headers"] if k == b"authorization"), b"")
            if not hmac.compare_digest(header, f"Bearer {self.ops_key}".encode()):
                await from_error(Unauthorized("this route needs 'Authorization: Bearer <ops key>'"))(
                    scope, receive, send
                )
                return
        if scope["type"] == "http" and scope["path"].startswith("/v1/"):
            header = next((v for k, v in scope["headers"] if k == b"authorization"), b"")
            try:
                tenant = tenant_for(self.keys, header.decode("latin-1"))
            except ChronicleError as exc:
                await from_error(exc)(scope, receive, send)
                return
            scope.setdefault("state", {})["tenant"] = tenant
        await self.app(scope, receive, send)
