"""vLLM's score API, POST /score (and /v1/score, its older path): pairs of texts scored
by the core's rerank pipeline (core/tasks.score: a cross-encoder's relevant label, or an
embedding model's cosine), the same models, queue, limits and errors as /v1/rerank."""

from __future__ import annotations

import time
import uuid

from fastapi import APIRouter, Request

from distilserve.server import errors
from distilserve.server.core import tasks
from distilserve.server.core.inference import usage
from distilserve.server.routes.common import http_call, reply
from distilserve.server.routes.vllm.schemas import ScoreRequest, ScoreResponse

router = APIRouter(tags=["vllm"])


@router.post("/score", response_model=ScoreResponse, responses=errors.INFERENCE)
@router.post("/v1/score", response_model=ScoreResponse, responses=errors.INFERENCE)
async def score(body: ScoreRequest, request: Request):
    """vLLM's score: each pair's score, in the order of data_2."""
    call = http_call(request)
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
