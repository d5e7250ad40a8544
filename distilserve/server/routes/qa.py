"""POST /v1/qa: extractive question answering, as transformers' question-answering pipeline
answers (DistilBERT's and BERT's SQuAD models): each question's answer spans in its
context, with the characters they cover. A long context is read in overlapping windows,
as the pipeline reads it, each window an input of its own in the model's batches."""

from __future__ import annotations

import asyncio

import numpy as np
from fastapi import APIRouter, Request

from distilserve.server import errors
from distilserve.server.core import postprocess, registry
from distilserve.server.core.inference import Call, check_answer_size, check_limits, infer
from distilserve.server.core.refusals import Refusal
from distilserve.server.engine import Engine, Result
from distilserve.server.routes.common import http_call, reply
from distilserve.server.schemas import QaRequest, QaResponse

router = APIRouter(tags=["question answering"])
WINDOW, STRIDE = 384, 128  # the pipeline's most tokens of a window, and of its overlap


@router.post("/v1/qa", response_model=QaResponse, responses=errors.INFERENCE)
async def qa(body: QaRequest, request: Request):
    call = http_call(request)
    engine, results, result = await answered(body, call)
    return reply(call, {"model": engine.name, "results": results}, result)


async def answered(body: QaRequest, call: Call
                   ) -> tuple[Engine, list[list[dict]], Result]:
    """The question-answering model, each input's answers (best first) and the run (also
    POST /'s, the Hugging Face Inference API's body, and the Open Inference Protocol's)."""
    engine = registry.pick(call.service, "qa", body.model)
    pairs = body.texts
    check_limits(call, pairs)
    size = body.max_seq_len or min(engine.max_length, WINDOW)
    if size > engine.max_length:
        raise Refusal("invalid", f"max_seq_len {size} is more than model {engine.name!r}'s "
                      f"max_length, {engine.max_length}")
    stride = min(STRIDE, size // 2) if body.doc_stride is None else body.doc_stride
    check_answer_size(engine, len(pairs) * body.top_k, min(body.max_answer_len, size),
                      "tokens", f"answers ({len(pairs)} inputs x top_k {body.top_k})")
    await asyncio.to_thread(_check_questions, engine, pairs, size, stride)
    result = await infer(call, engine, pairs, None, (size, stride),
                         iterations=body.iterations)
    return engine, await asyncio.to_thread(  # postprocessing off the event loop
        lambda: [postprocess.answers([(np.asarray(logits), encoding)
                                      for logits, encoding in windows], context,
                                     engine.text.cls_id, body.top_k, body.max_answer_len,
                                     body.handle_impossible_answer, body.align_to_words)
                 for windows, (_, context) in zip(result.outputs, pairs)]), result


def _check_questions(engine: Engine, pairs: list[tuple[str, str]], size: int,
                     stride: int) -> None:
    """A 413 for a question that leaves its context no room past the windows' overlap: a
    question is never cut."""
    for i, encoding in enumerate(engine.text.tokenize([q for q, _ in pairs], None)):
        room = size - len(encoding.ids) - 1  # [CLS] question [SEP] ... [SEP]
        if room <= stride:
            raise Refusal("input_too_long", f"input {i}: its question is "
                          f"{len(encoding.ids)} tokens with [CLS] and [SEP], which leaves "
                          f"{max(room, 0)} of a {size}-token window (max_seq_len) to its "
                          f"context, not more than the windows' overlap, {stride} "
                          "(doc_stride): a question is never cut")
