"""POST /v1/ner: entities with character offsets into the text as sent, as transformers'
token-classification pipeline finds them. With ``stride``, a text longer than the model's
max_length tokens is read whole, as the pipeline reads it: in overlapping windows, each an
input of its own in the model's batches, their entities merged where they overlap."""

from __future__ import annotations

import asyncio

import numpy as np
from fastapi import APIRouter, Request

from distilserve.models import entities as spans
from distilserve.server import errors
from distilserve.server.core import registry
from distilserve.server.core.inference import Call, check_limits, infer
from distilserve.server.core.refusals import Refusal
from distilserve.server.engine import Engine, Result
from distilserve.server.routes.common import http_call, reply
from distilserve.server.schemas import NerRequest, NerResponse

router = APIRouter(tags=["ner"])


@router.post("/v1/ner", response_model=NerResponse, responses=errors.INFERENCE)
async def ner(body: NerRequest, request: Request):
    call = http_call(request)
    engine, results, result = await recognised(body, call)
    return reply(call, {"model": engine.name, "results": results}, result)


async def recognised(body: NerRequest, call: Call
                     ) -> tuple[Engine, list[list[dict]], Result]:
    """The NER model, each input's entities and the run (also POST /'s, the Hugging Face
    Inference API's body, and the Open Inference Protocol's)."""
    engine = registry.pick(call.service, "ner", body.model)
    check_limits(call, body.texts)
    texts, ignore = body.texts, tuple(body.ignore_labels)
    if body.stride is None:
        result = await infer(call, engine, texts, body.truncation,
                             iterations=body.iterations)
    else:
        result = await infer(call, engine, texts, None, _windows(engine, body.stride),
                             iterations=body.iterations)
    results = await asyncio.to_thread(  # postprocessing off the event loop
        lambda: [entities(engine, text, output, body.aggregation_strategy, ignore)
                 for text, output in zip(texts, result.outputs)])
    return engine, results, result


def _windows(engine: Engine, stride: int) -> tuple[int, int]:
    """Windows of the model's max_length tokens, each ``stride`` over the one before (a 422
    unless that leaves each window something new)."""
    if stride >= engine.text.room:
        raise Refusal("invalid", f"stride {stride}: model {engine.name!r} reads windows "
                      f"of {engine.text.room} tokens of text (its max_length, "
                      f"{engine.max_length}, less its special tokens); stride must be less")
    return engine.max_length, stride


def entities(engine: Engine, text: str, output, strategy: str,
             ignore: tuple[str, ...]) -> list[dict]:
    """One text's token logits [T, C] and its encoding, or a list of its windows' -> the
    pipeline's entities (those of the windows merged where they overlap)."""
    if isinstance(output, list):
        found = [e for window in output for e in entities(engine, text, window, strategy,
                                                          ignore)]
        return spans.overlapping(found) if len(output) > 1 else found
    logits, encoding = output
    info = spans.TokenInfo.of(encoding, engine.text.unk_id, engine.text.word_aware)
    return spans.entities(text, info, np.asarray(logits), engine.labels, strategy,
                                ignore)
