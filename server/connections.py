"""How connections are served: uvicorn, with a header timeout and a clean exit.

uvicorn times out idle keep-alive connections, but not a client that connects and sends
half a request header: 200 such connections stayed open indefinitely, each holding a
file descriptor. ``HeaderTimeout`` closes a connection whose request headers are not
complete ``header_timeout`` seconds after it connected or began the request (nginx's
client_header_timeout). The number of open connections is capped by uvicorn's
``limit_concurrency`` (new requests past it get uvicorn's own 503).

A request's handler learns that its client went away (to drop its queued inputs) from the
``ClientWatch`` in its scope (``scope["extensions"][DISCONNECT]``), which the protocol
sets off when it loses the connection: the ASGI way, a task per request waiting for
``http.disconnect``, cost 2-11% of the event loop's time per request (128-512 clients).

uvicorn re-raises SIGTERM/SIGINT once it has drained, so a clean shutdown would exit
with the signal's status; ``Server`` exits normally (0), as Kubernetes and systemd expect.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from server.settings import Settings

DISCONNECT = "distilserve.disconnect"  # scope["extensions"] key of a request's ClientWatch


class ClientWatch:
    """Whether a request's client has gone, and what to call when it goes."""

    __slots__ = ("gone", "callbacks")

    def __init__(self):
        self.gone, self.callbacks = False, set()

    def on_gone(self, callback: Callable[[], None]) -> Callable[[], None]:
        """Calls ``callback()`` when the client goes (at once if it has gone), until the
        function returned is called."""
        if self.gone:
            callback()
        else:
            self.callbacks.add(callback)
        return lambda: self.callbacks.discard(callback)

    def lost(self) -> None:
        self.gone = True
        for callback in list(self.callbacks):
            callback()


class HeaderTimeout(HttpToolsProtocol):
    """uvicorn's HTTP/1.1 protocol (httptools) with a deadline for request headers, and a
    ClientWatch in each request's scope."""

    def __init__(self, config: Config, *args, **kwargs):
        super().__init__(config, *args, **kwargs)
        self.header_timeout = config.header_timeout
        self.header_timer: asyncio.TimerHandle | None = None

    def _arm(self) -> None:
        if self.header_timer is None:
            self.header_timer = self.loop.call_later(self.header_timeout, self._expire)

    def _disarm(self) -> None:
        if self.header_timer is not None:
            self.header_timer.cancel()
            self.header_timer = None

    def _expire(self) -> None:
        self.header_timer = None
        if not self.transport.is_closing():
            self.transport.close()

    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        self._arm()  # from connecting to the first request's headers

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self.scope["extensions"] = {DISCONNECT: ClientWatch()}
        self._arm()  # a keep-alive connection's next request, from its first byte

    def on_headers_complete(self) -> None:
        self._disarm()
        super().on_headers_complete()

    def connection_lost(self, exc) -> None:
        self._disarm()
        cycle = self.cycle
        super().connection_lost(exc)
        if cycle is not None and cycle.disconnected:  # lost before its response was sent
            cycle.scope["extensions"][DISCONNECT].lost()


class Config(uvicorn.Config):
    """uvicorn's configuration with the settings' connection limits and HeaderTimeout."""

    def __init__(self, app, settings: Settings, **kwargs):
        super().__init__(app, http=HeaderTimeout, limit_concurrency=settings.max_connections,
                         timeout_keep_alive=settings.keep_alive_timeout, **kwargs)
        self.header_timeout = settings.header_timeout


class Server(uvicorn.Server):
    """uvicorn's server, exiting normally after draining on SIGTERM or SIGINT."""

    @contextlib.contextmanager
    def capture_signals(self):
        with super().capture_signals():
            try:
                yield
            finally:
                self._captured_signals.clear()  # drained: nothing to re-raise
