"""POST /v1/ner: entities with character offsets into the text as sent."""

from __future__ import annotations

import asyncio

from fastapi import APIRouter, Request

from server import errors
from server.routes.common import choose, reply, run
from server.schemas import NerRequest, NerResponse

router = APIRouter(tags=["ner"])


@router.post("/v1/ner", response_model=NerResponse, responses=errors.INFERENCE)
async def ner(body: NerRequest, request: Request):
    engine = choose(request, body.model, "ner")
    texts = body.texts
    result = await run(request, engine, texts, body.truncate)
    results = await asyncio.to_thread(  # postprocessing off the event loop
        lambda: [engine.entities(text, output, body.aggregation_strategy)
                 for text, output in zip(texts, result.outputs)])
    return reply({"model": engine.name, "results": results}, result)
