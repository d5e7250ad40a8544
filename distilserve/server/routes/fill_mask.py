"""POST /v1/fill-mask: a masked-language model's likeliest tokens for each mask token of a
text, as transformers' fill-mask pipeline gives them (BERT's and DistilBERT's language
models: distilbert-base-uncased, the students of "How to Distill your BERT"). The model
runs up to its language-model head's decoder; the decoder runs after each batch, on the
batch's mask tokens' vectors alone (server/postprocess.decode_masks, in the engine; on the
model's GPU where it runs on one), and each input's logits [M, V] come here
(server/postprocess.fill_mask)."""

from __future__ import annotations

import asyncio

from fastapi import APIRouter, Request

from distilserve.server import errors
from distilserve.server.core import postprocess, registry
from distilserve.server.core.inference import Call, check_answer_size, check_limits, infer
from distilserve.server.core.refusals import Refusal
from distilserve.server.engine import Engine, Result
from distilserve.server.routes.common import http_call, reply
from distilserve.server.schemas import FillMaskRequest, FillMaskResponse

router = APIRouter(tags=["fill-mask"])


@router.post("/v1/fill-mask", response_model=FillMaskResponse, responses=errors.INFERENCE)
async def fill_mask(body: FillMaskRequest, request: Request):
    call = http_call(request)
    engine, results, result = await filled(body, call)
    return reply(call, {"model": engine.name, "results": results}, result)


async def filled(body: FillMaskRequest, call: Call
                 ) -> tuple[Engine, list[list[list[dict]]], Result]:
    """The fill-mask model, per input and per mask token its likeliest tokens, and the run
    (also POST /'s, the Hugging Face Inference API's body, and the Open Inference
    Protocol's)."""
    engine = registry.pick(call.service, "fill-mask", body.model)
    texts = body.texts
    check_limits(call, texts)
    for i, text in enumerate(texts):
        if engine.text.mask_token not in text:
            raise Refusal("invalid", f"input {i} has no {engine.text.mask_token}: the mask "
                          f"token of model {engine.name!r}, which fill-mask fills")
    targets = None
    if body.target_list is not None:
        targets = engine.text.target_ids(body.target_list)
        if not targets:
            raise Refusal("invalid", "targets: none has a token in model "
                          f"{engine.name!r}'s vocabulary")
    # each answer holds its input's tokens (the sequence with the mask filled)
    masks = sum(min(text.count(engine.text.mask_token), engine.max_length) for text in texts)
    k = min(body.top_k, engine.text.vocab_size if targets is None else len(targets))
    check_answer_size(engine, masks * k, engine.max_length, "tokens",
                      f"answers ({masks} masks x top_k {k})")
    result = await infer(call, engine, texts, body.truncation, iterations=body.iterations)

    def each(i: int, logits, encoding) -> list[list[dict]]:
        if engine.text.mask_id not in encoding.ids:
            raise Refusal("invalid", f"input {i}: its {engine.text.mask_token} was cut, "
                          f"past model {engine.name!r}'s max_length "
                          f"({engine.max_length} tokens)")
        return postprocess.fill_mask(logits, encoding.ids, engine.text.mask_id, body.top_k, targets,
                                     engine.text.text_of)

    return engine, await asyncio.to_thread(  # postprocessing off the event loop
        lambda: [each(i, logits, encoding)
                 for i, (logits, encoding) in enumerate(result.outputs)]), result
