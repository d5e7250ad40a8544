"""The Open Inference Protocol (KServe's V2 protocol, Triton's HTTP/REST API, Seldon
MLServer's), for the clients written for those servers: tritonclient.http, KServe's
InferenceRESTClient. Every served model is a model here, with texts in and
numbers (or texts) out:

    task      inputs                          outputs
    embed     text BYTES [N]                  embedding FP32 [N, D]
    classify  text BYTES [N]                  scores FP32 [N, C] (in the labels' order),
              (text_pair BYTES [N]: pairs)    label BYTES [N] (the best)
    ner       text BYTES [N]                  entities BYTES [N] (each input's /v1/ner
                                              entities, as JSON)
    qa        question BYTES [N],             answers BYTES [N] (each input's /v1/qa
              context BYTES [N]               answers, as JSON)
    fill-mask text BYTES [N]                  tokens BYTES [N] (each input's
                                              /v1/fill-mask tokens, as JSON)

A request with one input takes it as the texts whatever its name (KServe's examples call it
input-0). The request's ``parameters`` are the options of the route that does the task
(normalize, dimensions, prompt_name; raw_scores, function_to_apply; aggregation_strategy,
stride; top_k, max_answer_len, handle_impossible_answer, align_to_words, max_seq_len,
doc_stride; top_k, targets; truncate, truncation_direction: routes/options.py); the models,
queue, limits, errors and timing headers are those of the /v1 routes (the same core calls
run them). Tensors come and go as JSON or as Triton's binary tensor data (tensors.py,
beside this file); a classifier's scores also as Triton's classification extension gives
them (an output's ``classification``: its k best classes). Triton's repository index and
model control are distilserve/server/routes/oip/repository.py's; its statistics are the
/metrics series of each model (distilserve/server/metrics.py), and its model configuration
says what a model takes and gives and how the service batches it. One version of each model
is served, version 1: a model's routes answer at its /versions/1 paths too. Not served:
Triton's shared-memory extensions (shared memory is refused). The same protocol over gRPC
runs these functions: distilserve/server/routes/oip/grpc_services.py. An error is the
service's, in the protocol's shape, ``{"error": "message"}``
(distilserve/server/routes/oip/errors.py)."""

from __future__ import annotations

import numpy as np
import orjson
from fastapi import APIRouter, Request, Response
from fastapi.routing import APIRoute
from pydantic import ValidationError

from distilserve.server import errors
from distilserve.server.core import postprocess, registry, tasks
from distilserve.server.core.inference import Call
from distilserve.server.core.refusals import Refusal
from distilserve.server.engine import Engine, Result
from distilserve.server.errors import ApiError
from distilserve.server.metrics import VERSION
from distilserve.server.routes import health, options
from distilserve.server.routes.common import http_call, reply, service, timing
from distilserve.server.routes.oip import tensors
from distilserve.server.routes.oip.schemas import (
    OipInferRequest,
    OipInferResponse,
    OipModelConfig,
    OipModelMetadata,
    OipServerMetadata,
    OipStatistics,
    inlined,
)
from distilserve.server.routes.options import (
    ClassifyOptions,
    EmbedOptions,
    FillMaskOptions,
    NerOptions,
    QaOptions,
    parameters,
)

router = APIRouter(tags=["open inference protocol"])


TEXT, PAIR = "text", "text_pair"
# a task's inputs: a classifier's second is optional (a text alone, or pairs)
INPUTS = {"embed": [TEXT], "classify": [TEXT, PAIR], "ner": [TEXT],
          "qa": ["question", "context"], "fill-mask": [TEXT]}
# the platform and backend Triton names for a backend
PLATFORMS = {"onnx": "onnxruntime_onnx", "torchscript": "pytorch_libtorch", "torch": "pytorch"}
BACKENDS = {"onnx": "onnxruntime", "torchscript": "pytorch", "torch": "python"}
BINARY = "application/octet-stream"
# the content types a body is taken as besides JSON's: binary tensors', and curl -d's
# default (Triton's documented curl commands send it)
TRITONS_TYPES = (BINARY, "application/x-www-form-urlencoded")
HEADER_LENGTH = "inference-header-content-length"


@router.get("/v2", response_model=OipServerMetadata, responses=errors.responses(401))
async def server_metadata(request: Request):
    return server_described(service(request), request.app.version)


def server_described(svc, version: str) -> dict:
    """The server's metadata: its name, version and the protocol's extensions served."""
    return {"name": "distilserve", "version": version,
            # model_repository: its index, and loading and unloading by request
            "extensions": ["binary_tensor_data", "classification", "model_configuration",
                           "parameters", "statistics"] + (
                ["model_repository"] if svc.settings.model_control == "explicit" else [])}


@router.api_route("/v2/health/live", methods=health.PROBE)
async def live():
    """200 while the process is alive (as /health)."""
    return {"live": True}


@router.api_route("/v2/health/ready", methods=health.PROBE, responses=health.READY)
async def ready(request: Request):
    """200 once every model is loaded and warmed (as /ready, whose 503 it answers)."""
    answer = await health.ready(request)
    return {"ready": True} if isinstance(answer, dict) else answer


@router.get("/v2/models/stats", response_model=OipStatistics,
            responses=errors.responses(401))
async def statistics(request: Request):
    """Triton's statistics of every served model (its statistics extension): requests
    answered and failed, and where their time went, since the model was served (its
    warm-up left out), over every worker; per batch size, the forward passes."""
    svc = service(request)
    return {"model_stats": svc.metrics.statistics(sorted(svc.engines))}


@router.get("/v2/models/{model_name}/stats", response_model=OipStatistics,
            responses=errors.responses(401, 404, 422, 503))
async def model_statistics(model_name: str, request: Request):
    """Triton's statistics of that model."""
    engine = registry.pick_any(service(request), model_name)
    return {"model_stats": service(request).metrics.statistics([engine.name])}


@router.get("/v2/models/{model_name}/ready", responses=errors.responses(401, 404, 422, 503))
async def model_ready(model_name: str, request: Request):
    """200 when that model is served and the service ready (404: not served, 503: not
    ready yet)."""
    registry.pick_any(service(request), model_name)
    return {"name": model_name, "ready": True}


OUTPUTS = {  # a task's outputs, described
    "embed": lambda e: [{"name": "embedding", "datatype": tensors.FP32,
                         "shape": [-1, e.dimensions or -1]}],
    "classify": lambda e: [{"name": "scores", "datatype": tensors.FP32,
                            "shape": [-1, len(e.labels)]},
                           {"name": "label", "datatype": tensors.BYTES, "shape": [-1]}],
    "ner": lambda e: [{"name": "entities", "datatype": tensors.BYTES, "shape": [-1]}],
    "qa": lambda e: [{"name": "answers", "datatype": tensors.BYTES, "shape": [-1]}],
    "fill-mask": lambda e: [{"name": "tokens", "datatype": tensors.BYTES, "shape": [-1]}],
}


@router.get("/v2/models/{model_name}", response_model=OipModelMetadata,
            responses=errors.responses(401, 404, 422, 503))
async def model_metadata(model_name: str, request: Request):
    """The model's inputs and outputs: names, datatypes and shapes (-1: any size)."""
    return metadata(registry.pick_any(service(request), model_name))


def metadata(engine: Engine) -> dict:
    """A model's metadata (model_metadata's)."""
    inputs = [{"name": name, "datatype": tensors.BYTES, "shape": [-1]}
              for name in INPUTS[engine.task]]
    backend = engine.describe()["backend"]
    return {"name": engine.name, "versions": [VERSION],
            "platform": PLATFORMS.get(backend, backend),
            "inputs": inputs, "outputs": OUTPUTS[engine.task](engine)}


@router.get("/v2/models/{model_name}/config", response_model=OipModelConfig,
            response_model_exclude_none=True, responses=errors.responses(401, 404, 422, 503))
async def model_config(model_name: str, request: Request):
    """Triton's model configuration (its model_configuration extension): the metadata's
    tensors as config.pbtxt says them, and how the service batches the model. A text is
    one string per input, dims [1] (whole tensors [N, 1]), which the model takes as
    [N] (``reshape``: a tensor of [N] is taken too)."""
    return configuration(registry.pick_any(service(request), model_name),
                         service(request).settings)


def configuration(engine: Engine, settings) -> dict:
    """A model's configuration (model_config's)."""
    described = engine.describe()
    device, backend = described["device"], described["backend"]
    batch_size, batch_tokens = engine.batch_limits

    def config(tensor: dict) -> dict:
        dims = tensor["shape"][1:]  # [-1, ...] without the batch's
        kind = "STRING" if tensor["datatype"] == tensors.BYTES else tensor["datatype"]
        return {"name": tensor["name"], "data_type": "TYPE_" + kind,
                **({"dims": dims} if dims else {"dims": [1], "reshape": {"shape": []}})}

    tensors_of = metadata(engine)
    gpu = [int(device.partition(":")[2] or 0)] if device.startswith("cuda") else []
    return {
        "name": engine.name, "platform": tensors_of["platform"],
        "backend": BACKENDS.get(backend, backend), "max_batch_size": batch_size,
        "input": [config(t) for t in tensors_of["inputs"]],
        "output": [config(t) for t in tensors_of["outputs"]],
        "dynamic_batching": {
            "max_queue_delay_microseconds": round(settings.max_wait_ms * 1000),
            "default_queue_policy": {"max_queue_size": settings.max_queue}},
        "instance_group": [{"name": engine.name, "kind": "KIND_GPU" if gpu else "KIND_CPU",
                            "count": settings.workers, "gpus": gpu}],
        "parameters": {key: {"string_value": str(value)} for key, value in (
            ("task", engine.task), ("family", engine.family), ("dtype", described["dtype"]),
            ("max_length", engine.max_length), ("max_batch_tokens", batch_tokens),
            *((f"iterations_{k}", n) for k, n in described.get("iterations", {}).items()))}}


# the body, as JSON (a body with Triton's binary tensor data is this JSON, then the bytes),
# read by the route itself
INFER_BODY = {"requestBody": {"required": True, "content": {"application/json": {
    "schema": inlined(OipInferRequest.model_json_schema())}}}}


@router.post("/v2/models/{model_name}/infer", openapi_extra=INFER_BODY, responses={
    200: {"model": OipInferResponse, "description": "the outputs as JSON; with binary "
          "outputs, this JSON (Inference-Header-Content-Length bytes) and then their bytes",
          "content": {BINARY: {"schema": {"type": "string", "format": "binary"}}}},
    **errors.INFERENCE})
async def model_infer(model_name: str, request: Request):
    """Runs the model on its input tensors; answers its output tensors (all, or those
    ``outputs`` names), as JSON or as binary data (``binary_data_output``, or an output's
    ``binary_data``)."""
    engine = registry.pick_any(service(request), model_name)
    kind = request.headers.get("content-type", "")
    if not (errors.json_content_type(request.headers) or kind.lower().startswith(TRITONS_TYPES)):
        raise ApiError(422, "invalid_request", errors.not_json(kind))
    try:
        header, data = tensors.split(await request.body(), request.headers.get(HEADER_LENGTH))
        sent = orjson.loads(header)
    except orjson.JSONDecodeError as e:  # (orjson's words for a body not UTF-8 are Rust's)
        raise ApiError(422, "invalid_request", errors.unparseable(_utf8(header) or e)) from None
    except tensors.TensorError as e:
        raise ApiError(422, "invalid_request", str(e)) from None
    call = http_call(request)
    asking, outputs, result = await inferred(call, engine, sent, data)
    everything = asking.parameters.get("binary_data_output") is True
    asked = {o.name: o.parameters for o in asking.outputs or ()}
    binary = {name for name in outputs if asked.get(name, {}).get("binary_data",
                                                                  everything) is True}
    answer, data = tensors.response(
        {"model_name": engine.name, **({"id": asking.id} if asking.id is not None else {})},
        outputs, binary)
    if not data:
        return reply(call, answer, result)
    head = orjson.dumps(answer, option=orjson.OPT_SERIALIZE_NUMPY)
    return Response(head + data, media_type=BINARY,
                    headers={**timing(call, result), HEADER_LENGTH: str(len(head))})


async def inferred(call: Call, engine: Engine, sent, data: memoryview
                   ) -> tuple[OipInferRequest, dict, Result]:
    """An inference request (``sent``: its JSON, as sent; ``data``: its inputs' binary
    data) run on the engine: the request as read, its outputs (name -> value, those it
    asks for, in the model's order or the request's; a classifier's scores as its
    classification asks) and the run. For the HTTP route above and gRPC's ModelInfer
    (distilserve/server/routes/oip/grpc_services.py)."""
    try:
        asking = OipInferRequest.model_validate(sent)
        wanted = _wanted(engine, asking)
        raw = sent["inputs"]  # as sent (validated)
        texts = _texts(engine, raw, dict(zip((t["name"] for t in raw),
                                             tensors.binary_parts(raw, data))))
    except ValidationError as e:
        raise errors.refused(e) from None
    except tensors.TensorError as e:
        raise Refusal("invalid", str(e)) from None
    outputs, result = await RUN[engine.task](call, engine, texts, asking.parameters)
    asked = {o.name: o.parameters for o in asking.outputs or ()}
    return asking, {name: _classified(engine, outputs[name],
                                    asked.get(name, {}).get("classification"))
                  for name in wanted}, result


def _utf8(text: bytes) -> UnicodeDecodeError | None:
    """Why ``text`` is not UTF-8, if it is not."""
    try:
        bytes(text).decode()
    except UnicodeDecodeError as e:
        return e
    return None


def _wanted(engine: Engine, asking: OipInferRequest) -> list[str]:
    """The outputs the request asks for (default: all of the model's), said before it runs:
    a 422 for an output the model does not give, and for what Triton's extensions ask of
    a tensor that is not served here (shared memory; classification of anything but a
    classifier's scores)."""
    gives = [output["name"] for output in OUTPUTS[engine.task](engine)]
    wanted = [o.name for o in asking.outputs] if asking.outputs else gives
    if unknown := [name for name in wanted if name not in gives]:
        raise Refusal("invalid", f"outputs {', '.join(unknown)}: model "
                      f"{engine.name!r} gives {', '.join(gives)}")
    for tensor in (*asking.inputs, *(asking.outputs or ())):
        if any(key.startswith("shared_memory") for key in tensor.parameters):
            raise Refusal("invalid", f"{tensor.name}: shared memory (Triton's "
                          "extension) is not served here: send and ask for tensors as "
                          "JSON or binary data")
    for output in asking.outputs or ():
        k = output.parameters.get("classification")
        if k is None:
            continue
        if output.name != "scores" or engine.task != "classify":
            raise Refusal("invalid", f"{output.name}: classification {k!r}: "
                          "the classification extension takes a classifier's scores "
                          f"only; model {engine.name!r} does {engine.task}")
        if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= len(engine.labels):
            raise Refusal("invalid", f"{output.name}: classification {k!r}: "
                          "the number of best classes, 1 to the model's "
                          f"{len(engine.labels)}")
    return wanted


def _classified(engine: Engine, value, k: int | None):
    """An output, or the k best classes of a classifier's scores (Triton's classification
    extension) where its ``classification`` parameter asks for them."""
    return value if k is None else tensors.classes(value, engine.labels, k)


def _texts(engine: Engine, raw: list[dict], binary: dict) -> list:
    """The model's inputs from the tensors: texts, or pairs for a classifier given text and
    text_pair and for a question-answering model (question, context)."""
    takes = INPUTS[engine.task]
    if len(raw) == 1 and engine.task != "qa":  # whatever its name
        return tensors.texts(raw[0], binary[raw[0]["name"]])
    names = [t["name"] for t in raw]
    if sorted(names) != sorted(takes) or len(takes) == 1:
        raise tensors.TensorError(f"inputs {', '.join(names)}: model {engine.name!r} takes "
                                  + " and ".join(takes))
    by_name = {t["name"]: tensors.texts(t, binary[t["name"]]) for t in raw}
    first, second = takes
    if len(by_name[first]) != len(by_name[second]):
        raise tensors.TensorError(f"{first} has {len(by_name[first])} elements and {second} "
                                  f"{len(by_name[second])}: a pair is one of each")
    return list(zip(by_name[first], by_name[second]))


async def _embed(call: Call, engine: Engine, texts: list, given: dict):
    _, vectors, result = await options.embed(call, engine.name, texts,
                                             parameters(EmbedOptions, given))
    return {"embedding": vectors}, result


async def _classify(call: Call, engine: Engine, texts: list, given: dict):
    o = parameters(ClassifyOptions, given)
    _, result = await tasks.logits(call, engine.name, texts, o.truncation, o.iterations)
    scores = [postprocess.label_scores(logits, engine.labels, engine.multi_label,
                                       o.function) for logits in result.outputs]
    return {"scores": np.stack(scores),
            "label": [engine.labels[int(s.argmax())] for s in scores]}, result


async def _ner(call: Call, engine: Engine, texts: list, given: dict):
    _, results, result = await options.recognise(call, engine.name, texts,
                                                 parameters(NerOptions, given))
    return {"entities": [orjson.dumps(r).decode() for r in results]}, result


async def _qa(call: Call, engine: Engine, pairs: list, given: dict):
    _, results, result = await options.answer(call, engine.name, pairs,
                                              parameters(QaOptions, given))
    return {"answers": [orjson.dumps(r).decode() for r in results]}, result


async def _fill_mask(call: Call, engine: Engine, texts: list, given: dict):
    _, results, result = await options.fill(call, engine.name, texts,
                                            parameters(FillMaskOptions, given))
    return {"tokens": [orjson.dumps(r).decode() for r in results]}, result


RUN = {"embed": _embed, "classify": _classify, "ner": _ner, "qa": _qa,  # by task
       "fill-mask": _fill_mask}


def _versioned(route: APIRoute):
    """A model's route, at the path of one of its versions (only VERSION is served)."""
    endpoint = route.endpoint

    async def versioned(model_name: str, model_version: str, request: Request):
        if model_version != VERSION:  # its 404 (the route looks the model up itself)
            served_version(service(request), model_name, model_version)
        return await endpoint(model_name, request)

    return versioned


def served_version(svc, name: str, version: str) -> Engine:
    """The served model ``name`` at ``version`` (only VERSION is served): an unknown model's
    refusal, else another version's."""
    engine = registry.pick_any(svc, name)
    if version != VERSION:
        raise Refusal("not_found", f"model {name!r} has one version, {VERSION}, not "
                      f"{version!r}")
    return engine


for _route in [r for r in router.routes if r.path.startswith("/v2/models/{model_name}")]:
    router.add_api_route(
        _route.path.replace("{model_name}", "{model_name}/versions/{model_version}"),
        _versioned(_route), methods=list(_route.methods), name=_route.name + "_version",
        description=_route.description, response_model=_route.response_model,
        response_model_exclude_none=_route.response_model_exclude_none,
        responses=_route.responses, openapi_extra=_route.openapi_extra)
