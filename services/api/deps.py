"""Request dependencies shared by the API routers: the container, the tenant, common params."""

from typing import Annotated, Any

from fastapi import Depends, Header, Path, Query, Request
from pydantic import WithJsonSchema

from events import ids
from events import log as eventlog
from events.commands import ConfigJson as ConfigJson
from events.commands import MessageId
from events.commands import MessageJson as MessageJson
from events.commands import SessionId as SessionId
from events.validation import NO_NUL_PATTERN, PRINTABLE_ASCII_PATTERN
from projections import queries
from projections.search_query import MAX_QUERY_CHARS
from services.api.keyring import KeyRing
from services.bootstrap import Container
from services.errors import Unauthorized
from services.requests.checks import check_id as check_id
from services.requests.checks import no_nul as no_nul
from services.requests.limits import Charge
from services.settings import KeyGrant, hash_key
from services.writes.liveness import live_session


async def get_container(request: Request) -> Container:
    c: Container = request.app.state.c
    return c


def grant_for(keys: dict[str, KeyGrant], header: str) -> KeyGrant:
    """The tenant of an ``Authorization: Bearer`` header, and whether its key only reads (keys are
    kept as SHA-256)."""
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise Unauthorized("send 'Authorization: Bearer <api key>'")
    grant = keys.get(hash_key(token.strip()))
    if grant is None:
        raise Unauthorized("unknown API key")
    return grant


async def tenant_of(request: Request) -> str:
    """Set by the authentication middleware before the body is read."""
    tenant = getattr(request.state, "tenant", None)
    if tenant is None:
        keys: KeyRing = request.app.state.keys
        tenant = grant_for(keys.grants, request.headers.get("authorization", "")).tenant
    return str(tenant)


async def charge_of(request: Request) -> Charge | None:
    """The request's charge for the events it publishes past its first, set by the rate-limit
    middleware (services/api/limits.py); None when its tenant has no limit: nothing to count."""
    charge: Charge | None = getattr(request.state, "charge", None)
    return charge


def read_only(request: Request) -> bool:
    """Whether the request's key only reads (set by the authentication middleware)."""
    return bool(getattr(request.state, "read_only", False))


def key_digest(request: Request) -> str:
    """The SHA-256 of the request's API key, as ``CHRONICLE_API_KEYS`` names it."""
    _, _, token = request.headers.get("authorization", "").partition(" ")
    return hash_key(token.strip())


async def requester_of(request: Request) -> str:
    """Who a request's API key is, as an erasure records it: ``tenant:<t> key:<12 hex>``, the start
    of the key's SHA-256 as ``CHRONICLE_API_KEYS`` names it (keys have no other id)."""
    tenant = await tenant_of(request)
    return f"tenant:{tenant} key:{key_digest(request)[:12]}"


Tenant = Annotated[str, Depends(tenant_of)]
Requester = Annotated[str, Depends(requester_of)]
ContainerDep = Annotated[Container, Depends(get_container)]
ChargeDep = Annotated[Charge | None, Depends(charge_of)]
MAX_SEQ = 2**63 - 1
"""The largest stream sequence (or cursor) a query parameter may name."""
IDEMPOTENCY_KEY_MAX = 128
IDEMPOTENCY_KEY_PATTERN = PRINTABLE_ASCII_PATTERN
"""An ``Idempotency-Key`` header: 1 to 128 printable ASCII characters, no space."""


def idempotency_key(description: str) -> Any:
    """The ``Idempotency-Key`` header parameter (optional), described for its route."""
    return Header(
        alias="Idempotency-Key",
        min_length=1,
        max_length=IDEMPOTENCY_KEY_MAX,
        pattern=IDEMPOTENCY_KEY_PATTERN,
        description=description,
    )


MinSeq = Annotated[int | None, Query(ge=0, le=MAX_SEQ)]
SearchQuery = Annotated[str, Query(min_length=1, max_length=MAX_QUERY_CHARS, pattern=NO_NUL_PATTERN)]
Limit = Annotated[int, Query(ge=1, le=200)]

# Ids are checked by :func:`check_id` (``422 invalid_id``); these types only document the rules.
Sid = Annotated[str, Path(), WithJsonSchema(ids.SESSION_ID_SCHEMA)]
Mid = Annotated[str, Path(), WithJsonSchema(ids.MESSAGE_ID_SCHEMA)]
LeafId = Annotated[MessageId | None, Query()]
# Bodies the route validates itself (kept exactly as sent) are documented with the model's schema:
# ``x-model`` (events/commands.py's MessageJson, ConfigJson) becomes a reference to it in
# services/api/openapi.py.


async def caught_up(c: Container, tenant: str, sid: str, min_seq: int | None) -> None:
    """Read-your-writes for one session: wait until its events up to ``min_seq`` are applied."""
    if not min_seq or await c.waiter.session_applied(tenant, sid, min_seq):
        return
    last = await c.publisher.last_subject_seq(tenant, sid)
    await c.waiter.wait_session(tenant, sid, min(min_seq, last))


async def require_session(c: Container, tenant: str, sid: str) -> queries.SessionRow:
    """The live session, or ``404 session_not_found`` (never created for this tenant, or deleted),
    ``410 session_erased`` (erased).
    Reads call it only when their answer is empty, so the hot path gains no query."""
    async with c.pool.connection() as conn:
        row = await live_session(conn, tenant, sid, must_exist=True)
    assert row is not None
    return row


async def caught_up_all(c: Container, min_seq: int | None) -> None:
    """Read-your-writes for tenant-wide reads: wait until every projector has applied ``min_seq``,
    capped to the stream's last sequence (a ``min_seq`` beyond it cannot hang the read)."""
    if not min_seq or await c.waiter.all_applied(min_seq):
        return
    await c.waiter.wait_all(min(min_seq, await eventlog.last_seq(c.js, c.layout)))
