"""GET /v1/models."""

from __future__ import annotations

from fastapi import APIRouter, Request

from server.routes.common import service

router = APIRouter(tags=["models"])


@router.get("/v1/models")
async def list_models(request: Request):
    return {"object": "list",
            "data": [e.describe() for e in service(request).engines.values()]}
