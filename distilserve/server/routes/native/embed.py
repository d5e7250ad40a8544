"""POST /v1/embeddings (OpenAI-compatible: texts or token ids, ``dimensions``; also at
/embeddings, as TEI and Infinity serve it) and POST /v1/embed (also Cohere's v1 body)."""

from __future__ import annotations

import time
import uuid

from fastapi import APIRouter, Request

from distilserve.server import errors
from distilserve.server.core.inference import embedded, usage
from distilserve.server.routes import options
from distilserve.server.routes.cohere import http_routes as cohere
from distilserve.server.routes.cohere.schemas import CohereEmbedResponse, CohereV1EmbedRequest, EmbedBody
from distilserve.server.routes.common import PACKED, http_call, packed_reply, reply
from distilserve.server.routes.native.schemas import (
    EmbeddingsRequest,
    EmbeddingsResponse,
    EmbedResponse,
)

router = APIRouter(tags=["embeddings"])


@router.post("/v1/embeddings", response_model=EmbeddingsResponse,
             responses={**PACKED, **errors.INFERENCE})
@router.post("/embeddings", response_model=EmbeddingsResponse,
             responses={**PACKED, **errors.INFERENCE})
async def embeddings(body: EmbeddingsRequest, request: Request):
    # unit length (not with use_activation false), the first ``dimensions`` components
    # re-normalised; a long input: its end is cut (its start: truncation_side "left"), to
    # max_length or vLLM's truncate_prompt_tokens; token ids in the vocabulary the model
    # reads them in (foreign_ids)
    call = http_call(request, body.priority)
    engine, vectors, result = await embedded(
        call, body.model, body.texts, body.dimensions, truncation=body.truncation_side,
        normalize=body.activated, foreign_ids=True, iterations=body.iterations,
        truncate_prompt_tokens=body.truncate_prompt_tokens)
    if body.in_bytes:
        return packed_reply(call, list(vectors), body, {
            "id": f"embd-{uuid.uuid4().hex}", "created": int(time.time()),
            "model": engine.name, "usage": usage(result)}, result)
    data = [{"object": "embedding", "index": i, "embedding": body.payload(v)}
            for i, v in enumerate(vectors)]
    return reply(call, {"object": "list", "data": data, "model": engine.name,
                        "usage": usage(result)}, result)


@router.post("/v1/embed", response_model=EmbedResponse | CohereEmbedResponse,
             responses=errors.INFERENCE)
async def embed(body: EmbedBody, request: Request):
    """The native body (``inputs``), or Cohere's v1 (``texts``, ``cohere.Client.embed``),
    answered in Cohere's v1 shape."""
    if isinstance(body, CohereV1EmbedRequest):
        return await cohere.embed_v1(body, request)
    call = http_call(request)
    engine, vectors, result = await options.embed(call, body.model, body.texts, body)
    return reply(call, {"model": engine.name, "embeddings": vectors, "usage": usage(result)},
                 result)
