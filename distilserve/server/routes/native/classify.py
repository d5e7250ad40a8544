"""POST /v1/classify: single texts and text pairs, and texts zero-shot (candidate labels
scored by an NLI model); POST /classify, Infinity's. Run by core/tasks.py."""

from __future__ import annotations

from fastapi import APIRouter, Request

from distilserve.server import errors
from distilserve.server.core import tasks
from distilserve.server.core.inference import usage
from distilserve.server.routes import options
from distilserve.server.routes.common import http_call, model_results, reply
from distilserve.server.routes.native.schemas import ClassifyRequest, ClassifyResponse
from distilserve.server.routes.tei.schemas import InfinityClassifyRequest, InfinityClassifyResponse

router = APIRouter(tags=["classification"])


@router.post("/v1/classify", response_model=ClassifyResponse, responses=errors.INFERENCE)
async def classify(body: ClassifyRequest, request: Request):
    return await model_results(request, options.classify, body)


@router.post("/classify", response_model=InfinityClassifyResponse, responses=errors.INFERENCE)
async def classify_infinity(body: InfinityClassifyRequest, request: Request):
    """Infinity's: every label's score per input, highest first."""
    call = http_call(request)
    engine, results, result = await tasks.classify(call, body.model, body.texts,
                                                   body.truncation, body.function,
                                                   iterations=body.iterations)
    return reply(call, {"object": "classify", "data": results, "model": engine.name,
                        "usage": usage(result)}, result)
