"""What the HTTP routes share: a request as the core's Call (distilserve/server/core/
inference.py runs it), and the answer with where its time went. The API key is checked
before any route, by distilserve.server.middleware.ApiKey."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import orjson
from fastapi import Request, Response

from distilserve.server import tracing
from distilserve.server.connections import DISCONNECT
from distilserve.server.core import postprocess
from distilserve.server.core.inference import Call
from distilserve.server.core.runner import Result
from distilserve.server.metrics import STARTED


def service(request: Request):
    return request.app.state.service


def http_call(request: Request, priority: int = 0) -> Call:
    """The request as the core sees it: the app's service, when the request arrived, its
    span, and what says that its client went away; at the ``priority`` its body asks."""
    scope = request.scope
    return Call(request.app.state.service, scope[STARTED], scope.get(tracing.SPAN),
                lambda callback: _on_client_gone(request, callback), priority)


async def _disconnected(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


def _on_client_gone(request: Request, callback: Callable[[], None]) -> Callable[[], None]:
    """Calls ``callback()`` if the client goes away, until the function returned is
    called. distilserve's own server says so itself (distilserve/server/connections.py); under any
    other (Ray Serve's proxy), a task waits for the ASGI ``http.disconnect`` message."""
    watch = request.scope.get("extensions", {}).get(DISCONNECT)
    if watch is not None:
        return watch.on_gone(callback)
    waiting = asyncio.ensure_future(_disconnected(request))
    waiting.add_done_callback(lambda done: done.cancelled() or callback())
    return waiting.cancel


async def model_results(request: Request, run, body) -> Response:
    """``run(call, model, texts, options)``'s (model, results, run) for a body that holds
    its options (routes/options.py), answered as the native task routes answer:
    {"model", "results"}."""
    call = http_call(request)
    engine, results, result = await run(call, body.model, body.texts, body)
    return reply(call, {"model": engine.name, "results": results}, result)


def reply(call: Call, payload, result: Result) -> Response:
    """``payload`` as the JSON response, and where its time went in TEI's headers:
    x-total-time (since the request arrived; x-compute-time the same), x-tokenization-time,
    x-queue-time and x-inference-time in whole milliseconds, x-compute-tokens,
    x-compute-characters and x-compute-type (cpu or gpu); and in a Server-Timing header
    (milliseconds to the microsecond, as browsers' developer tools show it). orjson writes
    numpy arrays and scalars as they are: an embedding costs no Python floats, and no
    second validation (the route's response_model documents the shape)."""
    body = orjson.dumps(payload, option=orjson.OPT_SERIALIZE_NUMPY)
    return Response(body, media_type="application/json", headers=timing(call, result))


# the OpenAPI 200 of a route that may answer with packed_reply, beside its JSON
PACKED = {200: {"description": "JSON; with encoding_format bytes or bytes_only, the "
                "outputs' packed numbers (bytes: with a metadata header)",
                "content": {"application/octet-stream": {"schema": {
                    "type": "string", "format": "binary"}}}}}


def packed_reply(call: Call, outputs: list, packing, head: dict, result: Result) -> Response:
    """vLLM's bytes encodings (``packing``: routes/options.Packing): the outputs' packed
    numbers one after another as the body; with "bytes", a metadata header, ``head``'s
    fields (id, created, model, usage) and where each output lies (``data``), as vLLM's
    clients read it."""
    body, where = postprocess.packed_outputs(outputs, packing.embed_dtype, packing.endianness)
    headers = timing(call, result)
    if packing.encoding_format == "bytes":
        headers["metadata"] = orjson.dumps({**head, "data": where}).decode()
    return Response(body, media_type="application/octet-stream", headers=headers)


def timing(call: Call, result: Result) -> dict[str, str]:
    """The headers (gRPC: the initial metadata) that say where a request's time went
    (reply's); the same on the request's span, where it is traced; and the time the answer
    took, from the model's outputs to here, in the model's series."""
    tracing.record(call.span, result)
    if call.answering is not None:
        series, outputs_came = call.answering
        call.answering = None
        series.postprocessed.observe(time.perf_counter() - outputs_came)
    spent = {"tokenization": result.tokenize_s, "queue": result.queued_s,
             "inference": result.inference_s, "total": time.perf_counter() - call.started}
    headers = {f"x-{name}-time": str(int(seconds * 1000)) for name, seconds in spent.items()}
    headers.update({
        "x-compute-time": headers["x-total-time"], "x-compute-tokens": str(result.tokens),
        "x-compute-characters": str(result.characters),
        "x-compute-type": result.compute_type,
        "server-timing": ", ".join(f"{name};dur={seconds * 1000:.3f}"
                                   for name, seconds in spent.items())})
    return headers
