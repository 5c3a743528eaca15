"""The API key check: every ``/v1`` request names its tenant by its key; a read-only key may only
read; the ops key guards the operator routes."""

import hmac
import re

from starlette.types import ASGIApp, Receive, Scope, Send

from services.api.deps import grant_for
from services.api.keyring import KeyRing
from services.api.problems import from_error
from services.errors import AmbiguousCredentials, ChronicleError, ReadOnlyKey, Unauthorized

OPS_PATHS = frozenset(
    {"/metrics", "/readyz", "/docs", "/docs/oauth2-redirect", "/redoc", "/openapi.json", "/asyncapi.yaml"}
)
"""Operator routes: they show every tenant's totals, so ``CHRONICLE_OPS_KEY`` guards them."""

READ_METHODS = frozenset({"GET", "HEAD"})
READ_ONLY_POSTS = re.compile(r"^/v1/sessions/[^/]+/(?:tools/(?:session_search|search_context)|messages:exists)$")
"""POSTs a read-only key may send: the tools that search and record nothing (a POST because the
tool route takes the LLM's arguments as its body; the other tools write: ``load_context`` records
the load), and ``messages:exists`` (a read whose id list fits no URL)."""
NOT_FOR_READ_ONLY = re.compile(r"^/v1/(?:sessions/[^/]+/data-key|nats)/?$")
"""Reads a read-only key may not make: a session's data key (key material, and made on first read)
and how to publish over NATS (a read-only key has no NATS identity)."""


def credential(scope: Scope) -> bytes:
    """The request's one ``Authorization`` header (empty when it has none). More than one is
    refused, never resolved: a proxy appending its own credentials, or a confused client, would
    otherwise act as whichever came first."""
    values = [v for k, v in scope["headers"] if k == b"authorization"]
    if len(values) > 1:
        raise AmbiguousCredentials(f"send one 'Authorization: Bearer <api key>' header: this request has {len(values)}")
    return values[0] if values else b""


def read_only_refusal(scope: Scope) -> ChronicleError | None:
    """Why a read-only key may not make this request; None when it may (a read that creates nothing)."""
    if scope["method"] not in READ_METHODS and not (scope["method"] == "POST" and READ_ONLY_POSTS.match(scope["path"])):
        return ReadOnlyKey(f"this API key only reads: {scope['method']} {scope['path']} needs a full key")
    if NOT_FOR_READ_ONLY.match(scope["path"]):
        return ReadOnlyKey(f"this API key only reads: GET {scope['path']} needs a full key")
    return None


class ApiKeyAuth:
    """Checks the API key before anything reads the body (a bad key, or more than one
    ``Authorization`` header, is 401 whatever the body) and puts the tenant in the request state;
    a read-only key's write is 403 before anything runs; with an ops key, the operator routes need
    it. The hot paths (services/api/hot.py) sit inside: they serve only a request it let through.
    The keys are the ring's as the request arrives (a reload swaps them for the next requests).
    Plain ASGI: no response buffering or copying."""

    def __init__(self, app: ASGIApp, keys: KeyRing, ops_key: str | None = None) -> None:
        self.app = app
        self.keys = keys
        self.ops_key = ops_key

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and self.ops_key is not None and scope["path"] in OPS_PATHS:
            try:
                if not hmac.compare_digest(credential(scope), f"Bearer {self.ops_key}".encode()):
                    raise Unauthorized("this route needs 'Authorization: Bearer <ops key>'")
            except ChronicleError as exc:
                await from_error(exc)(scope, receive, send)
                return
        if scope["type"] == "http" and scope["path"].startswith("/v1/"):
            try:
                tenant, read_only = grant_for(self.keys.grants, credential(scope).decode("latin-1"))
                if read_only and (refusal := read_only_refusal(scope)) is not None:
                    raise refusal
            except ChronicleError as exc:
                await from_error(exc)(scope, receive, send)
                return
            state = scope.setdefault("state", {})
            state["tenant"] = tenant
            if read_only:
                state["read_only"] = True
        await self.app(scope, receive, send)
