"""POST /v1/embeddings (OpenAI-compatible: texts or token ids, ``dimensions``; also at
/embeddings, as TEI and Infinity serve it) and POST /v1/embed."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from fastapi import APIRouter, Request

from server import errors, postprocess
from server.engine import Engine, Result
from server.routes.common import (
    check_answer_size,
    check_embedding_request,
    check_limits,
    choose,
    infer,
    reply,
    usage,
    with_prompt,
)
from server.schemas import (
    EmbeddingsRequest,
    EmbeddingsResponse,
    EmbedRequest,
    EmbedResponse,
    numbered,
)

router = APIRouter(tags=["embeddings"])


@router.post("/v1/embeddings", response_model=EmbeddingsResponse, responses=errors.INFERENCE)
@router.post("/embeddings", response_model=EmbeddingsResponse, responses=errors.INFERENCE)
async def embeddings(body: EmbeddingsRequest, request: Request):
    # unit length, the first ``dimensions`` components re-normalised; a long input: its
    # end is cut
    engine, vectors, result = await embedded(request, body.model, body.texts, body.dimensions)
    data = [{"object": "embedding", "index": i,
             "embedding": postprocess.embedding_payload(v, body.encoding_format)}
            for i, v in enumerate(vectors)]
    return reply(request, {"object": "list", "data": data, "model": engine.name,
                  "usage": usage(result)}, result)


@router.post("/v1/embed", response_model=EmbedResponse, responses=errors.INFERENCE)
async def embed(body: EmbedRequest, request: Request):
    engine, vectors, result = await embedded(request, body.model, body.texts, body.dimensions,
                                             body.prompt_name, body.truncation, body.normalize)
    return reply(request, {"model": engine.name, "embeddings": vectors, "usage": usage(result)},
                 result)


async def embedded(request: Request, model: str | None, texts: list,
                   dimensions: int | None = None, prompt_name: str | None = None,
                   truncation: str | None = "right", normalize: bool = True,
                   named: Callable[[int], str] = numbered) -> tuple[Engine, np.ndarray, Result]:
    """The embedding model (``model``, or the only one), the inputs' embeddings [N, D] (the
    first ``dimensions`` components, then unit length if ``normalize``) and the run; for
    /v1/embeddings, /v1/embed and TEI's /embed and /similarity. ``texts``: texts or token
    ids, behind the prompt ``prompt_name`` (None: the model's default prompt); ``named``:
    as common.infer's."""
    engine = choose(request, model, "embed")
    check_limits(request, texts, named=named)
    check_embedding_request(engine, texts, dimensions)
    check_answer_size(engine, len(texts), dimensions or engine.dimensions or 1)
    result = await infer(request, engine, with_prompt(engine, texts, prompt_name), truncation,
                         named=named)
    if normalize and dimensions is None and result.postprocessed is not None:
        return engine, np.asarray(result.postprocessed), result  # [N, D], by their batch
    vectors = postprocess.sentence_embeddings(result.outputs, engine.pools)  # [N, D]
    if dimensions is not None:  # [N, dimensions], its rows one after another (orjson's)
        vectors = np.ascontiguousarray(vectors[:, :dimensions])
    if normalize:
        vectors = postprocess.normalize(vectors)
    return engine, vectors, result
