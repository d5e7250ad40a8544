"""Text Embeddings Inference's own routes, for the clients written for TEI (huggingface_hub's
InferenceClient, LangChain's HuggingFaceEndpointEmbeddings, Haystack's TEI components,
LlamaIndex's TextEmbeddingsInference): POST /embed, /embed_all, /embed_sparse,
/similarity, /predict and /rerank with TEI's bodies, POST / (and SageMaker's /invocations)
as TEI serves its one model there (and, where TEI serves none, as the Hugging Face
Inference API serves an NLI model's zero-shot classification, a NER model, a
question-answering model and a fill-mask model), POST /vertex (Vertex AI's instances,
each a body of /), and GET /info. The models, queue, limits, errors and timing headers
are those of the /v1 routes (the core's pipelines, core/tasks.py, run both); only the
bodies' shapes are TEI's. /rerank also takes
the body that Infinity and vLLM take at that path (Cohere's, with ``documents``) and
answers it as /v1/rerank. (/tokenize, /decode and /embeddings sit beside their /v1 twins,
in their own files; GET / and /ping, TEI's and SageMaker's health checks, beside
/ready.)"""

from __future__ import annotations

import asyncio
import json
from typing import get_args

import numpy as np
from fastapi import APIRouter, Request
from pydantic import BaseModel, TypeAdapter, ValidationError

from distilserve.server import errors
from distilserve.server.core import postprocess, registry, tasks
from distilserve.server.core.inference import Call, check_limits, embedded
from distilserve.server.core.refusals import Refusal
from distilserve.server.engine import Engine, Result
from distilserve.server.routes import options
from distilserve.server.routes.common import http_call, reply, service
from distilserve.server.routes.native import rerank as v1
from distilserve.server.routes.native.schemas import (
    RerankRequest,
    RerankResponse,
    Score,
)
from distilserve.server.routes.tei import hf_inference as hf
from distilserve.server.routes.tei.schemas import (
    HfFillMaskRequest,
    HfQaRequest,
    HfTokenRequest,
    HfZeroShotRequest,
    TeiAnswer,
    TeiEmbedRequest,
    TeiInfo,
    TeiInputsRequest,
    TeiPredictRequest,
    TeiRank,
    TeiRerankBody,
    TeiRerankRequest,
    TeiRootRequest,
    TeiSimilarityParameters,
    TeiSimilarityRequest,
    TeiSparseValue,
    TeiVertexRequest,
    TeiVertexResponse,
)

router = APIRouter(tags=["Text Embeddings Inference"])
DTYPES = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}


# each route's answer and its run, for the route, the root and /vertex -----------------
async def embedding(body: TeiEmbedRequest, call: Call) -> tuple[np.ndarray, Result]:
    _, vectors, result = await options.embed(call, body.model, body.texts, body)
    return vectors, result


async def token_vectors(body: TeiInputsRequest, call: Call
                        ) -> tuple[list[np.ndarray], Result]:
    """/embed_all's answer: each input's token vectors [T_i, D]."""
    _, vectors, result = await tasks.token_vectors(call, body.model, body.texts,
                                                   body.truncation, body.prompt_name)
    return vectors, result


async def sparse_vectors(body: TeiInputsRequest, call: Call
                         ) -> tuple[list[list[dict]], Result]:
    """/embed_sparse's answer: each input's non-zero entries, {index, value}."""
    _, values, result = await tasks.sparse_vectors(call, body.model, body.texts,
                                                   body.truncation, body.prompt_name)
    return values, result


async def similarities(body: TeiSimilarityRequest, call: Call
                       ) -> tuple[np.ndarray, Result]:
    parameters = body.parameters or TeiSimilarityParameters()
    _, vectors, result = await embedded(
        call, body.model, body.texts, None, parameters.prompt_name, parameters.truncation,
        named=body.name_of)
    return vectors[1:] @ vectors[0], result  # unit length: the cosines


async def predictions(body: TeiPredictRequest, call: Call) -> tuple[list, Result]:
    _, results, result = await tasks.classify(
        call, body.model, body.texts, body.truncation, body.function,
        body.parameters and body.parameters.top_k, body.iterations)
    return results if body.batch else results[0], result


async def ranks(body: TeiRerankRequest, call: Call) -> tuple[list[dict], Result]:
    _, scores, result = await v1.scored(body, call)
    return ranked(scores, body.document_texts, body.return_text), result


def ranked(scores: np.ndarray, texts: list[str], return_text: bool) -> list[dict]:
    """TEI's ranks: {index, score, text if asked}, highest first (ties in input order)."""
    return [{"index": r["index"], "score": r["relevance_score"],
             **({"text": texts[r["index"]]} if return_text else {})}
            for r in postprocess.ranked(scores, texts, None, False)]


ANSWERS = {TeiEmbedRequest: embedding, TeiSimilarityRequest: similarities,
           TeiPredictRequest: predictions, TeiRerankRequest: ranks,
           HfZeroShotRequest: hf.zero_shot_answers, HfTokenRequest: hf.token_answers,
           HfQaRequest: hf.qa_answers, HfFillMaskRequest: hf.fill_mask_answers}
# the body of POST /, by what its model does
ROOT_BODIES = {"embed": TypeAdapter(TeiRootRequest), "classify": TypeAdapter(TeiPredictRequest),
               "rerank": TypeAdapter(TeiRerankRequest),
               "zero_shot": TypeAdapter(HfZeroShotRequest), "ner": TypeAdapter(HfTokenRequest),
               "qa": TypeAdapter(HfQaRequest), "fill-mask": TypeAdapter(HfFillMaskRequest)}


# what each of ROOT_BODIES does, as the Hugging Face Inference API names it, and the names
# its ``parameters`` may hold
TASKS = {"embed": "feature extraction", "classify": "text classification",
         "rerank": "text ranking", "zero_shot": "zero-shot classification",
         "ner": "token classification", "qa": "question answering", "fill-mask": "fill-mask"}


def _parameter_names(*bodies: type[BaseModel]) -> frozenset[str]:
    names = set()
    for body in bodies:
        field = body.model_fields.get("parameters")
        for model in (get_args(field.annotation) or (field.annotation,)) if field else ():
            names |= set(getattr(model, "model_fields", ()))
    return frozenset(names)


PARAMETERS = {kind: _parameter_names(*bodies) for kind, bodies in {
    "embed": (TeiEmbedRequest, TeiSimilarityRequest), "classify": (TeiPredictRequest,),
    "rerank": (TeiRerankRequest,), "zero_shot": (HfZeroShotRequest,),
    "ner": (HfTokenRequest,), "qa": (HfQaRequest,), "fill-mask": (HfFillMaskRequest,)}.items()}


def _check_parameters(svc, engine: Engine, kind: str, body: dict) -> None:
    """A 400 for ``parameters`` that the body of ``kind`` (``engine``'s) has not: another
    task's, sent where this model answers; it names the URLs of the served models whose
    task takes them (/models/NAME)."""
    parameters = body.get("parameters")
    foreign = sorted(set(parameters) - PARAMETERS[kind]) if isinstance(parameters, dict) else []
    if not foreign:
        return
    takers = [f"/models/{other.name}" for other in svc.engines.values()
              if any(set(foreign) <= PARAMETERS[k] for k in (other.task, "zero_shot")
                     if k != "zero_shot" or other.entailment is not None)]
    raise Refusal("bad_request", f"parameters {', '.join(foreign)} are not {TASKS[kind]}'s, "
                  f"which model {engine.name!r} does here; "
                  + (f"post them to {' or '.join(takers)}" if takers else
                     "no served model's task takes them"))


def parse_root(body: dict, svc):
    """POST /'s body, as the route doing what its model does takes it: the model named in
    ``model``, else the only one, else the one embedding model; an embedding model's body
    is /embed's or /similarity's, a classifier's /predict's, or /rerank's when it has a
    ``query``, a NER or question-answering model's the Hugging Face Inference API's. A body
    whose ``parameters`` hold ``candidate_labels`` is its zero-shot classification, for
    the NLI model named, else the only one."""
    name = body.get("model")
    name = name if isinstance(name, str) else None
    parameters = body.get("parameters")
    if isinstance(parameters, dict) and "candidate_labels" in parameters:
        engine, kind = registry.pick(svc, "zero-shot", name), "zero_shot"
    else:
        engine = registry.pick_root(svc, name)
        kind = _kind(engine, body)
        _check_parameters(svc, engine, kind, body)
    return _parsed(kind, {"model": engine.name, **body})


def _kind(engine, body: dict) -> str:
    """Which of ROOT_BODIES a body for ``engine`` is, zero-shot classification aside."""
    return "rerank" if engine.task == "classify" and "query" in body else engine.task


def _parsed(kind: str, body: dict):
    """``body`` as the body of ``kind`` (ROOT_BODIES), with its model named (the route's
    own choice is then the same)."""
    try:
        return ROOT_BODIES[kind].validate_python(body)
    except ValidationError as e:
        raise errors.refused(e) from None


# the routes -------------------------------------------------------------------------
@router.post("/embed", response_model=list[list[float]], responses=errors.INFERENCE)
async def embed(body: TeiEmbedRequest, request: Request):
    """/v1/embed's request, its inputs texts or token ids (each the model's whole input, its
    special tokens included, as /tokenize gives them); the embeddings alone, one list per
    input."""
    call = http_call(request)
    return reply(call, *await embedding(body, call))


@router.post("/embed_all", response_model=list[list[list[float]]], responses=errors.INFERENCE)
async def embed_all(body: TeiInputsRequest, request: Request):
    """Every token's vector, special tokens included, unpooled and not normalised (the
    model's last hidden states): a list of them per input. For an embedding model exported
    with --token-embeddings; each input counted at max_length tokens in the answer's bound
    (check_answer_size)."""
    call = http_call(request)
    return reply(call, *await token_vectors(body, call))


@router.post("/embed_sparse", response_model=list[list[TeiSparseValue]],
             responses=errors.INFERENCE)
async def embed_sparse(body: TeiInputsRequest, request: Request):
    """Each input's SPLADE embedding as its non-zero entries, {index, value}, in index
    order: for a SPLADE model (a masked-language model exported with --pooling splade)."""
    call = http_call(request)
    return reply(call, *await sparse_vectors(body, call))


@router.post("/similarity", response_model=list[float], responses=errors.INFERENCE)
async def similarity(body: TeiSimilarityRequest, request: Request):
    """The cosine of source_sentence's embedding with each sentence's, in order."""
    call = http_call(request)
    return reply(call, *await similarities(body, call))


@router.post("/predict", response_model=list[Score] | list[list[Score]],
             responses=errors.INFERENCE)
async def predict(body: TeiPredictRequest, request: Request):
    """Every label's score, highest first: a list for a text or a pair, a list of them for
    a batch."""
    call = http_call(request)
    return reply(call, *await predictions(body, call))


@router.post("/rerank", response_model=list[TeiRank] | RerankResponse,
             response_model_exclude_none=True, responses=errors.INFERENCE)
async def rerank(body: TeiRerankBody, request: Request):
    """TEI's body (``texts``): every text's score, highest first (ties in input order),
    with the text if asked. Cohere's, Jina's, Infinity's and vLLM's (``documents``): as
    /v1/rerank."""
    if isinstance(body, RerankRequest):
        return await v1.rerank(body, request)
    call = http_call(request)
    return reply(call, *await ranks(body, call))


# POST / (and SageMaker's /invocations) as TEI serves its one model there: the body of the
# route that does what the model does, documented as any of them
ROOT_DOCUMENTED = {"requestBody": {"content": {"application/json": {"schema": {"anyOf": [
    {"$ref": f"#/components/schemas/{body.__name__}"} for body in ANSWERS]}}}}}


@router.post("/", response_model=TeiAnswer, response_model_exclude_none=True,
             responses=errors.INFERENCE, openapi_extra=ROOT_DOCUMENTED)
@router.post("/invocations", response_model=TeiAnswer, response_model_exclude_none=True,
             responses=errors.INFERENCE, openapi_extra=ROOT_DOCUMENTED)
async def root(body: dict, request: Request):
    """The route's answer for the model parse_root chooses: an embedding model's /embed or
    /similarity (huggingface_hub's feature_extraction, sentence_similarity), a
    classifier's /predict (its text_classification) or /rerank."""
    call = http_call(request)
    parsed = parse_root(body, call.service)
    return reply(call, *await ANSWERS[type(parsed)](parsed, call))


@router.post("/models/{model_name:path}", response_model=TeiAnswer,
             response_model_exclude_none=True, responses=errors.INFERENCE,
             openapi_extra={"requestBody": {"required": True, **ROOT_DOCUMENTED["requestBody"]}})
async def inference_api(model_name: str, request: Request):
    """The Hugging Face Inference API for the model ``model_name`` (huggingface_hub's
    ``InferenceClient(model="http://HOST/models/NAME")``), whatever else is served: the
    body and answer of the task it does (feature extraction or sentence similarity, text
    classification, token classification, fill-mask, question answering; zero-shot
    classification for an NLI model), text classification's a list of labels per input."""
    engine = registry.pick_any(service(request), model_name)
    try:
        body = json.loads(await request.body())
    except (ValueError, RecursionError) as e:
        raise errors.ApiError(422, "invalid_request", errors.unparseable(e)) from None
    if not isinstance(body, dict):
        raise errors.ApiError(422, "invalid_request", "body: Input should be a valid "
                              "dictionary or object")
    parameters = body.get("parameters")
    if isinstance(parameters, dict) and "candidate_labels" in parameters:
        kind = "zero_shot"
        registry.pick(service(request), "zero-shot", engine.name)  # an NLI model, or a 400 saying so
    else:
        kind = _kind(engine, body)
        _check_parameters(service(request), engine, kind, body)
    parsed = _parsed(kind, {**body, "model": engine.name})
    call = http_call(request)
    answer, result = await ANSWERS[type(parsed)](parsed, call)
    if isinstance(parsed, TeiPredictRequest) and not parsed.batch:
        answer = [answer]
    return reply(call, answer, result)


@router.post("/vertex", response_model=TeiVertexResponse, response_model_exclude_none=True,
             responses=errors.INFERENCE)
async def vertex(body: TeiVertexRequest, request: Request):
    """Vertex AI's prediction request (deploy with the predict route /vertex): each
    instance a body POST / takes, run together; an instance refused refuses them all,
    named by its index."""
    call = http_call(request)
    check_limits(call, [], len(body.instances), "instances")
    parsed = []
    for i, instance in enumerate(body.instances):
        try:
            parsed.append(parse_root(instance, call.service))
        except Refusal as e:
            raise _instance(i, e) from None

    async def run(i: int, instance):
        try:
            return await ANSWERS[type(instance)](instance, call)
        except Refusal as e:
            raise _instance(i, e) from None

    try:
        async with asyncio.TaskGroup() as group:  # the first refusal cancels the others
            runs = [group.create_task(run(i, instance)) for i, instance in enumerate(parsed)]
    except ExceptionGroup as failed:
        raise failed.exceptions[0] from None
    answers = [task.result() for task in runs]
    return reply(call, {"predictions": [answer for answer, _ in answers]},
                 together([result for _, result in answers]))


def _instance(i: int, refusal: Refusal) -> Refusal:
    """``refusal`` naming the instance it refuses."""
    message = f"instances.{i}: {refusal.message}"
    if isinstance(refusal, errors.ApiError):
        return errors.ApiError(refusal.status, refusal.kind, message, refusal.headers)
    return Refusal(refusal.reason, message, refusal.retry_after)


def together(results: list[Result]) -> Result:
    """One run's account of runs made at once (the timing headers): the counts summed,
    each time the longest."""
    return Result([], sum(r.tokens for r in results), sum(r.characters for r in results),
                  max(r.tokenize_s for r in results), max(r.queued_s for r in results),
                  max(r.inference_s for r in results), results[0].device)


# 422: FastAPI would document its own error shape for the query parameter (never refused)
@router.get("/info", response_model=TeiInfo,
            responses=errors.responses(400, 401, 404, 422, 503))
async def info(request: Request, model: str | None = None):
    """The model named in ``model``, else the one POST / serves, described as TEI does."""
    return described(registry.pick_root(service(request), model), service(request).settings,
                     request.app.version)


def described(engine, settings, version: str) -> dict:
    """``engine`` as TEI's /info describes its model (a NER or question-answering model:
    a 400, TEI has none)."""
    if engine.task not in ("embed", "classify"):  # (NER, question answering, fill-mask)
        raise Refusal("wrong_task", f"model {engine.name!r} does {engine.task}, which TEI's "
                      f"/info does not describe: GET /v1/models/{engine.name}")
    described = engine.describe()
    batch_size, batch_tokens = engine.batch_limits
    if engine.task == "embed":
        kind = {"embedding": {"pooling": described.get("pooling")}}
    else:
        kind = {"reranker" if registry.cross_encoder(engine) else "classifier": {
            "id2label": {str(i): label for i, label in enumerate(engine.labels)},
            "label2id": {label: i for i, label in enumerate(engine.labels)}}}
    return {"model_id": engine.name, "model_sha": None,
            "model_dtype": DTYPES[described["dtype"]], "model_type": kind,
            "max_concurrent_requests": settings.max_connections,
            "max_input_length": engine.max_length, "max_batch_tokens": batch_tokens,
            "max_batch_requests": batch_size, "max_client_batch_size": settings.max_inputs,
            "auto_truncate": True, "tokenization_workers": 1, "version": version,
            "sha": None, "docker_label": None}
