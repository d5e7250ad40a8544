"""POST /v1/fill-mask: a masked-language model's likeliest tokens for each mask token of a
text, as transformers' fill-mask pipeline gives them (BERT's and DistilBERT's language
models: distilbert-base-uncased, the students of "How to Distill your BERT"). The model
runs up to its language-model head's decoder; the decoder runs after each batch, on the
batch's mask tokens' vectors alone (core/postprocess.decode_masks, in the engine; on the
model's GPU where it runs on one), and each input's logits [M, V] are finished by
core/tasks.fill (core/postprocess.fill_mask)."""

from __future__ import annotations

from fastapi import APIRouter, Request

from distilserve.server import errors
from distilserve.server.routes import options
from distilserve.server.routes.common import model_results
from distilserve.server.routes.native.schemas import FillMaskRequest, FillMaskResponse

router = APIRouter(tags=["fill-mask"])


@router.post("/v1/fill-mask", response_model=FillMaskResponse, responses=errors.INFERENCE)
async def fill_mask(body: FillMaskRequest, request: Request):
    return await model_results(request, options.fill, body)
