"""The inference routes (the POST routes that run a model: /v1/embeddings, /v1/embed,
/v1/classify, /v1/ner, /v1/rerank, /v1/tokenize, TEI's, and the Open Inference Protocol's
infer) without FastAPI's per-request machinery.

Requests come hundreds a second, often one short text each, and FastAPI's routing,
dependency solving and exception middleware cost a large share of the event loop's time
per request (the results pages have the measurement); on a few cores
that time is taken from the model. This ASGI middleware answers the inference routes
itself, with the same pydantic request models, the same route functions and the same
error responses (distilserve/server/errors.py), inside the app's own middlewares (API key, body
limit, metrics). FastAPI still documents them (/docs) and serves every other route. A
request the fast path does not take (another method, a Content-Type other than JSON) and
a body that does not validate go on to FastAPI, so that those errors are FastAPI's own;
the errors the route functions raise get the response FastAPI's handler gives them
(errors.api_error). A body that is not JSON at all (not UTF-8, a number of thousands of
digits, nesting too deep for the parser) is answered here: 422, where FastAPI would say
400.
"""

from __future__ import annotations

import inspect
import json
from typing import get_type_hints

from pydantic import TypeAdapter
from starlette.datastructures import Headers
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.routing import Match

from distilserve.server import errors
from distilserve.server.core.inference import client_closed
from distilserve.server.core.refusals import Refusal


def replay(body: bytes, receive):
    """``receive`` for the next app: the body already read, then the connection's events."""
    first = True

    async def replay():
        nonlocal first
        if first:
            first = False
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay


class FastPath:
    def __init__(self, app, routes: list):
        """``routes``: the app's. It takes their POST routes, each f(body, request) (the
        body validated here) or, with the model's name in its path, f(model_name, (its
        version,) request) (the route reads its own body); one that runs no model,
        f(request), it leaves to FastAPI."""
        self.app = app
        # path -> FastAPI's route (the metrics read its label from it) and what validates
        # its body (a model, or a union of them: TypeAdapter)
        self.routes, self.named = {}, []
        for route in (r for r in routes if "POST" in getattr(r, "methods", ())):
            parameters = list(inspect.signature(route.endpoint).parameters)
            if parameters == ["body", "request"]:
                body = get_type_hints(route.endpoint, include_extras=True)["body"]
                self.routes[route.path] = route, TypeAdapter(body).validate_python
            elif parameters[-1:] == ["request"] and "model_name" in parameters \
                    and set(parameters[:-1]) == set(route.param_convertors):
                self.named.append(route)
            elif parameters != ["request"]:  # f(request): FastAPI's (no model runs)
                raise TypeError(f"POST {route.path}: the fast path takes f(body, request) "
                                f"or f(model_name, <the path's other parameters>, request), "
                                f"FastAPI f(request), not f({', '.join(parameters)})")

    def _named(self, scope) -> tuple | None:
        """The route of ``named`` whose path this is (its path parameters put in the
        scope, as FastAPI's routing does), and None for what validates its body."""
        for route in self.named:
            match, child = route.matches(scope)
            if match is Match.FULL:
                scope.update(child)
                return route, None
        return None

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["method"] != "POST":
            return await self.app(scope, receive, send)
        entry = self.routes.get(scope["path"]) or self._named(scope)
        if entry is None or not errors.json_content_type(Headers(scope=scope)):
            return await self.app(scope, receive, send)
        route, validate = entry
        scope["route"] = route
        request = Request(scope, receive)
        try:
            raw = await request.body()
        except HTTPException as e:  # the body limit, passed while reading a chunked body
            return await errors.http_error(e)(scope, receive, send)
        except ClientDisconnect:  # gone before its body arrived
            return await errors.api_error(client_closed())(scope, receive, send)
        if validate is None:  # the route reads the body itself (the request keeps it)
            return await self._answer(route.endpoint(**scope["path_params"], request=request),
                                      scope, receive, send)
        try:
            parsed = json.loads(raw)
        except (ValueError, RecursionError) as e:  # JSONDecodeError, UnicodeDecodeError too
            response = errors.api_error(errors.ApiError(422, "invalid_request", errors.unparseable(e)))
            return await response(scope, receive, send)
        try:
            body = validate(parsed)
        except Exception:  # invalid, or nested too deep to validate: FastAPI says why
            return await self.app(scope, replay(raw, receive), send)
        await self._answer(route.endpoint(body, request), scope, receive, send)

    @staticmethod
    async def _answer(answering, scope, receive, send) -> None:
        """Sends the route's response, or the one FastAPI's handler gives its Refusal."""
        try:
            response = await answering
        except Refusal as e:
            response = errors.api_error(e)
        await response(scope, receive, send)
