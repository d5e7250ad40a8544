"""What the routes share: limits, and running a request on an engine until it finishes or
its client goes away. The model is picked by distilserve/server/core/registry.py; the API
key is checked before any route, by distilserve.server.middleware.ApiKey."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import numpy as np
import orjson
from fastapi import Request, Response

from distilserve.server import tracing
from distilserve.server.connections import DISCONNECT
from distilserve.server.core import postprocess, registry
from distilserve.server.engine import (
    Engine,
    InputTooLong,
    ModelUnavailable,
    NotFinite,
    OverQueue,
    QueueFull,
    Result,
)
from distilserve.server.errors import ApiError, client_closed
from distilserve.server.metrics import STARTED
from distilserve.server.schemas import numbered


def service(request: Request):
    return request.app.state.service


# the most numbers one answer may hold (128 MiB of float32, some 400 MB of JSON): a SPLADE
# model's embeddings have one per vocabulary entry, token embeddings one per token
ANSWER_NUMBERS = 2**25


def check_answer_size(engine: Engine, count: int, each: int, unit: str = "numbers",
                      what: str = "inputs") -> None:
    """A 413 when ``count`` inputs (or ``what``), each answered with up to ``each`` numbers
    (or ``unit``: a text's tokens count as numbers), could make an answer of more than
    ANSWER_NUMBERS."""
    most = ANSWER_NUMBERS // each
    if count > most:
        raise ApiError(413, "payload_too_large", f"{count} {what}; model {engine.name!r} "
                       f"answers at most {most} at once (each up to {each} {unit})")


def check_embedding_request(engine: Engine, texts: list, dimensions: int | None) -> None:
    """What only the model can say is wrong with an embedding request, said before its
    inputs are queued: ``dimensions`` over its width, token ids outside its vocabulary."""
    if dimensions is not None and engine.dimensions and dimensions > engine.dimensions:
        raise ApiError(422, "invalid_request", f"dimensions {dimensions} is more than model "
                       f"{engine.name!r}'s width, {engine.dimensions}")
    check_token_ids(engine, texts)


def check_token_ids(engine: Engine, texts: list) -> None:
    """A 422 naming the first token id outside the model's vocabulary (of the inputs that
    are token ids)."""
    for i, text in enumerate(texts):
        if isinstance(text, list):
            bad = next((t for t in text if not 0 <= t < engine.text.vocab_size), None)
            if bad is not None:
                raise ApiError(422, "invalid_request", f"input {i}: token id {bad} is not "
                               f"in model {engine.name!r}'s vocabulary (0 to "
                               f"{engine.text.vocab_size - 1})")


def check_iterations(engine: Engine, iterations: int | None) -> None:
    """A 422 for ``iterations`` the model cannot run: not 1 to its trained depth, or any
    other than its own where its depth is fixed (not a recursive family, or its loop
    unrolled), saying why."""
    if iterations is None:
        return
    trained = engine.manifest.num_iterations
    if engine.depth is not None:
        if iterations <= engine.depth:
            return
        why = f"runs 1 to {engine.depth} iterations"
    elif trained is None:
        why = f"is a {engine.family} model, not a recursive one: its depth is fixed"
    elif iterations == trained:
        return
    else:
        why = (f"runs its {trained} iterations unrolled: its depth is fixed (export it "
               "with --loop keep, or --format torch, to choose it per request)")
    raise ApiError(422, "invalid_request", f"iterations {iterations}: model {engine.name!r} "
                   + why)


def read_foreign(engine: Engine, texts: list) -> list:
    """The inputs, those that are token ids read back into text where the model takes ids
    in another vocabulary than its own (Engine.foreign); a 422 naming the first id that
    vocabulary has not."""
    vocabulary = engine.foreign
    if vocabulary is None:
        return texts
    for i, ids in enumerate(texts):
        if isinstance(ids, list) and (bad := vocabulary.outside(ids)) is not None:
            raise ApiError(422, "invalid_request", f"input {i}: token id {bad} is not in "
                           f"{vocabulary.name} (0 to {vocabulary.size - 1}), the vocabulary "
                           f"model {engine.name!r} reads token ids in")
    return [vocabulary.text(t) if isinstance(t, list) else t for t in texts]


def with_prompt(engine: Engine, texts: list, name: str | None) -> list:
    """The texts behind the model's prompt ``name`` (sentence-transformers' prompts, TEI's
    prompt_name), or behind its default prompt where ``name`` is None; token ids as they
    are. A name the model has not is a 422."""
    if name is not None and name not in engine.prompts:
        raise ApiError(422, "invalid_request", f"prompt_name {name!r}: model {engine.name!r} "
                       + (f"has the prompts {', '.join(engine.prompts)}" if engine.prompts
                          else "has no prompts"))
    prefix = engine.default_prompt if name is None else engine.prompts[name]
    if not prefix:
        return texts
    return [prefix + t if isinstance(t, str) else t for t in texts]


def check_limits(request: Request, texts: list, count: int | None = None,
                 what: str = "inputs", named: Callable[[int], str] = numbered) -> None:
    """The request's size limits, on what the client sent (before any prompt): ``count``
    ``what`` (default: the texts, "inputs") at most, each text (or pair) at most so many
    characters (``named``: as infer's)."""
    settings = service(request).settings
    count = len(texts) if count is None else count
    if count > settings.max_inputs:
        raise ApiError(413, "payload_too_large", f"{count} {what}; at most "
                       f"{settings.max_inputs} per request (DISTILSERVE_MAX_INPUTS)")
    for i, text in enumerate(texts):
        size = sum(map(len, text)) if isinstance(text, tuple) else len(text)
        if size > settings.max_input_chars:
            raise ApiError(413, "payload_too_large", f"{named(i)} has {size} characters; at "
                           f"most {settings.max_input_chars} (DISTILSERVE_MAX_INPUT_CHARS)")


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


async def infer(request: Request, engine: Engine, texts: list, truncation: str | None,
                windows: tuple[int, int] | None = None,
                named: Callable[[int], str] = numbered, iterations: int | None = None) -> Result:
    """Runs the texts (within the limits: check_limits) on the engine (``windows``:
    question answering's, Engine.infer's; ``iterations``: a recursive model's depth,
    check_iterations'); drops them from the queue if the client goes away. ``named``: what
    the client calls the text at an index, for an error about it (where the texts are not
    the client's inputs in order: a rerank's query, then its documents)."""
    check_iterations(engine, iterations)
    task, running, gone = asyncio.current_task(), True, False

    def client_gone() -> None:
        nonlocal gone
        if running:  # a disconnect noticed once they ran cancels nothing
            gone = True
            task.cancel()  # engine.infer below is cancelled: its inputs leave the queue

    stop_watching = _on_client_gone(request, client_gone)
    result, began = None, time.perf_counter()
    try:
        result = await engine.infer(texts, truncation, windows, iterations)
        return result
    except asyncio.CancelledError:
        if not gone:
            raise  # not the client's doing
        task.uncancel()
        raise client_closed() from None
    except InputTooLong as e:
        raise ApiError(413, "input_too_long", e.said(named(e.index))) from None
    except NotFinite as e:
        raise ApiError(422, "not_finite", f"model {engine.name!r}: {e.said(named(e.index))}"
                       ) from None
    except OverQueue as e:
        raise ApiError(413, "payload_too_large", f"model {engine.name!r}: {e}; send fewer "
                       "per request") from None
    except QueueFull as e:
        raise ApiError(429, "overloaded", f"model {engine.name!r} is busy ({e}); retry "
                       "after a moment", {"Retry-After": "1"}) from None
    except ModelUnavailable as e:
        raise ApiError(503, "unavailable", f"model {engine.name!r} is unavailable ({e}); "
                       "retry after a moment", {"Retry-After": "1"}) from None
    finally:
        running = False
        stop_watching()
        _observe(request, engine, result, time.perf_counter() - began)


# the ASGI scope's key for a request's model outputs: (the model's series, when they came)
ANSWERING = "distilserve.answering"


def _observe(request: Request, engine: Engine, result: Result | None, seconds: float) -> None:
    """The model's series (and so Triton's statistics) of a request that took ``seconds``
    with it: answered (``result``) or failed. Its answer is timed from here to ``timing``."""
    if result is None:
        engine.series.failed.observe(seconds)
        return
    engine.series.observe_result(result, seconds)
    request.scope[ANSWERING] = engine.series, time.perf_counter()


def reply(request: Request, payload, result: Result) -> Response:
    """``payload`` as the JSON response, and where its time went in TEI's headers:
    x-total-time (since the request arrived; x-compute-time the same), x-tokenization-time,
    x-queue-time and x-inference-time in whole milliseconds, x-compute-tokens,
    x-compute-characters and x-compute-type (cpu or gpu); and in a Server-Timing header
    (milliseconds to the microsecond, as browsers' developer tools show it). orjson writes
    numpy arrays and scalars as they are: an embedding costs no Python floats, and no
    second validation (the route's response_model documents the shape)."""
    body = orjson.dumps(payload, option=orjson.OPT_SERIALIZE_NUMPY)
    return Response(body, media_type="application/json", headers=timing(request, result))


def timing(request: Request, result: Result) -> dict[str, str]:
    """The response headers that say where a request's time went (reply's); the same on
    the request's span, where it is traced; and the time the answer took, from the model's
    outputs to here, in the model's series."""
    tracing.record(request.scope, result)
    if (answering := request.scope.pop(ANSWERING, None)) is not None:
        series, outputs_came = answering
        series.postprocessed.observe(time.perf_counter() - outputs_came)
    spent = {"tokenization": result.tokenize_s, "queue": result.queued_s,
             "inference": result.inference_s,
             "total": time.perf_counter() - request.scope[STARTED]}
    headers = {f"x-{name}-time": str(int(seconds * 1000)) for name, seconds in spent.items()}
    headers.update({
        "x-compute-time": headers["x-total-time"], "x-compute-tokens": str(result.tokens),
        "x-compute-characters": str(result.characters),
        "x-compute-type": result.compute_type,
        "server-timing": ", ".join(f"{name};dur={seconds * 1000:.3f}"
                                   for name, seconds in spent.items())})
    return headers


def usage(result: Result) -> dict:
    return {"prompt_tokens": result.tokens, "total_tokens": result.tokens}


async def embedded(request: Request, model: str | None, texts: list,
                   dimensions: int | None = None, prompt_name: str | None = None,
                   truncation: str | None = "right", normalize: bool = True,
                   named: Callable[[int], str] = numbered, foreign_ids: bool = False,
                   iterations: int | None = None) -> tuple[Engine, np.ndarray, Result]:
    """The embedding model (``model``, or the only one), the inputs' embeddings [N, D] (the
    first ``dimensions`` components, then unit length if ``normalize``) and the run; for
    every protocol's embedding routes. ``texts``: texts or token
    ids, behind the prompt ``prompt_name`` (None: the model's default prompt); ``named``:
    as infer's; ``foreign_ids``: token ids in the vocabulary the model reads them in
    (DISTILSERVE_TOKEN_IDS), else its own; ``iterations``: as infer's."""
    engine = registry.pick(service(request), "embed", model)
    if foreign_ids:
        texts = read_foreign(engine, texts)
    check_limits(request, texts, named=named)
    check_embedding_request(engine, texts, dimensions)
    check_answer_size(engine, len(texts), dimensions or engine.dimensions or 1)
    result = await infer(request, engine, with_prompt(engine, texts, prompt_name), truncation,
                         named=named, iterations=iterations)
    if normalize and dimensions is None and result.postprocessed is not None:
        return engine, np.asarray(result.postprocessed), result  # [N, D], by their batch
    vectors = postprocess.sentence_embeddings(result.outputs, engine.pools)  # [N, D]
    if dimensions is not None:  # [N, dimensions], its rows one after another (orjson's)
        vectors = np.ascontiguousarray(vectors[:, :dimensions])
    if normalize:
        vectors = postprocess.normalize(vectors)
    return engine, vectors, result
