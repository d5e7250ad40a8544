"""distilserve/server/routes/common.py: how a route learns that its client went away, under
distilserve's own server (a ClientWatch in the scope) and under any other (the ASGI
``http.disconnect`` message); which model a request without one gets."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest
from starlette.requests import Request

from distilserve.server.connections import DISCONNECT, ClientWatch
from distilserve.server.errors import ApiError
from distilserve.server.routes.common import _on_client_gone, choose, choose_entailing, choose_giving


def request(scope_extra: dict, receive=None) -> Request:
    async def never():
        await asyncio.Event().wait()

    return Request({"type": "http", "method": "POST", "path": "/", "headers": [],
                    **scope_extra}, receive or never)


def test_the_servers_client_watch_is_used_without_a_task():
    async def scenario():
        watch, called = ClientWatch(), []
        stop = _on_client_gone(request({"extensions": {DISCONNECT: watch}}),
                               lambda: called.append(1))
        tasks = len(asyncio.all_tasks())
        watch.lost()
        stopped = _on_client_gone(request({"extensions": {DISCONNECT: watch}}),
                                  lambda: called.append(2))  # gone already: at once
        stop(), stopped()
        return tasks, called, watch.callbacks

    tasks, called, left = asyncio.run(scenario())
    assert tasks == 1 and called == [1, 2] and not left  # only the test's own task


def test_elsewhere_the_asgi_disconnect_message_is_awaited():
    async def scenario(stop_first: bool):
        gone, called = asyncio.Event(), []

        async def receive():
            await gone.wait()
            return {"type": "http.disconnect"}

        stop = _on_client_gone(request({}, receive), lambda: called.append(1))
        if stop_first:
            stop()
        gone.set()
        for _ in range(3):
            await asyncio.sleep(0)
        return called

    assert asyncio.run(scenario(stop_first=False)) == [1]
    assert asyncio.run(scenario(stop_first=True)) == []


def serving(*engines) -> Request:
    """A request to a ready service of these engines."""
    svc = SimpleNamespace(draining=False, ready=True, engines={e.name: e for e in engines})
    return Request({"type": "http", "method": "POST", "path": "/", "headers": [],
                    "app": SimpleNamespace(state=SimpleNamespace(service=svc))})


def refusal(choice, *args) -> tuple[int, str]:
    with pytest.raises(ApiError) as e:
        choice(*args)
    return e.value.status, e.value.message


def test_an_unnamed_model_is_the_one_that_can_else_the_refusal_says_why():
    pooled, tokens, more, splade = (
        SimpleNamespace(name=name, task="embed", pools=pools, sparse=sparse)
        for name, pools, sparse in (("a", None, False), ("b", "mean", False),
                                    ("c", "cls", False), ("s", None, True)))
    both = serving(pooled, tokens, splade)
    assert choose_giving(both, None, "token embeddings") is tokens
    assert choose_giving(both, "b", "token embeddings") is tokens
    assert choose_giving(both, None, "sparse embeddings") is splade
    assert refusal(choose, both, None, "embed") == (
        400, "several models do embed (a, b, s): name one in 'model'")
    assert refusal(choose, both, None, "ner") == (404, "no served model does ner")
    assert refusal(choose_giving, serving(pooled), None, "token embeddings") == (
        404, "no served model gives token embeddings (distilserve export --token-embeddings)")
    assert refusal(choose_giving, serving(tokens, more), None, "token embeddings") == (
        400, "several models give token embeddings (b, c): name one in 'model'")
    status, message = refusal(choose_giving, both, "a", "token embeddings")
    assert status == 400 and "export it with distilserve export --token-embeddings" in message
    assert refusal(choose_giving, both, "b", "sparse embeddings") == (
        400, "model 'b' is not a SPLADE model (a masked-language model exported with "
        "distilserve export --pooling splade)")


def test_zero_shot_takes_the_nli_model_named_or_the_only_one():
    nli, sentiment, embedder = (
        SimpleNamespace(name=name, task=task, labels=labels, entailment=entailment)
        for name, task, labels, entailment in (
            ("nli", "classify", ["contradiction", "entailment", "neutral"], 1),
            ("sentiment", "classify", ["negative", "positive"], None),
            ("e", "embed", [], None)))
    assert choose_entailing(serving(nli, sentiment, embedder), None) is nli
    assert choose_entailing(serving(nli, sentiment), "nli") is nli
    assert refusal(choose_entailing, serving(sentiment), None) == (
        404, "no served model classifies zero-shot (an NLI model, with an entailment label)")
    assert refusal(choose_entailing, serving(nli, sentiment), "sentiment") == (
        400, "model 'sentiment' has the labels negative, positive and none is entailment: "
        "zero-shot classification takes an NLI model (entailment, neutral, contradiction)")
    assert refusal(choose_entailing, serving(nli, embedder), "e")[0] == 400  # does embed
    other = SimpleNamespace(**{**vars(nli), "name": "nli2"})
    assert refusal(choose_entailing, serving(nli, other), None) == (
        400, "several models classify zero-shot (nli, nli2): name one in 'model'")
