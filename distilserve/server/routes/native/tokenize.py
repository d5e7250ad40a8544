"""POST /v1/tokenize (also /tokenize, as TEI serves it, which takes vLLM's body too): each
input's tokens, with character offsets; and POST /v1/decode (also /decode, TEI's): token
ids back to text."""

from __future__ import annotations

import orjson
from fastapi import APIRouter, Request, Response

from distilserve.server import errors
from distilserve.server.core import tasks
from distilserve.server.routes.common import http_call
from distilserve.server.routes.native.schemas import DecodeRequest, Token, TokenizeRequest
from distilserve.server.routes.vllm import http_routes as vllm
from distilserve.server.routes.vllm.schemas import (
    TokenizeBody,
    VllmTokenizeRequest,
    VllmTokenizeResponse,
)

router = APIRouter(tags=["tokenize"])
# never queued: no 429
RESPONSES = errors.responses(400, 401, 404, 413, 422, 503)


@router.post("/v1/tokenize", response_model=list[list[Token]], responses=RESPONSES)
async def tokenize(body: TokenizeRequest, request: Request):
    tokens = await tasks.tokens(http_call(request), body.model, body.texts,
                                body.add_special_tokens, body.prompt_name)
    return Response(orjson.dumps(tokens), media_type="application/json")


@router.post("/tokenize", response_model=list[list[Token]] | VllmTokenizeResponse,
             responses=RESPONSES)
async def tokenize_tei_or_vllm(body: TokenizeBody, request: Request):
    """TEI's body, answered as /v1/tokenize; or vLLM's (``prompt``), in vLLM's shape."""
    if isinstance(body, VllmTokenizeRequest):
        return await vllm.tokenize(body, request)
    return await tokenize(body, request)


@router.post("/v1/decode", response_model=list[str], responses=RESPONSES)
@router.post("/decode", response_model=list[str], responses=RESPONSES)
async def decode(body: DecodeRequest, request: Request):
    """Each input's text, one per list of ids (special tokens left out unless
    ``skip_special_tokens`` is false)."""
    texts = await tasks.decode(http_call(request), body.model, body.texts,
                               body.skip_special_tokens)
    return Response(orjson.dumps(texts), media_type="application/json")
