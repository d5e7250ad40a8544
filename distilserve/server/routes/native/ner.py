"""POST /v1/ner: entities with character offsets into the text as sent, as transformers'
token-classification pipeline finds them. With ``stride``, a text longer than the model's
max_length tokens is read whole, as the pipeline reads it: in overlapping windows, each an
input of its own in the model's batches, their entities merged where they overlap. Run by
core/tasks.recognise."""

from __future__ import annotations

from fastapi import APIRouter, Request

from distilserve.server import errors
from distilserve.server.routes import options
from distilserve.server.routes.common import model_results
from distilserve.server.routes.native.schemas import NerRequest, NerResponse

router = APIRouter(tags=["ner"])


@router.post("/v1/ner", response_model=NerResponse, responses=errors.INFERENCE)
async def ner(body: NerRequest, request: Request):
    return await model_results(request, options.recognise, body)
