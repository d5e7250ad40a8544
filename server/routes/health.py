"""GET /health (alive), GET /ready (every model loaded and warmed), GET /metrics."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST

from server.errors import body
from server.routes.common import service

router = APIRouter(tags=["health"])


@router.get("/health")
async def health():
    return {"status": "ok"}


@router.get("/ready")
async def ready(request: Request):
    svc = service(request)
    if svc.ready and not svc.draining:
        return {"status": "ready", "models": sorted(svc.engines), "failed": svc.failures}
    if svc.draining:
        return JSONResponse(body("unavailable", "shutting down"), 503,
                            headers={"Retry-After": "2"})
    return JSONResponse({**body("unavailable", f"not ready yet: {svc.status}"),
                         "status": svc.status}, 503, headers={"Retry-After": "2"})


@router.get("/metrics")
async def metrics(request: Request):
    return Response(service(request).metrics.render(), media_type=CONTENT_TYPE_LATEST)
