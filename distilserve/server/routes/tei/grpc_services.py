"""Text Embeddings Inference's gRPC API (``tei.v1``'s Info, Embed, Predict, Rerank and
Tokenize), for the clients generated from TEI's tei.proto: distilserve/server/routes/tei/tei.proto has the
same services and messages, compiled when the gRPC port starts (grpcio-tools). On the
gRPC port (distilserve/server/routes/grpc_server.py: the API key, errors, metrics, health checks and
reflection there).

Each RPC runs the functions TEI's HTTP routes run (distilserve/server/routes/tei/http_routes.py, ...) on its
one input, as the core's Call, and answers as TEI's gRPC server does:
- the model: TEI serves one; here the one named in the call's ``model`` metadata, else
  the one TEI's HTTP route would take (Embed: the one embedding model, EmbedSparse the one
  SPLADE model, Predict the one classifier, Rerank the one cross-encoder else the one
  embedding model, Info the one POST / serves);
- the messages' proto3 defaults are TEI's gRPC ones: ``normalize`` false (HTTP's default
  is true), ``raw_scores`` and ``return_text`` false. ``truncate`` cannot say "unset" and
  reads false then: an input longer than the model's max_length is cut whatever it says
  (as TEI started with --auto-truncate, which /info reports), at the end or, with
  TRUNCATION_DIRECTION_LEFT, at the start;
- every answer carries its Metadata (characters, tokens, where its time went in ns); a
  unary answer also the timing headers (x-total-time, ...) as its initial metadata;
- a stream's messages run side by side (at most STREAM_PARALLEL at once) and are answered
  in the order sent; a refused one ends the stream with its status, as TEI's does.
  RerankStream ranks its (query, text) pairs together once the stream ends (each query's
  texts one run, as /rerank's), with its first message's raw_scores, return_text and
  truncation_direction."""

from __future__ import annotations

import asyncio
import functools
import sys
import time
from pathlib import Path

import grpc
import numpy as np
from fastapi import FastAPI
from pydantic import BaseModel, ValidationError

from distilserve.server import errors
from distilserve.server.core import registry, tasks
from distilserve.server.core.inference import Call, check_limits
from distilserve.server.core.refusals import Refusal
from distilserve.server.routes.common import timing
from distilserve.server.routes.grpc_calls import Rpcs, refuse, unary
from distilserve.server.routes.native.rerank import scored
from distilserve.server.routes.native.schemas import DecodeRequest, EmbedRequest, TokenizeRequest
from distilserve.server.routes.tei import http_routes as tei
from distilserve.server.routes.tei.schemas import (
    TeiInputsRequest,
    TeiPredictRequest,
    TeiRerankRequest,
)


def _compiled():
    """tei.proto's messages and services (tei_pb2, tei_pb2_grpc), compiled from the file
    beside this one (grpcio-tools finds a .proto through sys.path)."""
    here = str(Path(__file__).parent)
    sys.path.insert(0, here)
    try:
        return grpc.protos_and_services("tei.proto")
    finally:
        sys.path.remove(here)


pb, pb_grpc = _compiled()
DIRECTIONS = {pb.TRUNCATION_DIRECTION_RIGHT: "right", pb.TRUNCATION_DIRECTION_LEFT: "left"}
MODEL_TYPES = {"embedding": pb.MODEL_TYPE_EMBEDDING, "classifier": pb.MODEL_TYPE_CLASSIFIER,
               "reranker": pb.MODEL_TYPE_RERANKER}
STREAM_PARALLEL = 1024  # a stream's messages running at once (TEI's default too)


# the health of TEI's services (grpc_server.Health): a model doing what the service does
SERVING = {
    "tei.v1.Embed": lambda svc: any(e.task == "embed" for e in svc.engines.values()),
    "tei.v1.Predict": lambda svc: any(e.task == "classify" for e in svc.engines.values()),
    "tei.v1.Rerank": lambda svc: any(map(registry.reranks, svc.engines.values()))}


# the messages as the HTTP routes' bodies, and their answers as messages -----------------
def _body(model: type[BaseModel], message, name: str | None, **fields) -> BaseModel:
    """The HTTP route's body for ``message``: ``model`` validated from ``fields``, with
    the model ``name`` and the message's truncation_direction if it has one (always
    truncated: see the module's docstring)."""
    if "truncation_direction" in message.DESCRIPTOR.fields_by_name:
        fields.update(truncate=True,
                      truncation_direction=DIRECTIONS.get(message.truncation_direction))
    if "prompt_name" in message.DESCRIPTOR.fields_by_name and message.HasField("prompt_name"):
        fields["prompt_name"] = message.prompt_name
    try:
        return model.model_validate({"model": name, **fields})
    except ValidationError as e:
        raise errors.refused(e) from None


def _ns(seconds: float) -> int:
    return int(seconds * 1e9)


def _metadata(call: Call, result) -> pb.Metadata:
    return pb.Metadata(compute_chars=result.characters, compute_tokens=result.tokens,
                       total_time_ns=_ns(time.perf_counter() - call.started),
                       tokenization_time_ns=_ns(result.tokenize_s),
                       queue_time_ns=_ns(result.queued_s),
                       inference_time_ns=_ns(result.inference_s))


async def _embed(message, call: Call, name: str | None):
    body = _body(EmbedRequest, message, name, inputs=message.inputs,
                 normalize=message.normalize)
    vectors, result = await tei.embedding(body, call)
    return pb.EmbedResponse(embeddings=vectors[0].tolist(),
                            metadata=_metadata(call, result)), result


async def _embed_sparse(message, call: Call, name: str | None):
    body = _body(TeiInputsRequest, message, name, inputs=message.inputs)
    values, result = await tei.sparse_vectors(body, call)
    return pb.EmbedSparseResponse(sparse_embeddings=[pb.SparseValue(**v) for v in values[0]],
                                  metadata=_metadata(call, result)), result


async def _embed_all(message, call: Call, name: str | None):
    body = _body(TeiInputsRequest, message, name, inputs=message.inputs)
    vectors, result = await tei.token_vectors(body, call)
    return pb.EmbedAllResponse(
        token_embeddings=[pb.TokenEmbedding(embeddings=v.tolist()) for v in vectors[0]],
        metadata=_metadata(call, result)), result


async def _predicted(body: TeiPredictRequest, call: Call):
    scores, result = await tei.predictions(body, call)  # highest first
    return pb.PredictResponse(predictions=[pb.Prediction(label=s["label"], score=s["score"])
                                           for s in scores],
                              metadata=_metadata(call, result)), result


async def _predict(message, call: Call, name: str | None):
    return await _predicted(_body(TeiPredictRequest, message, name, inputs=message.inputs,
                                  raw_scores=message.raw_scores), call)


async def _predict_pair(message, call: Call, name: str | None):
    if len(message.inputs) not in (1, 2):
        raise Refusal("invalid", "inputs: a text or a pair of texts, not "
                      f"{len(message.inputs)} texts")
    inputs = list(message.inputs)
    return await _predicted(_body(TeiPredictRequest, message, name,
                                  inputs=inputs if len(inputs) == 2 else inputs[0],
                                  raw_scores=message.raw_scores), call)


def _ranks(ranked: list[dict]) -> list:
    return [pb.Rank(**r) for r in ranked]


async def _rerank(message, call: Call, name: str | None):
    body = _body(TeiRerankRequest, message, name, query=message.query,
                 texts=list(message.texts), raw_scores=message.raw_scores,
                 return_text=message.return_text)
    ranked, result = await tei.ranks(body, call)
    return pb.RerankResponse(ranks=_ranks(ranked), metadata=_metadata(call, result)), result


async def _tokenize(message, call: Call, name: str | None):
    body = _body(TokenizeRequest, message, name, inputs=message.inputs,
                 add_special_tokens=message.add_special_tokens)
    tokens = (await tasks.tokens(call, body.model, body.texts, body.add_special_tokens,
                                 body.prompt_name))[0]
    return pb.EncodeResponse(tokens=[pb.SimpleToken(**{k: v for k, v in t.items()
                                                        if v is not None})
                                     for t in tokens]), None


async def _decode(message, call: Call, name: str | None):
    body = _body(DecodeRequest, message, name, ids=list(message.ids),
                 skip_special_tokens=message.skip_special_tokens)
    texts = await tasks.decode(call, body.model, body.texts, body.skip_special_tokens)
    return pb.DecodeResponse(text=texts[0]), None


# the services --------------------------------------------------------------------------
def _model(context: grpc.aio.ServicerContext) -> str | None:
    """The model the call names in its ``model`` metadata, if any."""
    return dict(context.invocation_metadata() or ()).get("model")


async def _run(run, message, call: Call, context: grpc.aio.ServicerContext):
    """``run``'s answer to ``message``, and its timing headers (none for a run without a
    model's: Tokenize's)."""
    answer, result = await run(message, call, _model(context))
    return answer, None if result is None else timing(call, result)


def _rpcs(name: str, run) -> tuple:
    """The unary RPC ``name`` and its stream ``name + "Stream"``, a message answered by
    ``run(message, call, model) -> (answer, the model's Result or None)``."""
    async def one(self, message, call, context):
        answer, headers = await _run(run, message, call, context)
        if headers:
            await context.send_initial_metadata(tuple(headers.items()))
        return answer

    async def stream(self: _Tei, messages, context):
        async for answer in self.in_order(name + "Stream", messages, context, run):
            yield answer

    one.__name__, stream.__name__ = name, name + "Stream"
    return unary(one), stream


class _Tei(Rpcs):
    async def in_order(self, method: str, messages, context: grpc.aio.ServicerContext, run):
        """A stream's answers, each message answered by ``run`` (as its unary RPC, counted
        under ``method``), side by side, in the order sent; a refusal ends the stream."""
        pending: asyncio.Queue = asyncio.Queue()
        room = asyncio.Semaphore(STREAM_PARALLEL)

        async def read():
            async for message in messages:
                await room.acquire()
                task = asyncio.ensure_future(self.answer(method, context, functools.partial(
                    _run, run, message, context=context)))
                task.add_done_callback(lambda _: room.release())
                pending.put_nowait(task)

        reading = asyncio.create_task(read())
        reading.add_done_callback(lambda _: pending.put_nowait(None))
        try:
            while (task := await pending.get()) is not None:
                answer, _ = await task
                yield answer
            await reading  # the stream's own failure, if any
        except Refusal as e:
            await refuse(context, e)
        finally:
            reading.cancel()
            while not pending.empty():
                if (task := pending.get_nowait()) is not None:
                    task.cancel()


class Info(_Tei, pb_grpc.InfoServicer):
    SERVICE = "tei.v1.Info"

    @unary
    async def Info(self, message, call, context):
        described = tei.described(registry.pick_root(call.service, _model(context)),
                                  call.settings, self.app.version)
        kind = MODEL_TYPES[next(iter(described.pop("model_type")))]  # its only key
        fields = pb.InfoResponse.DESCRIPTOR.fields_by_name
        return pb.InfoResponse(
            **{k: v for k, v in described.items() if k in fields and v is not None},
            model_type=kind)


class Embed(_Tei, pb_grpc.EmbedServicer):
    SERVICE = "tei.v1.Embed"
    Embed, EmbedStream = _rpcs("Embed", _embed)
    EmbedSparse, EmbedSparseStream = _rpcs("EmbedSparse", _embed_sparse)
    EmbedAll, EmbedAllStream = _rpcs("EmbedAll", _embed_all)


class Predict(_Tei, pb_grpc.PredictServicer):
    SERVICE = "tei.v1.Predict"
    Predict, PredictStream = _rpcs("Predict", _predict)
    PredictPair, PredictPairStream = _rpcs("PredictPair", _predict_pair)


class Rerank(_Tei, pb_grpc.RerankServicer):
    SERVICE = "tei.v1.Rerank"
    Rerank, _ = _rpcs("Rerank", _rerank)

    @unary
    async def RerankStream(self, messages, call, context):
        """The stream's (query, text) pairs ranked together: each query's texts scored
        as /rerank scores them (one run per query, side by side), indices in the order
        sent."""
        sent = [message async for message in messages]
        if not sent:
            raise Refusal("invalid", "the stream sent no (query, text) pairs")
        check_limits(call, [m.text for m in sent], what="texts")
        first, name = sent[0], _model(context)
        queries: dict[str, list[int]] = {}
        for i, message in enumerate(sent):
            queries.setdefault(message.query, []).append(i)
        async with asyncio.TaskGroup() as group:
            runs = [group.create_task(scored(_body(
                TeiRerankRequest, first, name, query=query,
                texts=[sent[i].text for i in indices], raw_scores=first.raw_scores), call))
                for query, indices in queries.items()]
        scores = np.empty(len(sent), dtype=np.float32)
        for indices, run in zip(queries.values(), runs):
            scores[indices] = run.result()[1]
        ranked = tei.ranked(scores, [m.text for m in sent], first.return_text)
        result = tei.together([run.result()[2] for run in runs])
        metadata = _metadata(call, result)
        await context.send_initial_metadata(tuple(timing(call, result).items()))
        return pb.RerankResponse(ranks=_ranks(ranked), metadata=metadata)


class Tokenize(_Tei, pb_grpc.TokenizeServicer):
    SERVICE = "tei.v1.Tokenize"
    Tokenize, TokenizeStream = _rpcs("Tokenize", _tokenize)
    Decode, DecodeStream = _rpcs("Decode", _decode)


# TEI's services, each with its generated add_<name>Servicer_to_server (distilserve/server/ray_grpc.py
# gives Ray Serve's proxy the same ones)
SERVICERS = (Info, Embed, Predict, Rerank, Tokenize)


def adder(servicer: type):
    """The generated ``add_<name>Servicer_to_server`` of one of SERVICERS."""
    return getattr(pb_grpc, f"add_{servicer.__name__}Servicer_to_server")


def add(server: grpc.aio.Server, app: FastAPI, key: str | None) -> list[str]:
    """TEI's services, added to ``server``; their names."""
    for servicer in SERVICERS:
        adder(servicer)(servicer(app, key), server)
    return [servicer.SERVICE for servicer in SERVICERS]
