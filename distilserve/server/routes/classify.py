"""POST /v1/classify: single texts and text pairs, and texts zero-shot (candidate labels
scored by an NLI model); POST /classify, Infinity's."""

from __future__ import annotations

import numpy as np
from fastapi import APIRouter, Request

from distilserve.server import errors
from distilserve.server.core import postprocess, registry
from distilserve.server.core.inference import Call, check_limits, infer, usage
from distilserve.server.engine import Engine, Result
from distilserve.server.routes.common import http_call, reply
from distilserve.server.routes.tei_schemas import (
    InfinityClassifyRequest,
    InfinityClassifyResponse,
    TeiPredictRequest,
)
from distilserve.server.schemas import (
    ClassifyRequest,
    ClassifyResponse,
)

router = APIRouter(tags=["classification"])


@router.post("/v1/classify", response_model=ClassifyResponse, responses=errors.INFERENCE)
async def classify(body: ClassifyRequest, request: Request):
    call = http_call(request)
    engine, results, result = await (zero_shot(body, call) if body.candidate_labels
                                     else classified(body, call, body.top_k))
    return reply(call, {"model": engine.name, "results": results}, result)


@router.post("/classify", response_model=InfinityClassifyResponse, responses=errors.INFERENCE)
async def classify_infinity(body: InfinityClassifyRequest, request: Request):
    """Infinity's: every label's score per input, highest first."""
    call = http_call(request)
    engine, results, result = await classified(body, call)
    return reply(call, {"object": "classify", "data": results, "model": engine.name,
                        "usage": usage(result)}, result)


async def classified(body: ClassifyRequest | TeiPredictRequest | InfinityClassifyRequest,
                     call: Call, top_k: int | None = None
                     ) -> tuple[Engine, list[list[dict]], Result]:
    """The classification model, each input's labels and scores (highest first, the best
    ``top_k``), and the run (also TEI's /predict and Infinity's /classify)."""
    engine, result = await run(body, call)
    scores = result.postprocessed  # the pipeline's function, applied by their batch
    if body.function is not None:
        scores = [postprocess.label_scores(logits, engine.labels, engine.multi_label,
                                           body.function) for logits in result.outputs]
    return engine, [postprocess.best(each, engine.labels, top_k) for each in scores], result


async def run(body: ClassifyRequest | TeiPredictRequest | InfinityClassifyRequest,
              call: Call) -> tuple[Engine, Result]:
    """The classification model and its run on the body's inputs (each output the input's
    logits; also the Open Inference Protocol's infer, which answers them in label order)."""
    engine = registry.pick(call.service, "classify", body.model)
    check_limits(call, body.texts)
    return engine, await infer(call, engine, body.texts, body.truncation,
                               iterations=body.iterations)


async def zero_shot(body: ClassifyRequest, call: Call
                    ) -> tuple[Engine, list[list[dict]], Result]:
    """The NLI model, each text's candidate labels and their scores (highest first, the
    best ``top_k``), and the run: transformers' zero-shot-classification pipeline, the
    model run on every (text, a label's hypothesis) pair (the pairs are the request's
    inputs for its limits)."""
    engine = registry.pick(call.service, "zero-shot", body.model)
    labels, hypotheses = body.candidate_labels, body.hypotheses()
    pairs = [(text, hypothesis) for text in body.texts for hypothesis in hypotheses]

    def named(k: int) -> str:  # (the pairs: each text with each label, in turn)
        return f"input {k // len(labels)} with candidate label {labels[k % len(labels)]!r}"

    check_limits(call, pairs, what="(text, candidate label) pairs", named=named)
    result = await infer(call, engine, pairs, body.truncation, named=named,
                         iterations=body.iterations)
    logits = np.stack(result.outputs).reshape(len(body.texts), len(labels), -1)  # [N, L, C]
    return engine, [postprocess.best(postprocess.zero_shot(
        each, engine.entailment, body.multi_label, body.raw_scores), labels, body.top_k)
        for each in logits], result
