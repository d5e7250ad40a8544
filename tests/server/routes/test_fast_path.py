"""Which requests the fast path takes (distilserve/server/routes/fast_path.py); that it answers as
FastAPI does is tested end to end (tests/e2e/test_service.py, test_oip.py)."""

from __future__ import annotations

import asyncio

import pytest
from fastapi import APIRouter

from distilserve.server.routes.fast_path import FastPath
from distilserve.server.routes.native import embed
from distilserve.server.routes.oip import http_routes as oip

ROUTES = [*embed.router.routes, *oip.router.routes]  # GET routes too: passed over


def _scope(method: str, path: str) -> dict:
    return {"type": "http", "method": method, "path": path, "root_path": "", "headers": []}


def test_a_route_with_the_models_name_in_its_path_is_found_with_its_name():
    fast = FastPath(app=None, routes=ROUTES)
    scope = _scope("POST", "/v2/models/my-model/infer")
    route, validate = fast._named(scope)
    assert route.path == "/v2/models/{model_name}/infer" and validate is None
    assert scope["path_params"] == {"model_name": "my-model"}  # as FastAPI's routing puts it
    # and at a version's path, the version with it
    scope = _scope("POST", "/v2/models/my-model/versions/1/infer")
    route, _ = fast._named(scope)
    assert route.path == "/v2/models/{model_name}/versions/{model_version}/infer"
    assert scope["path_params"] == {"model_name": "my-model", "model_version": "1"}
    for method, path in (("POST", "/v2/models/my-model/ready"), ("POST", "/v2/models/infer"),
                         ("POST", "/v2/models/a/b/infer")):
        assert fast._named(_scope(method, path)) is None, path


def test_only_post_requests_are_taken():
    seen = []

    async def app(scope, receive, send):
        seen.append(scope["path"])

    fast = FastPath(app, routes=ROUTES)
    for method, path in (("GET", "/v2/models/m/infer"), ("GET", "/v1/embed"),
                         ("POST", "/v2/models/m/ready")):
        asyncio.run(fast(_scope(method, path), None, None))
    assert seen == ["/v2/models/m/infer", "/v1/embed", "/v2/models/m/ready"]  # passed on


def test_it_takes_every_post_route_of_the_kinds_it_answers_and_refuses_another():
    fast = FastPath(app=None, routes=ROUTES)
    assert set(fast.routes) == {"/v1/embeddings", "/embeddings", "/v1/embed"}
    router = APIRouter()

    @router.post("/odd")
    async def odd(request, text: str):  # neither f(body, request) nor f(model_name, request)
        return text

    @router.post("/v2/models/{model_name}/odd")
    async def unnamed(model_name: str, other: str, request):  # other: not in its path
        return other

    for route in router.routes:
        with pytest.raises(TypeError, match=f"POST {route.path}: the fast path takes"):
            FastPath(app=None, routes=[route])
