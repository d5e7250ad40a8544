"""server/routes/common.py: how a route learns that its client went away, under
distilserve's own server (a ClientWatch in the scope) and under any other (the ASGI
``http.disconnect`` message); which model a request without one gets."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest
from starlette.requests import Request

from server.connections import DISCONNECT, ClientWatch
from server.errors import ApiError
from server.routes.common import _on_client_gone, choose, choose_token_embedder


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
    pooled, tokens, more = (SimpleNamespace(name=name, task="embed", pools=pools)
                            for name, pools in (("a", None), ("b", "mean"), ("c", "cls")))
    both = serving(pooled, tokens)
    assert choose_token_embedder(both, None) is tokens
    assert choose_token_embedder(both, "b") is tokens
    assert refusal(choose, both, None, "embed") == (
        400, "several models do embed (a, b): name one in 'model'")
    assert refusal(choose, both, None, "ner") == (404, "no served model does ner")
    assert refusal(choose_token_embedder, serving(pooled), None) == (
        404, "no served model gives token embeddings (distilserve export --token-embeddings)")
    assert refusal(choose_token_embedder, serving(tokens, more), None) == (
        400, "several models give token embeddings (b, c): name one in 'model'")
    status, message = refusal(choose_token_embedder, both, "a")
    assert status == 400 and "export it with distilserve export --token-embeddings" in message
