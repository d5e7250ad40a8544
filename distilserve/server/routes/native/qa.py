"""POST /v1/qa: extractive question answering, as transformers' question-answering pipeline
answers (DistilBERT's and BERT's SQuAD models): each question's answer spans in its
context, with the characters they cover. A long context is read in overlapping windows,
as the pipeline reads it, each window an input of its own in the model's batches. Run by
core/tasks.answer."""

from __future__ import annotations

from fastapi import APIRouter, Request

from distilserve.server import errors
from distilserve.server.routes import options
from distilserve.server.routes.common import model_results
from distilserve.server.routes.native.schemas import QaRequest, QaResponse

router = APIRouter(tags=["question answering"])


@router.post("/v1/qa", response_model=QaResponse, responses=errors.INFERENCE)
async def qa(body: QaRequest, request: Request):
    return await model_results(request, options.answer, body)
