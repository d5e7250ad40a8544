"""GET /v1/models and GET /v1/models/{id}."""

from __future__ import annotations

from fastapi import APIRouter, Request

from server.errors import ApiError
from server.routes.common import service

router = APIRouter(tags=["models"])


@router.get("/v1/models")
async def list_models(request: Request):
    return {"object": "list",
            "data": [e.describe() for e in service(request).engines.values()]}


@router.get("/v1/models/{model_id}")
async def get_model(model_id: str, request: Request):
    engine = service(request).engines.get(model_id)
    if engine is None:
        raise ApiError(404, "model_not_found", f"unknown model {model_id!r}; served: "
                       f"{', '.join(sorted(service(request).engines)) or 'none'}")
    return engine.describe()
