"""distilserve/server/core/inference.py against a fake engine: a request's limits, the run
and its refusals, without a transport; and each refusal said once by each transport."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import numpy as np
import pytest

from distilserve.server.core import inference
from distilserve.server.core.batching import InputTooLong, NotFinite, OverQueue, QueueFull
from distilserve.server.core.inference import Call
from distilserve.server.core.refusals import REASONS, Refusal
from distilserve.server.core.runner import ModelUnavailable, Result


class Series:
    def __init__(self):
        self.answered, self.failed = [], SimpleNamespace(observe=lambda s: self.answered.append(
            ("failed", s)))

    def observe_result(self, result, seconds):
        self.answered.append(("answered", seconds))


def engine(run=None, **facts):
    """A fake embedding engine whose ``infer`` is ``run(texts)`` (default: a row of ones
    per text)."""
    async def infer(texts, truncation, windows, iterations, priority):
        if run is not None:
            return await run(texts)
        return Result([np.ones(4, np.float32)] * len(texts), len(texts), 0, 0, 0, 0, "cpu")

    facts = {"name": "m", "task": "embed", "dimensions": 4, "depth": None, "family": "bert",
             "manifest": SimpleNamespace(num_iterations=None), "prompts": {},
             "default_prompt": None, "foreign": None, "pools": None, "sparse": False,
             "text": SimpleNamespace(vocab_size=10), **facts}
    return SimpleNamespace(infer=infer, series=Series(), **facts)


def call(*engines, max_inputs=8, max_input_chars=20, **fields) -> Call:
    svc = SimpleNamespace(
        engines={e.name: e for e in engines}, ready=True, draining=False, failures={},
        settings=SimpleNamespace(max_inputs=max_inputs, max_input_chars=max_input_chars),
        aliases=lambda: {}, unloaded=lambda: [])
    return Call(svc, **fields)


def refused(coroutine_or_call) -> Refusal:
    with pytest.raises(Refusal) as e:
        value = coroutine_or_call()
        if asyncio.iscoroutine(value):
            asyncio.run(value)
    return e.value


def test_limits_are_the_settings_and_name_the_input():
    c = call(engine())
    assert refused(lambda: inference.check_limits(c, ["a"] * 9)).message == (
        "9 inputs; at most 8 per request (DISTILSERVE_MAX_INPUTS)")
    e = refused(lambda: inference.check_limits(c, ["a", "x" * 21]))
    assert (e.reason, e.message) == ("too_large", "input 1 has 21 characters; at most 20 "
                                     "(DISTILSERVE_MAX_INPUT_CHARS)")
    assert e.input == "input 1"
    inference.check_limits(c, [("a" * 10, "b" * 10)])  # a pair: its texts' characters


def test_what_only_the_model_can_refuse_is_refused_before_it_runs():
    m = engine()
    assert refused(lambda: inference.check_dimensions(m, 5)).message == (
        "dimensions 5 is more than the width of model 'm', 4")
    e = refused(lambda: inference.check_token_ids(m, ["a", [1, 10]]))
    assert (e.reason, e.message, e.input) == ("invalid", "input 1: token id 10 is not in "
                                              "the vocabulary of model 'm' (0 to 9)", "input 1")
    # every run checks its token ids, naming the input as its route does
    e = refused(lambda: inference.infer(call(m), m, ["q", [10]], "right",
                                        named=lambda i: f"document {i - 1}"))
    assert (e.message, e.input) == ("document 0: token id 10 is not in the vocabulary of "
                                    "model 'm' (0 to 9)", "document 0")
    assert refused(lambda: inference.check_iterations(m, 2)).message == (
        "iterations 2: model 'm' is a bert model, not a recursive one: its depth is fixed")
    assert refused(lambda: inference.with_prompt(m, ["a"], "query")).message == (
        "prompt_name 'query': model 'm' has no prompts")
    prompted = engine(prompts={"query": "q: "}, default_prompt="d: ")
    assert inference.with_prompt(prompted, ["a", [1]], "query") == ["q: a", [1]]
    assert inference.with_prompt(prompted, ["a"], None) == ["d: a"]


def test_a_cap_on_tokens_cuts_below_what_the_model_reads_or_refuses_naming_its_field():
    # a fake tokenisation: a text's characters are its tokens
    text = SimpleNamespace(room=5, counted_cuts=lambda texts, most, truncation: [
        (t[:most] if truncation else t, len(t)) for t in texts])
    m = engine(text=text)
    texts = ["abc", "a"]
    for most in (None, 5, 9):  # no cap, or none the model would not make itself
        assert asyncio.run(inference.capped(m, texts, most, None, "max_tokens")) is texts
    assert asyncio.run(inference.capped(m, texts, 2, "right", "max_tokens")) == ["ab", "a"]
    e = refused(lambda: inference.capped(m, ["a", "abc"], 2, None, "max_tokens",
                                         lambda i: f"text {i}"))
    assert (e.reason, e.input) == ("input_too_long", "text 1")
    assert e.message.startswith("text 1 has 3 tokens, more than max_tokens 2;")


def test_a_cap_on_the_tokens_the_model_reads_counts_its_special_tokens_and_prompt():
    # a fake tokenisation: a text's characters are its tokens, [CLS] and [SEP] around each
    text = SimpleNamespace(room=6, specials=([101], [102]), count=len,
                           counted_cuts=lambda texts, most, truncation: [
                               (t[:most] if truncation == "right" else t[-most:], len(t))
                               for t in texts])
    plain, prompted = (engine(text=text, max_length=8, default_prompt=p, prompts={"q": "q:"})
                       for p in ("", "d: "))
    texts = ["abcdef", "ab"]
    for total in (8, 9, -1, None):  # what max_length cuts anyway; vLLM's -1, or none
        assert asyncio.run(inference.within(plain, texts, total, "cap")) is texts
    assert asyncio.run(inference.within(plain, texts, 5, "cap")) == ["abc", "ab"]
    assert asyncio.run(inference.within(prompted, texts, 7, "cap")) == ["ab", "ab"]
    assert asyncio.run(inference.within(prompted, [[1, 2, 3, 4]], 5, "cap")) == [[1, 2, 3]]
    assert asyncio.run(inference.within(prompted, texts, 7, "cap", "q")) == ["abc", "ab"]
    # a prompt goes before texts alone: token ids keep all but the special tokens' room
    assert asyncio.run(inference.within(prompted, ["abcdef", [1, 2, 3, 4, 5, 6]], 7, "cap")) \
        == ["ab", [1, 2, 3, 4, 5]]
    assert asyncio.run(inference.within(plain, ["abcdef", [1, 2, 3, 4, 5, 6]], 5, "cap",
                                        side="left")) == ["def", [4, 5, 6]]
    e = refused(lambda: inference.within(prompted, texts, 5, "cap"))
    assert e.reason == "invalid" and e.message == (
        "cap 5 leaves an input no token of its own: model 'm' reads 2 special tokens and 3 "
        "of its prompt with each")


def test_a_pair_cut_below_what_leaves_a_token_of_each_text_is_refused_naming_its_field():
    text = SimpleNamespace(pair_specials=3, pair_cuts=lambda pairs, total, side: [
        (a[:1], b[:total - 4]) for a, b in pairs])
    m = engine(text=text, max_length=8)
    assert asyncio.run(inference.pair_cuts(m, [("ab", "cdef")], 6, "cap")) == [("a", "cd")]
    pairs = [("ab", "cdef")]
    for total in (8, 9, -1, None):  # what max_length cuts anyway; vLLM's -1, or none
        assert asyncio.run(inference.pair_cuts(m, pairs, total, "cap")) is pairs
    e = refused(lambda: inference.pair_cuts(m, [("ab", "cd")], 4, "cap"))
    assert e.reason == "invalid" and e.message == (
        "cap 4 leaves a pair no token of each text: model 'm' reads 3 special tokens with "
        "each pair")


@pytest.mark.parametrize("error, reason, retry, said, which", [
    (InputTooLong(1, 9, 8), "input_too_long", None, "document 0 has 9 tokens", "document 0"),
    (NotFinite(1, 7), "not_finite", None, "model 'm': document 0: the model's outputs",
     "document 0"),
    (OverQueue("30 inputs"), "too_large", None, "model 'm': 30 inputs; send fewer", None),
    (QueueFull("9 queued"), "overloaded", 1, "model 'm' is busy (9 queued)", None),
    (ModelUnavailable("gone"), "unavailable", 1, "model 'm' is unavailable (gone)", None)])
def test_the_runs_failures_are_refusals_and_counted_failed(error, reason, retry, said, which):
    async def run(texts):
        raise error

    m = engine(run)
    e = refused(lambda: inference.infer(call(m), m, ["q", "d"], "right",
                                        named=lambda i: f"document {i - 1}"))
    assert (e.reason, e.retry_after, e.input) == (reason, retry, which)
    assert e.message.startswith(said)
    assert [kind for kind, _ in m.series.answered] == ["failed"]


def test_an_answer_is_counted_and_timed_from_its_outputs():
    m = engine()
    c = call(m)
    found, vectors, result = asyncio.run(inference.embedded(c, None, ["a", "b"]))
    assert found is m and vectors.shape == (2, 4)
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1, rtol=1e-6)
    assert [kind for kind, _ in m.series.answered] == ["answered"]
    assert c.answering[0] is m.series  # the transport times the answer from here


def test_a_client_gone_leaves_the_queue_and_is_refused_as_closed():
    async def scenario():
        callbacks, started = [], asyncio.Event()

        async def run(texts):
            started.set()
            await asyncio.Event().wait()  # queued for ever

        def on_gone(callback):
            callbacks.append(callback)
            return lambda: callbacks.remove(callback)

        m = engine(run)
        task = asyncio.ensure_future(inference.infer(call(m, on_gone=on_gone), m, ["a"], None))
        await started.wait()
        callbacks[0]()  # the client goes
        with pytest.raises(Refusal) as e:
            await task
        return e.value, callbacks

    refusal, left = asyncio.run(scenario())
    assert refusal.reason == "client_closed" and left == []


def test_a_cancel_not_the_clients_stays_a_cancel():
    async def scenario():
        async def run(texts):
            await asyncio.Event().wait()

        m = engine(run)
        task = asyncio.ensure_future(inference.infer(call(m), m, ["a"], None))
        await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(scenario())


def test_every_reason_is_said_by_http_and_by_grpc():
    grpc = pytest.importorskip("grpc")
    from distilserve.server.errors import HTTP, ApiError
    from distilserve.server.routes.grpc_calls import CODES, code

    assert set(HTTP) == set(CODES) == set(REASONS)
    assert code(Refusal("overloaded", "busy", 1)) == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert code(Refusal("client_closed", "gone")) == grpc.StatusCode.CANCELLED
    assert code(ApiError(401, "unauthorized", "key")) == grpc.StatusCode.UNAUTHENTICATED
    assert code(ApiError(501, "not_implemented", "no")) == grpc.StatusCode.UNIMPLEMENTED
    error = ApiError.of(Refusal("overloaded", "busy", retry_after=1))
    assert (error.status, error.kind, error.headers) == (429, "overloaded", {"Retry-After": "1"})
    assert ApiError.of(Refusal("client_closed", "gone")).status == 499
