"""Text Embeddings Inference's own routes, for the clients written for TEI (huggingface_hub's
InferenceClient, LangChain's HuggingFaceEndpointEmbeddings, Haystack's TEI components,
LlamaIndex's TextEmbeddingsInference): POST /embed, /predict and /rerank with TEI's
bodies, and POST / as TEI serves an embedding model there. The models, queue, limits,
errors and timing headers are those of the /v1 routes (their functions run them); only
the bodies' shapes are TEI's. /rerank also takes the body that Infinity and vLLM take at
that path (Cohere's, with ``documents``) and answers it as /v1/rerank. (/tokenize and
/embeddings sit beside /v1/tokenize and /v1/embeddings, in their own files.)"""

from __future__ import annotations

from fastapi import APIRouter, Request

from server import errors, postprocess
from server.routes import rerank as v1
from server.routes.classify import classified
from server.routes.common import reply
from server.routes.embed import embedded
from server.schemas import (
    EmbedRequest,
    RerankRequest,
    RerankResponse,
    Score,
    TeiPredictRequest,
    TeiRank,
    TeiRerankRequest,
)

router = APIRouter(tags=["Text Embeddings Inference"])


@router.post("/embed", response_model=list[list[float]], responses=errors.INFERENCE)
@router.post("/", response_model=list[list[float]], responses=errors.INFERENCE)
async def embed(body: EmbedRequest, request: Request):
    """/v1/embed's request; the embeddings alone, one list per input."""
    _, vectors, result = await embedded(body, request)
    return reply(request, vectors, result)


@router.post("/predict", response_model=list[Score] | list[list[Score]],
             responses=errors.INFERENCE)
async def predict(body: TeiPredictRequest, request: Request):
    """Every label's score, highest first: a list for a text or a pair, a list of them for
    a batch."""
    _, results, result = await classified(body, request)
    return reply(request, results if body.batch else results[0], result)


@router.post("/rerank", response_model=list[TeiRank] | RerankResponse,
             response_model_exclude_none=True, responses=errors.INFERENCE)
async def rerank(body: TeiRerankRequest | RerankRequest, request: Request):
    """TEI's body (``texts``): every text's score, highest first (ties in input order),
    with the text if asked. Cohere's, Jina's, Infinity's and vLLM's (``documents``): as
    /v1/rerank."""
    if isinstance(body, RerankRequest):
        return await v1.rerank(body, request)
    _, scores, result = await v1.scored(body, request)
    texts = body.document_texts
    return reply(request, [{"index": r["index"], "score": r["relevance_score"],
                            **({"text": texts[r["index"]]} if body.return_text else {})}
                           for r in postprocess.ranked(scores, texts, None, False)], result)
