"""Running a request's inputs on a model, whatever transport carried the request: the
request as the core sees it (Call), its limits, what only the model can say is wrong with
it, and the run, until it finishes or its client goes away. Every refusal is a Refusal
(core/refusals.py), which each transport says in its own words. The model is picked by
core/registry.py."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from distilserve.server.core import postprocess, registry
from distilserve.server.core.batching import InputTooLong, NotFinite, OverQueue, QueueFull
from distilserve.server.core.refusals import Refusal
from distilserve.server.core.runner import INLINE, ModelUnavailable, Result
from distilserve.server.core.tokenisation import WholeIds

# the most numbers one answer may hold (128 MiB of float32, some 400 MB of JSON): a SPLADE
# model's embeddings have one per vocabulary entry, token embeddings one per token
ANSWER_NUMBERS = 2**25


def numbered(index: int) -> str:
    """What a client calls the text at ``index`` of those a request runs, where they are
    its inputs in order."""
    return f"input {index}"


def _never_gone(callback: Callable[[], None]) -> Callable[[], None]:
    return lambda: None


@dataclass(eq=False)
class Call:
    """One request, as its transport hands it to the core: the ``service`` (its models and
    settings), when it ``started`` (time.perf_counter), its tracing ``span`` where traced,
    and ``on_gone(callback) -> stop``, which calls ``callback()`` if the client goes away
    before ``stop()`` (a transport that cancels the request's task itself, as gRPC does,
    never calls it). ``priority``: its inputs' place in the model's queue, lower first
    (vLLM's). ``answering``: the model's series and when its outputs came, set by
    ``infer`` for the transport to time the answer from."""

    service: Any
    started: float = field(default_factory=time.perf_counter)
    span: Any = None
    on_gone: Callable[[Callable[[], None]], Callable[[], None]] = _never_gone
    priority: int = 0
    answering: tuple | None = None

    @property
    def settings(self):
        return self.service.settings


def check_limits(call: Call, texts: list, count: int | None = None, what: str = "inputs",
                 named: Callable[[int], str] = numbered) -> None:
    """The request's size limits, on what the client sent (before any prompt): ``count``
    ``what`` (default: the texts, "inputs") at most, each text (or pair) at most so many
    characters (``named``: as infer's)."""
    settings = call.settings
    count = len(texts) if count is None else count
    if count > settings.max_inputs:
        raise Refusal("too_large", f"{count} {what}; at most {settings.max_inputs} per "
                      "request (DISTILSERVE_MAX_INPUTS)")
    for i, text in enumerate(texts):
        size = sum(map(len, text)) if isinstance(text, tuple) else len(text)
        if size > settings.max_input_chars:
            which = named(i)
            raise Refusal("too_large", f"{which} has {size} characters; at most "
                          f"{settings.max_input_chars} (DISTILSERVE_MAX_INPUT_CHARS)",
                          input=which)


def check_answer_size(engine, count: int, each: int, unit: str = "numbers",
                      what: str = "inputs") -> None:
    """Refused when ``count`` inputs (or ``what``), each answered with up to ``each``
    numbers (or ``unit``: a text's tokens count as numbers), could make an answer of more
    than ANSWER_NUMBERS."""
    most = ANSWER_NUMBERS // each
    if count > most:
        raise Refusal("too_large", f"{count} {what}; model {engine.name!r} answers at most "
                      f"{most} at once (each up to {each} {unit})")


def check_dimensions(engine, dimensions: int | None) -> None:
    """Refused: ``dimensions`` over the embedding model's width."""
    if dimensions is not None and engine.dimensions and dimensions > engine.dimensions:
        raise Refusal("invalid", f"dimensions {dimensions} is more than the width of "
                      f"model {engine.name!r}, {engine.dimensions}")


def check_token_ids(engine, texts: list, named: Callable[[int], str] = numbered) -> None:
    """Refused naming the first token id outside the model's vocabulary (of the inputs
    that are token ids; ``named``: as infer's)."""
    for i, text in enumerate(texts):
        if isinstance(text, list):
            bad = next((t for t in text if not 0 <= t < engine.text.vocab_size), None)
            if bad is not None:
                which = named(i)
                raise Refusal("invalid", f"{which}: token id {bad} is not in the vocabulary "
                              f"of model {engine.name!r} (0 to "
                              f"{engine.text.vocab_size - 1})", input=which)


def check_iterations(engine, iterations: int | None) -> None:
    """Refused for ``iterations`` the model cannot run: not 1 to its trained depth, or any
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
    raise Refusal("invalid", f"iterations {iterations}: model {engine.name!r} " + why)


def read_foreign(engine, texts: list) -> list:
    """The inputs, those that are token ids read back into text where the model takes ids
    in another vocabulary than its own (Engine.foreign); refused naming the first id that
    vocabulary has not."""
    vocabulary = engine.foreign
    if vocabulary is None:
        return texts
    for i, ids in enumerate(texts):
        if isinstance(ids, list) and (bad := vocabulary.outside(ids)) is not None:
            raise Refusal("invalid", f"input {i}: token id {bad} is not in "
                          f"{vocabulary.name} (0 to {vocabulary.size - 1}), the vocabulary "
                          f"model {engine.name!r} reads token ids in", input=f"input {i}")
    return [vocabulary.text(t) if isinstance(t, list) else t for t in texts]


def with_prompt(engine, texts: list, name: str | None) -> list:
    """The texts behind the model's prompt ``name`` (sentence-transformers' prompts, TEI's
    prompt_name), or behind its default prompt where ``name`` is None; a whole input's
    token ids (TEI's, WholeIds) read back into text behind it, as TEI does; other token ids
    as they are. A name the model has not is refused."""
    if name is not None and name not in engine.prompts:
        raise Refusal("invalid", f"prompt_name {name!r}: model {engine.name!r} "
                      + (f"has the prompts {', '.join(engine.prompts)}" if engine.prompts
                         else "has no prompts"))
    prefix = engine.default_prompt if name is None else engine.prompts[name]
    if not prefix:
        return texts
    whole = [t for t in texts if isinstance(t, WholeIds)]
    read = iter(engine.text.decode(whole, skip_special_tokens=True) if whole else ())
    return [prefix + t if isinstance(t, str) else prefix + next(read)
            if isinstance(t, WholeIds) else t for t in texts]


async def capped(engine, texts: list[str], most: int | None, truncation: str | None,
                 limit: str, named: Callable[[int], str] = numbered) -> list[str]:
    """The texts (their limits checked before: check_limits), each cut to ``most`` tokens
    of text at its end ("right") or its start ("left"), before any prompt
    (Tokenisation.counted_cuts); ``truncation`` None: one with more is refused, naming the
    request's ``limit`` (its field) and ``named`` as infer's. ``most`` None, or no fewer
    than the model reads: the texts as they are."""
    if most is None or most >= engine.text.room:
        return texts
    cut = engine.text.counted_cuts
    cuts = (cut(texts, most, truncation) if len(texts) <= INLINE else
            await asyncio.to_thread(cut, texts, most, truncation))
    if truncation is None:
        for i, (_, count) in enumerate(cuts):
            if count > most:
                which = named(i)
                raise Refusal("input_too_long", f"{which} has {count} tokens, more than "
                              f"{limit} {most}; let it be truncated or send a shorter text",
                              input=which)
    return [text for text, _ in cuts]


def _cuts(engine, total: int | None) -> bool:
    """Whether vLLM's truncate_prompt_tokens ``total`` cuts what the model reads: not None
    or -1 (its max_length), and less than the model's max_length."""
    return total not in (None, -1) and total < engine.max_length


async def within(engine, texts: list, total: int | None, limit: str,
                 prompt_name: str | None = None, side: str = "right") -> list:
    """The inputs, each cut at its end (``side`` "right") or its start ("left") to at most
    ``total`` tokens as the model reads it: its special tokens counted, and before a text
    the model's prompt ``prompt_name`` (None: its default prompt; vLLM's
    truncate_prompt_tokens); token ids, the model's own, cut as they are. None or -1, or
    no smaller than max_length: as they are (max_length cuts them as always); a ``total``
    that leaves an input no token of its own is refused, naming ``limit``."""
    if not _cuts(engine, total):
        return texts
    strings = [t for t in texts if isinstance(t, str)]
    specials = sum(map(len, engine.text.specials))
    # (a name the model has not: no prompt counted here, with_prompt refuses it)
    prefix = {None: engine.default_prompt, **engine.prompts}.get(prompt_name, "")
    prompt = engine.text.count(prefix) if prefix and strings else 0  # (before texts alone)
    room = total - specials - prompt  # a text's tokens
    if room <= 0:
        raise Refusal("invalid", f"{limit} {total} leaves an input no token of its own: "
                      f"model {engine.name!r} reads {specials} special tokens"
                      + (f" and {prompt} of its prompt" if prompt else "") + " with each")
    cut = iter(await capped(engine, strings, room, side, limit))
    keep = total - specials
    return [next(cut) if isinstance(t, str) else t[:keep] if side == "right" else t[-keep:]
            for t in texts]


async def pair_cuts(engine, pairs: list[tuple[str, str]], total: int | None, limit: str,
                    side: str = "right") -> list[tuple[str, str]]:
    """A cross-encoder's pairs, each cut to at most ``total`` tokens as the model reads it,
    each text at its end or its start as ``side`` says (Tokenisation.pair_cuts), inline or
    on a thread as ``capped`` cuts (as ``within``: None, -1 or max_length and more, as they
    are); a ``total`` that leaves a pair no token of each text is refused, naming
    ``limit``."""
    if not _cuts(engine, total):
        return pairs
    specials = engine.text.pair_specials
    if total - specials < 2:
        raise Refusal("invalid", f"{limit} {total} leaves a pair no token of each text: model "
                      f"{engine.name!r} reads {specials} special tokens with each pair")
    cut = engine.text.pair_cuts
    return (cut(pairs, total, side) if len(pairs) <= INLINE else
            await asyncio.to_thread(cut, pairs, total, side))


def client_closed() -> Refusal:
    """A client that went away before its answer: counted, never sent."""
    return Refusal("client_closed", "the client closed the connection")


async def infer(call: Call, engine, texts: list, truncation: str | None,
                windows: tuple[int, int] | None = None,
                named: Callable[[int], str] = numbered, iterations: int | None = None) -> Result:
    """Runs the texts (within the limits: check_limits) on the engine (``windows``:
    question answering's, Engine.infer's; ``iterations``: a recursive model's depth,
    check_iterations'); drops them from the queue if the client goes away. ``named``: what
    the client calls the text at an index, for a refusal about it (where the texts are not
    the client's inputs in order: a rerank's query, then its documents). Token ids outside
    the model's vocabulary are refused (check_token_ids)."""
    check_iterations(engine, iterations)
    check_token_ids(engine, texts, named)
    task, running, gone = asyncio.current_task(), True, False

    def client_gone() -> None:
        nonlocal gone
        if running:  # a disconnect noticed once they ran cancels nothing
            gone = True
            task.cancel()  # engine.infer below is cancelled: its inputs leave the queue

    stop_watching = call.on_gone(client_gone)
    result, began = None, time.perf_counter()
    try:
        result = await engine.infer(texts, truncation, windows, iterations, call.priority)
        return result
    except asyncio.CancelledError:
        if not gone:
            raise  # not the client's doing
        task.uncancel()
        raise client_closed() from None
    except InputTooLong as e:
        which = named(e.index)
        raise Refusal("input_too_long", e.said(which), input=which) from None
    except NotFinite as e:
        which = named(e.index)
        raise Refusal("not_finite", f"model {engine.name!r}: {e.said(which)}",
                      input=which) from None
    except OverQueue as e:
        raise Refusal("too_large", f"model {engine.name!r}: {e}; send fewer per request"
                      ) from None
    except QueueFull as e:
        raise Refusal("overloaded", f"model {engine.name!r} is busy ({e}); retry after a "
                      "moment", retry_after=1) from None
    except ModelUnavailable as e:
        raise Refusal("unavailable", f"model {engine.name!r} is unavailable ({e}); retry "
                      "after a moment", retry_after=1) from None
    finally:
        running = False
        stop_watching()
        seconds = time.perf_counter() - began
        if result is None:
            engine.series.failed.observe(seconds)
        else:  # the model's series (and so Triton's statistics); its answer timed from here
            engine.series.observe_result(result, seconds)
            call.answering = engine.series, time.perf_counter()


def usage(result: Result) -> dict:
    return {"prompt_tokens": result.tokens, "total_tokens": result.tokens}


async def embedded(call: Call, model: str | None, texts: list,
                   dimensions: int | None = None, prompt_name: str | None = None,
                   truncation: str | None = "right", normalize: bool = True,
                   named: Callable[[int], str] = numbered, foreign_ids: bool = False,
                   iterations: int | None = None, truncate_prompt_tokens: int | None = None
                   ) -> tuple[Any, np.ndarray, Result]:
    """The embedding model (``model``, or the only one), the inputs' embeddings [N, D] (the
    first ``dimensions`` components, then unit length if ``normalize``) and the run; for
    every protocol's embedding requests. ``texts``: texts or token ids, behind the prompt
    ``prompt_name`` (None: the model's default prompt); ``named``: as infer's;
    ``foreign_ids``: token ids in the vocabulary the model reads them in
    (DISTILSERVE_TOKEN_IDS), else its own; ``iterations``: as infer's;
    ``truncate_prompt_tokens`` (vLLM's): each input first cut to at most so many tokens as
    the model reads it, at the side ``truncation`` says (within; -1 or None: not)."""
    engine = registry.pick(call.service, "embed", model)
    if foreign_ids:
        texts = read_foreign(engine, texts)
    check_limits(call, texts, named=named)
    check_dimensions(engine, dimensions)
    check_answer_size(engine, len(texts), dimensions or engine.dimensions or 1)
    texts = await within(engine, texts, truncate_prompt_tokens, "truncate_prompt_tokens",
                         prompt_name, truncation)
    result = await infer(call, engine, with_prompt(engine, texts, prompt_name), truncation,
                         named=named, iterations=iterations)
    if normalize and dimensions is None and result.postprocessed is not None:
        return engine, np.asarray(result.postprocessed), result  # [N, D], by their batch
    vectors = postprocess.sentence_embeddings(result.outputs, engine.pools)  # [N, D]
    if dimensions is not None:  # [N, dimensions], its rows one after another (orjson's)
        vectors = np.ascontiguousarray(vectors[:, :dimensions])
    if normalize:
        vectors = postprocess.normalize(vectors)
    return engine, vectors, result
