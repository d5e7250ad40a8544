"""POST /v1/qa: extractive question answering, as transformers' question-answering pipeline
answers (DistilBERT's and BERT's SQuAD models): each question's answer spans in its
context, with the characters they cover."""

from __future__ import annotations

import asyncio

import numpy as np
from fastapi import APIRouter, Request

from server import errors, postprocess
from server.engine import Engine, Result
from server.errors import ApiError
from server.routes.common import check_limits, choose, infer, reply
from server.schemas import QaRequest, QaResponse

router = APIRouter(tags=["question answering"])


@router.post("/v1/qa", response_model=QaResponse, responses=errors.INFERENCE)
async def qa(body: QaRequest, request: Request):
    engine, results, result = await answered(body, request)
    return reply(request, {"model": engine.name, "results": results}, result)


async def answered(body: QaRequest, request: Request
                   ) -> tuple[Engine, list[list[dict]], Result]:
    """The question-answering model, each input's answers (best first) and the run (also
    POST /'s, the Hugging Face Inference API's body). A context over the model's max_length
    tokens, with its question, is cut as ``truncate`` says (the question never)."""
    engine = choose(request, body.model, "qa")
    pairs = body.texts
    check_limits(request, pairs)
    if body.truncation is not None:
        _check_questions(engine, [question for question, _ in pairs])
    result = await infer(request, engine, pairs, body.truncation)
    return engine, await asyncio.to_thread(  # postprocessing off the event loop
        lambda: [postprocess.answers(np.asarray(logits), encoding, context, engine.cls_id,
                                     body.top_k, body.max_answer_len,
                                     body.handle_impossible_answer, body.align_to_words)
                 for (logits, encoding), (_, context) in zip(result.outputs, pairs)]), result


def _check_questions(engine: Engine, questions: list[str]) -> None:
    """A 413 for a question that leaves its context no room: a question is never cut."""
    for i, encoding in enumerate(engine.tokenize(questions, None)):  # [CLS] question [SEP]
        if len(encoding.ids) + 2 > engine.max_length:  # its context's [SEP] and a token
            raise ApiError(413, "input_too_long", f"input {i}: its question is "
                           f"{len(encoding.ids)} tokens with [CLS] and [SEP]: with a context "
                           f"model {engine.name!r} takes at most {engine.max_length} (a "
                           "question is never cut)")
