"""POST /v1/tokenize (also /tokenize, as TEI serves it): each input's tokens, with
character offsets."""

from __future__ import annotations

import asyncio

import orjson
from fastapi import APIRouter, Request, Response

from server import errors
from server.routes.common import check_limits, choose_tokenizer
from server.schemas import Token, TokenizeRequest

router = APIRouter(tags=["tokenize"])


# never queued: no 429; /tokenize as TEI serves it
@router.post("/v1/tokenize", response_model=list[list[Token]],
             responses=errors.responses(400, 401, 404, 413, 422, 503))
@router.post("/tokenize", response_model=list[list[Token]],
             responses=errors.responses(400, 401, 404, 413, 422, 503))
async def tokenize(body: TokenizeRequest, request: Request):
    engine = choose_tokenizer(request, body.model)
    texts = body.texts
    check_limits(request, texts)
    tokens = await asyncio.to_thread(engine.tokens, texts, body.add_special_tokens)
    return Response(orjson.dumps(tokens), media_type="application/json")
