"""POST /v1/classify: single texts and text pairs."""

from __future__ import annotations

from fastapi import APIRouter, Request

from server import errors, postprocess
from server.routes.common import check_limits, choose, infer, reply
from server.schemas import ClassifyRequest, ClassifyResponse

router = APIRouter(tags=["classification"])


@router.post("/v1/classify", response_model=ClassifyResponse, responses=errors.INFERENCE)
async def classify(body: ClassifyRequest, request: Request):
    engine = choose(request, body.model, "classify")
    check_limits(request, body.texts)
    result = await infer(request, engine, body.texts, body.truncation)
    return reply(request, {"model": engine.name, "results": [
        postprocess.classification(logits, engine.labels, body.top_k, engine.multi_label,
                                   body.raw_scores)
        for logits in result.outputs]}, result)
