"""The Hugging Face Inference API's tasks that TEI's own routes have not, answered at POST /
and /models/NAME (distilserve/server/routes/tei/http_routes.py): zero-shot classification, token
classification, fill-mask and question answering: each the task's core call
(routes/options.py), its options the Inference API's ``parameters``, with its body and
answer."""

from __future__ import annotations

from distilserve.server.core.inference import Call
from distilserve.server.core.runner import Result
from distilserve.server.routes import options
from distilserve.server.routes.options import (
    ClassifyOptions,
    FillMaskOptions,
    NerOptions,
    QaOptions,
    parameters,
)
from distilserve.server.routes.tei.schemas import (
    HfFillMaskRequest,
    HfQaRequest,
    HfTokenRequest,
    HfZeroShotRequest,
)


def _as(options_type, body, **given):
    """The options of a body and its ``parameters`` (the Hugging Face Inference API's,
    given in ``given``: None is the option's default)."""
    return parameters(options_type, {
        **body.model_dump(include={"truncate", "truncation_direction"}),
        **{key: value for key, value in given.items() if value is not None}})


async def zero_shot_answers(body: HfZeroShotRequest, call: Call
                            ) -> tuple[dict | list[dict], Result]:
    """The zero-shot-classification pipeline's answer: per text, its sequence and the
    candidate labels with their scores, highest first; a list of them for a list."""
    _, results, result = await options.classify(call, body.model, body.texts, _as(
        ClassifyOptions, body, **body.parameters.model_dump()))
    answers = [{"sequence": text, "labels": [r["label"] for r in ranked],
                "scores": [r["score"] for r in ranked]}
               for text, ranked in zip(body.texts, results)]
    return answers[0] if isinstance(body.inputs, str) else answers, result


async def token_answers(body: HfTokenRequest, call: Call) -> tuple[list, Result]:
    """The token-classification pipeline's answer: a text's entities (/v1/ner's); a list
    of them for a list."""
    given = {} if body.parameters is None else body.parameters.model_dump()
    _, results, result = await options.recognise(call, body.model, body.texts,
                                                 _as(NerOptions, body, **given))
    return results[0] if isinstance(body.inputs, str) else results, result


async def fill_mask_answers(body: HfFillMaskRequest, call: Call
                            ) -> tuple[list, Result]:
    """The fill-mask pipeline's answer: a text's likeliest tokens (a list of them per mask
    where it has several, as /v1/fill-mask's); a list of those for a list."""
    given = {} if body.parameters is None else body.parameters.model_dump()
    _, results, result = await options.fill(call, body.model, body.texts,
                                            _as(FillMaskOptions, body, **given))
    each = [masks[0] if len(masks) == 1 else masks for masks in results]
    return each[0] if isinstance(body.inputs, str) else each, result


async def qa_answers(body: HfQaRequest, call: Call) -> tuple[list | dict, Result]:
    """The question-answering pipeline's answer: an input's answers (/v1/qa's), or the one
    where there is one; a list of them for a list."""
    given = {} if body.parameters is None else body.parameters.model_dump(exclude={
        "max_question_len"})  # (the pipeline's, unused with a fast tokenizer)
    _, results, result = await options.answer(call, body.model, body.texts,
                                              _as(QaOptions, body, **given))
    each = [found[0] if len(found) == 1 else found for found in results]
    return each if isinstance(body.inputs, list) else each[0], result
