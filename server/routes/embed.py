"""POST /v1/embeddings (OpenAI-compatible: texts or token ids, ``dimensions``; also at
/embeddings, as TEI and Infinity serve it) and POST /v1/embed."""

from __future__ import annotations

import numpy as np
from fastapi import APIRouter, Request

from server import errors, postprocess
from server.engine import Engine, Result
from server.routes.common import (
    check_embedding_request,
    check_limits,
    choose,
    infer,
    reply,
    usage,
    with_prompt,
)
from server.schemas import EmbeddingsRequest, EmbeddingsResponse, EmbedRequest, EmbedResponse

router = APIRouter(tags=["embeddings"])


@router.post("/v1/embeddings", response_model=EmbeddingsResponse, responses=errors.INFERENCE)
@router.post("/embeddings", response_model=EmbeddingsResponse, responses=errors.INFERENCE)
async def embeddings(body: EmbeddingsRequest, request: Request):
    engine = choose(request, body.model, "embed")
    check_limits(request, body.texts)
    check_embedding_request(engine, body.texts, body.dimensions)
    texts = with_prompt(engine, body.texts, None)
    result = await infer(request, engine, texts, "right")  # a long input: its end is cut
    vectors = postprocess.normalize(np.stack(result.outputs))  # [N, D]
    vectors = postprocess.first_dimensions(vectors, body.dimensions)  # [N, dimensions]
    data = [{"object": "embedding", "index": i,
             "embedding": postprocess.embedding_payload(v, body.encoding_format)}
            for i, v in enumerate(vectors)]
    return reply(request, {"object": "list", "data": data, "model": engine.name,
                  "usage": usage(result)}, result)


@router.post("/v1/embed", response_model=EmbedResponse, responses=errors.INFERENCE)
async def embed(body: EmbedRequest, request: Request):
    engine, vectors, result = await embedded(body, request)
    return reply(request, {"model": engine.name, "embeddings": vectors, "usage": usage(result)},
                 result)


async def embedded(body: EmbedRequest, request: Request) -> tuple[Engine, np.ndarray, Result]:
    """The embedding model, the inputs' embeddings [N, D] and the run (also TEI's /embed)."""
    engine = choose(request, body.model, "embed")
    check_limits(request, body.texts)
    check_embedding_request(engine, body.texts, body.dimensions)
    texts = with_prompt(engine, body.texts, body.prompt_name)
    result = await infer(request, engine, texts, body.truncation)
    vectors = np.stack(result.outputs)  # [N, D]
    if body.dimensions is not None:
        vectors = vectors[:, : body.dimensions]
    if body.normalize:
        vectors = postprocess.normalize(vectors)
    return engine, vectors, result
