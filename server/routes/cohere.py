"""Cohere's v2 API (``cohere.ClientV2(base_url=...)``): /v2/embed and /v2/rerank, run by
the /v1 routes' functions (the same models, queue, limits and errors)."""

from __future__ import annotations

import uuid

from fastapi import APIRouter, Request

from server import errors, postprocess
from server.routes import rerank as v1_rerank
from server.routes.common import choose, reply, usage
from server.routes.embed import embedded
from server.schemas import CohereEmbedRequest, CohereEmbedResponse, RerankRequest

router = APIRouter(tags=["cohere"])
# input_type -> the model's prompts it is put behind, the first the model has (none: its
# default prompt), as sentence-transformers' encode_query and encode_document choose them
PROMPTS = {"search_query": ("query",), "search_document": ("document", "passage", "corpus"),
           "classification": ("classification",), "clustering": ("clustering",)}
TRUNCATION = {"END": "right", "START": "left", "NONE": None}


def _meta(tokens: int) -> dict:
    return {"api_version": {"version": "2"}, "billed_units": {"input_tokens": tokens}}


@router.post("/v2/embed", response_model=CohereEmbedResponse, responses=errors.INFERENCE)
async def embed(body: CohereEmbedRequest, request: Request):
    """Cohere's v2 embed: each text's embedding in every type asked for (float, int8,
    uint8, binary, ubinary, base64), behind the model's prompt for its ``input_type``."""
    engine = choose(request, body.model, "embed")
    prompt = next((name for name in PROMPTS[body.input_type] if name in engine.prompts), None)
    _, vectors, result = await embedded(request, engine.name, body.texts,
                                        body.output_dimension, prompt, TRUNCATION[body.truncate],
                                        named=body.name_of)
    return reply(request, {
        "id": str(uuid.uuid4()), "response_type": "embeddings_by_type",
        "embeddings": postprocess.cohere_embeddings(vectors, body.embedding_types),
        "texts": body.texts, "meta": _meta(result.tokens)}, result)


@router.post("/v2/rerank", responses=errors.INFERENCE)
async def rerank(body: RerankRequest, request: Request):
    """Cohere's v2 rerank: /v1/rerank's answer, with Cohere's id and meta."""
    engine, scores, result = await v1_rerank.scored(body, request)
    return reply(request, {
        "id": str(uuid.uuid4()), "model": engine.name, "usage": usage(result),
        "results": postprocess.ranked(scores, body.document_texts, body.top_n,
                                      body.return_documents),
        "meta": _meta(result.tokens)}, result)
