"""Operator routes: liveness, readiness (503 with its reasons) and Prometheus metrics (always 200:
during an outage, the last known values and ``chronicle_backend_up`` say which backend is down)."""

from fastapi import APIRouter, Response
from fastapi.responses import JSONResponse, PlainTextResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from services.api import metrics
from services.api.deps import ContainerDep
from services.api.strict_json import StrictJsonRoute

router = APIRouter(route_class=StrictJsonRoute)


@router.get("/healthz")
async def healthz() -> dict[str, str]:
    return {"status": "ok"}


@router.get("/readyz", responses={503: {"description": "Not ready: `reasons` says why"}})
async def readyz(c: ContainerDep) -> JSONResponse:
    status = await metrics.readiness(c)
    return JSONResponse(status, status_code=200 if status["ready"] else 503)


@router.get("/metrics", response_class=PlainTextResponse)
async def prometheus(c: ContainerDep) -> Response:
    await metrics.refresh(c, work=True)
    return Response(generate_latest(metrics.REGISTRY), media_type=CONTENT_TYPE_LATEST)
