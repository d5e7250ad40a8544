"""POST /v1/rerank (Jina / Cohere shape): documents ranked by relevance to a query, by a
cross-encoder (a classification model scoring (query, document) pairs) or by the cosine
of an embedding model's embeddings (core/tasks.score). The documents are queued like any
other inputs, so they share batches with other requests."""

from __future__ import annotations

from fastapi import APIRouter, Request

from distilserve.server import errors
from distilserve.server.core import postprocess, tasks
from distilserve.server.core.inference import Call, usage
from distilserve.server.routes.common import http_call, reply
from distilserve.server.routes.native.schemas import RerankRequest, RerankResponse
from distilserve.server.routes.tei.schemas import TeiRerankRequest

router = APIRouter(tags=["rerank"])


@router.post("/v1/rerank", response_model=RerankResponse, response_model_exclude_none=True,
             responses=errors.INFERENCE)
async def rerank(body: RerankRequest, request: Request):
    call = http_call(request, body.priority)
    engine, scores, result = await scored(body, call)
    return reply(call, {"model": engine.name, "usage": usage(result), "results":
                        postprocess.ranked(scores, body.document_texts, body.top_n,
                                           body.return_documents)}, result)


def scored(body: RerankRequest | TeiRerankRequest, call: Call):
    """The body's documents scored, each first cut to its max_tokens_per_doc (also TEI's
    /rerank and Cohere's v2 rerank)."""
    return tasks.score(call, body.model, [body.query], body.document_texts, body.truncation,
                       body.raw_scores, body.name_of, body.iterations, body.max_tokens_per_doc,
                       total=body.truncate_prompt_tokens, query_most=body.max_tokens_per_query)
