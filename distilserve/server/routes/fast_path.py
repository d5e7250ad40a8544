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

import json

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


def _kind(d) -> str | None:
    """What a POST route takes, as FastAPI read it (its ``dependant``): "body", a body and
    the request; "named", path parameters with the model's name and the request; "request",
    the request alone (FastAPI's: it runs no model); None, anything else."""
    if (d.query_params or d.header_params or d.cookie_params or d.dependencies
            or d.request_param_name is None or len(d.body_params) > 1):
        return None
    names = [p.name for p in d.path_params]
    if d.body_params:
        return None if names else "body"
    if names:
        return "named" if "model_name" in names else None
    return "request"


class FastPath:
    def __init__(self, app, routes: list):
        """``routes``: the app's. It takes their POST routes as FastAPI reads them (their
        ``dependant``): one with a body and the request, f(body, request), whose body it
        validates with FastAPI's own field; one with the model's name in its path and the
        request, f(model_name, (its version,) request), which reads its own body. One that
        takes the request alone (it runs no model) it leaves to FastAPI."""
        self.app = app
        # path -> FastAPI's route (the metrics read its label from it) and its body's field
        self.routes, self.named = {}, []
        for route in (r for r in routes if "POST" in getattr(r, "methods", ())):
            kind = _kind(route.dependant)
            if kind == "body":
                self.routes[route.path] = route, route.dependant.body_params[0]
            elif kind == "named":
                self.named.append(route)
            elif kind is None:
                raise TypeError(f"POST {route.path}: the fast path takes f(body, request) "
                                f"or f(model_name, <the path's other parameters>, request), "
                                f"FastAPI f(request)")

    def _named(self, scope) -> tuple | None:
        """The route of ``named`` whose path this is (its path parameters put in the
        scope, as FastAPI's routing does), and None for its body (it reads its own)."""
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
        route, field = entry
        scope["route"] = route
        request = Request(scope, receive)
        try:
            raw = await request.body()
        except HTTPException as e:  # the body limit, passed while reading a chunked body
            return await errors.http_error(e)(scope, receive, send)
        except ClientDisconnect:  # gone before its body arrived
            return await errors.api_error(client_closed())(scope, receive, send)
        taken = {route.dependant.request_param_name: request}
        if field is None:  # the route reads the body itself (the request keeps it)
            return await self._answer(route.endpoint(**scope["path_params"], **taken),
                                      scope, receive, send)
        try:
            parsed = json.loads(raw)
        except (ValueError, RecursionError) as e:  # JSONDecodeError, UnicodeDecodeError too
            response = errors.api_error(errors.ApiError(422, "invalid_request", errors.unparseable(e)))
            return await response(scope, receive, send)
        try:
            body, problems = field.validate(parsed)
        except Exception:  # nested too deep to validate: FastAPI says why
            problems = True
        if problems:  # FastAPI's own 422
            return await self.app(scope, replay(raw, receive), send)
        await self._answer(route.endpoint(**{field.name: body}, **taken), scope, receive, send)

    @staticmethod
    async def _answer(answering, scope, receive, send) -> None:
        """Sends the route's response, or the one FastAPI's handler gives its Refusal."""
        try:
            response = await answering
        except Refusal as e:
            response = errors.api_error(e)
        await response(scope, receive, send)
