"""distilserve/server/connections.py: stalled clients are cut off, connections are capped, and the
requests of well-behaved clients are served meanwhile, and through a graceful stop; the
workers' supervisor replaces a dead worker at once."""

from __future__ import annotations

import http.client
import json
import os
import signal
import socket
import threading
import time
from urllib.parse import urlsplit

import httpx
import pytest
import uvicorn
from uvicorn.supervisors.multiprocess import SIGNALS, Process

from distilserve.server.connections import ClientWatch, Workers
from loadtests import lightload
from tests import web
from tests.conftest import running_server, serving, wait_for


@pytest.fixture(scope="module")
def repository(exports, tiny_checkpoints, tmp_path_factory):
    repo = tmp_path_factory.mktemp("connections-repo")
    exports(tiny_checkpoints["cmow", "embed"], repo / "cmow", "onnx", check=False)
    return repo


def embed_request(text: str, close: bool = False) -> bytes:
    """A raw HTTP/1.1 POST of ``text`` to /v1/embed (asking to close the connection after
    it with ``close``)."""
    return lightload.request("/v1/embed", json.dumps({"inputs": text}).encode(), close=close)


def stalled(port: int, count: int) -> list[socket.socket]:
    """Connections that send half a request header and then nothing."""
    out = []
    for _ in range(count):
        s = socket.create_connection(("127.0.0.1", port))
        s.sendall(embed_request("stalled")[:50])
        out.append(s)
    return out


def closed_by_server(s: socket.socket) -> bool:
    s.setblocking(False)
    try:
        return s.recv(1) == b""
    except BlockingIOError:
        return False  # still open, nothing to read
    except ConnectionResetError:
        return True


def until_closed(s: socket.socket) -> bytes:
    """What the server sends on ``s`` until it closes the connection (a bound for a hung
    server: 10 minutes)."""
    answer = b""
    s.settimeout(600)
    try:
        while chunk := s.recv(65536):
            answer += chunk
    except ConnectionResetError:
        pass
    return answer


def test_stalled_connections_are_closed_while_others_are_served(repository):
    with running_server(repository, header_timeout=2.0) as url:
        port = urlsplit(url).port
        hung = stalled(port, 200)
        assert not any(closed_by_server(s) for s in hung)  # open until the timeout
        with httpx.Client(timeout=60) as client:  # served meanwhile, on one connection
            for _ in range(5):
                assert client.post(url + "/v1/embed", json={"inputs": "fine"}).status_code == 200
        wait_for(lambda: all(closed_by_server(s) for s in hung), "the stalled connections "
                 "to be closed", seconds=60)
        for s in hung:
            s.close()
        # an idle connection that never sends a byte is closed too
        idle = socket.create_connection(("127.0.0.1", port))
        wait_for(lambda: closed_by_server(idle), "the idle connection to be closed", 60)
        idle.close()
        assert web.post(url + "/v1/embed", json={"inputs": "after"}).status_code == 200


def test_a_slow_but_steady_client_within_the_timeout_is_served(repository):
    with running_server(repository, header_timeout=3.0) as url:
        port = urlsplit(url).port
        request = embed_request("slow", close=True)
        with socket.create_connection(("127.0.0.1", port)) as s:
            for part in (request[:20], request[20:60], request[60:]):
                s.sendall(part)
                time.sleep(0.5)
            answer = until_closed(s)
        assert answer.startswith(b"HTTP/1.1 200"), answer[:200]


def test_connections_past_the_cap_get_503(repository):
    # the test closes the stalled connections itself: a long header timeout, so that none
    # is cut off before the request past the cap, however slow this machine is
    with running_server(repository, max_connections=8, header_timeout=60.0) as url:
        port = urlsplit(url).port
        hung = stalled(port, 8)  # accepted, in order, before the next connection
        refused = web.post(url + "/v1/embed", json={"inputs": "x"}, timeout=60)
        assert refused.status_code == 503
        for s in hung:
            s.close()
        wait_for(lambda: web.post(url + "/v1/embed", json={"inputs": "x"},
                                    timeout=60).status_code == 200,
                 "a request to be served once the connections are gone", 60)


def test_a_stop_serves_the_requests_awaited_and_closes_the_idle_connections(repository):
    request = embed_request("the last")
    # a long header deadline: the requests awaited are not cut off, however slow this machine
    with serving(repository, header_timeout=600.0) as (url, server):
        port = urlsplit(url).port
        idle = http.client.HTTPConnection("127.0.0.1", port, timeout=600)  # kept alive
        idle.request("GET", "/health")
        assert idle.getresponse().read() and idle.sock is not None
        new = socket.create_connection(("127.0.0.1", port))  # its request yet to come
        begun = socket.create_connection(("127.0.0.1", port))
        begun.sendall(request[:30])  # its request's first bytes

        def accepted():  # the server's connections by client address (a copy: its thread
            return {p.client: p for p in list(server.server_state.connections)}  # changes them)

        wait_for(lambda: new.getsockname() in accepted() and getattr(
            accepted().get(begun.getsockname()), "receiving", False),
            "both connections accepted, a request begun on one")
        server.should_exit = True  # what SIGTERM does
        wait_for(lambda: closed_by_server(idle.sock), "the idle connection to be closed", 60)
        new.sendall(request)  # sent as the stop began: served, then the connections closed
        begun.sendall(request[30:])
        for s in (new, begun):
            answer = until_closed(s)
            assert answer.startswith(b"HTTP/1.1 200"), answer[:200]
            assert b"connection: close" in answer.lower()
            s.close()
        idle.close()


def test_a_client_watch_calls_back_until_stopped():
    watch, called = ClientWatch(), []
    first = watch.on_gone(lambda: called.append("first"))
    second = watch.on_gone(lambda: called.append("second"))
    second()  # stopped before the client went: not called
    assert not watch.gone and called == []
    watch.lost()
    assert watch.gone and called == ["first"]
    watch.on_gone(lambda: called.append("late"))  # the client has gone: at once
    assert called == ["first", "late"]
    first()  # stopping after the call is harmless


async def nothing(scope, receive, send):  # the supervisor's workers' app: never called
    raise NotImplementedError


@pytest.mark.slow  # worker processes
def test_a_worker_dying_while_pinged_is_replaced_at_once():
    """The supervisor pings a worker that does not answer (stopped), and the worker dies
    meanwhile: the ping ends there and the worker is replaced, where the supervisor would
    have waited for the whole health-check timeout (an hour here)."""
    handlers = {sig: signal.getsignal(sig) for sig in SIGNALS}  # the supervisor takes them
    sock = socket.create_server(("127.0.0.1", 0))
    config = uvicorn.Config(f"{__name__}:nothing", workers=1, timeout_worker_healthcheck=3600)
    workers = Workers(config, sockets=[sock])
    stopped = Process(config, [sock])
    try:
        stopped.start()
        os.kill(stopped.pid, signal.SIGSTOP)
        workers.processes.append(stopped)
        supervising = threading.Thread(target=workers.keep_subprocess_alive, daemon=True)
        supervising.start()
        time.sleep(1)  # the ping sent, unanswered
        os.kill(stopped.pid, signal.SIGKILL)
        supervising.join(timeout=600)
        assert not supervising.is_alive(), "the supervisor waits on a dead worker's ping"
        (replacement,) = workers.processes
        assert replacement is not stopped and replacement.process.is_alive()
    finally:
        for process in {stopped, *workers.processes}:
            if process.process.pid is not None:  # (a start that failed is the error to see)
                process.kill()
                process.process.join()
        sock.close()
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
