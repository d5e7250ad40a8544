"""The Open Inference Protocol over gRPC (KServe's V2 gRPC API, Triton's
``inference.GRPCInferenceService``), for the clients written for those servers:
tritonclient.grpc, KServe's InferenceGRPCClient. Served on DISTILSERVE_GRPC_PORT beside the
HTTP port, by the same process (each worker's, sharing the port), on the same event loop.

Each call runs the HTTP routes' functions (server/routes/oip.py): the same models and
tensors, parameters, queue, limits and metrics (its requests counted under its method's
path, ``/inference.GRPCInferenceService/ModelInfer``, with the HTTP status it would have
had). Texts come as BYTES tensors, in ``raw_input_contents`` (tritonclient's way: each
element's length in 4 bytes, then its UTF-8) or in ``contents.bytes_contents``; outputs go
back in ``raw_output_contents``, as Triton sends them. An error is the gRPC status of its
HTTP one (server/errors.py: 400, 413 and 422 INVALID_ARGUMENT, 401 UNAUTHENTICATED, 404
NOT_FOUND, 429 RESOURCE_EXHAUSTED, 503 UNAVAILABLE) with the same message; Retry-After,
where HTTP sends it, is trailing metadata. The timing headers (x-total-time, ...,
server-timing) are an answer's trailing metadata. With DISTILSERVE_API_KEY every call but
ServerLive and ServerReady needs ``authorization: Bearer KEY`` metadata (tritonclient's
``headers``).

Served: ServerLive, ServerReady, ServerMetadata, ModelReady, ModelMetadata, ModelConfig,
ModelInfer, ModelStreamInfer (each request answered as it is done, by its id),
ModelStatistics, RepositoryIndex, RepositoryModelLoad and RepositoryModelUnload (with
DISTILSERVE_MODEL_CONTROL=explicit). The others answer UNIMPLEMENTED: shared memory,
traces and log settings. The protocol's messages are
tritonclient's generated ones (``tritonclient.grpc.service_pb2``): the service Triton's
clients call, by the package that ships it."""

from __future__ import annotations

import asyncio
import functools
import logging
import time

import grpc
from fastapi import FastAPI, Request
from google.protobuf.json_format import ParseDict
from tritonclient.grpc import model_config_pb2, service_pb2, service_pb2_grpc

from server import logs, tensors
from server.app import ApiKey
from server.connections import DISCONNECT, ClientWatch
from server.engine import Engine
from server.errors import ApiError
from server.metrics import STARTED, VERSION
from server.routes import health, oip
from server.routes.common import service, timing
from server.settings import Settings

log = logging.getLogger("distilserve")
SERVICE = "/inference.GRPCInferenceService/"
PUBLIC = {"ServerLive", "ServerReady"}  # as /v2/health/live and /v2/health/ready
# an HTTP status's gRPC code (google.rpc.Code's mapping to HTTP)
CODES = {400: grpc.StatusCode.INVALID_ARGUMENT, 401: grpc.StatusCode.UNAUTHENTICATED,
         404: grpc.StatusCode.NOT_FOUND, 413: grpc.StatusCode.INVALID_ARGUMENT,
         415: grpc.StatusCode.INVALID_ARGUMENT, 422: grpc.StatusCode.INVALID_ARGUMENT,
         429: grpc.StatusCode.RESOURCE_EXHAUSTED, 499: grpc.StatusCode.CANCELLED,
         501: grpc.StatusCode.UNIMPLEMENTED, 503: grpc.StatusCode.UNAVAILABLE}


def _call(method):
    """A servicer's method ``method(self, message, request, context)`` as the unary RPC of
    its name (Inference.answer's), an ApiError answered as its gRPC status."""
    route = SERVICE + method.__name__

    @functools.wraps(method)
    async def rpc(self, message, context: grpc.aio.ServicerContext):
        try:
            return await self.answer(route, context, functools.partial(
                method, self, message, context=context))
        except ApiError as e:
            await context.abort(CODES.get(e.status, grpc.StatusCode.INTERNAL), e.message,
                                tuple((k.lower(), v) for k, v in (e.headers or {}).items()))

    return rpc


class Inference(service_pb2_grpc.GRPCInferenceServiceServicer):
    """The protocol's RPCs, each running the HTTP route that does the same."""

    def __init__(self, app: FastAPI, key: str | None):
        self.app, self.key = app, key and key.encode()

    async def answer(self, route: str, context: grpc.aio.ServicerContext, run):
        """``await run(request)``, ``request`` a Request of the app as an HTTP route's (so
        the routes' functions run as they do for HTTP, with the same X-Request-Id rule),
        once the API key is checked; counted in the metrics under ``route`` with the HTTP
        status it would have had. Anything but an ApiError is logged and raised as a 500's."""
        started, status = time.perf_counter(), 500
        sent = dict(context.invocation_metadata() or ())
        logs.REQUEST_ID.set(logs.request_id(sent.get("x-request-id", "")))
        request = Request({"type": "http", "app": self.app, "method": "POST", "path": route,
                           "headers": [], STARTED: started,
                           "extensions": {DISCONNECT: ClientWatch()}})
        try:
            if self.key is not None and route.removeprefix(SERVICE) not in PUBLIC \
                    and not ApiKey.accepts(self.key, sent.get("authorization", "")):
                raise ApiError(401, "unauthorized", "missing or wrong API key: send "
                               "'authorization: Bearer KEY' metadata")
            answer = await run(request)
            status = 200
            return answer
        except ApiError as e:
            status = e.status
            raise
        except asyncio.CancelledError:  # the client went (or its deadline passed)
            status = 499
            raise
        except Exception as e:
            log.exception("%s failed", route)
            raise ApiError(500, "internal_error", f"{type(e).__name__}: {e}") from e
        finally:
            service(request).metrics.observe_request(route, status,
                                                     time.perf_counter() - started)

    @_call
    async def ServerLive(self, message, request, context):
        return service_pb2.ServerLiveResponse(live=True)

    @_call
    async def ServerReady(self, message, request, context):
        ready = isinstance(await health.ready(request), dict)  # else /ready's 503
        return service_pb2.ServerReadyResponse(ready=ready)

    @_call
    async def ServerMetadata(self, message, request, context):
        return ParseDict(await oip.server_metadata(request), service_pb2.ServerMetadataResponse())

    @_call
    async def ModelReady(self, message, request, context):
        try:
            _model(request, message.name, message.version)
        except ApiError:  # not served (or not yet), or another version
            return service_pb2.ModelReadyResponse(ready=False)
        return service_pb2.ModelReadyResponse(ready=True)

    @_call
    async def ModelMetadata(self, message, request, context):
        _model(request, message.name, message.version)
        return ParseDict(await oip.model_metadata(message.name, request),
                         service_pb2.ModelMetadataResponse())

    @_call
    async def ModelConfig(self, message, request, context):
        _model(request, message.name, message.version)
        config = await oip.model_config(message.name, request)
        return service_pb2.ModelConfigResponse(
            config=ParseDict(config, model_config_pb2.ModelConfig()))

    @_call
    async def ModelStatistics(self, message, request, context):
        if message.name:
            engine = _model(request, message.name, message.version)
            names = [engine.name]
        else:
            names = sorted(service(request).engines)
        return ParseDict({"model_stats": service(request).metrics.statistics(names)},
                         service_pb2.ModelStatisticsResponse())

    @_call
    async def RepositoryIndex(self, message, request, context):
        return ParseDict({"models": oip.index(service(request), message.ready)},
                         service_pb2.RepositoryIndexResponse())

    @_call
    async def RepositoryModelLoad(self, message, request, context):
        await oip.loaded(service(request), message.model_name,
                         _parameters(message.parameters))
        return service_pb2.RepositoryModelLoadResponse()

    @_call
    async def RepositoryModelUnload(self, message, request, context):
        await oip.unloaded(service(request), message.model_name)
        return service_pb2.RepositoryModelUnloadResponse()

    @_call
    async def ModelInfer(self, message, request, context):
        answer, timed = await _inferred(message, request)
        context.set_trailing_metadata(tuple(timed.items()))
        return answer

    async def ModelStreamInfer(self, messages, context: grpc.aio.ServicerContext):
        """Triton's stream: each request answered once it has run (run side by side, so
        their answers may come in another order: each carries its request's id), a
        request's error in its answer's error_message without ending the stream."""
        route, answers = SERVICE + "ModelStreamInfer", asyncio.Queue()

        async def one(message):
            try:
                answer, _ = await self.answer(route, context, functools.partial(
                    _inferred, message))
                answers.put_nowait(service_pb2.ModelStreamInferResponse(infer_response=answer))
            except ApiError as e:
                answers.put_nowait(service_pb2.ModelStreamInferResponse(
                    error_message=e.message, infer_response=service_pb2.ModelInferResponse(
                        model_name=message.model_name, id=message.id)))

        async def read():
            async with asyncio.TaskGroup() as running:
                async for message in messages:
                    running.create_task(one(message))

        reading = asyncio.create_task(read())
        reading.add_done_callback(lambda _: answers.put_nowait(None))
        try:
            while (answer := await answers.get()) is not None:
                yield answer
            await reading  # the stream's own failure, if any
        finally:
            reading.cancel()


def _model(request: Request, name: str, version: str) -> Engine:
    """The served model ``name`` at ``version`` (none: its one version, VERSION)."""
    return oip.served_version(request, name, version or VERSION)


def _refused(name: str, why: str):
    """The RPC ``name``, not served: UNIMPLEMENTED, saying ``why``."""
    async def refused(self, message, request, context):
        raise ApiError(501, "not_implemented", f"{name}: {why}")

    refused.__name__ = name
    return _call(refused)


SHARED_MEMORY = ("Triton's shared memory is not served: send the tensors in the request "
                 "(raw_input_contents)")
for _name in (f"{kind}SharedMemory{op}" for kind in ("System", "Cuda")
              for op in ("Status", "Register", "Unregister")):
    setattr(Inference, _name, _refused(_name, SHARED_MEMORY))


async def _inferred(message: service_pb2.ModelInferRequest, request: Request
                    ) -> tuple[service_pb2.ModelInferResponse, dict[str, str]]:
    """A ModelInferRequest run as the HTTP route runs its body (oip.inferred): the answer,
    its outputs in raw_output_contents, and the timing headers' values."""
    engine = _model(request, message.model_name, message.model_version)
    try:
        sent = _sent(message)
    except tensors.TensorError as e:
        raise ApiError(422, "invalid_request", str(e)) from None
    _, outputs, result = await oip.inferred(
        request, engine, sent, memoryview(b"".join(message.raw_input_contents)))
    answer = service_pb2.ModelInferResponse(model_name=engine.name, model_version=VERSION,
                                            id=message.id)
    for name, value in outputs.items():
        tensor, raw = tensors.encoded(name, value, binary=True)
        answer.outputs.add(name=name, datatype=tensor["datatype"], shape=tensor["shape"])
        answer.raw_output_contents.append(raw)
    return answer, timing(request, result)


def _parameters(parameters) -> dict:
    """A message's parameters (name -> InferParameter) as the JSON protocol's."""
    return {name: getattr(p, choice) for name, p in parameters.items()
            if (choice := p.WhichOneof("parameter_choice")) is not None}


def _sent(message: service_pb2.ModelInferRequest) -> dict:
    """A ModelInferRequest as the JSON protocol's body (oip.inferred's), the inputs in
    ``raw_input_contents`` as its binary data."""
    raw = message.raw_input_contents
    if raw and len(raw) != len(message.inputs):
        raise tensors.TensorError(f"{len(raw)} raw_input_contents for {len(message.inputs)} "
                                  "inputs: one for each input, or none")
    inputs = []
    for i, tensor in enumerate(message.inputs):
        sent = {"name": tensor.name, "datatype": tensor.datatype, "shape": list(tensor.shape),
                "parameters": _parameters(tensor.parameters)}
        if raw:
            sent["parameters"]["binary_data_size"] = len(raw[i])
        elif tensor.HasField("contents"):
            sent["data"] = list(tensor.contents.bytes_contents)
        inputs.append(sent)
    return {"id": message.id or None, "parameters": _parameters(message.parameters),
            "inputs": inputs,
            "outputs": [{"name": o.name, "parameters": _parameters(o.parameters)}
                        for o in message.outputs] or None}


def _address(settings: Settings) -> str:
    host = f"[{settings.host}]" if ":" in settings.host else settings.host
    return f"{host}:{settings.grpc_port}"


async def start(app: FastAPI, settings: Settings) -> grpc.aio.Server:
    """The gRPC server of ``app`` on DISTILSERVE_GRPC_PORT, started (messages up to
    DISTILSERVE_MAX_BODY_BYTES; the workers of ``--workers N`` share the port)."""
    server = grpc.aio.server(options=[
        ("grpc.max_receive_message_length", settings.max_body_bytes),
        ("grpc.max_send_message_length", -1),
        ("grpc.so_reuseport", int(settings.workers > 1))])
    key = settings.api_key.get_secret_value() if settings.api_key else None
    service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(Inference(app, key), server)
    try:
        server.add_insecure_port(_address(settings))
    except RuntimeError as e:
        raise RuntimeError(f"cannot serve gRPC on {_address(settings)}: {e}") from None
    await server.start()
    return server
