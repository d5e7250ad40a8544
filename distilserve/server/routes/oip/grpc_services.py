"""The Open Inference Protocol over gRPC (KServe's V2 gRPC API, Triton's
``inference.GRPCInferenceService``), for the clients written for those servers:
tritonclient.grpc, KServe's InferenceGRPCClient; on the gRPC port
(distilserve/server/routes/grpc_server.py: the API key, errors and metrics there).

Each call runs as the HTTP routes run theirs (distilserve/server/routes/oip/http_routes.py): the same models
and tensors, parameters, queue, limits and metrics. Texts come as BYTES tensors, in
``raw_input_contents`` (tritonclient's way: each element's length in 4 bytes, then its
UTF-8) or in ``contents.bytes_contents``; outputs go back in ``raw_output_contents``, as
Triton sends them. The timing headers (x-total-time, ..., server-timing) are an answer's
trailing metadata. ServerLive and ServerReady need no API key.

Served: ServerLive, ServerReady, ServerMetadata, ModelReady, ModelMetadata, ModelConfig,
ModelInfer, ModelStreamInfer (each request answered as it is done, by its id),
ModelStatistics, RepositoryIndex, RepositoryModelLoad and RepositoryModelUnload (with
DISTILSERVE_MODEL_CONTROL=explicit). The others answer UNIMPLEMENTED: shared memory,
traces and log settings. The protocol's messages are tritonclient's generated ones
(``tritonclient.grpc.service_pb2``): the service Triton's clients call, by the package
that ships it."""

from __future__ import annotations

import asyncio
import functools

import grpc
from fastapi import FastAPI
from google.protobuf.json_format import ParseDict
from tritonclient.grpc import model_config_pb2, service_pb2, service_pb2_grpc

from distilserve.server.core import registry
from distilserve.server.core.inference import Call
from distilserve.server.core.refusals import Refusal
from distilserve.server.engine import Engine
from distilserve.server.errors import ApiError
from distilserve.server.metrics import VERSION
from distilserve.server.routes.common import timing
from distilserve.server.routes.grpc_calls import Rpcs, unary
from distilserve.server.routes.oip import http_routes as oip
from distilserve.server.routes.oip import repository as oip_repository
from distilserve.server.routes.oip import tensors

SERVICE = "inference.GRPCInferenceService"


class Inference(Rpcs, service_pb2_grpc.GRPCInferenceServiceServicer):
    """The protocol's RPCs, each answered as the HTTP route that does the same."""

    SERVICE = SERVICE
    PUBLIC = frozenset({"ServerLive", "ServerReady"})  # as /v2/health/live and /ready

    @unary
    async def ServerLive(self, message, call, context):
        return service_pb2.ServerLiveResponse(live=True)

    @unary
    async def ServerReady(self, message, call, context):
        ready = registry.unready(call.service) is None
        return service_pb2.ServerReadyResponse(ready=ready)

    @unary
    async def ServerMetadata(self, message, call, context):
        return ParseDict(oip.server_described(call.service, self.app.version),
                         service_pb2.ServerMetadataResponse())

    @unary
    async def ModelReady(self, message, call, context):
        try:
            _model(call, message.name, message.version)
        except Refusal:  # not served (or not yet), or another version
            return service_pb2.ModelReadyResponse(ready=False)
        return service_pb2.ModelReadyResponse(ready=True)

    @unary
    async def ModelMetadata(self, message, call, context):
        return ParseDict(oip.metadata(_model(call, message.name, message.version)),
                         service_pb2.ModelMetadataResponse())

    @unary
    async def ModelConfig(self, message, call, context):
        config = oip.configuration(_model(call, message.name, message.version),
                                   call.settings)
        return service_pb2.ModelConfigResponse(
            config=ParseDict(config, model_config_pb2.ModelConfig()))

    @unary
    async def ModelStatistics(self, message, call, context):
        if message.name:
            engine = _model(call, message.name, message.version)
            names = [engine.name]
        else:
            names = sorted(call.service.engines)
        return ParseDict({"model_stats": call.service.metrics.statistics(names)},
                         service_pb2.ModelStatisticsResponse())

    @unary
    async def RepositoryIndex(self, message, call, context):
        return ParseDict({"models": oip_repository.index(call.service, message.ready)},
                         service_pb2.RepositoryIndexResponse())

    @unary
    async def RepositoryModelLoad(self, message, call, context):
        await oip_repository.loaded(call.service, message.model_name,
                                    _parameters(message.parameters))
        return service_pb2.RepositoryModelLoadResponse()

    @unary
    async def RepositoryModelUnload(self, message, call, context):
        await oip_repository.unloaded(call.service, message.model_name)
        return service_pb2.RepositoryModelUnloadResponse()

    @unary
    async def ModelInfer(self, message, call, context):
        answer, timed = await _inferred(message, call)
        context.set_trailing_metadata(tuple(timed.items()))
        return answer

    async def ModelStreamInfer(self, messages, context: grpc.aio.ServicerContext):
        """Triton's stream: each request answered once it has run (run side by side, so
        their answers may come in another order: each carries its request's id), a
        request's error in its answer's error_message without ending the stream."""
        answers = asyncio.Queue()

        async def one(message):
            try:
                answer, _ = await self.answer("ModelStreamInfer", context, functools.partial(
                    _inferred, message))
                answers.put_nowait(service_pb2.ModelStreamInferResponse(infer_response=answer))
            except Refusal as e:
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


def _model(call: Call, name: str, version: str) -> Engine:
    """The served model ``name`` at ``version`` (none: its one version, VERSION)."""
    return oip.served_version(call.service, name, version or VERSION)


def _refused(name: str, why: str):
    """The RPC ``name``, not served: UNIMPLEMENTED, saying ``why``."""
    async def refused(self, message, call, context):
        raise ApiError(501, "not_implemented", f"{name}: {why}")

    refused.__name__ = name
    return unary(refused)


SHARED_MEMORY = ("Triton's shared memory is not served: send the tensors in the request "
                 "(raw_input_contents)")
for _name in (f"{kind}SharedMemory{op}" for kind in ("System", "Cuda")
              for op in ("Status", "Register", "Unregister")):
    setattr(Inference, _name, _refused(_name, SHARED_MEMORY))


async def _inferred(message: service_pb2.ModelInferRequest, call: Call
                    ) -> tuple[service_pb2.ModelInferResponse, dict[str, str]]:
    """A ModelInferRequest run as the HTTP route runs its body (oip.inferred): the answer,
    its outputs in raw_output_contents, and the timing headers' values."""
    engine = _model(call, message.model_name, message.model_version)
    try:
        sent = _sent(message)
    except tensors.TensorError as e:
        raise Refusal("invalid", str(e)) from None
    _, outputs, result = await oip.inferred(
        call, engine, sent, memoryview(b"".join(message.raw_input_contents)))
    answer = service_pb2.ModelInferResponse(model_name=engine.name, model_version=VERSION,
                                            id=message.id)
    for name, value in outputs.items():
        tensor, raw = tensors.encoded(name, value, binary=True)
        answer.outputs.add(name=name, datatype=tensor["datatype"], shape=tensor["shape"])
        answer.raw_output_contents.append(raw)
    return answer, timing(call, result)


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


def add(server: grpc.aio.Server, app: FastAPI, key: str | None) -> list[str]:
    """The protocol's service, added to ``server``; its name."""
    service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(Inference(app, key), server)
    return [SERVICE]
