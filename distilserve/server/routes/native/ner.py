"""POST /v1/ner: entities with character offsets into the text as sent, as transformers'
token-classification pipeline finds them. With ``stride``, a text longer than the model's
max_length tokens is read whole, as the pipeline reads it: in overlapping windows, each an
input of its own in the model's batches, their entities merged where they overlap. Run by
core/tasks.recognise."""

from __future__ import annotations

from fastapi import APIRouter, Request

from distilserve.server import errors
from distilserve.server.core import tasks
from distilserve.server.core.inference import Call
from distilserve.server.routes.common import model_results
from distilserve.server.routes.native.schemas import NerRequest, NerResponse

router = APIRouter(tags=["ner"])


@router.post("/v1/ner", response_model=NerResponse, responses=errors.INFERENCE)
async def ner(body: NerRequest, request: Request):
    return await model_results(request, recognised, body)


def recognised(body: NerRequest, call: Call):
    """/v1/ner's body run (also the Hugging Face Inference API's and the Open Inference
    Protocol's, as /v1/ner's options)."""
    return tasks.recognise(call, body.model, body.texts, body.truncation,
                           body.aggregation_strategy, tuple(body.ignore_labels), body.stride,
                           body.iterations)
