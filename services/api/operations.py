"""Operator routes: liveness, readiness (503 with its reasons) and Prometheus metrics (always 200:
during an outage, the last known values and ``chronicle_backend_up`` say which backend is down)."""

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse, PlainTextResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from services.api import metrics
from services.api.deps import ContainerDep
from services.api.strict_json import StrictJsonRoute
from services.bootstrap import Container

router = APIRouter(route_class=StrictJsonRoute)


@router.get("/healthz", responses={503: {"description": "The process cannot recover by itself: restart it"}})
async def healthz(request: Request) -> JSONResponse:
    """Liveness: ``ok`` unless the process's NATS connection is closed for good (the client gives
    up after a protocol error the server answered by closing it, such as a message over its
    ``max_payload``); reconnecting is not closed (``/readyz`` says not ready then). A liveness
    probe that restarts the process on 503 brings its writes back."""
    c: Container | None = getattr(request.app.state, "c", None)  # none yet: alive, nothing to say
    if c is not None and c.nc.is_closed:
        return JSONResponse(
            {"status": "nats_closed", "detail": "the NATS connection is closed: restart the process"}, 503
        )
    return JSONResponse({"status": "ok"})


@router.get("/readyz", responses={503: {"description": "Not ready: `reasons` says why"}})
async def readyz(c: ContainerDep) -> JSONResponse:
    status = await metrics.readiness(c)
    return JSONResponse(status, status_code=200 if status["ready"] else 503)


@router.get("/metrics", response_class=PlainTextResponse)
async def prometheus(c: ContainerDep) -> Response:
    await metrics.refresh(c, work=True)
    return Response(generate_latest(metrics.REGISTRY), media_type=CONTENT_TYPE_LATEST)
