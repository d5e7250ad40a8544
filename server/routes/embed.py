"""POST /v1/embeddings (OpenAI-compatible) and POST /v1/embed."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response

from server import postprocess
from server.routes.common import choose, run
from server.schemas import (
    EmbeddingItem,
    EmbeddingsRequest,
    EmbeddingsResponse,
    EmbedRequest,
    EmbedResponse,
    Usage,
)

router = APIRouter(tags=["embeddings"])


@router.post("/v1/embeddings", response_model=EmbeddingsResponse)
async def embeddings(body: EmbeddingsRequest, request: Request, response: Response):
    engine = choose(request, body.model, "embed")
    result = await run(request, response, engine, body.texts, truncate=True)
    data = [EmbeddingItem(index=i, embedding=postprocess.embedding_payload(
        postprocess.normalize(v), body.encoding_format)) for i, v in enumerate(result.outputs)]
    return EmbeddingsResponse(data=data, model=engine.name,
                              usage=Usage(prompt_tokens=result.tokens, total_tokens=result.tokens))


@router.post("/v1/embed", response_model=EmbedResponse)
async def embed(body: EmbedRequest, request: Request, response: Response):
    engine = choose(request, body.model, "embed")
    result = await run(request, response, engine, body.texts, body.truncate)
    vectors = [postprocess.normalize(v) if body.normalize else v for v in result.outputs]
    return EmbedResponse(model=engine.name, embeddings=[v.tolist() for v in vectors],
                         usage=Usage(prompt_tokens=result.tokens, total_tokens=result.tokens))
