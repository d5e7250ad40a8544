"""POST /v1/embeddings (OpenAI-compatible: texts or token ids, ``dimensions``; also at
/embeddings, as TEI and Infinity serve it) and POST /v1/embed (also Cohere's v1 body)."""

from __future__ import annotations

from fastapi import APIRouter, Request

from distilserve.server import errors
from distilserve.server.core import postprocess, registry
from distilserve.server.core.inference import check_limits, embedded, read_foreign, usage, within
from distilserve.server.routes import options
from distilserve.server.routes.cohere import http_routes as cohere
from distilserve.server.routes.cohere.schemas import CohereEmbedResponse, CohereV1EmbedRequest, EmbedBody
from distilserve.server.routes.common import http_call, reply
from distilserve.server.routes.native.schemas import (
    EmbeddingsRequest,
    EmbeddingsResponse,
    EmbedResponse,
)

router = APIRouter(tags=["embeddings"])


@router.post("/v1/embeddings", response_model=EmbeddingsResponse, responses=errors.INFERENCE)
@router.post("/embeddings", response_model=EmbeddingsResponse, responses=errors.INFERENCE)
async def embeddings(body: EmbeddingsRequest, request: Request):
    # unit length, the first ``dimensions`` components re-normalised; a long input: its
    # end is cut (its start: truncation_side "left"); token ids in the vocabulary the model
    # reads them in (foreign_ids)
    call = http_call(request)
    texts = body.texts
    if body.truncate_prompt_tokens not in (None, -1):  # the limits on what was sent, then cut
        engine = registry.pick(call.service, "embed", body.model)
        texts = read_foreign(engine, texts)
        check_limits(call, texts)
        texts = await within(engine, texts, body.truncate_prompt_tokens, "truncate_prompt_tokens",
                             side=body.truncation_side)
    engine, vectors, result = await embedded(call, body.model, texts, body.dimensions,
                                             truncation=body.truncation_side, foreign_ids=True,
                                             iterations=body.iterations)
    data = [{"object": "embedding", "index": i,
             "embedding": postprocess.embedding_payload(v, body.encoding_format)}
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
