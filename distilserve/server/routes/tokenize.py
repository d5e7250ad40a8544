"""POST /v1/tokenize (also /tokenize, as TEI serves it): each input's tokens, with
character offsets; and POST /v1/decode (also /decode, TEI's): token ids back to text."""

from __future__ import annotations

import asyncio

import orjson
from fastapi import APIRouter, Request, Response

from distilserve.server import errors
from distilserve.server.core import registry
from distilserve.server.core.inference import Call, check_limits, check_token_ids, with_prompt
from distilserve.server.routes.common import http_call
from distilserve.server.schemas import DecodeRequest, Token, TokenizeRequest

router = APIRouter(tags=["tokenize"])
# never queued: no 429
RESPONSES = errors.responses(400, 401, 404, 413, 422, 503)


@router.post("/v1/tokenize", response_model=list[list[Token]], responses=RESPONSES)
@router.post("/tokenize", response_model=list[list[Token]], responses=RESPONSES)
async def tokenize(body: TokenizeRequest, request: Request):
    return Response(orjson.dumps(await tokenized(http_call(request), body)), media_type="application/json")


@router.post("/v1/decode", response_model=list[str], responses=RESPONSES)
@router.post("/decode", response_model=list[str], responses=RESPONSES)
async def decode(body: DecodeRequest, request: Request):
    """Each input's text, one per list of ids (special tokens left out unless
    ``skip_special_tokens`` is false)."""
    return Response(orjson.dumps(await decoded(http_call(request), body)), media_type="application/json")


async def tokenized(call: Call, body: TokenizeRequest) -> list[list[dict]]:
    """Each input's tokens (behind the prompt named, if any)."""
    engine = registry.pick_tokenizer(call.service, body.model)
    check_limits(call, body.texts)
    texts = (body.texts if body.prompt_name is None
             else with_prompt(engine, body.texts, body.prompt_name))
    return await asyncio.to_thread(engine.text.tokens, texts, body.add_special_tokens)


async def decoded(call: Call, body: DecodeRequest) -> list[str]:
    """Each input's text."""
    engine = registry.pick_tokenizer(call.service, body.model)
    ids = body.texts
    check_limits(call, ids)
    check_token_ids(engine, ids)
    return await asyncio.to_thread(engine.text.decode, ids, body.skip_special_tokens)
