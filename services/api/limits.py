"""Per-tenant request limits over HTTP (services/requests/limits.py): a tenant over its limit gets
``429 rate_limited`` with ``Retry-After`` before anything reads its request. A request of a limited
tenant carries its charge (``scope["state"]["charge"]``, a
:class:`services.requests.limits.RequestCharge`) for the routes that publish more than one event (a
batch, a fork: :func:`services.api.deps.charge_of`), and its body is weighed: a declared
``Content-Length`` before anything is read (over what the bucket may owe: ``429``, the body never
read), a body of unknown length (chunked) as it arrives (refused part-way the same, the app's own
answer to the body it could not read replaced by the ``429``)."""

from __future__ import annotations

from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

from services.api.guards import CountedReceive, Refusal, chunked, content_codings, declared_length
from services.api.metrics import RATE_LIMITED
from services.api.problems import as_response
from services.errors import RateLimited
from services.requests.limits import RequestCharge, TenantLimits
from services.requests.problems import problem_of


def _refused(exc: RateLimited, unread: bool = False) -> Response:
    """The ``429`` of a refusal, counted; ``unread``: a body is left unread (weighed, refused), so
    the connection is closed after it, as a ``413``'s is (the client stops sending it)."""
    RATE_LIMITED.labels("http").inc()
    body = problem_of(exc)
    assert body is not None
    response = as_response(body)
    if unread:
        response.headers["Connection"] = "close"
    return response


class TenantRateLimit:
    """ASGI middleware inside the key check (the tenant is known): counts each ``/v1`` request
    against its tenant's bucket, weighs its body, and refuses the ones over the limit."""

    def __init__(self, app: ASGIApp, limits: TenantLimits, body_limit: int | None = None) -> None:
        self.app = app
        self.limits = limits
        self.body_limit = body_limit  # a declared body over it is refused unread (413): never weighed

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        tenant = scope.get("state", {}).get("tenant") if scope["type"] == "http" else None
        if tenant is None:
            await self.app(scope, receive, send)
            return
        headers = scope.get("headers", [])
        declared = declared_length(headers)
        weighed = declared if declared and self._readable(scope["method"], declared, headers) else None
        try:
            self.limits.admit(tenant)
        except RateLimited as exc:
            await _refused(exc)(scope, receive, send)
            return
        charge = self.limits.charger(tenant)
        if charge is not None and weighed:
            try:
                charge.weigh(weighed)  # before the body is read: the server reads no more than that
            except RateLimited as exc:
                await _refused(exc, unread=True)(scope, receive, send)
                return
        if charge is None:
            await self.app(scope, receive, send)
            return
        scope["state"]["charge"] = _Counted(charge)
        if weighed and charge.weight > 1:  # a weight past the admission's token: given back if unread
            await self._read_as_weighed(scope, receive, send, charge, weighed)
            return
        if declared is not None or not chunked(scope.get("headers", [])):
            await self.app(scope, receive, send)
            return
        await self._weighed_as_it_arrives(scope, receive, send, charge)

    async def _read_as_weighed(
        self, scope: Scope, receive: Receive, send: Send, charge: RequestCharge, weighed: int
    ) -> None:
        """The app, a body weighed before it was read: what it did not read of it is given back
        when it ends (a route refusing unread, ``404``/``405``/``422`` on its path, or a client
        gone mid-body), so a length claimed, never sent, leaves no debt."""
        counted = CountedReceive(receive)
        try:
            await self.app(scope, counted, send)
        finally:
            if counted.received < weighed:
                charge.read(counted.received)

    def _readable(self, method: str, declared: int, headers: list[tuple[bytes, bytes]]) -> bool:
        """Whether a declared body may be read, so weighed before it is: not one that is refused
        unread (over the body limit: ``413``; sent with a content coding: ``415``), nor a ``GET``'s
        (no route reads one). A declared length costs nothing by itself: weighing what a head
        claimed (``Content-Length: 10**30``) put the tenant in debt for good, a read-only key's
        request too."""
        if method in ("GET", "HEAD") or content_codings(headers):
            return False
        return self.body_limit is None or declared <= self.body_limit

    async def _weighed_as_it_arrives(self, scope: Scope, receive: Receive, send: Send, charge: RequestCharge) -> None:

        def refuse(received: int) -> Response | None:
            try:
                charge.weigh(received)
            except RateLimited as exc:
                return _refused(exc, unread=True)
            return None

        await Refusal().run_counted(self.app, scope, receive, send, refuse)


class _Counted:
    """A route's charge (:class:`RequestCharge`), its refusals counted as the middleware's."""

    def __init__(self, charge: RequestCharge) -> None:
        self._charge = charge

    def __call__(self, tokens: int) -> None:
        try:
            self._charge(tokens)
        except RateLimited:
            RATE_LIMITED.labels("http").inc()
            raise
