"""What the gRPC services share (distilserve/server/routes/grpc_server.py serves them): a
call runs the HTTP route's function (Rpcs.answer), with the same models, queue, limits
and metrics, and an error becomes the gRPC status of its HTTP one (CODES: google.rpc's
mapping), with the same message; Retry-After, where HTTP sends it, is trailing
metadata."""

from __future__ import annotations

import asyncio
import functools
import logging
import time

import grpc
from fastapi import FastAPI, Request

from distilserve.server import logs
from distilserve.server.connections import DISCONNECT, ClientWatch
from distilserve.server.core.refusals import Refusal
from distilserve.server.errors import ApiError
from distilserve.server.metrics import STARTED
from distilserve.server.middleware import ApiKey
from distilserve.server.routes.common import service
from distilserve.server.tracing import SPAN

log = logging.getLogger("distilserve")
# an HTTP status's gRPC code (google.rpc.Code's mapping to HTTP)
CODES = {400: grpc.StatusCode.INVALID_ARGUMENT, 401: grpc.StatusCode.UNAUTHENTICATED,
         404: grpc.StatusCode.NOT_FOUND, 413: grpc.StatusCode.INVALID_ARGUMENT,
         415: grpc.StatusCode.INVALID_ARGUMENT, 422: grpc.StatusCode.INVALID_ARGUMENT,
         429: grpc.StatusCode.RESOURCE_EXHAUSTED, 499: grpc.StatusCode.CANCELLED,
         501: grpc.StatusCode.UNIMPLEMENTED, 503: grpc.StatusCode.UNAVAILABLE}


def http_request(app: FastAPI, path: str) -> Request:
    """A Request of ``app`` for a call to ``path``, as an HTTP route's, so that the
    routes' functions run as they do for HTTP."""
    return Request({"type": "http", "app": app, "method": "POST", "path": path,
                    "headers": [], STARTED: time.perf_counter(),
                    "extensions": {DISCONNECT: ClientWatch()}})


async def refuse(context: grpc.aio.ServicerContext, refusal: Refusal):
    """Ends the call with ``refusal``'s gRPC status and message (its headers as trailing
    metadata)."""
    error = ApiError.of(refusal)
    await context.abort(CODES.get(error.status, grpc.StatusCode.INTERNAL), error.message,
                        tuple((k.lower(), v) for k, v in (error.headers or {}).items()))


class Rpcs:
    """What the services' servicers share: ``SERVICE``, the service's full name; ``PUBLIC``,
    its methods that need no API key (the probes: not traced either)."""

    SERVICE = ""
    PUBLIC: frozenset[str] = frozenset()

    def __init__(self, app: FastAPI, key: str | None):
        self.app, self.key = app, key and key.encode()

    async def answer(self, method: str, context: grpc.aio.ServicerContext, run):
        """``await run(request)``, ``request`` a Request of the app (http_request: with the
        same X-Request-Id rule), once the API key is checked; counted in the metrics under
        the method's path with the HTTP status it would have had, and a span where traced
        (DISTILSERVE_OTLP_ENDPOINT). Anything but a Refusal is logged and raised as a
        500's."""
        route = f"/{self.SERVICE}/{method}"
        sent = dict(context.invocation_metadata() or ())
        logs.REQUEST_ID.set(logs.request_id(sent.get("x-request-id", "")))
        request, status, counted = http_request(self.app, route), 500, False
        tracing = self.app.state.tracing if method not in self.PUBLIC else None
        if tracing is not None:  # (scope[SPAN]: where a model's run records its times)
            request.scope[SPAN] = span = tracing.start_rpc(self.SERVICE, method, sent)
        try:
            if self.key is not None and method not in self.PUBLIC \
                    and not ApiKey.accepts(self.key, sent.get("authorization", "")):
                raise ApiError(401, "unauthorized", "missing or wrong API key: send "
                               "'authorization: Bearer KEY' metadata")
            answer = await run(request)
            status = 200
            return answer
        except Refusal as e:
            status = ApiError.of(e).status
            raise
        except asyncio.CancelledError:  # the client went (or its deadline passed)
            status = 499
            raise
        except grpc.aio.AbortError:  # a message that does not decode (Guard counted it)
            status, counted = 400, True
            raise
        except Exception as e:
            log.exception("%s failed", route)
            raise ApiError(500, "internal_error", f"{type(e).__name__}: {e}") from e
        finally:
            if not counted:
                service(request).metrics.observe_request(
                    route, status, time.perf_counter() - request.scope[STARTED])
            if tracing is not None:
                code = grpc.StatusCode.OK if status == 200 else CODES.get(
                    status, grpc.StatusCode.INTERNAL)
                tracing.end_rpc(span, code.value[0], status)


def unary(method):
    """A servicer's method ``method(self, message, request, context)`` as the RPC of its
    name (Rpcs.answer's), a Refusal answered as its gRPC status."""
    @functools.wraps(method)
    async def rpc(self: Rpcs, message, context: grpc.aio.ServicerContext):
        try:
            return await self.answer(method.__name__, context, functools.partial(
                method, self, message, context=context))
        except Refusal as e:
            await refuse(context, e)

    return rpc
