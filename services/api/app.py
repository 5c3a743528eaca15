"""The HTTP API v1 (docs/http-api.md): the app factory. Commands publish events, queries read
projections; each resource's routes are a router of their own module."""

import asyncio
import contextlib
from collections.abc import AsyncIterator

from fastapi import FastAPI

from services.api import auditor_view, metrics, openapi
from services.api.asyncapi import router as asyncapi_router
from services.api.audit import router as audit_router
from services.api.auth import ApiKeyAuth
from services.api.body_timeout import BodyTimeout
from services.api.compaction import router as compaction_router
from services.api.context import router as context_router
from services.api.guards import BodyLimit, ContentEncoding, HeadAsGet, Utf8Path
from services.api.history import router as history_router
from services.api.hot import HotPaths
from services.api.keyring import KeyRing
from services.api.limits import TenantRateLimit
from services.api.log import router as log_router
from services.api.messages import router as messages_router
from services.api.operations import router as operations_router
from services.api.problems import CrashGuard, install
from services.api.search import router as search_router
from services.api.sessions import router as sessions_router
from services.api.strict_json import StrictJsonRoute
from services.bootstrap import Container, open_container
from services.requests.limits import limits_of
from services.settings import Settings

ROUTERS = (
    context_router,
    audit_router,
    sessions_router,
    messages_router,
    history_router,
    compaction_router,
    search_router,
    log_router,
    operations_router,
    asyncapi_router,
)


def build_app(settings: Settings, container: Container | None = None, keys: KeyRing | None = None) -> FastAPI:
    """The API; opens its own adapters from ``settings`` unless a container is injected; its keys
    are ``settings``' unless a ring is given (``chronicle api`` reloads that one on SIGHUP)."""
    keys = keys if keys is not None else KeyRing(settings.grants_by_key_hash())

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if container is not None:
            app.state.c = container
            yield
            return
        # (``chronicle api`` opens its container before the server starts and injects it:
        # services/ops/processes.py; this path serves an app built from settings alone)
        async with open_container(settings, warm_reads=True) as c:
            c.publisher.on_stored = metrics.published
            app.state.c = c
            yield

    # a JSON body without a Content-Type is taken as JSON; one declared as anything else is 415
    # (services/api/strict_json.py)
    app = FastAPI(title="Chronicle", version="1.0", lifespan=lifespan, strict_content_type=False)
    app.router.route_class = StrictJsonRoute  # every JSON body parsed strictly, before the route runs
    app.state.keys = keys
    app.state.stopping = asyncio.Event()  # set when the server stops: followed answers end (services/api/following.py)
    if container is not None:
        # every event its publisher has stored is counted, whichever route (or tool) wrote it
        container.publisher.on_stored = metrics.published
        app.state.c = container  # usable without running the lifespan (in-process clients)
    install(app)
    openapi.install(app)

    ops_key = settings.ops_key.get_secret_value() if settings.ops_key is not None else None
    if settings.api_hot_paths:
        app.add_middleware(HotPaths)  # inside the key check: the tenant is known
    app.add_middleware(BodyLimit, limit=settings.request_bytes_limit())  # before anything reads a body
    app.add_middleware(ContentEncoding)  # a coded body is refused unread
    app.add_middleware(Utf8Path)
    if (limits := limits_of(settings)) is not None:
        # before the hot paths (they are requests too); a body the limit refuses unread is not weighed
        app.add_middleware(TenantRateLimit, limits=limits, body_limit=settings.request_bytes_limit())
    app.add_middleware(ApiKeyAuth, keys=keys, ops_key=ops_key)
    app.add_middleware(HeadAsGet)  # HEAD is GET to every layer inside, without the body
    # every reader of a body inside: it must be whole in time, else 408 (services/api/body_timeout.py)
    app.add_middleware(
        BodyTimeout, timeout_s=settings.api_body_timeout_s, min_bytes_per_s=settings.api_body_min_bytes_per_s
    )
    app.add_middleware(CrashGuard)  # outermost: no error drops the connection

    for router in ROUTERS:
        app.include_router(router)
    auditor_view.install(app)
    return app
