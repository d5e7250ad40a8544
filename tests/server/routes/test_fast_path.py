"""Which requests the fast path takes (server/routes/fast_path.py); that it answers as
FastAPI does is tested end to end (tests/e2e/test_service.py, test_oip.py)."""

from __future__ import annotations

import asyncio

from server.routes.fast_path import FastPath


def _scope(method: str, path: str) -> dict:
    return {"type": "http", "method": method, "path": path, "root_path": "", "headers": []}


def test_a_route_with_the_models_name_in_its_path_is_found_with_its_name():
    fast = FastPath(app=None)
    scope = _scope("POST", "/v2/models/my-model/infer")
    route, validate = fast._named(scope)
    assert route.path == "/v2/models/{model_name}/infer" and validate is None
    assert scope["path_params"] == {"model_name": "my-model"}  # as FastAPI's routing puts it
    for method, path in (("POST", "/v2/models/my-model/ready"), ("POST", "/v2/models/infer"),
                         ("POST", "/v2/models/a/b/infer")):
        assert fast._named(_scope(method, path)) is None, path


def test_only_post_requests_are_taken():
    seen = []

    async def app(scope, receive, send):
        seen.append(scope["path"])

    fast = FastPath(app)
    for method, path in (("GET", "/v2/models/m/infer"), ("GET", "/v1/embed"),
                         ("POST", "/v2/models/m/ready")):
        asyncio.run(fast(_scope(method, path), None, None))
    assert seen == ["/v2/models/m/infer", "/v1/embed", "/v2/models/m/ready"]  # passed on
