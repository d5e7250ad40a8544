"""How connections are served: uvicorn's HTTP/1.1 protocol with connection-level defences
in the manner of nginx's (limit_conn, client_header_timeout, client_body_timeout) and a
clean exit.

- A cap on a worker's open connections (DISTILSERVE_MAX_CONNECTIONS) and on those from
  one client address (DISTILSERVE_MAX_CLIENT_CONNECTIONS), applied when a connection is
  accepted: one past either is answered 503 with Retry-After and closed at once; the
  connections already being served are never refused for it.
- Deadlines: for a request's headers (from connecting, or from a keep-alive request's
  first byte: the connection is closed), for its body once the headers are in (408, then
  closed), and for an idle keep-alive connection (uvicorn's, closed).
- Each connection closed for one of these is counted by why, in
  ``distilserve_connections_closed_total{reason}`` (metrics.CLOSED), through the metrics the
  app's lifespan puts in its state (METRICS).

A request's handler learns that its client went away (to drop its queued inputs) from the
``ClientWatch`` in its scope (``scope["extensions"][DISCONNECT]``), which the protocol
sets off when it loses the connection, rather than from a task per request waiting for
``http.disconnect`` (the ASGI way), which costs the event loop time on every request.

On a graceful stop (SIGTERM, SIGINT, a restart's retirement), as nginx's: an idle
keep-alive connection is closed and a request in flight answered, then its connection
closed (uvicorn's); and a request awaited on a new connection, or begun on a kept-alive one,
is served too, then its connection closed, rather than closed unanswered (the header
deadline still bounds the wait).

uvicorn re-raises SIGTERM/SIGINT once it has drained, so a clean shutdown would exit
with the signal's status; ``Server`` exits normally (0), as Kubernetes and systemd expect.
``Workers`` is uvicorn's supervisor of ``--workers N``, which stops listening as soon as
it is told to stop, so that a connection arriving after the signal is refused at connect
rather than accepted by the kernel, never served, and reset.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import signal
import threading
from collections.abc import Callable
from http import HTTPStatus

import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
from uvicorn.supervisors import Multiprocess

from distilserve.server.errors import body
from distilserve.server.settings import Settings

DISCONNECT = "distilserve.disconnect"  # scope["extensions"] key of a request's ClientWatch
METRICS = "distilserve.metrics"  # the lifespan state's key of the app's Metrics
RETRY_AFTER_S = 1  # what a connection refused for a cap is told


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


class Admission:
    """A worker's open connections, in all and per client address, against their caps
    (``per_client`` 0: none per address)."""

    def __init__(self, limit: int, per_client: int):
        self.limit, self.per_client = limit, per_client
        self.open = 0
        self.by_client: dict[str, int] = {}

    def admit(self, client: str) -> str | None:
        """Counts a connection from ``client`` in; or, past a cap, says which (a REASON)."""
        if self.open >= self.limit:
            return "over_capacity"
        held = self.by_client.get(client, 0)
        if self.per_client and held >= self.per_client:
            return "client_over_capacity"
        self.open += 1
        self.by_client[client] = held + 1
        return None

    def release(self, client: str) -> None:
        self.open -= 1
        held = self.by_client.pop(client) - 1
        if held:
            self.by_client[client] = held


@functools.cache
def raw_response(status: int, message: str, *headers: tuple[str, str]) -> bytes:
    """An HTTP/1.1 response with the service's error body that closes its connection."""
    content = json.dumps(body(HTTPStatus(status).phrase.lower().replace(" ", "_"),
                              message)).encode()
    head = [f"HTTP/1.1 {status} {HTTPStatus(status).phrase}", "content-type: application/json",
            f"content-length: {len(content)}", "connection: close",
            *(f"{name}: {value}" for name, value in headers)]
    return ("\r\n".join(head) + "\r\n\r\n").encode() + content


class Guarded(HttpToolsProtocol):
    """uvicorn's HTTP/1.1 protocol (httptools) with the caps and deadlines above, and a
    ClientWatch in each request's scope."""

    def __init__(self, config: Config, *args, **kwargs):
        super().__init__(config, *args, **kwargs)
        self.admission = config.admission
        self.header_timeout, self.body_timeout = config.header_timeout, config.body_timeout
        self.deadline: asyncio.TimerHandle | None = None
        self.address: str | None = None  # the client's, once admitted
        self.receiving = False  # a request's headers begun, not complete
        self.last_request = False  # stopping: the next request is the connection's last

    def _arm(self, reason: str, seconds: float) -> None:
        if self.deadline is None:
            self.deadline = self.loop.call_later(seconds, self._expire, reason)

    def _disarm(self) -> None:
        if self.deadline is not None:
            self.deadline.cancel()
            self.deadline = None

    def _count(self, reason: str) -> None:
        metrics = self.app_state.get(METRICS)
        if metrics is not None:
            metrics.connections_closed.labels(reason).inc()

    def _expire(self, reason: str) -> None:
        self.deadline = None
        if self.transport.is_closing():
            return
        self._count(reason)
        cycle = self.cycle
        if reason == "body_timeout" and cycle is not None and not cycle.response_started:
            cycle.disconnected = True  # the app's receive() hears that the client went
            cycle.message_event.set()
            self.transport.write(raw_response(408, "the request's body did not arrive "
                                              f"within {self.body_timeout:g} s"))
        self.transport.close()

    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        address = self.client[0] if self.client else ""
        refused = self.admission.admit(address)
        if refused is not None:
            self._count(refused)
            transport.write(raw_response(503, "too many open connections" + (
                " from this address" if refused == "client_over_capacity" else "")
                + "; retry shortly", ("retry-after", str(RETRY_AFTER_S))))
            transport.close()
            return
        self.address = address
        self._arm("header_timeout", self.header_timeout)  # to the first request's headers

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self.scope["extensions"] = {DISCONNECT: ClientWatch()}
        self.receiving = True
        self._arm("header_timeout", self.header_timeout)  # a keep-alive request's, from its
        # first byte

    def on_headers_complete(self) -> None:
        self._disarm()
        self.receiving = False
        super().on_headers_complete()
        if self.last_request and self.cycle is not None:
            self.cycle.keep_alive = False
        for name, value in self.headers:
            if name == b"transfer-encoding" or name == b"content-length" and value != b"0":
                self._arm("body_timeout", self.body_timeout)  # a body is to come
                break

    def on_message_complete(self) -> None:
        self._disarm()
        super().on_message_complete()

    def timeout_keep_alive_handler(self) -> None:
        if not self.transport.is_closing():
            self._count("keep_alive_timeout")
        super().timeout_keep_alive_handler()

    def shutdown(self) -> None:
        """uvicorn's (an idle keep-alive connection closed, a request in flight its
        connection's last), but a request awaited on a new connection, or begun, is served
        as the connection's last."""
        awaited = self.cycle is None or self.cycle.response_complete and self.receiving
        if awaited and not self.transport.is_closing():
            self.last_request = True
        else:
            super().shutdown()

    def connection_lost(self, exc) -> None:
        self._disarm()
        if self.address is not None:
            self.admission.release(self.address)
            self.address = None
        cycle = self.cycle
        super().connection_lost(exc)
        if cycle is not None and cycle.disconnected:  # lost before its response was sent
            cycle.scope["extensions"][DISCONNECT].lost()


class Config(uvicorn.Config):
    """uvicorn's configuration with the settings' connection caps and deadlines (Guarded);
    each worker process has its own (and its own Admission)."""

    def __init__(self, app, settings: Settings, **kwargs):
        super().__init__(app, http=Guarded, timeout_keep_alive=settings.keep_alive_timeout,
                         **kwargs)
        self.admission = Admission(settings.max_connections, settings.max_client_connections)
        self.header_timeout, self.body_timeout = settings.header_timeout, settings.body_timeout


class Server(uvicorn.Server):
    """uvicorn's server, exiting normally after draining on SIGTERM or SIGINT; on SIGHUP
    (in the main thread), ``on_hup`` is called on the event loop."""

    def __init__(self, config: uvicorn.Config, on_hup: Callable[[], None] | None = None):
        super().__init__(config)
        self.on_hup = on_hup

    @contextlib.contextmanager
    def capture_signals(self):
        with super().capture_signals():
            hup = None
            if self.on_hup is not None and threading.current_thread() is threading.main_thread():
                loop = asyncio.get_running_loop()
                hup = signal.signal(signal.SIGHUP,
                                    lambda *_: loop.call_soon_threadsafe(self.on_hup))
            try:
                yield
            finally:
                self._captured_signals.clear()  # drained: nothing to re-raise
                if hup is not None:
                    signal.signal(signal.SIGHUP, hup)


class Workers(Multiprocess):
    """uvicorn's supervisor of worker processes, which closes its own copy of the
    listening sockets when told to stop (SIGTERM, SIGINT), before the workers drain: once
    they have closed theirs too, a new connection is refused at connect, where the
    supervisor's copy would have kept the socket listening, its connections queued for
    no one and reset when it exits. It replaces a worker that dies as soon as it is gone,
    even while the worker was being pinged. SIGHUP replaces the workers in turn, after
    ``on_hup`` (the shared engine process told to read its repository again)."""

    def __init__(self, config: Config, sockets: list, on_hup: Callable[[], None] | None = None):
        super().__init__(config, sockets)
        self.on_hup = on_hup

    def handle_hup(self) -> None:
        if self.on_hup is not None:
            self.on_hup()
        super().handle_hup()

    def keep_subprocess_alive(self) -> None:
        # each worker's end of its health-check pipe, closed in the supervisor once the
        # worker has its own: a worker that dies while pinged then ends the ping at once
        # (EOF), where the supervisor's copy would keep the pipe open for the whole
        # health-check timeout, the dead worker unreplaced and signals unhandled meanwhile
        for process in self.processes:
            process.child_conn.close()
        super().keep_subprocess_alive()

    def handle_term(self) -> None:
        self._stop_listening()
        super().handle_term()

    def handle_int(self) -> None:
        self._stop_listening()
        super().handle_int()

    def _stop_listening(self) -> None:
        for sock in self.sockets:
            sock.close()
