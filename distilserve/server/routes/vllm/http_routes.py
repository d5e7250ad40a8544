"""vLLM's score API, POST /score (and /v1/score, its older path): pairs of texts scored
by the core's rerank pipeline (core/tasks.score: a cross-encoder's relevant label, or an
embedding model's cosine), the same models, queue, limits and errors as /v1/rerank; its
pooling API, POST /pooling (core/tasks.pooled: each input's output as numbers); and its
/tokenize body (which /tokenize takes beside TEI's) and /detokenize."""

from __future__ import annotations

import time
import uuid

import orjson
from fastapi import APIRouter, Request, Response

from distilserve.server import errors
from distilserve.server.core import registry, tasks
from distilserve.server.core.inference import usage
from distilserve.server.routes.common import PACKED, http_call, packed_reply, reply
from distilserve.server.routes.vllm.schemas import (
    PoolingRequest,
    PoolingResponse,
    ScoreRequest,
    ScoreResponse,
    VllmDetokenizeRequest,
    VllmDetokenizeResponse,
    VllmTokenizeRequest,
)

router = APIRouter(tags=["vllm"])


@router.post("/score", response_model=ScoreResponse, responses=errors.INFERENCE)
@router.post("/v1/score", response_model=ScoreResponse, responses=errors.INFERENCE)
async def score(body: ScoreRequest, request: Request):
    """vLLM's score: each pair's score, in the order of data_2."""
    call = http_call(request, body.priority)
    engine, scores, result = await tasks.score(
        call, body.model, body.queries, body.documents, body.truncation_side, body.raw_scores,
        body.name_of, body.iterations, body.max_tokens_per_doc,
        "pairs" if len(body.queries) > 1 else "documents", body.truncate_prompt_tokens,
        body.max_tokens_per_query)
    return reply(call, {
        "id": f"score-{uuid.uuid4().hex}", "object": "list", "created": int(time.time()),
        "model": engine.name,
        "data": [{"index": i, "object": "score", "score": float(s)} for i, s in enumerate(scores)],
        "usage": {**usage(result), "completion_tokens": 0}}, result)


@router.post("/pooling", response_model=PoolingResponse,
             responses={**PACKED, **errors.INFERENCE})
async def pooling(body: PoolingRequest, request: Request):
    """vLLM's pooling: each input's output as numbers, of the task's kind (by default the
    model's own: an embedding, a classifier's label scores, a NER model's token label
    scores)."""
    call = http_call(request, body.priority)
    engine, outputs, result = await tasks.pooled(
        call, body.model, body.task, body.texts, body.truncation_side,
        body.truncate_prompt_tokens, body.activated, body.dimensions, body.iterations)
    head = {"id": f"pool-{uuid.uuid4().hex}", "created": int(time.time()),
            "model": engine.name, "usage": {**usage(result), "completion_tokens": 0}}
    if body.in_bytes:
        return packed_reply(call, outputs, body, head, result)
    data = [{"index": i, "object": "pooling", "data": body.payload(output)}
            for i, output in enumerate(outputs)]
    return reply(call, {**head, "object": "list", "data": data}, result)


async def tokenize(body: VllmTokenizeRequest, request: Request):
    """vLLM's tokenize: the prompt's token ids, how many, and the model's max_length (its
    tokens as the vocabulary spells them with ``return_token_strs``)."""
    call = http_call(request)
    engine = registry.pick_tokenizer(call.service, body.model)
    (tokens,) = await tasks.tokens(call, engine.name, body.texts, body.add_special_tokens)
    ids = [t["id"] for t in tokens]
    return Response(orjson.dumps({
        "count": len(ids), "max_model_len": engine.max_length, "tokens": ids,
        "token_strs": engine.text.token_strings(ids) if body.return_token_strs else None}),
        media_type="application/json")


@router.post("/detokenize", response_model=VllmDetokenizeResponse,
             responses=errors.responses(400, 401, 404, 413, 422, 503))
async def detokenize(body: VllmDetokenizeRequest, request: Request):
    """vLLM's detokenize: the ids as text, special tokens included."""
    (text,) = await tasks.decode(http_call(request), body.model, body.texts, False)
    return Response(orjson.dumps({"prompt": text}), media_type="application/json")
