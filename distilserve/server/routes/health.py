"""GET /health (alive), GET /ready (every model loaded and warmed; also at / and /ping),
GET /metrics."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST

from distilserve.server import errors
from distilserve.server.core import registry
from distilserve.server.routes.common import service

router = APIRouter(tags=["health"])


# the probes answer HEAD too, as load balancers' health checks send it
PROBE = ["GET", "HEAD"]


@router.api_route("/health", methods=PROBE)
async def health():
    return {"status": "ok"}


READY = {503: {"model": errors.ErrorBody, "description": "still building or loading the "
               "models ('status' says what), shutting down, no model to serve, or (with "
               "DISTILSERVE_REQUIRE_ALL_MODELS) a model failed to load"}}


# also GET / and /ping: the health checks of TEI's clients and of SageMaker (which sends
# traffic to a container once its /ping answers 200)
@router.api_route("/ready", methods=PROBE, responses=READY)
@router.api_route("/ping", methods=PROBE, responses=READY)
@router.api_route("/", methods=PROBE, responses=READY)
async def ready(request: Request):
    """200 once every model folder has been loaded and warmed or has failed (failures are
    listed) and at least one is served; with DISTILSERVE_REQUIRE_ALL_MODELS, 503 while any
    failed."""
    svc = service(request)
    if svc.draining:
        return JSONResponse(errors.body("unavailable", "shutting down"), 503,
                            headers={"Retry-After": "2"})
    status = registry.unready(svc)
    if status is None:
        return {"status": "ready", "models": sorted(svc.engines), "failed": svc.failures}
    return JSONResponse({**errors.body("unavailable", f"not ready: {status}"),
                         "status": status}, 503, headers={"Retry-After": "2"})


# Response: no media type of its own, so the 401 stays JSON in the OpenAPI document
@router.get("/metrics", response_class=Response, responses={
    200: {"description": "Prometheus' text format",
          "content": {"text/plain": {"schema": {"type": "string"}}}},
    **errors.responses(401)})
async def metrics(request: Request):
    return Response(service(request).metrics.render(), media_type=CONTENT_TYPE_LATEST)
