"""distilserve/server/routes/common.py: how a route learns that its client went away, under
distilserve's own server (a ClientWatch in the scope) and under any other (the ASGI
``http.disconnect`` message)."""

from __future__ import annotations

import asyncio

from starlette.requests import Request

from distilserve.server.connections import DISCONNECT, ClientWatch
from distilserve.server.routes.common import _on_client_gone


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
