"""POST /v1/ner: entities with character offsets into the text as sent."""

from __future__ import annotations

import asyncio

import numpy as np
from fastapi import APIRouter, Request

from server import errors, postprocess
from server.engine import Engine, Result
from server.routes.common import check_limits, choose, infer, reply
from server.schemas import NerRequest, NerResponse

router = APIRouter(tags=["ner"])


@router.post("/v1/ner", response_model=NerResponse, responses=errors.INFERENCE)
async def ner(body: NerRequest, request: Request):
    engine, results, result = await recognised(body, request)
    return reply(request, {"model": engine.name, "results": results}, result)


async def recognised(body: NerRequest, request: Request
                     ) -> tuple[Engine, list[list[dict]], Result]:
    """The NER model, each input's entities and the run (also the Open Inference
    Protocol's infer)."""
    engine = choose(request, body.model, "ner")
    check_limits(request, body.texts)
    texts = body.texts
    result = await infer(request, engine, texts, body.truncation)
    results = await asyncio.to_thread(  # postprocessing off the event loop
        lambda: [entities(engine, text, output, body.aggregation_strategy)
                 for text, output in zip(texts, result.outputs)])
    return engine, results, result


def entities(engine, text: str, output, strategy: str) -> list[dict]:
    """One text's token logits [T, C] and its encoding -> the pipeline's entities."""
    logits, encoding = output
    info = postprocess.TokenInfo.of(encoding, engine.unk_id, engine.word_aware)
    return postprocess.entities(text, info, np.asarray(logits), engine.labels, strategy)
