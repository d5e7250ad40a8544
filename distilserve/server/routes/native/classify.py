"""POST /v1/classify: single texts and text pairs, and texts zero-shot (candidate labels
scored by an NLI model); POST /classify, Infinity's. Run by core/tasks.py."""

from __future__ import annotations

from fastapi import APIRouter, Request

from distilserve.server import errors
from distilserve.server.core import tasks
from distilserve.server.core.inference import Call, usage
from distilserve.server.routes.common import http_call, reply
from distilserve.server.routes.native.schemas import ClassifyRequest, ClassifyResponse
from distilserve.server.routes.tei.schemas import InfinityClassifyRequest, InfinityClassifyResponse

router = APIRouter(tags=["classification"])


@router.post("/v1/classify", response_model=ClassifyResponse, responses=errors.INFERENCE)
async def classify(body: ClassifyRequest, request: Request):
    call = http_call(request)
    engine, results, result = await (zero_shot(body, call) if body.candidate_labels else
                                     tasks.classify(call, body.model, body.texts,
                                                    body.truncation, body.function,
                                                    body.top_k, body.iterations))
    return reply(call, {"model": engine.name, "results": results}, result)


def zero_shot(body: ClassifyRequest, call: Call):
    """A body with candidate labels run (also the Hugging Face Inference API's
    zero-shot classification, as /v1/classify's options)."""
    return tasks.zero_shot(call, body.model, body.texts, body.candidate_labels,
                           body.hypotheses(), body.truncation, body.multi_label,
                           body.raw_scores, body.top_k, body.iterations)


@router.post("/classify", response_model=InfinityClassifyResponse, responses=errors.INFERENCE)
async def classify_infinity(body: InfinityClassifyRequest, request: Request):
    """Infinity's: every label's score per input, highest first."""
    call = http_call(request)
    engine, results, result = await tasks.classify(call, body.model, body.texts,
                                                   body.truncation, body.function,
                                                   iterations=body.iterations)
    return reply(call, {"object": "classify", "data": results, "model": engine.name,
                        "usage": usage(result)}, result)
