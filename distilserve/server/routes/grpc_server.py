"""The gRPC port (DISTILSERVE_GRPC_PORT): one grpc.aio server beside the HTTP port, in the
same process (each worker's, sharing the port) and on the same event loop, serving

- the Open Inference Protocol, ``inference.GRPCInferenceService`` (KServe's V2 gRPC API,
  Triton's): distilserve/server/routes/oip/grpc_services.py;
- Text Embeddings Inference's API, ``tei.v1``'s Info, Embed, Predict, Rerank and
  Tokenize: distilserve/server/routes/tei/grpc_services.py;
- gRPC's health checking, ``grpc.health.v1.Health`` (Kubernetes' gRPC probes,
  grpc_health_probe, Envoy's and the load balancers' checks): Health, below;
- server reflection (grpcurl and Postman list and call the services without their
  .proto files).

The first two run the core's calls as the HTTP routes do
(distilserve/server/routes/grpc_calls.py): the same models, queue, limits and metrics (a
call counted under its method's path, ``/tei.v1.Embed/Embed``, with the HTTP status it
would have had). A refusal is its gRPC status (grpc_calls.CODES) with the same message;
its retry-after, where HTTP sends Retry-After, is trailing metadata. With
DISTILSERVE_API_KEY every call needs ``authorization: Bearer KEY`` metadata but the probes
(Health, the protocol's ServerLive and ServerReady) and reflection, which are public, as
/ready is. The key is checked before a message is read (Guard); a message that does not
decode is INVALID_ARGUMENT, logged in a line at most every LOG_EVERY seconds."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

import grpc
from fastapi import FastAPI
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from distilserve.server.core import registry
from distilserve.server.core.refusals import Refusal
from distilserve.server.errors import ApiError
from distilserve.server.middleware import ApiKey
from distilserve.server.routes.grpc_calls import refuse
from distilserve.server.service import Service
from distilserve.server.settings import Settings

log = logging.getLogger("distilserve")
WATCH_SECONDS = 1.0  # how often a health Watch looks at the service's state
LOG_EVERY = 10.0  # seconds between two log lines of undecodable messages


class Health(health_pb2_grpc.HealthServicer):
    """grpc.health.v1 for the services ``names`` (here and on Ray Serve): a service (``""``,
    the server, too) is SERVING while /ready would answer 200 and, for TEI's (each with its
    condition: tei_grpc.SERVING), a model that does what the service does is served;
    NOT_SERVING otherwise, and once the service shuts down. An unknown service is NOT_FOUND
    (Check) or SERVICE_UNKNOWN (Watch), as the protocol says."""

    def __init__(self, app: FastAPI, names: list[str]):
        from distilserve.server.routes.tei import grpc_services as tei_grpc

        self.app = app
        self.services: dict[str, Callable[[Service], bool]] = {
            name: tei_grpc.SERVING.get(name, lambda svc: True) for name in ["", *names]}

    async def status(self, name: str) -> int:
        if name not in self.services:
            return health_pb2.HealthCheckResponse.SERVICE_UNKNOWN
        svc = self.app.state.service
        ready = registry.unready(svc) is None  # as /ready's 200
        return (health_pb2.HealthCheckResponse.SERVING if ready and self.services[name](svc)
                else health_pb2.HealthCheckResponse.NOT_SERVING)

    async def Check(self, message, context: grpc.aio.ServicerContext):
        status = await self.status(message.service)
        if status == health_pb2.HealthCheckResponse.SERVICE_UNKNOWN:
            await context.abort(grpc.StatusCode.NOT_FOUND,
                                f"unknown service {message.service!r}; served: "
                                f"{', '.join(repr(s) for s in self.services)}")
        return health_pb2.HealthCheckResponse(status=status)

    async def Watch(self, message, context: grpc.aio.ServicerContext):
        """The service's status, and again whenever it changes (looked at every
        WATCH_SECONDS); the stream ends once the service shuts down, NOT_SERVING (so that
        the server's stop does not wait for it)."""
        last = None
        while True:
            status = await self.status(message.service)
            if status != last:
                yield health_pb2.HealthCheckResponse(status=status)
                last = status
            if self.app.state.service.draining:
                return
            await asyncio.sleep(WATCH_SECONDS)


class Guard(grpc.aio.ServerInterceptor):
    """Every call but those to the ``public`` methods (full names, ``/service/method``, or
    a service's, ``/service/``) needs the API key (when there is one), checked before its
    messages are read; the messages are decoded in the call, so that one that does not
    decode ends it INVALID_ARGUMENT (counted as a 400 under its method's path), not as
    grpc's UNKNOWN with a traceback logged."""

    def __init__(self, app: FastAPI, key: str | None, public: set[str]):
        self.app, self.key, self.public = app, key and key.encode(), public
        self.last_logged, self.unlogged = float("-inf"), 0
        self.decoding: dict[str, grpc.RpcMethodHandler] = {}  # by method, made once

    async def intercept_service(self, continuation, details: grpc.HandlerCallDetails):
        handler = await continuation(details)
        if handler is None or handler.request_deserializer is None:
            return handler
        method = details.method
        keyed = self.key is not None and method not in self.public \
            and method[:method.rfind("/") + 1] not in self.public
        if keyed and not ApiKey.accepts(self.key, dict(details.invocation_metadata or ()).get(
                "authorization", "")):
            return self._refusing(handler, method, ApiError(
                401, "unauthorized", "missing or wrong API key: send 'authorization: "
                "Bearer KEY' metadata"))
        if method not in self.decoding:
            self.decoding[method] = self._decoding(handler, method)
        return self.decoding[method]

    def _decoding(self, handler: grpc.RpcMethodHandler, method: str) -> grpc.RpcMethodHandler:
        """``handler`` taking its messages' bytes, decoded in the call (_decoded)."""
        decode, kind = handler.request_deserializer, _kind(handler)
        run = getattr(handler, kind)
        if handler.request_streaming:
            async def decoded(raws, context):
                async for raw in raws:
                    yield await self._decoded(decode, raw, method, context)

            if handler.response_streaming:
                async def call(raws, context):
                    async for answer in run(decoded(raws, context), context):
                        yield answer
            else:
                async def call(raws, context):
                    return await run(decoded(raws, context), context)
        elif handler.response_streaming:
            async def call(raw, context):
                async for answer in run(await self._decoded(decode, raw, method, context),
                                        context):
                    yield answer
        else:
            async def call(raw, context):
                return await run(await self._decoded(decode, raw, method, context), context)
        return handler._replace(request_deserializer=None, **{kind: call})

    async def _decoded(self, decode, raw: bytes, method: str, context):
        try:
            return decode(raw)
        except Exception as e:
            now = time.monotonic()
            if now - self.last_logged >= LOG_EVERY:
                log.warning("%s: a message that does not decode (%s: %s)%s", method,
                            type(e).__name__, e, f"; {self.unlogged} more since the last "
                            "such line" if self.unlogged else "")
                self.last_logged, self.unlogged = now, 0
            else:
                self.unlogged += 1
            self._count(method, 400)
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                f"the message is not a valid {method} request: it does not "
                                f"decode ({type(e).__name__})")

    def _count(self, method: str, status: int) -> None:
        self.app.state.service.metrics.observe_request(method, status, 0.0)

    def _refusing(self, handler, method: str, error: Refusal):
        async def refused(_, context):
            self._count(method, ApiError.of(error).status)
            await refuse(context, error)

        if handler.response_streaming:
            async def refused_stream(_, context):
                await refused(_, context)
                yield  # never reached: a stream's handler is an async generator
            return handler._replace(request_deserializer=None,
                                    **{_kind(handler): refused_stream})
        return handler._replace(request_deserializer=None, **{_kind(handler): refused})


def _kind(handler: grpc.RpcMethodHandler) -> str:
    """The field of ``handler`` that holds its behaviour: unary_unary, stream_stream, ..."""
    return (("stream" if handler.request_streaming else "unary") + "_"
            + ("stream" if handler.response_streaming else "unary"))


def _address(settings: Settings) -> str:
    host = f"[{settings.host}]" if ":" in settings.host else settings.host
    return f"{host}:{settings.grpc_port}"


async def start(app: FastAPI, settings: Settings) -> grpc.aio.Server:
    """The gRPC server of ``app`` on DISTILSERVE_GRPC_PORT, started (messages up to
    DISTILSERVE_MAX_BODY_BYTES; the workers of ``--workers N`` share the port)."""
    from distilserve.server.routes.oip import grpc_services as oip_grpc
    from distilserve.server.routes.tei import grpc_services as tei_grpc

    key = settings.bearer_key()
    public = {f"/{health_pb2.DESCRIPTOR.services_by_name['Health'].full_name}/",
              f"/{reflection.SERVICE_NAME}/",
              *(f"/{oip_grpc.Inference.SERVICE}/{m}" for m in oip_grpc.Inference.PUBLIC)}
    server = grpc.aio.server(interceptors=[Guard(app, key, public)], options=[
        ("grpc.max_receive_message_length", settings.max_body_bytes),
        ("grpc.max_send_message_length", -1),
        ("grpc.so_reuseport", int(settings.workers > 1))])
    names = [*oip_grpc.add(server, app, key), *tei_grpc.add(server, app, key)]
    health_pb2_grpc.add_HealthServicer_to_server(Health(app, names), server)
    reflection.enable_server_reflection(
        [*names, health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
         reflection.SERVICE_NAME], server)
    try:
        server.add_insecure_port(_address(settings))
    except RuntimeError as e:
        raise RuntimeError(f"cannot serve gRPC on {_address(settings)}: {e}") from None
    await server.start()
    return server
