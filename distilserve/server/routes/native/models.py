"""GET /v1/models (also /models, as Infinity serves it) and GET /v1/models/{id}."""

from __future__ import annotations

from fastapi import APIRouter, Request

from distilserve.server import errors
from distilserve.server.core.registry import named
from distilserve.server.routes.common import service

router = APIRouter(tags=["models"])


@router.get("/v1/models", responses=errors.responses(401))
@router.get("/models", responses=errors.responses(401))
async def list_models(request: Request):
    svc = service(request)
    return {"object": "list", "data": [described(svc, e) for e in svc.engines.values()]}


# 422: FastAPI would document its own error shape for the path parameter (never refused)
@router.get("/v1/models/{model_id:path}", responses=errors.responses(401, 404, 422))
async def get_model(model_id: str, request: Request):
    """The model of that name, or of that alias."""
    svc = service(request)
    return described(svc, named(svc, model_id))


def described(svc, engine) -> dict:
    """The model's description, with the aliases it answers to (if any)."""
    info = engine.describe()
    if names := sorted(alias for alias, model in svc.aliases().items() if model == engine.name):
        info["aliases"] = names
    return info
