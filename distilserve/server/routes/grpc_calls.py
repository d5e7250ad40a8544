"""What the gRPC services share (distilserve/server/routes/grpc_server.py serves them): a
call is the core's Call (Rpcs.answer), run on the same models, queue, limits and metrics
as an HTTP request; a refusal becomes its gRPC status (CODES), with the same message, and
its retry-after the trailing metadata HTTP's header would be."""

from __future__ import annotations

import asyncio
import functools
import logging
import time

import grpc
from fastapi import FastAPI

from distilserve.server import logs
from distilserve.server.core.inference import Call
from distilserve.server.core.refusals import Refusal
from distilserve.server.errors import ApiError
from distilserve.server.middleware import ApiKey

log = logging.getLogger("distilserve")
# the core's refusals' gRPC codes (core/refusals.py's REASONS)
CODES = {"not_found": grpc.StatusCode.NOT_FOUND, "wrong_task": grpc.StatusCode.INVALID_ARGUMENT,
         "ambiguous": grpc.StatusCode.INVALID_ARGUMENT,
         "bad_request": grpc.StatusCode.INVALID_ARGUMENT,
         "invalid": grpc.StatusCode.INVALID_ARGUMENT,
         "too_large": grpc.StatusCode.INVALID_ARGUMENT,
         "input_too_long": grpc.StatusCode.INVALID_ARGUMENT,
         "not_finite": grpc.StatusCode.INVALID_ARGUMENT,
         "overloaded": grpc.StatusCode.RESOURCE_EXHAUSTED,
         "unavailable": grpc.StatusCode.UNAVAILABLE,
         "client_closed": grpc.StatusCode.CANCELLED}
# a refusal said in HTTP's words (ApiError), by its status: google.rpc.Code's mapping
HTTP_CODES = {400: grpc.StatusCode.INVALID_ARGUMENT, 401: grpc.StatusCode.UNAUTHENTICATED,
              404: grpc.StatusCode.NOT_FOUND, 413: grpc.StatusCode.INVALID_ARGUMENT,
              415: grpc.StatusCode.INVALID_ARGUMENT, 422: grpc.StatusCode.INVALID_ARGUMENT,
              429: grpc.StatusCode.RESOURCE_EXHAUSTED, 499: grpc.StatusCode.CANCELLED,
              501: grpc.StatusCode.UNIMPLEMENTED, 503: grpc.StatusCode.UNAVAILABLE}


def code(refusal: Refusal) -> grpc.StatusCode:
    """The gRPC status code of a refusal."""
    if isinstance(refusal, ApiError):
        return HTTP_CODES.get(refusal.status, grpc.StatusCode.INTERNAL)
    return CODES.get(refusal.reason, grpc.StatusCode.INTERNAL)


async def refuse(context: grpc.aio.ServicerContext, refusal: Refusal):
    """Ends the call with ``refusal``'s gRPC status and message (its retry-after as
    trailing metadata)."""
    retry = () if refusal.retry_after is None else (("retry-after", str(refusal.retry_after)),)
    await context.abort(code(refusal), refusal.message, retry)


class Rpcs:
    """What the services' servicers share: ``SERVICE``, the service's full name; ``PUBLIC``,
    its methods that need no API key (the probes: not traced either)."""

    SERVICE = ""
    PUBLIC: frozenset[str] = frozenset()

    def __init__(self, app: FastAPI, key: str | None):
        self.app, self.key = app, key and key.encode()

    @property
    def service(self):
        return self.app.state.service

    async def answer(self, method: str, context: grpc.aio.ServicerContext, run):
        """``await run(call)``, ``call`` the core's Call (its X-Request-Id as HTTP's), once
        the API key is checked; counted in the metrics under the method's path with the
        HTTP status it would have had, and a span where traced (DISTILSERVE_OTLP_ENDPOINT).
        Anything but a Refusal is logged and raised as a 500's."""
        route = f"/{self.SERVICE}/{method}"
        sent = dict(context.invocation_metadata() or ())
        logs.REQUEST_ID.set(logs.request_id(sent.get("x-request-id", "")))
        status, said, counted = 500, grpc.StatusCode.INTERNAL, False
        tracing = self.app.state.tracing if method not in self.PUBLIC else None
        span = None if tracing is None else tracing.start_rpc(self.SERVICE, method, sent)
        call = Call(self.service, span=span)  # (the task is cancelled if the client goes)
        try:
            if self.key is not None and method not in self.PUBLIC \
                    and not ApiKey.accepts(self.key, sent.get("authorization", "")):
                raise ApiError(401, "unauthorized", "missing or wrong API key: send "
                               "'authorization: Bearer KEY' metadata")
            answer = await run(call)
            status, said = 200, grpc.StatusCode.OK
            return answer
        except Refusal as e:
            status, said = ApiError.of(e).status, code(e)
            raise
        except asyncio.CancelledError:  # the client went (or its deadline passed)
            status, said = 499, grpc.StatusCode.CANCELLED
            raise
        except grpc.aio.AbortError:  # a message that does not decode (Guard counted it)
            status, said, counted = 400, grpc.StatusCode.INVALID_ARGUMENT, True
            raise
        except Exception as e:
            log.exception("%s failed", route)
            raise ApiError(500, "internal_error", f"{type(e).__name__}: {e}") from e
        finally:
            if not counted:
                call.service.metrics.observe_request(route, status,
                                                     time.perf_counter() - call.started)
            if tracing is not None:
                tracing.end_rpc(span, said.value[0], status)


def unary(method):
    """A servicer's method ``method(self, message, call, context)`` as the RPC of its
    name (Rpcs.answer's), a Refusal answered as its gRPC status."""
    @functools.wraps(method)
    async def rpc(self: Rpcs, message, context: grpc.aio.ServicerContext):
        try:
            return await self.answer(method.__name__, context, functools.partial(
                method, self, message, context=context))
        except Refusal as e:
            await refuse(context, e)

    return rpc
