"""POST /v1/rerank (Jina / Cohere shape): documents ranked by relevance to a query, by a
cross-encoder (a classification model scoring (query, document) pairs) or by the cosine
of an embedding model's embeddings. The documents are queued like any other inputs, so
they share batches with other requests."""

from __future__ import annotations

import numpy as np
from fastapi import APIRouter, Request

from distilserve.server import errors
from distilserve.server.core import postprocess, registry
from distilserve.server.core.inference import Call, check_limits, infer, usage, with_prompt
from distilserve.server.engine import Engine, Result
from distilserve.server.routes.common import http_call, reply
from distilserve.server.routes.tei_schemas import TeiRerankRequest
from distilserve.server.schemas import RerankRequest, RerankResponse

router = APIRouter(tags=["rerank"])


@router.post("/v1/rerank", response_model=RerankResponse, response_model_exclude_none=True,
             responses=errors.INFERENCE)
async def rerank(body: RerankRequest, request: Request):
    call = http_call(request)
    engine, scores, result = await scored(body, call)
    return reply(call, {"model": engine.name, "usage": usage(result), "results":
                           postprocess.ranked(scores, body.document_texts, body.top_n,
                                              body.return_documents)}, result)


async def scored(body: RerankRequest | TeiRerankRequest, call: Call
                 ) -> tuple[Engine, np.ndarray, Result]:
    """The reranking model, each document's score [N], and the run (also TEI's /rerank)."""
    engine = registry.pick(call.service, "rerank", body.model)
    documents = body.document_texts
    check_limits(call, body.texts, len(documents), "documents",  # the query: not counted
                 body.name_of)
    if engine.task == "embed":  # prompted as sentence-transformers' encode_query/_document
        texts = (with_prompt(engine, [body.query], _first(engine, "query"))
                 + with_prompt(engine, documents, _first(engine, "document", "passage", "corpus")))
        result = await infer(call, engine, texts, body.truncation, named=body.name_of,
                             iterations=body.iterations)
        # [1 + N, D]: the query, then the documents
        vectors = postprocess.sentence_embeddings(result.outputs, engine.pools)
        if engine.sparse:  # SPLADE ranks by dot product
            return engine, vectors[1:] @ vectors[0], result
        return engine, postprocess.cosine_ranking(vectors[0], vectors[1:]), result
    result = await infer(call, engine, [(body.query, d) for d in documents], body.truncation,
                         named=lambda k: f"document {k} (with the query)",
                         iterations=body.iterations)
    # [N]: the relevant label's score as /v1/classify gives it (the batch's label scores,
    # scored on the model's thread: Engine.batch_postprocess), or its logit (raw_scores)
    rows = result.outputs if body.raw_scores else result.postprocessed
    return engine, np.stack(rows)[:, engine.relevant], result


def _first(engine, *names: str) -> str | None:
    """The first of ``names`` that is one of the model's prompts."""
    return next((name for name in names if name in engine.prompts), None)
