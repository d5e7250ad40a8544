"""Triton's repository extension over the Open Inference Protocol: the repository index
(every model folder and its state) and, with DISTILSERVE_MODEL_CONTROL=explicit, its
models loaded and unloaded by request. The gRPC twins (distilserve/server/routes/oip/grpc_services.py)
run the same functions."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from pydantic import ValidationError

from distilserve.server import errors
from distilserve.server.core.refusals import Refusal
from distilserve.server.routes.common import service
from distilserve.server.routes.oip.schemas import (
    OipControlRequest,
    OipIndexRequest,
    OipRepositoryModel,
    inlined,
)

router = APIRouter(tags=["open inference protocol"])


@router.post("/v2/repository/index", response_model=list[OipRepositoryModel],
             responses=errors.responses(401, 422), openapi_extra={"requestBody": {
                 "required": False, "content": {"application/json": {
                     "schema": inlined(OipIndexRequest.model_json_schema())}}}})
async def repository_index(request: Request):
    """Triton's repository extension: every model folder and its state, READY (served) or
    UNAVAILABLE with the reason; with ``{"ready": true}``, the served ones alone. (Models
    are loaded and unloaded by the service itself, DISTILSERVE_POLL_SECONDS: there is no
    load or unload here.)"""
    body = await request.body()
    try:
        ready = OipIndexRequest.model_validate_json(body or b"{}").ready
    except ValidationError as e:
        raise errors.refused(e) from None
    return index(service(request), ready)


def index(svc, ready: bool) -> list[dict]:
    """The repository index: the served models, READY, and (unless ``ready``) the other
    folders, UNAVAILABLE with the reason: why they failed, or "unloaded" (unloaded by
    request, or added since the repository was read); by name."""
    models = [{"name": name, "state": "READY"} for name in svc.engines]
    if not ready:
        models += [{"name": name, "state": "UNAVAILABLE", "reason": why}
                   for name, why in svc.failures.items() if name not in svc.engines]
        models += [{"name": name, "state": "UNAVAILABLE", "reason": UNLOADED}
                   for name in svc.unloaded()]
    return sorted(models, key=lambda m: m["name"])


UNLOADED = "unloaded"
CONTROLLED = errors.responses(400, 401, 404, 422, 503)


@router.post("/v2/repository/models/{model_name}/load", response_model=OipRepositoryModel,
             responses=CONTROLLED)
async def load(model_name: str, request: Request):
    """Triton's model control (DISTILSERVE_MODEL_CONTROL=explicit): the repository's
    folder of that name loaded and served (again: it takes the place of the one served);
    a config or files sent in the body (Triton's overrides) are refused."""
    state = await loaded(service(request), model_name, (await _control_body(request)).parameters)
    return JSONResponse(state)  # (a Response: the fast path takes every POST of a model)


@router.post("/v2/repository/models/{model_name}/unload", response_model=OipRepositoryModel,
             responses=CONTROLLED)
async def unload(model_name: str, request: Request):
    """Triton's model control (DISTILSERVE_MODEL_CONTROL=explicit): that model no longer
    served, what was queued for it answered first (``unload_dependents``: it has none)."""
    await _control_body(request)
    return JSONResponse(await unloaded(service(request), model_name))


async def loaded(svc, name: str, parameters: dict) -> dict:
    """The load of the model ``name`` (``parameters``: the request's, which would override
    the folder's files: refused), and its state after it (also gRPC's
    RepositoryModelLoad)."""
    if parameters:
        raise Refusal("invalid", f"parameters {', '.join(parameters)}: a model's "
                      "configuration or files by request are not served; the "
                      "repository's folder is loaded as it is")
    await svc.load(name)
    return {"name": name, "state": "READY"}


async def unloaded(svc, name: str) -> dict:
    """The unload of the model ``name``, and its state after it (also gRPC's
    RepositoryModelUnload)."""
    await svc.unload(name)
    return {"name": name, "state": "UNAVAILABLE", "reason": UNLOADED}


async def _control_body(request: Request) -> OipControlRequest:
    try:
        return OipControlRequest.model_validate_json(await request.body() or b"{}")
    except ValidationError as e:
        raise errors.refused(e) from None
