"""Cohere's API: v2 (``cohere.ClientV2(base_url=...)``) /v2/embed and /v2/rerank, and v1
(``cohere.Client``) embed, whose body /v1/embed takes (v1's rerank is /v1/rerank's own),
run by the core's pipelines as the /v1 routes are (the same models, queue, limits and
errors)."""

from __future__ import annotations

import uuid

from fastapi import APIRouter, Request

from distilserve.server import errors
from distilserve.server.core import postprocess, registry
from distilserve.server.core.inference import Call, capped, check_limits, embedded, usage
from distilserve.server.routes.cohere.schemas import (
    CohereEmbedRequest,
    CohereEmbedResponse,
    CohereRerankRequest,
    CohereV1EmbedRequest,
)
from distilserve.server.routes.common import http_call, reply
from distilserve.server.routes.native import rerank as v1_rerank

router = APIRouter(tags=["cohere"])
# input_type -> the model's prompts it is put behind, the first the model has (none, or no
# input_type: its default prompt), as sentence-transformers' encode_query and
# encode_document choose them
PROMPTS = {"search_query": ("query",), "search_document": ("document", "passage", "corpus"),
           "classification": ("classification",), "clustering": ("clustering",)}
TRUNCATION = {"END": "right", "START": "left", "NONE": None}


def _meta(tokens: int, version: str) -> dict:
    return {"api_version": {"version": version}, "billed_units": {"input_tokens": tokens}}


async def _embedded(body: CohereEmbedRequest | CohereV1EmbedRequest, call: Call,
                    max_tokens: int | None = None):
    """The texts' embeddings [N, D], each cut to ``max_tokens`` (as ``truncate`` says),
    behind the model's prompt for their input_type."""
    engine = registry.pick(call.service, "embed", body.model)
    prompt = next((name for name in PROMPTS.get(body.input_type, ()) if name in engine.prompts),
                  None)
    texts = body.texts
    if max_tokens is not None:  # the limits on the texts sent, then the texts cut
        check_limits(call, texts, named=body.name_of)
        texts = await capped(engine, texts, max_tokens, TRUNCATION[body.truncate],
                             "max_tokens", body.name_of)
    _, vectors, result = await embedded(call, engine.name, texts,
                                        body.output_dimension, prompt, TRUNCATION[body.truncate],
                                        named=body.name_of)
    return vectors, result


@router.post("/v2/embed", response_model=CohereEmbedResponse, responses=errors.INFERENCE)
async def embed(body: CohereEmbedRequest, request: Request):
    """Cohere's v2 embed: each text's embedding in every type asked for (float, int8,
    uint8, binary, ubinary, base64), behind the model's prompt for its ``input_type``."""
    call = http_call(request)
    vectors, result = await _embedded(body, call, body.max_tokens)
    return reply(call, {
        "id": str(uuid.uuid4()), "response_type": "embeddings_by_type",
        "embeddings": postprocess.cohere_embeddings(vectors, body.embedding_types),
        "texts": body.texts, "meta": _meta(result.tokens, "2")}, result)


async def embed_v1(body: CohereV1EmbedRequest, request: Request):
    """Cohere's v1 embed: as v2's, or the float embeddings alone where no
    ``embedding_types`` are asked for ("embeddings_floats")."""
    call = http_call(request)
    vectors, result = await _embedded(body, call)
    floats = body.embedding_types is None
    return reply(call, {
        "id": str(uuid.uuid4()),
        "response_type": "embeddings_floats" if floats else "embeddings_by_type",
        "embeddings": vectors if floats else
        postprocess.cohere_embeddings(vectors, body.embedding_types),
        "texts": body.texts, "meta": _meta(result.tokens, "1")}, result)


@router.post("/v2/rerank", responses=errors.INFERENCE)
async def rerank(body: CohereRerankRequest, request: Request):
    """Cohere's v2 rerank: /v1/rerank's answer, with Cohere's id and meta."""
    call = http_call(request)
    engine, scores, result = await v1_rerank.scored(body, call)
    return reply(call, {
        "id": str(uuid.uuid4()), "model": engine.name, "usage": usage(result),
        "results": postprocess.ranked(scores, body.document_texts, body.top_n,
                                      body.return_documents),
        "meta": _meta(result.tokens, "2")}, result)
