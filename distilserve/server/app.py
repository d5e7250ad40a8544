"""create_app(settings): the FastAPI application. Its lifespan loads the model repository
in the background, building the embedded default first when no repository is named (the
port is open meanwhile: /health answers, /ready says what is being built or loaded and
turns 200 when done), with DISTILSERVE_POLL_SECONDS keeps serving the repository as it
changes, and drains the queues on shutdown."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import threading
import warnings
from contextlib import asynccontextmanager
from pathlib import Path

from fastapi import FastAPI
from fastapi_offline import FastAPIOffline
from pydantic.json_schema import models_json_schema
from starlette.middleware.cors import CORSMiddleware

from distilserve.server import errors
from distilserve.server.connections import METRICS
from distilserve.server.engine_process import front_end
from distilserve.server.engine_process.supervisor import ENGINE_SOCKET
from distilserve.server.metrics import Metrics
from distilserve.server.middleware import ApiKey, BodyLimit, Decompress, Gzip, RequestId, RequestMetrics
from distilserve.server.routes import health
from distilserve.server.routes.cohere import http_routes as cohere
from distilserve.server.routes.fast_path import FastPath
from distilserve.server.routes.native import classify, embed, fill_mask, ner, qa, rerank, tokenize
from distilserve.server.routes.native import models as models_route
from distilserve.server.routes.oip import errors as oip_errors
from distilserve.server.routes.oip import http_routes as oip
from distilserve.server.routes.oip import repository as oip_repository
from distilserve.server.routes.tei import http_routes as tei
from distilserve.server.routes.vllm import http_routes as vllm
from distilserve.server.service import Service, build_and_load
from distilserve.server.settings import Settings
from distilserve.server.tracing import Tracing

log = logging.getLogger("distilserve")
# the response headers a web page's script may read, where CORS lets it call the service:
# the timing headers (server/routes/common.reply), Retry-After and X-Request-Id
EXPOSED = ["x-total-time", "x-compute-time", "x-tokenization-time", "x-queue-time",
           "x-inference-time", "x-compute-tokens", "x-compute-characters", "x-compute-type",
           "server-timing", "retry-after", "x-request-id"]


def create_app(settings: Settings | None = None, repository: Path | None = None,
               loader=None, load_first: bool = False) -> FastAPI:
    """The service. Its lifespan loads the repository (None: the embedded default), or
    runs ``await loader(service)`` instead (the Ray Serve ingress: distilserve/server/ray_serve.py):
    while the port takes connections (/health answers, /ready says when it is done), or
    with ``load_first`` before (a worker of several: app_from_environment)."""
    settings = settings or Settings()
    repository = repository or settings.model_repository  # None: the embedded default
    tracing = Tracing(  # the probes and /metrics: no spans
        settings.otlp_endpoint, settings.otlp_service_name, ApiKey.PUBLIC | {"/metrics"}
    ) if settings.otlp_endpoint else None

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        put_back = settings.tune_interpreter()  # for serving; Python's own, at the end
        service = Service(settings, Metrics())
        app.state.service, app.state.tracing = service, tracing  # (tracing: gRPC's too)
        loading = asyncio.create_task(loader(service) if loader else build_and_load(
            service, Path(repository) if repository else None))
        if load_first:
            await loaded_or_stopped(loading)
        grpc_server = None
        if settings.grpc_port is not None:  # the gRPC APIs too (OIP's, TEI's, health)
            from distilserve.server.routes import grpc_server as grpc_port

            grpc_server = await grpc_port.start(app, settings)
        yield {METRICS: service.metrics}  # the lifespan's state: the connections' too
        service.draining = True
        if grpc_server is not None:  # its calls in flight answered (new ones: refused)
            await grpc_server.stop(grace=30)
        loading.cancel()
        await asyncio.gather(loading, return_exceptions=True)
        for engine in service.engines.values():
            await engine.stop()
        service.cpu_thread.shutdown(wait=False)
        if tracing:
            tracing.shutdown()  # the spans not sent yet
        put_back()

    # FastAPI's own OpenTelemetry hooks look up the providers on every request (a tenth
    # of the event loop's time under load); /metrics is Prometheus
    # FastAPIOffline: /docs and /redoc load their scripts and styles from this service
    # (fastapi-offline's copies), not from a CDN, so they work without internet
    app = FastAPIOffline(title="distilserve", version="0.1.0", lifespan=lifespan,
                  description="Embeddings, classification and NER from compact encoders.",
                  telemetry={"tracing": False, "metrics": False, "logs": False})
    errors.install(app)

    key = settings.bearer_key()
    document(app, keyed=bool(key))
    routers = (embed.router, classify.router, ner.router, qa.router, fill_mask.router,
               rerank.router, tokenize.router, tei.router, oip.router, oip_repository.router, cohere.router,
               vllm.router,
               models_route.router,
               health.router)
    routes = [r for router in routers for r in router.routes]
    # the inference routes (the POST routes that run a model), without FastAPI's stack
    app.add_middleware(FastPath, routes=routes)
    if settings.compress_min_bytes:  # outside the fast path: its answers too. Level 1:
        # nearly level 9's ratio on JSON numbers for a small part of its time; Triton's
        # binary tensors hardly shrink, so they go as they are
        app.add_middleware(Gzip, minimum_size=settings.compress_min_bytes,
                           compresslevel=1, exclude_content_types=(
                               "application/octet-stream", "text/event-stream"))
    app.add_middleware(Decompress, limit=settings.max_body_bytes)
    app.add_middleware(ApiKey, key=key)
    app.add_middleware(BodyLimit, limit=settings.max_body_bytes)
    app.add_middleware(oip_errors.OipErrors)  # the protocol's error shape, for its routes' errors
    if origins := settings.cors_origins():  # outside the API key: a preflight carries none
        app.add_middleware(CORSMiddleware, allow_origins=origins,
                           allow_methods=["GET", "POST"],
                           allow_headers=["authorization", "content-type", "x-request-id"],
                           expose_headers=EXPOSED, max_age=600)
    # outside the API key and the body limit: counts the 401s and 413s too, under the route
    # they were sent to
    app.add_middleware(RequestMetrics, routes=routes, tracing=tracing)
    app.add_middleware(RequestId)  # outermost: every answer carries the request's id
    for router in routers:
        app.include_router(router)
    return app


async def loaded_or_stopped(loading: asyncio.Task) -> None:
    """Until ``loading`` is done, or SIGTERM or SIGINT comes (uvicorn's own handlers then
    called too: its server exits without serving), so that a worker that loads before it
    serves stops when told to, while it loads (its engine process may never come up),
    where uvicorn's server would wait for its lifespan's startup first."""
    if threading.current_thread() is not threading.main_thread():  # (no signals there)
        await asyncio.wait([loading])
        return
    loop, stopped = asyncio.get_running_loop(), asyncio.Event()
    before = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}

    def stop(sig, frame) -> None:
        loop.call_soon_threadsafe(stopped.set)
        if callable(before[sig]):
            before[sig](sig, frame)

    for sig in before:
        signal.signal(sig, stop)
    told = asyncio.create_task(stopped.wait())
    try:
        await asyncio.wait([loading, told], return_when=asyncio.FIRST_COMPLETED)
    finally:
        told.cancel()
        for sig, handler in before.items():
            signal.signal(sig, handler)


def document(app: FastAPI, keyed: bool) -> None:
    """The OpenAPI document names the bodies POST / and /invocations take (those of the
    routes they stand for, which no route of their own declares), gives each operation an
    id of its own, says the Open Inference Protocol's routes' errors as that protocol
    writes them (oip_errors.OipErrors), and, with an API key, says which operations need it (all
    but the probes), so that /docs' Authorize button and generated clients send it."""
    plain = app.openapi

    def openapi() -> dict:
        if app.openapi_schema is None:
            with warnings.catch_warnings():  # the ids made one each below
                warnings.filterwarnings("ignore", "Duplicate Operation ID")
                schema = plain()
            schemas = schema.setdefault("components", {}).setdefault("schemas", {})
            _, bodies = models_json_schema([(body, "validation") for body in tei.ANSWERS],
                                           ref_template="#/components/schemas/{model}")
            for name, body in bodies["$defs"].items():
                schemas.setdefault(name, body)
            # a route of two methods (a probe's GET and HEAD) has one id: each its own
            seen = set()
            for operations in schema["paths"].values():
                for method, operation in operations.items():
                    if operation["operationId"] in seen:
                        operation["operationId"] = operation["operationId"].removesuffix(
                            "_get") + f"_{method}"
                    seen.add(operation["operationId"])
            schemas["OipError"] = oip_errors.ERROR_SCHEMA  # the errors of the protocol's routes
            for path, operations in schema["paths"].items():
                for operation in operations.values() if oip_errors.protocols(path) else ():
                    for status, response in operation.get("responses", {}).items():
                        if status[0] in "45":
                            response["content"] = {"application/json": {"schema": {
                                "$ref": "#/components/schemas/OipError"}}}
            if keyed:
                schema["components"]["securitySchemes"] = {
                    "apiKey": {"type": "http", "scheme": "bearer",
                               "description": "DISTILSERVE_API_KEY"}}
                for path, operations in schema["paths"].items():
                    for method, operation in operations.items():
                        if not ApiKey.public(method.upper(), path):
                            operation["security"] = [{"apiKey": []}]
        return app.openapi_schema

    app.openapi = openapi


def app_from_environment() -> FastAPI:
    """The app of a worker process (``distilserve serve --workers N``): its settings come
    from the DISTILSERVE_* variables the command set before starting the workers. The
    service's first worker takes connections at once, so that /health answers while it
    loads; every other one (the first's siblings, and a worker replacing one that died)
    loads its models before it takes any, while the others serve: no request goes to a
    worker still loading, to be answered 503."""
    # the workers' shared folder (their metrics'; prometheus-client reads only its *.db),
    # which serve_workers makes (without it, run by hand: a worker on its own)
    shared = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
    try:
        if shared:
            (Path(shared) / "first-worker").touch(exist_ok=False)  # O_EXCL: one makes it
        first = True
    except FileExistsError:
        first = False
    loader = None
    if socket := os.environ.get(ENGINE_SOCKET):  # a front end of the engine process
        loader = front_end.loader(socket)
    return create_app(Settings(), loader=loader, load_first=not first)
